//! Accept→start latency on an otherwise idle system: single jobs submitted one at a time over
//! HTTP to `relay serve`, run by a `relay worker` child; the gap between the job's commit
//! (`created_at`) and its claim (`started_at`), both stamped by Postgres.

use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::intake::Server;
use super::setup::{Lifecycle, db_counters};
use taskdeck::store::tooling::readouts;

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub jobs: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Cost per job when jobs arrive one at a time (nothing to batch).
    pub lifecycle: Lifecycle,
}

pub async fn run(base_url: &str, jobs: usize) -> anyhow::Result<Latency> {
    let server = Server::start(base_url).await?;
    let mut worker = tokio::process::Command::new(std::env::current_exe()?)
        .args(["worker", "--workers", "1"])
        .env("DATABASE_URL", &server.scratch.url)
        .env("RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pool = server.scratch.platform.pool.clone();
    let before = db_counters(&pool).await?;
    for i in 0..jobs {
        let status = server.post("/v1/jobs", Some(&format!("lat-{i}")), &json!({"task_type": "noop"})).await?;
        anyhow::ensure!(status == 202, "intake answered {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::ensure!(server.scratch.wait_all_terminal(Duration::from_secs(60)).await?, "jobs did not finish");
    let after = db_counters(&pool).await?;
    let lifecycle = Lifecycle::between(before, after, jobs);
    let db = pool.get().await?;
    let mut lat = readouts::start_latencies_ms(&db, None, None).await?;
    drop(db);
    lat.sort_by(f64::total_cmp);
    let pick = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    let result = Latency {
        jobs: lat.len(),
        p50_ms: pick(0.5),
        p99_ms: pick(0.99),
        max_ms: *lat.last().unwrap_or(&f64::NAN),
        lifecycle,
    };
    let _ = worker.start_kill();
    let _ = worker.wait().await;
    server.stop(base_url).await?;
    Ok(result)
}
