//! Processing throughput: pre-inserted `noop` jobs drained by a real `relay worker` child
//! process (so its memory is its own), timed from the first claim to the last finish.

use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::peer::Peer;
use super::setup::{Lifecycle, Scratch, close_idle, db_counters, peak_rss_mib};
use super::wal::{self, JobCost, Reading};
use super::{Options, WORKER_CONCURRENCY, median, opt, row};
use taskdeck::platform::Settings;
use taskdeck::store::tooling::bench::RELAY;

#[derive(Debug, Clone, Serialize)]
pub struct Processing {
    pub jobs: usize,
    pub workers: usize,
    pub jobs_per_sec: f64,
    pub seconds: f64,
    pub worker_peak_rss_mib: Option<f64>,
    /// Per job, claim + complete (+ events), as Postgres counted them.
    pub lifecycle: Lifecycle,
    /// WAL, heap tuples and index entries per job: the load (accept) and the drain.
    pub cost: JobCost,
}

/// Drain `n` pre-inserted noop jobs with a `relay worker --workers w` child process.
pub async fn run(base_url: &str, n: usize, w: usize, concurrency: usize) -> anyhow::Result<Processing> {
    let scratch = Scratch::new(base_url, Settings::default()).await?;
    let counters = scratch.platform.pool.get().await?;
    let r0 = Reading::take(&counters, &scratch.schema, &RELAY).await?;
    scratch.preload_noops(n).await?;
    close_idle(&scratch.platform.pool);
    let r1 = Reading::take(&counters, &scratch.schema, &RELAY).await?;
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
    let r2 = Reading::take(&counters, &scratch.schema, &RELAY).await?;
    let cost = JobCost::between(&counters, n, &r0, &r1, &r2).await?;
    drop(counters);
    let (seconds, succeeded) = scratch.processing_span().await?;
    anyhow::ensure!(succeeded == n as i64, "{succeeded} of {n} jobs succeeded");
    let result = Processing {
        jobs: n,
        workers: w,
        jobs_per_sec: n as f64 / seconds.max(1e-9),
        seconds,
        worker_peak_rss_mib: rss,
        lifecycle: Lifecycle::between(before, after, n),
        cost,
    };
    scratch.drop_schema(base_url).await?;
    Ok(result)
}

/// The processing section: each cell (jobs, W) `runs` times. With a peer, each Relay run is
/// followed by a peer run of the same jobs (A B A B …); the cell's ratio is the median of the
/// pairs' ratios, the figure of record (absolutes on a shared machine move ±30 % in minutes).
pub async fn section(url: &str, opts: &Options, peer: Option<&Peer>) -> anyhow::Result<Value> {
    let sizes: &[usize] = if opts.quick { &[20_000] } else { &[20_000, 200_000] };
    let mut all = Vec::new();
    for &n in sizes {
        for w in [1, 4, 16] {
            let mut rs = Vec::new();
            let mut ps = Vec::new();
            for _ in 0..opts.runs {
                rs.push(run(url, n, w, WORKER_CONCURRENCY).await?);
                if let Some(p) = peer {
                    ps.push(p.process(n).await?);
                }
            }
            let rate = median(rs.iter().map(|r| r.jobs_per_sec).collect());
            let rss = median(rs.iter().filter_map(|r| r.worker_peak_rss_mib).collect());
            row("processing", &format!("{n} noop, W={w}: jobs/s"), format!("{rate:.0}"), "target ≥ 40,000".into());
            let mut cell = json!({"jobs": n, "workers": w, "median_jobs_per_sec": rate, "runs": rs});
            if let Some(p) = peer {
                let theirs = median(ps.iter().map(|q| q.jobs_per_sec).collect());
                let ratio = median(rs.iter().zip(&ps).map(|(r, q)| r.jobs_per_sec / q.jobs_per_sec).collect());
                row(
                    "processing",
                    &format!("  {} {n} noop: jobs/s", p.name),
                    format!("{theirs:.0}"),
                    format!("Relay ÷ peer {ratio:.2}× (median of {} pairs; target ≥ 1.5)", ps.len()),
                );
                cell["peer"] = json!({"name": p.name, "median_jobs_per_sec": theirs, "ratio": ratio, "runs": ps});
            }
            row("memory", &format!("  worker peak RSS MiB ({n}, W={w})"), format!("{rss:.1}"), "target ≤ 64".into());
            let l = rs[0].lifecycle;
            row(
                "cost",
                "  claim / complete statements per job",
                format!("{} / {}", opt(l.claim), opt(l.complete)),
                format!("{:.3} commits/job", l.commits_per_job),
            );
            if w == 4 {
                let theirs = peer.zip(ps.first()).map(|(p, q)| (p.name.as_str(), &q.cost));
                for l in wal::lines(&format!("{n}, W=4, 1st run"), &rs[0].cost, theirs) {
                    println!("{l}");
                }
            }
            all.push(cell);
        }
    }
    Ok(Value::Array(all))
}
