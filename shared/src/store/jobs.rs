//! The `jobs` table and the events each transition writes beside it.
//!
//! Every write after a claim is fenced by (id, attempt, status = 'running'); a fenced write
//! returns the ids it could not apply, and the caller treats them as stale, never as done.
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
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::modes::Modes;
use super::{GenericClient, StoreError};
use crate::job::{ClaimedJob, Dispatch, JobId, JobStatus, TenantId};

pub mod operator;
pub mod retention;

/// A job as stored. Serialises as the API's job resource (tenant and request hash omitted).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Job {
    pub id: Uuid,
    #[serde(skip)]
    pub tenant_id: TenantId,
    pub task_type: String,
    pub status: JobStatus,
    pub params: Value,
    pub correlation_id: String,
    pub idempotency_key: String,
    #[serde(skip)]
    pub request_hash: Vec<u8>,
    pub parent_id: Option<Uuid>,
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
}

pub(crate) const JOB_COLUMNS: &str = "id, tenant_id, task_type, status, params, correlation_id, \
    idempotency_key, request_hash, parent_id, run_at, attempt, max_attempts, timeout_seconds, \
    lease_until, started_at, result, last_error, created_at, updated_at, finished_at";

impl Job {
    pub(crate) fn from_row(r: &Row) -> Self {
        let status: &str = r.get("status");
        Job {
            id: r.get("id"),
            tenant_id: r.get("tenant_id"),
            task_type: r.get("task_type"),
            status: JobStatus::parse(status).unwrap_or(JobStatus::Failed),
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
        }
    }
}

/// A job to insert, already validated.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: Uuid,
    pub task_type: String,
    pub params: Value,
    pub correlation_id: String,
    pub idempotency_key: String,
    pub request_hash: Vec<u8>,
    pub parent_id: Option<Uuid>,
    pub run_at: DateTime<Utc>,
    pub max_attempts: i32,
    pub timeout_seconds: i32,
}

/// What an insert found for one idempotency key.
#[derive(Debug, Clone)]
pub enum Inserted {
    Created(Job),
    /// The key was taken already; the caller compares `request_hash`.
    Existing(Job),
}

/// Insert jobs for one tenant in one statement, marked as dispatched now (the caller dispatches
/// after commit and calls `undispatch` if that fails). Keys already taken come back as
/// `Existing`, in input order.
pub async fn insert_many(
    db: &impl GenericClient,
    tenant_id: TenantId,
    jobs: &[NewJob],
) -> Result<Vec<Inserted>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH input AS (
                 SELECT * FROM unnest($2::uuid[], $1::uuid[], $3::text[], $4::jsonb[],
                        $5::text[], $6::text[], $7::bytea[], $8::uuid[], $9::timestamptz[],
                        $10::int[], $11::int[]) WITH ORDINALITY
                     AS t(id, tenant_id, task_type, params, correlation_id, idempotency_key,
                          request_hash, parent_id, run_at, max_attempts, timeout_seconds, ord)
             ), keys AS (
                 -- In key order: two concurrent inserts sharing keys then wait for each other
                 -- instead of deadlocking (found by `relay chaos idempotency`). Among repeats of
                 -- a key, input order: the first item takes the key.
                 INSERT INTO job_keys (tenant_id, idempotency_key, correlation_id, job_id)
                 SELECT tenant_id, idempotency_key, correlation_id, id FROM input ORDER BY idempotency_key, ord
                 ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
                 RETURNING job_id
             )
             INSERT INTO jobs (id, tenant_id, task_type, params, correlation_id, idempotency_key,
                               request_hash, parent_id, run_at, max_attempts, timeout_seconds,
                               dispatched_at)
             SELECT id, tenant_id, task_type, params, correlation_id, idempotency_key, request_hash,
                    parent_id, run_at, max_attempts, timeout_seconds, now()
             FROM input WHERE id IN (SELECT job_id FROM keys)
             RETURNING {JOB_COLUMNS}"
        ))
        .await?;
    let tenants = vec![tenant_id; jobs.len()];
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.id).collect();
    let types: Vec<&str> = jobs.iter().map(|j| j.task_type.as_str()).collect();
    let params: Vec<&Value> = jobs.iter().map(|j| &j.params).collect();
    let corr: Vec<&str> = jobs.iter().map(|j| j.correlation_id.as_str()).collect();
    let keys: Vec<&str> = jobs.iter().map(|j| j.idempotency_key.as_str()).collect();
    let hashes: Vec<&[u8]> = jobs.iter().map(|j| j.request_hash.as_slice()).collect();
    let parents: Vec<Option<Uuid>> = jobs.iter().map(|j| j.parent_id).collect();
    let run_ats: Vec<DateTime<Utc>> = jobs.iter().map(|j| j.run_at).collect();
    let max_attempts: Vec<i32> = jobs.iter().map(|j| j.max_attempts).collect();
    let timeouts: Vec<i32> = jobs.iter().map(|j| j.timeout_seconds).collect();
    let rows = db
        .query(
            &stmt,
            &[&tenants, &ids, &types, &params, &corr, &keys, &hashes, &parents, &run_ats,
              &max_attempts, &timeouts],
        )
        .await?;
    let mut created: std::collections::HashMap<String, Job> =
        rows.iter().map(Job::from_row).map(|j| (j.idempotency_key.clone(), j)).collect();
    let missing: Vec<&str> = keys.iter().copied().filter(|k| !created.contains_key(*k)).collect();
    let mut existing: std::collections::HashMap<String, Job> = if missing.is_empty() {
        Default::default()
    } else {
        by_keys(db, tenant_id, &missing).await?.into_iter().map(|j| (j.idempotency_key.clone(), j)).collect()
    };
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        // The first item with a key takes the created row; a repeat of the key in the same
        // batch sees it as existing.
        if let Some(j) = created.remove(&job.idempotency_key) {
            existing.insert(job.idempotency_key.clone(), j.clone());
            out.push(Inserted::Created(j));
        } else if let Some(j) = existing.get(&job.idempotency_key) {
            out.push(Inserted::Existing(j.clone()));
        } else {
            // ON CONFLICT waited for any concurrent insert of the key, so the row existed a
            // moment ago; only a deletion in between (retention) lands here.
            return Err(StoreError::Vanished(format!("idempotency key {:?}", job.idempotency_key)));
        }
    }
    Ok(out)
}

