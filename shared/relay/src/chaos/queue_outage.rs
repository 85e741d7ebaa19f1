//! Scenario 6, queue outage: the API, the executor function's consumers and the sweep all
//! reach SQS (moto) through a proxy that goes down for 60 s under load. Every request must
//! still answer 202 for its committed row (the dispatch fails, the row stays pending), and
//! every job must run after the queue returns, with nothing restarted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use super::harness::{self, Proxy};
use super::{Env, Report};
use taskdeck::job::{JobId, JobStatus};
use taskdeck::platform::Settings;
use taskdeck::store::effects;
use taskdeck::store::tooling::readouts;
use taskdeck::transport::sqs::SqsTransport;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("queue-outage", env.scale);
    let moto = env.moto().await?;
    let queue = harness::new_queue(&harness::sqs_client(&moto), "chaos-qout").await?;
    let proxy = Proxy::start(&moto).await?;
    let client = harness::sqs_client(&proxy.url);
    let mut settings = Settings { sweep_interval: Duration::from_secs(1), ..Settings::default() };
    // The default grace (30 s): failed dispatches are unmarked and sent on the next pass
    // anyway. A 3 s grace re-sent every row moto had not delivered yet, again every 3 s: a
    // re-dispatch storm (7,132 re-sends for 1,273 jobs) that slowed moto further.
    settings.sweep.redispatch_grace = Duration::from_secs(30);
    let mut scratch = env.scratch(settings).await?;
    scratch.platform =
        scratch.platform.clone().with_transport(Arc::new(SqsTransport::new(client.clone(), queue.clone())));
    let (stop_tx, stop) = watch::channel(false);
    let http = harness::serve_in_process(&scratch.platform, stop.clone()).await?;
    let received = Arc::new(harness::Received::default());
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(harness::consume_sqs(
                scratch.platform.executor(),
                client.clone(),
                queue.clone(),
                received.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let sweeper = scratch.platform.spawn_sweeper(&stop);

    let (load_tx, load) = watch::channel(false);
    let t0 = Instant::now();
    let key = Arc::new(scratch.key.clone());
    // About 20 submissions a second. moto recomputes every queue attribute, scanning every
    // message, for each message sent and each message received, so its rate falls with the
    // queue's length: with ~1,000 messages queued it delivered ~10 a second, and the backlog
    // of a 60 s outage at 160/s (~8,000 rows) or 40/s (~2,000) did not drain in 120 s. Real
    // SQS has no such limit.
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let (http, key, load) = (http.clone(), key.clone(), load.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut i = 0;
                while !*load.borrow() {
                    let started = t0.elapsed().as_secs_f64();
                    let body = json!({"task_type": "test.effect"});
                    let answer =
                        http.call("POST", "/v1/jobs", Some(&key), Some(&format!("q-{c}-{i}")), Some(&body)).await;
                    let took = t0.elapsed().as_secs_f64() - started;
                    let (status, id) = match answer {
                        Ok((s, v)) => (s, v["id"].as_str().map(str::to_owned)),
                        Err(_) => (0, None),
                    };
                    out.push((started, took, status, id));
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                out
            })
        })
        .collect();
    let down_for = env.secs(60.0, 5.0);
    tokio::time::sleep(env.secs(5.0, 2.0)).await;
    let down_at = t0.elapsed().as_secs_f64();
    proxy.set_up(false);
    tokio::time::sleep(down_for).await;
    proxy.set_up(true);
    let up_at = t0.elapsed().as_secs_f64();
    tokio::time::sleep(env.secs(5.0, 2.0)).await;
    let _ = load_tx.send(true);
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await?);
    }
    let pool = scratch.platform.pool.clone();
    let finished = harness::wait_until(Duration::from_secs(120), || harness::all_terminal(&pool)).await;
    let all_done_after = t0.elapsed().as_secs_f64() - up_at;
    let _ = stop_tx.send(true);
    for c in consumers {
        let _ = c.await;
    }
    let _ = sweeper.await;

    let accepted: Vec<JobId> =
        answers.iter().filter(|a| a.2 == 202).filter_map(|a| a.3.as_deref()?.parse().ok()).collect();
    let db = pool.get().await?;
    let succeeded =
        readouts::jobs_among(&db, &accepted).await?.iter().filter(|j| j.status == JobStatus::Succeeded).count() as i64;
    let redispatched = readouts::count_events(&db, "redispatched", None).await?;
    let doubled = effects::jobs_with_repeats(&db).await?;
    let during: Vec<_> = answers.iter().filter(|a| a.0 + a.1 >= down_at && a.0 <= up_at).collect();
    let lat = harness::sorted(during.iter().map(|a| a.1).collect());
    let not_202 = answers.len() - accepted.len();
    report.fig("queue down for s", down_for.as_secs_f64());
    report.fig("requests / 202", format!("{} / {}", answers.len(), accepted.len()));
    report.fig("requests during the outage", during.len());
    report.fig(
        "latency during the outage p50 / max s",
        format!("{:.2} / {:.2}", harness::percentile(&lat, 0.5), lat.last().copied().unwrap_or(0.0)),
    );
    report.fig("re-dispatched by the sweep", redispatched);
    report.fig("accepted jobs succeeded", format!("{succeeded} of {}", accepted.len()));
    report.fig("all jobs terminal, s after the queue returned", all_done_after);
    report.check(not_202 == 0, format!("{not_202} requests were not answered 202"));
    report.check(!during.is_empty(), "no request overlapped the outage");
    report.check(
        finished && succeeded == accepted.len() as i64,
        format!("{} accepted jobs did not run", accepted.len() as i64 - succeeded),
    );
    report.check(redispatched > 0, "the sweep re-dispatched nothing (was the queue really down?)");
    report.check(doubled == 0, format!("{doubled} jobs ran their effect twice"));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
