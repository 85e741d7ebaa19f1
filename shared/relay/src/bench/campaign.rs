//! Fan-out and keyed claims: a shadow-mode `email.campaign` of 100,000 recipients posted in 20
//! pages of 5,000 to a `relay serve` child, run by a `relay worker` child with `relay dev`'s
//! defaults (2 loops × 64) and the campaign's default `concurrency_limit`, timed end to end;
//! and N keyed noop jobs behind one key (limit 10). Each reports its completion rate with 90 %
//! of the jobs still to finish and with 10 %: a keyed claim that costs the same whatever waits
//! behind its key shows two equal rates.

use std::process::Stdio;
use std::time::{Duration, Instant};

use hyper::Method;
use serde::Serialize;
use serde_json::json;

use super::intake::Server;
use super::setup::Scratch;
use taskdeck::job::JobId;
use taskdeck::job::terms::{Concurrency, CorrelationId, IdempotencyKey, Limits};
use taskdeck::platform::Settings;
use taskdeck::store::jobs::{self, NewJob};
use taskdeck::store::sending_identities;
use taskdeck::store::tooling::bench;

/// A run's completions over time, and the rates read from them.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    pub jobs: usize,
    pub seconds: f64,
    /// Jobs finished per second while 95–85 % of them were still to finish, and 15–5 %.
    pub rate_at_90: Option<f64>,
    pub rate_at_10: Option<f64>,
    /// Jobs pending (created, not yet claimed) when each rate was read.
    pub pending_at_90: Option<i64>,
    pub pending_at_10: Option<i64>,
    pub finished: bool,
    /// Every sample: (seconds since start, jobs pending, jobs finished).
    pub samples: Vec<Sample>,
}

impl Drain {
    /// `rate_at_10 / rate_at_90`: 1 when a claim's cost does not grow with the backlog.
    pub fn flatness(&self) -> Option<f64> {
        Some(self.rate_at_10? / self.rate_at_90?)
    }
}

/// (seconds since start, jobs pending, jobs finished)
type Sample = (f64, i64, i64);

/// The rate while the jobs still to finish went from `hi` to `lo` (fractions of `n`), and the
/// pending count at the window's start.
fn window(samples: &[Sample], n: usize, hi: f64, lo: f64) -> (Option<f64>, Option<i64>) {
    let left = |s: &Sample| (n as i64 - s.2) as f64 / n as f64;
    let (Some(a), Some(b)) = (samples.iter().find(|s| left(s) <= hi), samples.iter().find(|s| left(s) <= lo)) else {
        return (None, None);
    };
    let rate = (b.0 > a.0).then(|| (b.2 - a.2) as f64 / (b.0 - a.0));
    (rate, Some(a.1))
}

/// Sample the jobs (the children of `parent`, or all) until `n` are finished or `limit`
/// passes; then read the rates. A sample counts every live job (50 ms of the database's time
/// with 100,000 of them), so samples are 500 ms apart or 25 times the last one's time,
/// whichever is longer: the watching takes at most 4 % of one core from what it watches.
async fn watch(
    scratch: &Scratch,
    parent: Option<JobId>,
    n: usize,
    start: Instant,
    limit: Duration,
) -> anyhow::Result<Drain> {
    let db = scratch.platform.pool.get().await?;
    let mut samples: Vec<Sample> = Vec::new();
    loop {
        let took = Instant::now();
        let (pending, done) = bench::status_counts(&db, parent, n as i64).await?;
        let took = took.elapsed();
        samples.push((start.elapsed().as_secs_f64(), pending, done));
        if done >= n as i64 || start.elapsed() > limit {
            break;
        }
        tokio::time::sleep((took * 25).max(Duration::from_millis(500))).await;
    }
    let (rate_at_90, pending_at_90) = window(&samples, n, 0.95, 0.85);
    let (rate_at_10, pending_at_10) = window(&samples, n, 0.15, 0.05);
    let last = samples.last().copied().unwrap_or_default();
    Ok(Drain {
        jobs: n,
        seconds: last.0,
        rate_at_90,
        rate_at_10,
        pending_at_90,
        pending_at_10,
        finished: last.2 >= n as i64,
        samples,
    })
}

/// A `relay worker` child with `relay dev`'s defaults, on the scratch schema.
fn worker(scratch: &Scratch) -> anyhow::Result<tokio::process::Child> {
    worker_with(scratch, &[])
}