async fn by_keys(db: &impl GenericClient, tenant_id: TenantId, keys: &[&str]) -> Result<Vec<Job>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs
             WHERE id IN (SELECT job_id FROM job_keys WHERE tenant_id = $1 AND idempotency_key = ANY($2))
               AND tenant_id = $1"
        ))
        .await?;
    Ok(db.query(&stmt, &[&tenant_id, &keys]).await?.iter().map(Job::from_row).collect())
}

/// Clear the dispatch mark of jobs whose dispatch failed, so the sweep sends them at once.
pub async fn undispatch(db: &impl GenericClient, ids: &[JobId]) -> Result<(), StoreError> {
    db.execute(
        "UPDATE jobs SET dispatched_at = NULL WHERE id = ANY($1) AND status = 'pending'",
        &[&ids],
    )
    .await?;
    Ok(())
}

/// One job of one tenant; another tenant's job is indistinguishable from a missing one.
pub async fn get(db: &impl GenericClient, tenant_id: TenantId, id: JobId) -> Result<Option<Job>, StoreError> {
    let stmt = db
        .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 AND tenant_id = $2"))
        .await?;
    Ok(db.query_opt(&stmt, &[&id, &tenant_id]).await?.as_ref().map(Job::from_row))
}

/// Filters for a tenant's change feed, ordered by (updated_at, id).
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub status: Option<JobStatus>,
    pub task_type: Option<String>,
    pub correlation_id: Option<String>,
    pub updated_since: Option<DateTime<Utc>>,
    /// Resume after this (updated_at, id): the cursor of the previous page.
    pub after: Option<(DateTime<Utc>, JobId)>,
    pub limit: i64,
}

