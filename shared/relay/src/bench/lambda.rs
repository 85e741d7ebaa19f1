//! The serverless path: jobs/s through the executor function's handler, fed SQS-shaped
//! batches of 10 directly (no network, no queue), by several "containers" each with the
//! one-connection pool a Lambda container has. Shows the handler is not the bottleneck.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use serde::Serialize;

use super::setup::Scratch;
use taskdeck::platform::{Platform, Settings};
use taskdeck::transport::sqs::WorkMessage;

#[derive(Debug, Clone, Serialize)]
pub struct LambdaPath {
    pub jobs: usize,
    pub containers: usize,
    pub jobs_per_sec: f64,
    /// Commits per job: one claim per batch of 10 plus the statements that wrote outcomes
    /// (the executor writes outcomes as jobs end, those within 5 ms of each other together).
    pub commits_per_job: f64,
}

pub async fn run(base_url: &str, n: usize, containers: usize) -> anyhow::Result<LambdaPath> {
    let scratch = Scratch::new(base_url, Settings::default()).await?;
    scratch.preload_noops(n).await?;
    let ids = taskdeck::store::tooling::bench::job_ids(&scratch.platform.pool.get().await?).await?;
    let now = chrono::Utc::now();
    let events: VecDeque<SqsEvent> = ids
        .chunks(10)
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
        .collect();
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
                loop {
                    let Some(event) = queue.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.pop_front() else {
                        return anyhow::Ok(());
                    };
                    let res = taskdeck::lambda::executor::handle(&exec, event, None).await;
                    anyhow::ensure!(
                        res.batch_item_failures.is_empty(),
                        "records failed: {:?}",
                        res.batch_item_failures.len()
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let seconds = start.elapsed().as_secs_f64();
    let writes = taskdeck::metrics::OUTCOME_WRITES.get() - writes_before;
    let commits_per_job = (batches as u64 + writes) as f64 / n as f64;
    let (_, succeeded) = scratch.processing_span().await?;
    anyhow::ensure!(succeeded == n as i64, "{succeeded} of {n} jobs succeeded");
    scratch.drop_schema(base_url).await?;
    Ok(LambdaPath { jobs: n, containers, jobs_per_sec: n as f64 / seconds, commits_per_job })
}
