//! The physical limit of the database under test: single-row insert commits per second at 1
//! and 16 clients, and rows per second of 100-row multi-inserts. Every Relay figure is read
//! beside these, taken in the same run, because commit latency on shared disks swings ~20×.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::cpu::{CpuPerUnit, CpuTimes, postmaster_pid};
use super::setup::Scratch;
use taskdeck::platform::Settings;
use taskdeck::store::tooling::bench;

#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub commits_per_sec_1: f64,
    pub commits_per_sec_16: f64,
    pub multi_insert_rows_per_sec: f64,
    /// What each commit cost at 16 clients: the database's processes and this client.
    pub cpu_per_commit_16: CpuPerUnit,
}

pub async fn run(base_url: &str, secs: f64) -> anyhow::Result<Probe> {
    let mut settings = Settings::default();
    settings.pool.max_size = 20;
    let scratch = Scratch::new(base_url, settings).await?;
    let pool = scratch.platform.pool.clone();
    bench::create_probe(&pool.get().await?).await?;
    let postmaster = postmaster_pid(&pool.get().await?).await;
    let commits_per_sec_1 = rate(&pool, 1, secs, false).await?.0;
    let before = CpuTimes::read(postmaster, None);
    let (commits_per_sec_16, commits) = rate(&pool, 16, secs, false).await?;
    let cpu_per_commit_16 = CpuTimes::read(postmaster, None).per_unit(before, commits);
    let p = Probe {
        commits_per_sec_1,
        commits_per_sec_16,
        multi_insert_rows_per_sec: rate(&pool, 1, secs, true).await?.0 * 100.0,
        cpu_per_commit_16,
    };
    scratch.drop_schema(base_url).await?;
    Ok(p)
}

/// Commits per second (and how many ran) from `clients` connections each inserting one probe
/// row (or a hundred) per commit.
async fn rate(pool: &deadpool_postgres::Pool, clients: usize, secs: f64, hundred: bool) -> anyhow::Result<(f64, u64)> {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let db = pool.get().await?;
                let rows: Vec<String> = (0..100).map(|i| format!("row {i}")).collect();
                while Instant::now() < until {
                    if hundred {
                        bench::probe_insert_many(&db, &rows).await?;
                    } else {
                        bench::probe_insert(&db, "one row").await?;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    let start = Instant::now();
    for t in tasks {
        t.await??;
    }
    let n = done.load(Ordering::Relaxed);
    Ok((n as f64 / start.elapsed().as_secs_f64(), n))
}
