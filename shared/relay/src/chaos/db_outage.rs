//! Scenario 5, database outage: a private Postgres cluster (never the shared server) is
//! stopped for 20 s while clients submit jobs to `relay serve` and `relay worker`/`relay sweep`
//! run. Intake must answer 503 with a JSON error (never 500, never past its timeout), the same
//! processes must recover without a restart, and every accepted job must run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use super::harness::{self, Relay};
use super::{Env, Report};
use crate::pgcluster::{Durability, PrivateCluster};
use taskdeck::api::REQUEST_TIMEOUT;
use taskdeck::job::{JobId, JobStatus};
use taskdeck::platform::Settings;
use taskdeck::store::tooling::{bench, readouts};

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("db-outage", env.scale);
    let dir = env.tmp.join("chaos-outage-pg");
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&dir, Durability::Throwaway)).await??;
    let base = cluster.url("postgres");
    let result = outage(env, &cluster, &base, &mut report).await;
    let stopped = tokio::task::spawn_blocking(move || cluster.stop()).await?;
    result?;
    stopped?;
    Ok(report)
}

async fn outage(env: &Env, cluster: &PrivateCluster, base: &str, report: &mut Report) -> anyhow::Result<()> {
    let scratch = crate::bench::setup::Scratch::new(base, Settings { test_tasks: true, ..Settings::default() }).await?;
    let url = scratch.url.clone();
    let lease = ["--lease-seconds", "3"];
    let mut worker = Relay::spawn(
        &env.relay,
        &["worker", "--workers", "2", lease[0], lease[1]],
        &url,
        &[],
        &env.log("outage-worker"),
    )?;
    let mut sweeper = Relay::spawn(
        &env.relay,
        &["sweep", "--loop", "--sweep-interval-seconds", "1", lease[0], lease[1]],
        &url,
        &[],
        &env.log("outage-sweep"),
    )?;
    let (mut server, http) = harness::serve(&env.relay, &url, &[], &env.log("outage-serve")).await?;
    let pids = (worker.pid, sweeper.pid, server.pid);

    let (stop_tx, stop) = watch::channel(false);
    let t0 = Instant::now();
    let key = Arc::new(scratch.key.clone());
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (http, key, stop) = (http.clone(), key.clone(), stop.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut i = 0;
                while !*stop.borrow() {
                    let started = t0.elapsed().as_secs_f64();
                    let body = json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.05}});
                    let idem = format!("o-{c}-{i}");
                    let call = http.call("POST", "/v1/jobs", Some(&key), Some(&idem), Some(&body));
                    let answer = tokio::time::timeout(REQUEST_TIMEOUT + Duration::from_secs(5), call).await;
                    let took = t0.elapsed().as_secs_f64() - started;
                    let (status, v) = match answer {
                        Ok(Ok(a)) => a,
                        Ok(Err(_)) => (0, json!(null)),
                        Err(_) => (1, json!(null)), // hung past the timeout
                    };
                    out.push((
                        started,
                        took,
                        status,
                        v["id"].as_str().map(str::to_owned),
                        v["error"]["code"].as_str().map(str::to_owned),
                    ));
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                out
            })
        })
        .collect();
    let warm = env.secs(5.0, 2.0);
    let down_for = env.secs(20.0, 5.0);
    tokio::time::sleep(warm).await;
    let down_at = t0.elapsed().as_secs_f64();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop()).await??;
    tokio::time::sleep(down_for).await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.resume()).await??;
    let up_at = t0.elapsed().as_secs_f64();
    let up_wall = chrono::Utc::now();
    tokio::time::sleep(env.secs(10.0, 5.0)).await;
    let _ = stop_tx.send(true);
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await?);
    }
    let pool = scratch.platform.pool.clone();
    let finished = harness::wait_until(Duration::from_secs(90), || harness::all_terminal(&pool)).await;
    let finished_at = t0.elapsed().as_secs_f64();

    let accepted: Vec<JobId> =
        answers.iter().filter(|a| a.2 == 202).filter_map(|a| a.3.as_deref()?.parse().ok()).collect();
    let db = pool.get().await?;
    let jobs = readouts::jobs_among(&db, &accepted).await?;
    let present = jobs.len() as i64;
    let succeeded = jobs.iter().filter(|j| j.status == JobStatus::Succeeded).count() as i64;
    let first_finish_after_up = bench::first_finish_after(&db, up_wall).await?;
    let during = |a: &&(f64, f64, u16, Option<String>, Option<String>)| a.0 + a.1 >= down_at && a.0 <= up_at;
    let in_outage: Vec<_> = answers.iter().filter(during).collect();
    let count = |s: u16| answers.iter().filter(|a| a.2 == s).count();
    let unavailable_json = answers.iter().filter(|a| a.2 == 503 && a.4.as_deref() == Some("unavailable")).count();
    let max_latency = answers.iter().map(|a| a.1).fold(0.0, f64::max);
    let first_202_after =
        answers.iter().filter(|a| a.2 == 202 && a.0 >= up_at).map(|a| a.0 - up_at).fold(f64::INFINITY, f64::min);
    let five_hundred = answers.iter().filter(|a| a.2 >= 500 && a.2 != 503).count();
    let other = answers.len() - count(202) - count(503);
    let alive = [worker.alive(), sweeper.alive(), server.alive()].iter().all(|a| *a);
    let same = (worker.pid, sweeper.pid, server.pid) == pids;
    report.fig("database down for s", down_for.as_secs_f64());
    report.fig("requests / 202 / 503", format!("{} / {} / {}", answers.len(), count(202), count(503)));
    report.fig("requests overlapping the outage", in_outage.len());
    report.fig("503 with JSON error code 'unavailable'", unavailable_json);
    report.fig("5xx other than 503 / no answer / hung", format!("{five_hundred} / {} / {}", count(0), count(1)));
    report.fig("slowest answer s (timeout 15 s)", max_latency);
    report.fig("first 202 after the database returned, s", first_202_after);
    report.fig("accepted jobs present / succeeded", format!("{present} / {succeeded} of {}", accepted.len()));
    report.fig("workers: first job finished after the return, s", first_finish_after_up.unwrap_or(f64::NAN));
    report.fig("all accepted jobs terminal, s after the return", finished_at - up_at);
    report.check(five_hundred == 0, format!("{five_hundred} answers were 5xx other than 503"));
    report.check(other == 0, format!("{other} requests got neither 202 nor 503 (including no answer or hung)"));
    report.check(unavailable_json == count(503), "a 503 had no JSON error with code 'unavailable'");
    report.check(max_latency <= REQUEST_TIMEOUT.as_secs_f64() + 1.0, format!("an answer took {max_latency:.1} s"));
    report.check(count(503) > 0, "the outage was never seen (no 503)");
    report.check(present == accepted.len() as i64, format!("{} accepted jobs lost", accepted.len() as i64 - present));
    report.check(
        finished && succeeded == accepted.len() as i64,
        format!("{} accepted jobs did not run", accepted.len() as i64 - succeeded),
    );
    report.check(alive && same, "a process died or was restarted");
    drop(db);
    worker.kill9().await;
    sweeper.kill9().await;
    server.kill9().await;
    scratch.drop_schema(base).await?;
    Ok(())
}
