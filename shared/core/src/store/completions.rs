//! `completion_waits`: a job's waits for an outside party's completion, one per attempt at
//! most (migration 0016). A task opens one (fenced by its attempt) and hands the token out; a
//! completion or the sweep's overdue pass locks it with its job, ends it and closes it, in
//! one transaction. Open waits are read through the partial index on their deadline only.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::{GenericClient, StoreError, decode};
use crate::job::completion::{CompletionOutcome, OpenWait, OverduePolicy};
use crate::job::{Fence, JobId, JobStatus, TenantId};

/// A wait as its task opens it.
#[derive(Debug, Clone)]
pub struct NewWait {
    pub fence: Fence,
    /// sha256 of the token handed out (`tenants::hash_key`).
    pub token_hash: Vec<u8>,
    /// Seconds from now (the database's clock) to the deadline.
    pub within_secs: f64,
    pub on_overdue: OverduePolicy,
    pub retry_delay_secs: f64,
}

/// Open a wait for a job still running under the fence's attempt; returns its deadline. `None`
/// when the job has left that attempt (its lease expired) or the attempt has a wait already.
pub async fn open(db: &impl GenericClient, w: &NewWait) -> Result<Option<DateTime<Utc>>, StoreError> {
    let reschedule = match w.on_overdue {
        OverduePolicy::Reschedule { after } => Some(after.as_secs_f64()),
        _ => None,
    };
    let stmt = db
        .prepare_cached(
            "INSERT INTO completion_waits (job_id, attempt, token_hash, deadline, on_overdue, reschedule_seconds, retry_delay_seconds)
             SELECT id, attempt, $3, now() + make_interval(secs => $4), $5, $6, $7 FROM jobs
             WHERE id = $1 AND attempt = $2 AND status = 'running'
             ON CONFLICT DO NOTHING
             RETURNING deadline",
        )
        .await?;
    let row = db
        .query_opt(
            &stmt,
            &[
                &w.fence.job,
                &w.fence.attempt,
                &w.token_hash,
                &w.within_secs,
                &w.on_overdue.as_str(),
                &reschedule,
                &w.retry_delay_secs,
            ],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// How a closed wait ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    pub at: DateTime<Utc>,
    /// `completion`, `overdue` or `superseded`.
    pub by: String,
    /// A completion's outcome and fingerprint.
    pub outcome: Option<CompletionOutcome>,
    pub completion_hash: Option<Vec<u8>>,
}

/// A wait locked with its job.
#[derive(Debug, Clone, PartialEq)]
pub struct Locked {
    pub wait: OpenWait,
    pub tenant_id: TenantId,
    /// The job's state and attempt now: the wait applies only while the job is still in its
    /// attempt, running or waiting.
    pub job_status: JobStatus,
    pub job_attempt: i32,
    pub closed: Option<Closed>,
}

impl Locked {
    /// Whether the job is still in the wait's attempt, running or waiting.
    pub fn current(&self) -> bool {
        self.job_attempt == self.wait.fence.attempt
            && matches!(self.job_status, JobStatus::Running | JobStatus::Waiting)
    }
}

const LOCKED_COLUMNS: &str =
    "w.job_id, w.attempt, w.deadline, w.on_overdue, w.reschedule_seconds, w.retry_delay_seconds,
    w.closed_at, w.closed_by, w.outcome, w.completion_hash, j.tenant_id, j.status, j.attempt, j.max_attempts";

fn locked(r: &Row) -> Result<Locked, StoreError> {
    let reschedule: Option<f64> = r.get(4);
    let closed_outcome = r.get::<_, Option<&str>>(8);
    let closed_outcome =
        closed_outcome.map(|o| decode("completion_waits.outcome", o, CompletionOutcome::parse)).transpose()?;
    Ok(Locked {
        wait: OpenWait {
            fence: Fence { job: r.get(0), attempt: r.get(1) },
            max_attempts: r.get(13),
            deadline: r.get(2),
            on_overdue: decode("completion_waits.on_overdue", r.get(3), |p| OverduePolicy::parse(p, reschedule))?,
            retry_delay: std::time::Duration::from_secs_f64(r.get::<_, f64>(5).max(0.0)),
        },
        tenant_id: r.get(10),
        job_status: decode("jobs.status", r.get(11), JobStatus::parse)?,
        job_attempt: r.get(12),
        closed: r.get::<_, Option<DateTime<Utc>>>(6).map(|at| Closed {
            at,
            by: r.get(7),
            outcome: closed_outcome,
            completion_hash: r.get(9),
        }),
    })
}

/// The wait this token opened, locked with its job (wait first, then job: no other path locks
/// both while waiting). With `scope`, only that tenant's job's wait: another tenant's rows
/// are never locked, nor told apart from a token that names nothing.
pub async fn lock_by_token(
    db: &impl GenericClient,
    token_hash: &[u8],
    scope: Option<(TenantId, JobId)>,
) -> Result<Option<Locked>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT {LOCKED_COLUMNS} FROM completion_waits w JOIN jobs j ON j.id = w.job_id
             WHERE w.token_hash = $1 AND ($2::uuid IS NULL OR (j.tenant_id = $2 AND w.job_id = $3))
             FOR UPDATE OF w, j"
        ))
        .await?;
    let (tenant, job) = (scope.map(|s| s.0), scope.map(|s| s.1));
    db.query_opt(&stmt, &[&token_hash, &tenant, &job]).await?.as_ref().map(locked).transpose()
}

