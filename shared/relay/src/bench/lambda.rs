//! The serverless path: jobs/s through the executor function's handler, fed SQS-shaped
//! batches of 10 directly (no network, no queue), by several "containers" each with the
//! one-connection pool a Lambda container has; and what a job costs on that path (commits,
//! SQS requests, Lambda GB-seconds, WAL bytes, and the price of a million jobs) beside the
//! floor: a consumer of the same batches that touches no database.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use serde::Serialize;

use super::setup::Scratch;
use taskdeck::platform::{Platform, Settings};
use taskdeck::store::tooling::bench::wal_position;
use taskdeck::transport::sqs::WorkMessage;

/// The executor's memory in infra/template.yaml (`Globals.Function.MemorySize`: 256 MB).
const EXECUTOR_GB: f64 = 0.25;
/// The floor's memory: Lambda's smallest (128 MB).
const FLOOR_GB: f64 = 0.125;
/// Records per SQS request: `SendMessageBatch`, the event source mapping's `ReceiveMessage`
/// and `DeleteMessageBatch` each carry up to 10.
const SQS_BATCH: usize = 10;

/// AWS list prices, us-east-1, arm64, free tiers ignored (aws.amazon.com/lambda/pricing and
/// /sqs/pricing): USD per request, per GB-second, per SQS request.
pub mod price {
    pub const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
    pub const LAMBDA_GB_SECOND: f64 = 0.000_013_333_4;
    pub const SQS_REQUEST: f64 = 0.40 / 1e6;
}

/// What a job costs on one path.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Cost {
    /// Commits per job: one claim per batch of 10 plus the statements that wrote outcomes
    /// (the executor writes outcomes as jobs end, those within 5 ms of each other together).
    pub commits_per_job: f64,
    /// Lambda invocations per job (one per batch).
    pub invocations_per_job: f64,
    /// SQS requests per job: the batches sent, received and deleted, counted from the run.
    pub sqs_requests_per_job: f64,
    /// Billed duration (each invocation rounded up to the millisecond) × memory, per job.
    pub gb_seconds_per_job: f64,
    /// WAL bytes per job written while the jobs were accepted (bulk insert) and while they ran.
    pub wal_accept_per_job: f64,
    pub wal_run_per_job: f64,
    /// USD per million jobs: Lambda requests and GB-seconds plus SQS requests (the database
    /// is priced by the deployment's RDS; its share is the commits and WAL above).
    pub usd_per_million: f64,
}