pub async fn list(db: &impl GenericClient, tenant_id: TenantId, f: &JobFilter) -> Result<Vec<Job>, StoreError> {
    // With a correlation id, start from that chain's keys (an index on job_keys); otherwise
    // walk the tenant's change feed index.
    let source = if f.correlation_id.is_some() {
        "jobs WHERE id IN (SELECT job_id FROM job_keys WHERE tenant_id = $1 AND correlation_id = $4) AND tenant_id = $1"
    } else {
        "jobs WHERE tenant_id = $1 AND $4::text IS NULL"
    };
    let stmt = db
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM {source}
               AND ($2::text IS NULL OR status = $2)
               AND ($3::text IS NULL OR task_type = $3)
               AND ($5::timestamptz IS NULL OR updated_at >= $5)
               AND ($6::timestamptz IS NULL OR (updated_at, id) > ($6, $7::uuid))
             ORDER BY updated_at, id
             LIMIT $8"
        ))
        .await?;
    let status = f.status.map(JobStatus::as_str);
    let (after_at, after_id) = f.after.map_or((None, None), |(a, i)| (Some(a), Some(i)));
    let rows = db
        .query(
            &stmt,
            &[&tenant_id, &status, &f.task_type, &f.correlation_id, &f.updated_since, &after_at,
              &after_id, &f.limit],
        )
        .await?;
    Ok(rows.iter().map(Job::from_row).collect())
}

/// Cancel a pending or waiting job and its pending or waiting children. Returns false when
/// the job is in another state (or not this tenant's); the caller reads it to say why.
pub async fn cancel(db: &impl GenericClient, tenant_id: TenantId, id: JobId) -> Result<bool, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH cancelled AS (
                 UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now()
                 WHERE (id = $1 OR parent_id = $1) AND tenant_id = $2
                   AND status IN ('pending', 'waiting')
                 RETURNING id, attempt
             ), events AS (
                 INSERT INTO job_events (job_id, kind, to_status, attempt, reason)
                 SELECT id, 'cancelled', 'cancelled', attempt, 'cancelled by client' FROM cancelled
             )
             SELECT count(*) FILTER (WHERE id = $1) FROM cancelled",
        )
        .await?;
    let n: i64 = db.query_one(&stmt, &[&id, &tenant_id]).await?.get(0);
    Ok(n == 1)
}

/// One recorded transition or recovery.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobEvent {
    pub at: DateTime<Utc>,
    pub kind: String,
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    pub attempt: i32,
    /// When the attempt this event ends was claimed.
    pub started_at: Option<DateTime<Utc>>,
    pub reason: Option<String>,
}

impl JobEvent {
    /// From a row of `at, kind, from_status, to_status, attempt, started_at, reason`.
    pub(crate) fn from_row(r: &Row) -> Self {
        JobEvent {
            at: r.get(0),
            kind: r.get(1),
            from_status: r.get(2),
            to_status: r.get(3),
            attempt: r.get(4),
            started_at: r.get(5),
            reason: r.get(6),
        }
    }
}

/// A tenant's job's history, oldest first.
pub async fn events(db: &impl GenericClient, tenant_id: TenantId, id: JobId) -> Result<Vec<JobEvent>, StoreError> {
    let rows = db
        .query(
            "SELECT e.at, e.kind, e.from_status, e.to_status, e.attempt, e.started_at, e.reason
             FROM job_events e JOIN jobs j ON j.id = e.job_id
             WHERE e.job_id = $1 AND j.tenant_id = $2 ORDER BY e.id",
            &[&id, &tenant_id],
        )
        .await?;
    Ok(rows.iter().map(JobEvent::from_row).collect())
}

// ---- the worker's side: claim, heartbeat, complete ----

const CLAIM_RETURNING: &str =
    "RETURNING j.id, j.tenant_id, j.task_type, j.params, j.correlation_id, j.attempt, j.max_attempts, j.timeout_seconds";

fn claimed_from_row(r: &Row) -> ClaimedJob {
    ClaimedJob {
        id: r.get(0),
        tenant_id: r.get(1),
        task_type: r.get(2),
        params: r.get(3),
        correlation_id: r.get(4),
        attempt: r.get(5),
        max_attempts: r.get(6),
        timeout_seconds: r.get(7),
    }
}

/// The rows a claim takes: due, pending, not of a paused task type, not locked by another
/// claimer. Shared by both claim shapes so they cannot disagree.
const CLAIMABLE: &str = "status = 'pending' AND run_at <= now()
    AND task_type <> ALL (SELECT substr(name, 7) FROM operating_modes
                          WHERE name LIKE 'pause:%' AND enabled)";

