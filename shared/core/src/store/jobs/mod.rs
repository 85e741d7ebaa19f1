//! The `jobs` table and the events each transition writes beside it, by what each part does:
//! `insert` (the intake's batched insert and dispatch marks), `read`, `claim` (and `defer`, for
//! claimed ids that do not fit an invocation), `transition` (a running job's fenced writes, a
//! client's cancel), `sweep` (expired leases, lost dispatches, finished fan-outs), `operator`
//! and `retention`; `fence` writes the fenced statement they share.
//!
//! Every write after a claim is fenced by (id, attempt, status = 'running'); a fenced write
//! returns the fences it could not apply, and the caller treats them as stale, never as done.
//! Batches travel as `unnest` arrays: one statement, one round trip, however many jobs.
//!
//! Plans: these statements are prepared once and soon run on Postgres's generic plan, which
//! does not know the batch size. Two shapes stay index-driven whatever it guesses: a join of
//! `unnest(...)` to `jobs` on `id` (a nested loop over the batch, one index probe each), and
//! `id = ANY (ARRAY(SELECT ...))` for rows chosen by a CTE. Mixing both in one statement, or
//! joining a CTE to `jobs`, can fall back to a scan of the table or of the batch per row.
//! Fenced writes test `(status || '') = 'running'`, not `status = 'running'`: statistics
//! taken when no job was running (after a bulk load, say) make the plain form look like one
//! row, and the planner then drives the join from the running jobs and rescans the batch for
//! each of them. Postgres has no statistics for the wrapped form, so it assumes many rows and
//! keeps the batch as the outer side, one index probe per job. Measured (`relay bench`):
//! 200,000 jobs with 4 worker loops went from ~3,800 to ~30,000 jobs/s, and 20,000 jobs
//! stayed at 22,000-27,000 jobs/s.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;

use crate::job::{Dispatch, Fault, JobId, JobStatus, TenantId};
use crate::store::{StoreError, decode};

mod claim;
mod defer;
mod fence;
mod insert;
pub mod operator;
mod read;
pub mod retention;
mod sweep;
mod transition;

#[cfg(feature = "testing")]
pub(crate) use claim::fair_claim_sql;
pub use claim::{
    Claim, Keyed, Lane, LongLane, Running, Shares, claim_check, claim_due, claim_ids, claim_keyed, claim_locked,
    claim_shared, keyed_ready, lock_keys,
};
pub(crate) use claim::{keyed_claim_sql, plan_keyed_claim};
pub use defer::{DeferBounds, Deferred, defer_unfit};
pub use fence::lock_in_order;
pub use insert::{Inserted, NewJob, insert_many, release, undispatch};
pub use read::{EventKind, JobEvent, JobFilter, count_children, events, get, list, tenants_of};
pub use sweep::{
    ExpiredLease, Finished, finish_parents, finish_parents_of, lock_expired_leases, return_expired,
    take_lost_dispatches, take_lost_keyed,
};
pub use transition::{
    Cancelled, Continued, Failed, Failure, Retry, Succeeded, await_completion, cancel, continue_later,
    declare_children, fail, fail_from, fail_reporting, heartbeat, retry, retry_wait, succeed, succeed_from,
    succeed_reporting, wait_for_children, wait_running,
};

/// A job as stored.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: JobId,
    pub tenant_id: TenantId,
    pub task_type: String,
    pub status: JobStatus,
    pub params: Value,
    pub correlation_id: String,
    pub idempotency_key: String,
    pub request_hash: Vec<u8>,
    pub parent_id: Option<JobId>,
    pub run_at: DateTime<Utc>,
    pub attempt: i32,
    pub max_attempts: i32,
    pub timeout_seconds: i32,
    pub lease_until: Option<DateTime<Utc>>,
    /// When the current (or last) attempt was claimed.
    pub started_at: Option<DateTime<Utc>>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// No more than `concurrency_limit` jobs with this key run at once.
    pub concurrency_key: Option<String>,
    pub concurrency_limit: Option<i32>,
    /// A fan-out parent's declared number of children.
    pub children_total: Option<i32>,
    /// Where this job's callbacks go, instead of the tenant's callback URL.
    pub callback_url: Option<String>,
    /// Whose failure a failed job is (`None` otherwise).
    pub fault: Option<Fault>,
}

pub(crate) const JOB_COLUMNS: &str = "id, tenant_id, task_type, status, params, correlation_id, \
    idempotency_key, request_hash, parent_id, run_at, attempt, max_attempts, timeout_seconds, \
    lease_until, started_at, result, last_error, created_at, updated_at, finished_at, \
    concurrency_key, concurrency_limit, children_total, callback_url, fault";

impl Job {
    pub(crate) fn from_row(r: &Row) -> Result<Self, StoreError> {
        let tenant_id = r.get("tenant_id");
        let fault: Option<&str> = r.get("fault");
        Ok(Job {
            id: r.get("id"),
            tenant_id,
            task_type: r.get("task_type"),
            status: decode("jobs.status", r.get("status"), JobStatus::parse)?,
            params: r.get("params"),
            correlation_id: r.get("correlation_id"),
            idempotency_key: r.get("idempotency_key"),
            request_hash: r.get("request_hash"),
            parent_id: r.get("parent_id"),
            run_at: r.get("run_at"),
            attempt: r.get("attempt"),
            max_attempts: r.get("max_attempts"),
            timeout_seconds: r.get("timeout_seconds"),
            lease_until: r.get("lease_until"),
            started_at: r.get("started_at"),
            result: r.get("result"),
            last_error: r.get("last_error"),
            created_at: r.get("created_at"),
            updated_at: r.get("updated_at"),
            finished_at: r.get("finished_at"),
            concurrency_key: r.get("concurrency_key"),
            concurrency_limit: r.get("concurrency_limit"),
            children_total: r.get("children_total"),
            callback_url: r.get("callback_url"),
            fault: fault.map(|f| decode("jobs.fault", f, |f| Fault::parse(f, tenant_id))).transpose()?,
        })
    }
}

/// Every pending job, as a derived table (`FROM {PENDING_JOBS} j`): the unkeyed ones along
/// `jobs_due_free`, the keyed ones along `jobs_keyed_pending`. There is no index of all pending
/// jobs: each would cost every accepted job one more entry.
pub(crate) const PENDING_JOBS: &str = "(SELECT * FROM jobs WHERE status = 'pending' AND concurrency_key IS NULL
      UNION ALL
      SELECT * FROM jobs WHERE status = 'pending' AND concurrency_key IS NOT NULL)";

pub(crate) use super::callbacks::TERMINAL_RETURNING;

/// The callback deliveries among a terminal write's rows (`id, is_callback, run_at` last).
fn callbacks_of(rows: &[Row], flag: usize) -> Vec<Dispatch> {
    rows.iter()
        .filter(|r| r.get::<_, bool>(flag))
        .map(|r| Dispatch { id: r.get(0), run_at: r.get(flag + 1), tenant: None })
        .collect()
}
