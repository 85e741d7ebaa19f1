//! Scenario 4, zombie worker: a `relay worker` holding running jobs is paused (SIGSTOP) past
//! its lease; the sweep returns the jobs and a second worker runs them to success; then the
//! first is resumed (SIGCONT). Its late writes must change no row: the newer attempt's result
//! stands, and the zombie reports its writes as stale (or aborts on a lost lease).

use std::time::Duration;

use serde_json::json;

use super::harness::{self, Relay};
use super::{Env, Report};
use taskdeck::job::{JobId, JobStatus};
use taskdeck::platform::Settings;
use taskdeck::store::tooling::readouts;

const LEASE_SECS: u64 = 3;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("zombie", env.scale);
    let n = env.n(50, 5);
    let settings = Settings { sweep_interval: Duration::from_millis(500), ..Settings::default() };
    let scratch = env.scratch(settings).await?;
    let pool = scratch.platform.pool.clone();
    let lease = LEASE_SECS.to_string();
    let args = ["worker", "--workers", "1", "--concurrency", "256", "--lease-seconds", lease.as_str()];
    // Jobs that take a while, so the zombie is paused mid-run and finishes right after resuming.
    let sleep = LEASE_SECS as f64 + 1.0;
    let mut ids = Vec::new();
    for i in 0..n {
        let (status, body) = scratch_submit(&scratch, i, sleep).await?;
        anyhow::ensure!(status == 202, "submit answered {status}");
        ids.push(body);
    }
    let zombie = Relay::spawn(&env.relay, &args, &scratch.url, &[("RELAY_LOG", "warn".into())], &env.log("zombie-a"))?;
    let all_running = harness::wait_until(Duration::from_secs(30), || async {
        let Ok(db) = pool.get().await else { return false };
        readouts::running_in_attempt(&db, 1).await.is_ok_and(|running| running == n as i64)
    })
    .await;
    anyhow::ensure!(all_running, "the first worker did not claim every job");
    zombie.signal("STOP")?;
    let paused_at = std::time::Instant::now();
    // The sweep (in this process) returns the expired leases; a second worker runs attempt 2.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let sweeper = scratch.platform.spawn_sweeper(&stop);
    let mut second = Relay::spawn(&env.relay, &args, &scratch.url, &[], &env.log("zombie-b"))?;
    let done = harness::wait_until(Duration::from_secs(60), || harness::all_terminal(&pool)).await;
    let paused_for = paused_at.elapsed().as_secs_f64();
    let db = pool.get().await?;
    let before = states(&db).await?;
    // Resume the zombie: its jobs' sleeps are over, so it tries to record at once.
    zombie.signal("CONT")?;
    tokio::time::sleep(Duration::from_secs(LEASE_SECS)).await;
    let after = states(&db).await?;
    let changed = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    let second_won = after.iter().filter(|(_, s, a, _, _)| *s == JobStatus::Succeeded && *a == 2).count();
    let returned = readouts::count_events(&db, "lease_expired", None).await?;
    let log = zombie.log_text();
    let stale = log.matches("relay.executor.stale_write").count();
    let aborted = log.matches("relay.worker.lease_lost").count();
    let _ = stop_tx.send(true);
    let _ = sweeper.await;
    second.kill9().await;
    let mut zombie = zombie;
    zombie.kill9().await;
    report.fig("jobs held by the paused worker", n);
    report.fig("paused for s (lease is 3 s)", paused_for);
    report.fig("leases returned by the sweep", returned);
    report.fig("jobs whose attempt 2 (newer) result stands", second_won);
    report.fig("zombie writes refused as stale (its log)", stale);
    report.fig("zombie jobs aborted on a lost lease (its log)", aborted);
    report.fig("rows changed after the zombie resumed", changed);
    report.check(done, "the second worker did not finish the jobs");
    report.check(changed == 0, format!("the zombie's late writes changed {changed} rows"));
    report.check(second_won == n, format!("{second_won} of {n} jobs kept attempt 2's result"));
    report.check(
        stale + aborted >= n,
        format!("the zombie reported {} of {n} late outcomes (stale or aborted)", stale + aborted),
    );
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

async fn scratch_submit(
    scratch: &crate::bench::setup::Scratch,
    i: usize,
    sleep: f64,
) -> anyhow::Result<(u16, taskdeck::job::JobId)> {
    let req: taskdeck::api::submit::JobRequest =
        serde_json::from_value(json!({"task_type": "test.effect", "params": {"sleep_seconds": sleep}}))?;
    let admits = taskdeck::api::submit::Admission {
        callback_allow: scratch.platform.settings.callback_allow.clone(),
        max_timeout_seconds: scratch.platform.settings.max_timeout_seconds,
    };
    let key = taskdeck::job::terms::IdempotencyKey::parse(&format!("zombie-{i}"))?;
    let new = req
        .into_new_job(key, &scratch.platform.catalogue, &admits, chrono::Utc::now())
        .map_err(|e| anyhow::anyhow!(e.message))?;
    let id = new.id;
    scratch.platform.intake.enqueue(scratch.tenant.id, vec![new]).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((202, id))
}

/// Each job's (id, status, attempt, result, last update), in id order: what a stale write would change.
type State = (JobId, JobStatus, i32, Option<serde_json::Value>, chrono::DateTime<chrono::Utc>);

async fn states(db: &impl taskdeck::store::GenericClient) -> anyhow::Result<Vec<State>> {
    Ok(readouts::jobs(db).await?.into_iter().map(|j| (j.id, j.status, j.attempt, j.result, j.updated_at)).collect())
}
