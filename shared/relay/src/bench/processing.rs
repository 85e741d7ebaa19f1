//! Processing throughput: pre-inserted `noop` jobs drained by a real `relay worker` child
//! process (so its memory is its own), timed from the first claim to the last finish.

use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;

use super::setup::{Lifecycle, Scratch, db_counters, peak_rss_mib};
use taskdeck::platform::Settings;

#[derive(Debug, Clone, Serialize)]
pub struct Processing {
    pub jobs: usize,
    pub workers: usize,
    pub jobs_per_sec: f64,
    pub seconds: f64,
    pub worker_peak_rss_mib: Option<f64>,
    /// Per job, claim + complete (+ events), as Postgres counted them.
    pub lifecycle: Lifecycle,
}

/// Drain `n` pre-inserted noop jobs with a `relay worker --workers w` child process.
pub async fn run(base_url: &str, n: usize, w: usize, concurrency: usize) -> anyhow::Result<Processing> {
    let scratch = Scratch::new(base_url, Settings::default()).await?;
    scratch.preload_noops(n).await?;
    let before = db_counters(&scratch.platform.pool).await?;
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["worker", "--workers", &w.to_string(), "--concurrency", &concurrency.to_string()])
        .env("DATABASE_URL", &scratch.url)
        .env("RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or_default();
    let done = scratch.wait_all_terminal(Duration::from_secs(600)).await?;
    let rss = peak_rss_mib(pid);
    child.start_kill()?;
    let _ = child.wait().await;
    anyhow::ensure!(done, "workers did not finish {n} jobs in 10 minutes");
    let after = db_counters(&scratch.platform.pool).await?;
    let (seconds, succeeded) = scratch.processing_span().await?;
    anyhow::ensure!(succeeded == n as i64, "{succeeded} of {n} jobs succeeded");
    let result = Processing {
        jobs: n,
        workers: w,
        jobs_per_sec: n as f64 / seconds.max(1e-9),
        seconds,
        worker_peak_rss_mib: rss,
        lifecycle: Lifecycle::between(before, after, n),
    };
    scratch.drop_schema(base_url).await?;
    Ok(result)
}