/// Up to `limit` open waits past their deadline, locked with their jobs; rows another
/// transaction holds (a completion being applied, another sweeper) are skipped. A wait whose
/// job still runs under its attempt (the task has not returned yet) is left for a later pass.
/// Reads the open waits' deadline index only.
pub async fn lock_overdue(db: &impl GenericClient, limit: i64) -> Result<Vec<Locked>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT {LOCKED_COLUMNS} FROM completion_waits w JOIN jobs j ON j.id = w.job_id
             WHERE w.closed_at IS NULL AND w.deadline < now()
               AND NOT (j.status = 'running' AND j.attempt = w.attempt)
             ORDER BY w.deadline LIMIT $1
             FOR UPDATE OF w, j SKIP LOCKED"
        ))
        .await?;
    db.query(&stmt, &[&limit]).await?.iter().map(locked).collect::<Result<_, _>>()
}

/// A completion that ended a wait: recorded on it, so a second one is told apart.
#[derive(Debug, Clone)]
pub struct Completed<'a> {
    pub outcome: CompletionOutcome,
    pub hash: &'a [u8],
    /// `api` or `ingress`.
    pub via: &'static str,
}

/// Close locked waits: by a completion (`completed`), or by the sweep (`by`: `overdue`,
/// `superseded`). Returns how many were open.
pub async fn close(
    db: &impl GenericClient,
    fences: &[Fence],
    by: &str,
    completed: Option<&Completed<'_>>,
) -> Result<u64, StoreError> {
    let stmt = db
        .prepare_cached(
            "UPDATE completion_waits w SET closed_at = now(), closed_by = $3, outcome = $4, completion_hash = $5, via = $6
             FROM unnest($1::uuid[], $2::int[]) AS f(job_id, attempt)
             WHERE w.job_id = f.job_id AND w.attempt = f.attempt AND w.closed_at IS NULL",
        )
        .await?;
    let ids: Vec<JobId> = fences.iter().map(|f| f.job).collect();
    let attempts: Vec<i32> = fences.iter().map(|f| f.attempt).collect();
    let (outcome, hash, via) = match completed {
        Some(c) => (Some(c.outcome.as_str()), Some(c.hash), Some(c.via)),
        None => (None, None, None),
    };
    Ok(db.execute(&stmt, &[&ids, &attempts, &by, &outcome, &hash, &via]).await?)
}

/// The deadlines of these jobs' open waits (jobs without one are absent).
pub async fn open_deadlines(
    db: &impl GenericClient,
    jobs: &[JobId],
) -> Result<HashMap<JobId, DateTime<Utc>>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT w.job_id, w.deadline FROM completion_waits w JOIN jobs j ON j.id = w.job_id AND j.attempt = w.attempt
             WHERE w.job_id = ANY ($1) AND w.closed_at IS NULL",
        )
        .await?;
    Ok(db.query(&stmt, &[&jobs]).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Open waits whose job still waits for them (or still runs the attempt that opened them),
/// and how many of those are past their deadline: (open, overdue). Reads the open waits'
/// index and one job row each.
pub async fn count_open(db: &impl GenericClient) -> Result<(i64, i64), StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT count(*), count(*) FILTER (WHERE w.deadline < now())
             FROM completion_waits w JOIN jobs j ON j.id = w.job_id AND j.attempt = w.attempt
             WHERE w.closed_at IS NULL AND j.status IN ('running', 'waiting')",
        )
        .await?;
    let row = db.query_one(&stmt, &[]).await?;
    Ok((row.get(0), row.get(1)))
}
