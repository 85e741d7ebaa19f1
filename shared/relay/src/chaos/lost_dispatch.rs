//! Scenario 3, lost dispatch: over SQS (moto), 10% of dispatch calls fail and 1% of jobs are
//! silently dropped after commit. The sweep must send each again within one sweep interval of
//! it becoming eligible (at once for a failed dispatch, after the grace period for a lost
//! one), never re-send a fresh row early, and lose nothing.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;

use super::harness::{self, Fate, Faulty};
use super::{Env, Report};
use taskdeck::job::terms::{IdempotencyKey, Limits};
use taskdeck::platform::Settings;
use taskdeck::store::effects;
use taskdeck::store::jobs::NewJob;
use taskdeck::store::tooling::readouts;
use taskdeck::transport::sqs::SqsTransport;

pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
pub const GRACE: Duration = Duration::from_secs(3);
/// Allowed on top of a bound: one sweep pass's own time and clock reads.
const SLACK_SECS: f64 = 0.5;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("lost-dispatch", env.scale);
    let n = env.n(5000, 200);
    let mut settings = Settings::default();
    settings.sweep.redispatch_grace = GRACE;
    settings.sweep_interval = SWEEP_INTERVAL;
    let mut scratch = env.scratch(settings).await?;
    let client = harness::sqs_client(&env.moto().await?);
    let url = harness::new_queue(&client, "chaos-lost").await?;
    let faulty = Arc::new(Faulty::new(Arc::new(SqsTransport::new(client.clone(), url.clone())), 0.10, 0.01, (1, 1)));
    scratch.platform = scratch.platform.clone().with_transport(faulty.clone());
    let (stop_tx, stop) = watch::channel(false);
    let received = Arc::new(harness::Received::default());
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(harness::consume_sqs(
                scratch.platform.executor(),
                client.clone(),
                url.clone(),
                received.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let sweeper = scratch.platform.spawn_sweeper(&stop);

    // One job per dispatch call, from a few concurrent submitters, so a failed call is one job;
    // about 100 jobs a second, which moto takes in without its queue growing (it recomputes
    // every queue attribute for each message, so a long queue slows it to a few a second).
    let intake = scratch.platform.intake.clone();
    let tenant = scratch.tenant.id;
    let submitters: Vec<_> = (0..8)
        .map(|s| {
            let intake = intake.clone();
            tokio::spawn(async move {
                for i in (s..n).step_by(8) {
                    let key = IdempotencyKey::parse(&format!("lost-{i}")).expect("a valid key");
                    let job = NewJob { limits: Limits::fixed(5, 60), ..NewJob::new("test.effect", json!({}), key) };
                    intake.enqueue(tenant, vec![job]).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                    tokio::time::sleep(Duration::from_millis(80)).await;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for s in submitters {
        s.await??;
    }
    let pool = scratch.platform.pool.clone();
    let finished = harness::wait_until(Duration::from_secs(180), || harness::all_terminal(&pool)).await;
    let _ = stop_tx.send(true);
    for c in consumers {
        let _ = c.await;
    }
    let _ = sweeper.await;

    let db = pool.get().await?;
    let counts = harness::status_counts(&db).await?;
    let events = readouts::events_of_kind(&db, "redispatched").await?;
    let effects_doubled = effects::jobs_with_repeats(&db).await?;
    let log = faulty.log();
    let (mut failed, mut dropped) = (0, 0);
    let mut early = 0;
    let mut late_fresh = 0;
    let mut fail_delays = Vec::new();
    let mut drop_delays = Vec::new();
    let mut unrecovered = 0;
    for (i, (id, at, fate)) in log.iter().enumerate() {
        // The re-dispatch that answers this dispatch: the row's next dispatch call (the sweep's
        // re-send, or its second try of a refused re-send in the same pass).
        let next = log
            .iter()
            .filter(|(j, t, _)| j == id && t > at)
            .map(|(_, t, _)| (*t - *at).as_seconds_f64())
            .min_by(f64::total_cmp);
        // Each earlier dispatch of the row that went out unclaimed doubles its grace
        // (`store::jobs::lost_dispatch`); a failed one does not count.
        let resends = log[..i].iter().filter(|(j, _, f)| j == id && !matches!(f, Fate::Failed)).count();
        let superseded = log[i + 1..].iter().any(|(j, _, _)| j == id);
        match fate {
            Fate::Failed => {
                failed += 1;
                match next {
                    Some(d) => fail_delays.push(d),
                    None => unrecovered += 1,
                }
            }
            Fate::Dropped => {
                dropped += 1;
                match next {
                    // How long after this row's own grace.
                    Some(d) => drop_delays.push(d - GRACE.as_secs_f64() * f64::from(1u32 << resends.min(5))),
                    None => unrecovered += 1,
                }
            }
            Fate::Sent(_) => {
                if let Some(d) = next.filter(|_| superseded) {
                    if d < GRACE.as_secs_f64() {
                        early += 1;
                    } else {
                        late_fresh += 1;
                    }
                }
            }
        }
    }
    let fail_delays = harness::sorted(fail_delays);
    let drop_delays = harness::sorted(drop_delays);
    let interval = SWEEP_INTERVAL.as_secs_f64();
    let grace = GRACE.as_secs_f64();
    report.fig("jobs", n);
    report.fig("jobs by status", &counts);
    report.fig("dispatch failures injected (jobs)", failed);
    report.fig("silent drops injected (jobs)", dropped);
    report.fig("redispatched events", events.len());
    report.fig(
        "failed → re-sent, p99 / max s (bound: one sweep interval)",
        format!("{:.3} / {:.3}", harness::percentile(&fail_delays, 0.99), fail_delays.last().copied().unwrap_or(0.0)),
    );
    report.fig(
        "dropped → re-sent after its grace, max s (bound: one interval)",
        drop_delays.last().copied().unwrap_or(0.0),
    );
    report.fig("sweep interval / grace s", format!("{interval} / {grace}"));
    report.fig("fresh rows re-sent before the grace period", early);
    report.fig("delivered rows re-sent after the grace (slow consumer)", late_fresh);
    report.check(
        finished && counts.get("succeeded").copied().unwrap_or(0) == n as i64,
        format!("not every job succeeded: {counts:?}"),
    );
    report.check(unrecovered == 0, format!("{unrecovered} failed or dropped dispatches were never re-sent"));
    report.check(
        fail_delays.last().is_none_or(|d| *d <= interval + SLACK_SECS),
        "a failed dispatch waited more than one sweep interval",
    );
    report.check(
        drop_delays.last().is_none_or(|d| *d <= interval + SLACK_SECS),
        "a lost dispatch waited more than its grace + one sweep interval",
    );
    report.check(early == 0, format!("{early} fresh rows were re-dispatched before the grace period"));
    report.check(effects_doubled == 0, format!("{effects_doubled} jobs ran their effect twice"));
    report.check(failed > 0 && dropped > 0, "no faults were injected (scale too small?)");
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