fn claim_sql(extra_filter: &str) -> String {
    format!(
        "WITH due AS (
             SELECT id FROM jobs WHERE {CLAIMABLE} {extra_filter}
             ORDER BY run_at LIMIT $1 FOR UPDATE SKIP LOCKED
         ), claimed AS (
             UPDATE jobs j SET status = 'running', attempt = j.attempt + 1,
                 lease_until = now() + make_interval(secs => $2), started_at = now(), updated_at = now()
             WHERE j.id = ANY (ARRAY(SELECT id FROM due))
             {CLAIM_RETURNING}
         )
         SELECT claimed.*, modes.switches FROM claimed,
             (SELECT coalesce(jsonb_object_agg(name, enabled), '{{}}') AS switches FROM operating_modes) modes"
    )
}

/// Jobs taken by one claim, with the operating modes read in the same statement.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    pub jobs: Vec<ClaimedJob>,
    pub modes: Modes,
}

impl Claim {
    fn from_rows(rows: &[Row]) -> Claim {
        let modes = rows.first().map(|r| Modes::from_json(&r.get::<_, Value>("switches"))).unwrap_or_default();
        Claim { jobs: rows.iter().map(claimed_from_row).collect(), modes }
    }
}

/// Claim up to `limit` due jobs under a lease of `lease_secs` (the Postgres-native transport).
pub async fn claim_due(db: &impl GenericClient, limit: i64, lease_secs: f64) -> Result<Claim, StoreError> {
    let stmt = db.prepare_cached(&claim_sql("")).await?;
    Ok(Claim::from_rows(&db.query(&stmt, &[&limit, &lease_secs]).await?))
}

/// Claim the named jobs if they are still claimable (a transport that delivers ids, like SQS).
/// A duplicate or stale delivery claims nothing.
pub async fn claim_ids(
    db: &impl GenericClient,
    ids: &[JobId],
    lease_secs: f64,
) -> Result<Claim, StoreError> {
    let stmt = db.prepare_cached(&claim_sql("AND id = ANY($3)")).await?;
    let limit = i64::try_from(ids.len()).unwrap_or(i64::MAX);
    Ok(Claim::from_rows(&db.query(&stmt, &[&limit, &lease_secs, &ids]).await?))
}

/// Which of the (id, attempt) pairs a fenced write did not reach.
fn refused(fence: &[(JobId, i32)], written: &[Row]) -> Vec<(JobId, i32)> {
    let done: std::collections::HashSet<JobId> = written.iter().map(|r| r.get(0)).collect();
    fence.iter().copied().filter(|(id, _)| !done.contains(id)).collect()
}

fn split<T>(items: &[(JobId, i32, T)]) -> (Vec<JobId>, Vec<i32>) {
    items.iter().map(|(id, a, _)| (*id, *a)).unzip()
}

/// Multi-row writes lock rows in the order of their input arrays. Every batch goes in sorted
/// by id, so two statements touching the same rows (a heartbeat and a completion that raced
/// it) wait for each other instead of deadlocking.
fn by_id<T: Clone>(items: &[(JobId, i32, T)]) -> Vec<(JobId, i32, T)> {
    let mut sorted = items.to_vec();
    sorted.sort_by_key(|(id, _, _)| *id);
    sorted
}

/// Extend the leases of jobs still running under these attempts; returns the ones lost.
pub async fn heartbeat(
    db: &impl GenericClient,
    fence: &[(JobId, i32)],
    lease_secs: f64,
) -> Result<Vec<(JobId, i32)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "UPDATE jobs j SET lease_until = now() + make_interval(secs => $3)
             FROM unnest($1::uuid[], $2::int[]) AS f(id, attempt)
             WHERE j.id = f.id AND j.attempt = f.attempt AND (j.status || '') = 'running'
             RETURNING j.id",
        )
        .await?;
    let mut sorted = fence.to_vec();
    sorted.sort();
    let (ids, attempts): (Vec<JobId>, Vec<i32>) = sorted.into_iter().unzip();
    let rows = db.query(&stmt, &[&ids, &attempts, &lease_secs]).await?;
    Ok(refused(fence, &rows))
}

