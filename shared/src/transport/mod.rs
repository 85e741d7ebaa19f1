//! Transports carry execution only: a dispatch is a hint that a job row is due; the row
//! decides. Dispatch happens strictly after the row's transaction committed, through `send`,
//! which is the only caller of `Transport::dispatch`.

pub mod postgres;
pub mod sqs;

use std::sync::Arc;

use deadpool_postgres::Pool;

use crate::job::Dispatch;
use crate::metrics;
use crate::store::jobs;

#[derive(Debug, thiserror::Error)]
#[error("transport {transport}: {message}")]
pub struct TransportError {
    pub transport: &'static str,
    pub message: String,
}

/// A way to tell workers that jobs are due. Implementations: Postgres LISTEN/NOTIFY
/// (`postgres::PgTransport`) and SQS (`sqs::SqsTransport`), both held to one conformance suite.
#[async_trait::async_trait]
pub trait Transport: Send + Sync {
    fn name(&self) -> &'static str;
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError>;
}

/// Hand committed jobs to the transport. A failure never fails the caller: the rows stay
/// pending with their dispatch mark cleared, and the sweep sends them.
/// Returns whether the transport took them.
pub async fn send(transport: &Arc<dyn Transport>, pool: &Pool, jobs: &[Dispatch]) -> bool {
    if jobs.is_empty() {
        return true;
    }
    let Err(e) = transport.dispatch(jobs).await else { return true };
    metrics::DISPATCH_FAILURES.add(jobs.len());
    tracing::warn!(event = "relay.dispatch.failed", jobs = jobs.len(), error = %e,
        "dispatch failed; the sweep will send these jobs");
    let ids: Vec<_> = jobs.iter().map(|d| d.id).collect();
    let cleared = async { jobs::undispatch(&pool.get().await?, &ids).await };
    if let Err(e) = cleared.await {
        // Still safe: the sweep re-sends rows whose dispatch is older than its grace period.
        tracing::warn!(event = "relay.dispatch.unmark_failed", error = %e, "could not clear dispatch marks");
    }
    false
}