/// `worker`, with these environment variables besides.
pub fn worker_with(scratch: &Scratch, envs: &[(&str, &str)]) -> anyhow::Result<tokio::process::Child> {
    Ok(tokio::process::Command::new(std::env::current_exe()?)
        .args(["worker", "--workers", "2", "--concurrency", "64"])
        .envs(envs.iter().copied())
        .env("DATABASE_URL", &scratch.url)
        .env("RELAY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?)
}

/// A shadow campaign of `pages` × `per_page` recipients: submitted, its pages posted, run to
/// the end. The clock starts at the submission and stops when the parent is terminal.
pub async fn campaign(base_url: &str, pages: usize, per_page: usize) -> anyhow::Result<Drain> {
    let n = pages * per_page;
    let server = Server::start(base_url).await?;
    sending_identities::set(
        &mut server.scratch.platform.pool.get().await?,
        server.scratch.tenant.id,
        &["bench.example".into()],
    )
    .await?;
    let template = json!({"subject": "News for {{ name }}", "text": "Hi {{ name }}"});
    let (status, _) = server.request(Method::PUT, "/v1/templates/news", None, Some(&template)).await?;
    anyhow::ensure!(status == 200, "template answered {status}");
    let mut worker = worker(&server.scratch)?;
    let start = Instant::now();
    let body = json!({"task_type": "email.campaign", "correlation_id": "bench-campaign", "params": {
        "message": {"from": "News <news@bench.example>", "template": "news", "data": {"name": "friend"}},
        "pages": pages,
    }});
    let (status, parent) = server.request(Method::POST, "/v1/jobs", Some("bench-campaign"), Some(&body)).await?;
    anyhow::ensure!(status == 202, "campaign answered {status}: {parent}");
    let id: JobId = parent["id"].as_str().unwrap_or_default().parse()?;
    for page in 0..pages {
        let recipients: Vec<_> = (0..per_page)
            .map(|i| json!({"to": format!("r{page}-{i}@example.com"), "data": {"name": format!("r{i}")}}))
            .collect();
        let path = format!("/v1/jobs/{id}/recipients/{page}");
        let (status, e) = server.request(Method::PUT, &path, None, Some(&json!({"recipients": recipients}))).await?;
        anyhow::ensure!(status == 200 || status == 201, "page {page} answered {status}: {e}");
    }
    let limit = Duration::from_secs(900);
    let mut drain = watch(&server.scratch, Some(id), n, start, limit).await?;
    // The end is the parent's: it closes after its last child.
    loop {
        let (_, job) = server.request(Method::GET, &format!("/v1/jobs/{id}"), None, None).await?;
        if ["succeeded", "failed", "cancelled"].contains(&job["status"].as_str().unwrap_or_default()) {
            drain.finished = drain.finished && job["status"] == "succeeded";
            break;
        }
        anyhow::ensure!(start.elapsed() < limit, "the campaign did not finish in {} s", limit.as_secs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drain.seconds = start.elapsed().as_secs_f64();
    let _ = worker.start_kill();
    let _ = worker.wait().await;
    server.stop(base_url).await?;
    Ok(drain)
}

/// `n` due noop jobs behind one concurrency key (limit 10), drained by a `relay worker` child.
pub async fn keyed(base_url: &str, n: usize) -> anyhow::Result<Drain> {
    let scratch = Scratch::new(base_url, Settings::default()).await?;
    {
        let db = scratch.platform.pool.get().await?;
        let now = chrono::Utc::now();
        let one = Concurrency::parse(Some("one".into()), Some(10))?;
        for from in (0..n).step_by(5000) {
            let chunk: Vec<NewJob> = (from..n.min(from + 5000))
                .map(|i| NewJob {
                    correlation_id: CorrelationId::parse(&format!("keyed-{i}")).expect("a valid correlation id"),
                    run_at: now,
                    limits: Limits::fixed(3, 60),
                    concurrency: one.clone(),
                    ..NewJob::new("noop", json!({}), IdempotencyKey::parse(&format!("keyed-{i}")).expect("a valid key"))
                })
                .collect();
            jobs::insert_many(&db, scratch.tenant.id, &chunk, None).await?;
        }
        bench::analyze_jobs(&db, false).await?;
    }
    let mut worker = worker(&scratch)?;
    let drain = watch(&scratch, None, n, Instant::now(), Duration::from_secs(600)).await?;
    let _ = worker.start_kill();
    let _ = worker.wait().await;
    scratch.drop_schema(base_url).await?;
    Ok(drain)
}