/// Record successes (fenced). Returns the (id, attempt) pairs refused as stale.
pub async fn succeed(db: &impl GenericClient, done: &[(JobId, i32, Value)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH done AS (
                 UPDATE jobs j SET status = 'succeeded', result = d.result, lease_until = NULL,
                     last_error = NULL, finished_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::jsonb[]) AS d(id, attempt, result)
                 WHERE j.id = d.id AND j.attempt = d.attempt AND (j.status || '') = 'running'
                 RETURNING j.id, j.attempt, j.started_at
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at)
                 SELECT id, 'succeeded', 'running', 'succeeded', attempt, started_at FROM done
             ), resolved AS (
                 -- A job with an open exception (retried by an operator) that now succeeds
                 -- closes it: the condition cleared. A probe of the small open-exception index.
                 UPDATE exceptions x SET status = 'resolved', closed_at = now(), closed_by = 'system',
                     close_reason = 'the job succeeded'
                 WHERE x.job_id = ANY (ARRAY(SELECT id FROM done)) AND x.status = 'open'
                 RETURNING x.id, x.job_id
             ), audit AS (
                 INSERT INTO exception_actions (exception_id, job_id, action, actor, reason)
                 SELECT id, job_id, 'resolve', 'system', 'the job succeeded' FROM resolved
             )
             SELECT id FROM done",
        )
        .await?;
    let done = &by_id(done);
    let (ids, attempts) = split(done);
    let results: Vec<&Value> = done.iter().map(|d| &d.2).collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &results]).await?;
    Ok(refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows))
}

/// A retry to schedule: back to pending at `run_at`, with the error that caused it.
#[derive(Debug, Clone)]
pub struct Retry {
    pub run_at: DateTime<Utc>,
    pub error: String,
}

/// Send jobs back to pending for another attempt (fenced); marked dispatched now, since the
/// caller dispatches them after commit. Returns the pairs refused as stale.
pub async fn retry(db: &impl GenericClient, retries: &[(JobId, i32, Retry)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH retried AS (
                 UPDATE jobs j SET status = 'pending', run_at = r.run_at, lease_until = NULL,
                     last_error = r.error, dispatched_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::text[])
                     AS r(id, attempt, run_at, error)
                 WHERE j.id = r.id AND j.attempt = r.attempt AND (j.status || '') = 'running'
                 RETURNING j.id, j.attempt, j.started_at, r.error
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, 'retry_scheduled', 'running', 'pending', attempt, started_at, error FROM retried
             )
             SELECT id FROM retried",
        )
        .await?;
    let retries = &by_id(retries);
    let (ids, attempts) = split(retries);
    let run_ats: Vec<DateTime<Utc>> = retries.iter().map(|r| r.2.run_at).collect();
    let errors: Vec<&str> = retries.iter().map(|r| r.2.error.as_str()).collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &run_ats, &errors]).await?;
    Ok(refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows))
}

/// Why a job fails for good: the kind of exception it opens and the error.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: &'static str,
    pub error: String,
}

/// What the terminal-failure path wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failed {
    /// The (id, attempt) pairs refused as stale.
    pub refused: Vec<(JobId, i32)>,
    /// Exceptions newly opened, as (exception id, job id). A job failing again while its
    /// exception is still open (an operator's retry that failed) opens none.
    pub opened: Vec<(Uuid, JobId)>,
}

/// The one terminal-failure path (see `fail_reporting`); returns the pairs refused as stale.
pub async fn fail(db: &impl GenericClient, failures: &[(JobId, i32, Failure)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    Ok(fail_reporting(db, failures).await?.refused)
}

/// The one terminal-failure path: the job becomes `failed` and an exception opens, in one
/// statement, for every task type. Fenced. The caller alerts on `opened` after commit
/// (`crate::exceptions::alert_opened`).
pub async fn fail_reporting(db: &impl GenericClient, failures: &[(JobId, i32, Failure)]) -> Result<Failed, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH failed AS (
                 UPDATE jobs j SET status = 'failed', lease_until = NULL, last_error = f.error,
                     finished_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[])
                     AS f(id, attempt, kind, error)
                 WHERE j.id = f.id AND j.attempt = f.attempt AND (j.status || '') = 'running'
                 RETURNING j.id, j.tenant_id, j.task_type, j.attempt, j.started_at, f.kind, f.error
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, 'failed', 'running', 'failed', attempt, started_at, kind || ': ' || error FROM failed
             ), opened AS (
                 INSERT INTO exceptions (id, job_id, tenant_id, task_type, kind, cause)
                 SELECT gen_random_uuid(), id, tenant_id, task_type, kind, error FROM failed
                 ON CONFLICT (job_id) WHERE status = 'open' DO NOTHING
                 RETURNING id, job_id
             )
             SELECT f.id, o.id FROM failed f LEFT JOIN opened o ON o.job_id = f.id",
        )
        .await?;
    let failures = &by_id(failures);
    let (ids, attempts) = split(failures);
    let kinds: Vec<&str> = failures.iter().map(|f| f.2.kind).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.2.error.as_str()).collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &kinds, &errors]).await?;
    let opened = rows.iter().filter_map(|r| Some((r.get::<_, Option<Uuid>>(1)?, r.get::<_, JobId>(0)))).collect();
    Ok(Failed { refused: refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows), opened })
}