impl Cost {
    fn priced(mut self) -> Cost {
        self.usd_per_million = 1e6
            * (self.invocations_per_job * price::LAMBDA_REQUEST
                + self.gb_seconds_per_job * price::LAMBDA_GB_SECOND
                + self.sqs_requests_per_job * price::SQS_REQUEST);
        self
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LambdaPath {
    pub jobs: usize,
    pub containers: usize,
    pub jobs_per_sec: f64,
    pub cost: Cost,
    /// The same batches through a consumer that only parses them.
    pub floor: Cost,
    pub floor_jobs_per_sec: f64,
}

fn batches_of(ids: &[taskdeck::job::JobId]) -> VecDeque<SqsEvent> {
    let now = chrono::Utc::now();
    ids.chunks(SQS_BATCH)
        .map(|chunk| {
            let mut event = SqsEvent::default();
            event.records = chunk
                .iter()
                .map(|id| {
                    let mut m = SqsMessage::default();
                    m.message_id = Some(id.to_string());
                    m.body = serde_json::to_string(&WorkMessage { job_id: *id, run_at: now }).ok();
                    m
                })
                .collect();
            event
        })
        .collect()
}

/// Each invocation's duration, billed: rounded up to the millisecond.
fn billed_seconds(durations: &[Duration]) -> f64 {
    durations.iter().map(|d| (d.as_secs_f64() * 1000.0).ceil() / 1000.0).sum()
}

pub async fn run(base_url: &str, n: usize, containers: usize) -> anyhow::Result<LambdaPath> {
    let scratch = Scratch::new(base_url, Settings::default()).await?;
    let wal_start = wal_position(&scratch.platform.pool.get().await?).await?;
    scratch.preload_noops(n).await?;
    let ids = taskdeck::store::tooling::bench::job_ids(&scratch.platform.pool.get().await?).await?;
    let wal_accepted = wal_position(&scratch.platform.pool.get().await?).await?;
    let events = batches_of(&ids);
    let batches = events.len();
    let queue = Arc::new(Mutex::new(events));
    let writes_before = taskdeck::metrics::OUTCOME_WRITES.get();
    let start = Instant::now();
    let tasks: Vec<_> = (0..containers)
        .map(|_| {
            let (queue, url) = (queue.clone(), scratch.url.clone());
            tokio::spawn(async move {
                // A container: one connection, built once, reused by every invocation.
                let mut settings = Settings::default();
                settings.pool.max_size = 1;
                let platform = Platform::new(&url, settings)?;
                let exec = platform.executor();
                let mut durations = Vec::new();
                loop {
                    let Some(event) = queue.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.pop_front() else {
                        return anyhow::Ok(durations);
                    };
                    let t = Instant::now();
                    let res = taskdeck::lambda::executor::handle(&exec, event, None).await;
                    durations.push(t.elapsed());
                    anyhow::ensure!(
                        res.batch_item_failures.is_empty(),
                        "records failed: {:?}",
                        res.batch_item_failures.len()
                    );
                }
            })
        })
        .collect();
    let mut durations = Vec::new();
    for t in tasks {
        durations.extend(t.await??);
    }
    let seconds = start.elapsed().as_secs_f64();
    let wal_ran = wal_position(&scratch.platform.pool.get().await?).await?;
    let writes = taskdeck::metrics::OUTCOME_WRITES.get() - writes_before;
    let (_, succeeded) = scratch.processing_span().await?;
    anyhow::ensure!(succeeded == n as i64, "{succeeded} of {n} jobs succeeded");
    let per_job = |x: f64| x / n as f64;
    // Sent, received and deleted in batches of 10: three requests per batch.
    let sqs = per_job((3 * batches) as f64);
    let cost = Cost {
        commits_per_job: per_job((batches as u64 + writes) as f64),
        invocations_per_job: per_job(batches as f64),
        sqs_requests_per_job: sqs,
        gb_seconds_per_job: per_job(billed_seconds(&durations) * EXECUTOR_GB),
        wal_accept_per_job: per_job((wal_accepted - wal_start) as f64),
        wal_run_per_job: per_job((wal_ran - wal_accepted) as f64),
        ..Cost::default()
    }
    .priced();
    let (floor_seconds, floor_durations) = floor(&ids, containers).await?;
    let floor = Cost {
        invocations_per_job: per_job(batches as f64),
        sqs_requests_per_job: sqs,
        gb_seconds_per_job: per_job(billed_seconds(&floor_durations) * FLOOR_GB),
        ..Cost::default()
    }
    .priced();
    scratch.drop_schema(base_url).await?;
    Ok(LambdaPath {
        jobs: n,
        containers,
        jobs_per_sec: n as f64 / seconds,
        cost,
        floor,
        floor_jobs_per_sec: n as f64 / floor_seconds,
    })
}

/// The floor: the same batches handed to a consumer that reads each record's job id and
/// touches nothing else (a plain SQS + Lambda consumer of trivial work). Returns the run's
/// seconds and each invocation's duration.
async fn floor(ids: &[taskdeck::job::JobId], containers: usize) -> anyhow::Result<(f64, Vec<Duration>)> {
    let queue = Arc::new(Mutex::new(batches_of(ids)));
    let start = Instant::now();
    let tasks: Vec<_> = (0..containers)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let mut durations = Vec::new();
                loop {
                    let Some(event) = queue.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.pop_front() else {
                        return anyhow::Ok(durations);
                    };
                    let t = Instant::now();
                    for r in &event.records {
                        let m: WorkMessage = serde_json::from_str(r.body.as_deref().unwrap_or_default())?;
                        std::hint::black_box(m);
                    }
                    durations.push(t.elapsed());
                }
            })
        })
        .collect();
    let mut durations = Vec::new();
    for t in tasks {
        durations.extend(t.await??);
    }
    Ok((start.elapsed().as_secs_f64(), durations))
}
