//! Transports carry execution only: a dispatch is a hint that a job row is due; the row
//! decides. Dispatch happens strictly after the row's transaction committed: through `send`,
//! the only caller of `Transport::dispatch`, or, for a transport with a `commit_wake` channel,
//! by the inserting statement's own NOTIFY, which Postgres delivers only when it commits.

pub mod postgres;
pub mod sqs;

use std::borrow::Cow;
use std::sync::Arc;

use deadpool_postgres::Pool;

use crate::job::{Dispatch, JobId};
use crate::metrics;
use crate::store::StoreError;
use crate::store::jobs;

#[derive(Debug, thiserror::Error)]
#[error("transport {transport}: {message}")]
pub struct TransportError {
    pub transport: &'static str,
    pub message: String,
    /// The jobs this dispatch did not send: all of them unless the transport knows which got
    /// through. `send` clears their dispatch marks, so the sweep sends them (and only them).
    pub unsent: Vec<JobId>,
}

impl TransportError {
    /// A dispatch that sent none of `jobs`.
    pub fn nothing_sent(transport: &'static str, message: impl Into<String>, jobs: &[Dispatch]) -> Self {
        Self { transport, message: message.into(), unsent: jobs.iter().map(|d| d.id).collect() }
    }
}

/// A way to tell workers that jobs are due. Implementations: Postgres LISTEN/NOTIFY
/// (`postgres::PgTransport`) and SQS (`sqs::SqsTransport`), both held to one conformance suite.
#[async_trait::async_trait]
pub trait Transport: Send + Sync {
    fn name(&self) -> &'static str;
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError>;

    /// For a transport whose workers listen on the database itself: the channel the inserting
    /// statement NOTIFYs, so new jobs are dispatched by their own commit (one round trip and
    /// one commit fewer per insert). The intake then skips `dispatch` for them.
    fn commit_wake(&self) -> Option<&'static str> {
        None
    }

    /// Whether each message carries its job's tenant (SQS: the message group of a fair queue).
    /// `send` then looks up the tenants its dispatches lack before handing them over.
    fn groups_by_tenant(&self) -> bool {
        false
    }
}

/// Hand committed jobs to the transport. A failure never fails the caller: the rows stay
/// pending with their dispatch mark cleared, and the sweep sends them.
/// Returns whether the transport took them.
pub async fn send(transport: &Arc<dyn Transport>, pool: &Pool, jobs: &[Dispatch]) -> bool {
    send_tries(transport, pool, jobs, 1).await
}

/// `send`, with what the transport refused offered again, up to `tries` dispatches in all.
pub async fn send_tries(transport: &Arc<dyn Transport>, pool: &Pool, jobs: &[Dispatch], tries: u32) -> bool {
    if jobs.is_empty() {
        return true;
    }
    // Borrowed as given: copied only when tenants are added or a failed dispatch leaves some.
    let mut jobs: Cow<'_, [Dispatch]> = if transport.groups_by_tenant() && jobs.iter().any(|d| d.tenant.is_none()) {
        Cow::Owned(with_tenants_of(pool, jobs).await)
    } else {
        Cow::Borrowed(jobs)
    };
    let mut unsent = Vec::new();
    for _ in 0..tries.max(1) {
        let Err(e) = transport.dispatch(&jobs).await else { return true };
        metrics::DISPATCH_FAILURES.add(e.unsent.len());
        tracing::warn!(event = "relay.dispatch.failed", jobs = jobs.len(), unsent = e.unsent.len(), error = %e,
            "dispatch failed; the sweep will send the unsent jobs");
        jobs.to_mut().retain(|d| e.unsent.contains(&d.id));
        unsent = e.unsent;
    }
    let cleared = async { jobs::undispatch(&pool.get().await?, &unsent).await };
    if let Err(e) = cleared.await {
        // Still safe: the sweep re-sends rows whose dispatch is older than its grace period.
        tracing::warn!(event = "relay.dispatch.unmark_failed", error = %e, "could not clear dispatch marks");
    }
    false
}

/// These dispatches with each job's tenant, read in one statement on a connection given back
/// before the dispatch is sent. A failed read leaves them without (the messages then carry no
/// group: still delivered, only not shared out by tenant).
async fn with_tenants_of(pool: &Pool, jobs: &[Dispatch]) -> Vec<Dispatch> {
    let ids: Vec<JobId> = jobs.iter().filter(|d| d.tenant.is_none()).map(|d| d.id).collect();
    let read = async { jobs::tenants_of(&pool.get().await.map_err(StoreError::from)?, &ids).await };
    let tenants = match read.await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(event = "relay.dispatch.tenants_unread", error = %e,
                "could not read the jobs' tenants; their messages go without a message group");
            Default::default()
        }
    };
    jobs.iter().map(|d| Dispatch { tenant: d.tenant.or_else(|| tenants.get(&d.id).copied()), ..*d }).collect()
}