// ---- the sweep's side ----

/// A running job whose lease has expired, locked for the sweep's transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredLease {
    pub id: Uuid,
    pub attempt: i32,
    pub max_attempts: i32,
}

/// Lock up to `limit` expired leases; rows another sweeper holds are skipped.
pub async fn lock_expired_leases(db: &impl GenericClient, limit: i64) -> Result<Vec<ExpiredLease>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT id, attempt, max_attempts FROM jobs
             WHERE status = 'running' AND lease_until < now()
             ORDER BY lease_until LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .await?;
    let rows = db.query(&stmt, &[&limit]).await?;
    Ok(rows
        .iter()
        .map(|r| ExpiredLease { id: r.get(0), attempt: r.get(1), max_attempts: r.get(2) })
        .collect())
}

/// Return expired leases to pending, due now, with a `lease_expired` event each (fenced).
pub async fn return_expired(db: &impl GenericClient, fence: &[(JobId, i32)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH returned AS (
                 UPDATE jobs j SET status = 'pending', run_at = now(), lease_until = NULL,
                     last_error = 'lease expired: the worker stopped heartbeating',
                     dispatched_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[]) AS f(id, attempt)
                 WHERE j.id = f.id AND j.attempt = f.attempt AND (j.status || '') = 'running'
                 RETURNING j.id, j.attempt, j.started_at
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, 'lease_expired', 'running', 'pending', attempt, started_at,
                        'lease expired; returned to pending by the sweep' FROM returned
             )
             SELECT id FROM returned",
        )
        .await?;
    let mut sorted = fence.to_vec();
    sorted.sort();
    let (ids, attempts): (Vec<JobId>, Vec<i32>) = sorted.into_iter().unzip();
    let rows = db.query(&stmt, &[&ids, &attempts]).await?;
    Ok(refused(fence, &rows))
}

/// Find due pending jobs whose dispatch failed (`dispatched_at` NULL) or was lost (dispatched
/// more than `grace_secs` ago and still not claimed, at least `grace_secs` after falling due),
/// mark them dispatched now and record a `redispatched` event each. Paused task types wait.
/// A fresh row is never taken: its own dispatch is still in flight.
pub async fn take_lost_dispatches(
    db: &impl GenericClient,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Dispatch>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH lost AS (
                 SELECT id, dispatched_at IS NULL AS never FROM jobs
                 WHERE {CLAIMABLE}
                   AND (dispatched_at IS NULL
                        OR (dispatched_at < now() - make_interval(secs => $1)
                            AND run_at < now() - make_interval(secs => $1)))
                 ORDER BY run_at LIMIT $2 FOR UPDATE SKIP LOCKED
             ), marked AS (
                 UPDATE jobs j SET dispatched_at = now()
                 WHERE j.id = ANY (ARRAY(SELECT id FROM lost))
                 RETURNING j.id, j.run_at, j.attempt
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT m.id, 'redispatched', 'pending', 'pending', m.attempt,
                        CASE WHEN l.never THEN 'dispatch failed; sent by the sweep'
                             ELSE 'dispatch lost; sent again by the sweep' END
                 FROM marked m JOIN lost l ON l.id = m.id
             )
             SELECT id, run_at FROM marked"
        ))
        .await?;
    let rows = db.query(&stmt, &[&grace_secs, &limit]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1) }).collect())
}

/// Which of these ids name no job at all.
pub async fn missing(db: &impl GenericClient, ids: &[JobId]) -> Result<Vec<JobId>, StoreError> {
    let rows = db
        .query("SELECT id FROM unnest($1::uuid[]) AS i(id) WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = i.id)", &[&ids])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
