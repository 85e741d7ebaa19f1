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

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::modes::Modes;
use super::{GenericClient, StoreError};
use crate::job::terms::Concurrency;
use crate::job::{ClaimedJob, Dispatch, ExceptionKind, Fault, JobId, JobStatus, TenantId};

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
    /// No more than `concurrency_limit` jobs with this key run at once.
    pub concurrency_key: Option<String>,
    pub concurrency_limit: Option<i32>,
    /// A fan-out parent's declared number of children.
    pub children_total: Option<i32>,
    /// Where this job's callbacks go, instead of the tenant's callback URL.
    pub callback_url: Option<String>,
    /// Why a pending or waiting job is not running (null when running or finished): `not_due`,
    /// `paused`, `concurrency_key_busy`, `waiting_for_children` or `not_claimed` (due, but no
    /// worker has taken it yet). Filled on reads (`annotate`), not in a submit's answer.
    pub waiting_reason: Option<WaitingReason>,
    /// How far it has got (see `progress`): counted children for a fan-out, elapsed time
    /// against a baseline for a single unit. Filled on reads, not in a submit's answer.
    pub progress: Option<crate::progress::Progress>,
}

/// Why a non-terminal job is not running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingReason {
    /// `run_at` is in the future (a delay or a retry's backoff).
    NotDue,
    /// Its task type is paused by an operator.
    Paused,
    /// As many jobs of its concurrency key as its limit allows are running.
    ConcurrencyKeyBusy,
    /// A fan-out parent whose children have not all finished.
    WaitingForChildren,
    /// Due and free to run, but no worker has taken it yet.
    NotClaimed,
}

pub(crate) const JOB_COLUMNS: &str = "id, tenant_id, task_type, status, params, correlation_id, \
    idempotency_key, request_hash, parent_id, run_at, attempt, max_attempts, timeout_seconds, \
    lease_until, started_at, result, last_error, created_at, updated_at, finished_at, \
    concurrency_key, concurrency_limit, children_total, callback_url";

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
            concurrency_key: r.get("concurrency_key"),
            concurrency_limit: r.get("concurrency_limit"),
            children_total: r.get("children_total"),
            callback_url: r.get("callback_url"),
            waiting_reason: None,
            progress: None,
        }
    }
}

/// A job to insert, already validated.
#[derive(Debug, Clone, Default)]
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
    /// At most `limit` jobs of this key run at once.
    pub concurrency: Option<Concurrency>,
    pub callback_url: Option<String>,
}

impl NewJob {
    /// A child of the parent `parent_id`: it carries the parent's correlation id. Fields not
    /// named here are the request's own.
    pub fn child_of(parent_id: JobId, correlation_id: &str, mut child: NewJob) -> NewJob {
        child.parent_id = Some(parent_id);
        child.correlation_id = correlation_id.to_owned();
        child
    }
}

/// What an insert found for one idempotency key.
#[derive(Debug, Clone)]
pub enum Inserted {
    Created(Job),
    /// The key was taken already; the caller compares `request_hash`.
    Existing(Job),
}

/// Insert jobs for one tenant in one statement, marked as dispatched now. Keys already taken
/// come back as `Existing`, in input order.
///
/// With a `wake` channel the statement itself NOTIFYs it when it creates a job, so the wake-up
/// goes out with the commit (the Postgres transport, `Transport::commit_wake`); otherwise the
/// caller dispatches after commit and calls `undispatch` if that fails.
pub async fn insert_many(
    db: &impl GenericClient,
    tenant_id: TenantId,
    jobs: &[NewJob],
    wake: Option<&str>,
) -> Result<Vec<Inserted>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH input AS (
                 SELECT * FROM unnest($2::uuid[], $1::uuid[], $3::text[], $4::jsonb[],
                        $5::text[], $6::text[], $7::bytea[], $8::uuid[], $9::timestamptz[],
                        $10::int[], $11::int[], $12::text[], $13::int[], $14::text[]) WITH ORDINALITY
                     AS t(id, tenant_id, task_type, params, correlation_id, idempotency_key,
                          request_hash, parent_id, run_at, max_attempts, timeout_seconds,
                          concurrency_key, concurrency_limit, callback_url, ord)
             ), keys AS (
                 -- In key order: two concurrent inserts sharing keys then wait for each other
                 -- instead of deadlocking (found by `relay chaos idempotency`). Among repeats of
                 -- a key, input order: the first item takes the key.
                 INSERT INTO job_keys (tenant_id, idempotency_key, correlation_id, job_id)
                 SELECT tenant_id, idempotency_key, correlation_id, id FROM input ORDER BY idempotency_key, ord
                 ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
                 RETURNING job_id
             ), wake AS (
                 -- One row, always; NOTIFYs $15 (when given) if a job is created. Joined below
                 -- so that it runs; Postgres sends the notification when this commits.
                 SELECT CASE WHEN $15::text IS NOT NULL AND EXISTS (SELECT FROM keys)
                             THEN pg_notify($15, '') END
             )
             INSERT INTO jobs (id, tenant_id, task_type, params, correlation_id, idempotency_key,
                               request_hash, parent_id, run_at, max_attempts, timeout_seconds,
                               concurrency_key, concurrency_limit, callback_url, dispatched_at)
             SELECT id, tenant_id, task_type, params, correlation_id, idempotency_key, request_hash,
                    parent_id, run_at, max_attempts, timeout_seconds, concurrency_key, concurrency_limit,
                    callback_url, now()
             FROM input CROSS JOIN wake WHERE id IN (SELECT job_id FROM keys)
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
    let ckeys: Vec<Option<&str>> = jobs.iter().map(|j| j.concurrency.as_ref().map(|c| c.key.as_str())).collect();
    let climits: Vec<Option<i32>> = jobs.iter().map(|j| j.concurrency.as_ref().map(|c| c.limit)).collect();
    let callbacks: Vec<Option<&str>> = jobs.iter().map(|j| j.callback_url.as_deref()).collect();
    let rows = db
        .query(
            &stmt,
            &[&tenants, &ids, &types, &params, &corr, &keys, &hashes, &parents, &run_ats,
              &max_attempts, &timeouts, &ckeys, &climits, &callbacks, &wake],
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
/// the job is in another state (or not this tenant's); the caller reads it to say why. Its
/// callback delivery is created in the same statement and sent by the next sweep pass.
pub async fn cancel(db: &impl GenericClient, tenant_id: TenantId, id: JobId) -> Result<bool, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH cancelled AS (
                 UPDATE jobs j SET status = 'cancelled', finished_at = now(), updated_at = now()
                 WHERE (id = $1 OR parent_id = $1) AND tenant_id = $2
                   AND status IN ('pending', 'waiting')
                 RETURNING {TERMINAL_RETURNING}
             ), events AS (
                 INSERT INTO job_events (job_id, kind, to_status, attempt, reason)
                 SELECT id, 'cancelled', 'cancelled', attempt, 'cancelled by client' FROM cancelled
             ), {callbacks}
             SELECT count(*) FILTER (WHERE id = $1) FROM cancelled",
            callbacks = super::callbacks::enqueue_ctes("cancelled", false),
        ))
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
        concurrency_key: r.get(8),
    }
}

/// The rows a claim takes: due, pending, not of a paused task type, not locked by another
/// claimer. Shared by every claim shape so they cannot disagree.
const CLAIMABLE: &str = "status = 'pending' AND run_at <= now()
    AND task_type <> ALL (SELECT substr(name, 7) FROM operating_modes
                          WHERE name LIKE 'pause:%' AND enabled)";

/// Claiming has two paths. Jobs without a concurrency key (the hot path) are claimed by
/// `claim_due`, fairly across tenants; jobs with a key by `claim_keyed`, key by key, under a
/// per-key lock (see there).
///
/// `claim_due` is one statement: find each tenant with pending unkeyed jobs by skipping
/// through `jobs_due_free` (tenant_id, run_at), one index probe per tenant, give each an equal
/// share of the claim, and take each one's share of due jobs, oldest first (tenants in random
/// order, which matters only when there are more tenants than jobs to claim). A tenant
/// flooding the queue holds back only itself: a quiet tenant's job is in the very next claim,
/// however deep the flood's backlog. One tenant alone gets the whole claim, as before.
/// `share` comes back so the worker can tell a short claim (nothing more due) from a fair one
/// (some tenant had more). The tenant probes walk the index backwards, from each tenant's
/// newest entry: the oldest entries are those of rows just claimed, dead until vacuum, and
/// only the claim itself should have to step over them.
fn fair_claim_sql() -> String {
    format!(
        "WITH RECURSIVE tenants(tenant_id) AS (
            (SELECT tenant_id FROM jobs WHERE status = 'pending' AND concurrency_key IS NULL
             ORDER BY tenant_id DESC, run_at DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT tenant_id FROM jobs WHERE status = 'pending' AND concurrency_key IS NULL
                      AND tenant_id < t.tenant_id ORDER BY tenant_id DESC, run_at DESC LIMIT 1)
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        ), share AS (
            SELECT ceil($1::int8::float8 / greatest(count(*), 1))::int8 AS n FROM tenants WHERE tenant_id IS NOT NULL
        ), due AS (
            SELECT f.id FROM (SELECT tenant_id FROM tenants WHERE tenant_id IS NOT NULL ORDER BY random()) t
            CROSS JOIN LATERAL (SELECT id FROM jobs
                                WHERE {CLAIMABLE} AND concurrency_key IS NULL AND tenant_id = t.tenant_id
                                ORDER BY tenant_id, run_at LIMIT (SELECT n FROM share) FOR UPDATE SKIP LOCKED) f
            LIMIT $1
        ), claimed AS (
            {CLAIM_UPDATE}
        )
        SELECT c.*, share.n AS share FROM ({CLAIM_SELECT}) c, share"
    )
}

/// `started_at` is the moment of the claim (`clock_timestamp()`), not the start of its
/// transaction: a keyed claim's transaction begins before it takes its key's lock, and the
/// recorded start must not precede the end of the job whose slot it took.
const CLAIM_UPDATE: &str = "UPDATE jobs j SET status = 'running', attempt = j.attempt + 1, resends = 0,
                 lease_until = now() + make_interval(secs => $2), started_at = clock_timestamp(), updated_at = now()
             WHERE j.id = ANY (ARRAY(SELECT id FROM due))
             RETURNING j.id, j.tenant_id, j.task_type, j.params, j.correlation_id, j.attempt,
                 j.max_attempts, j.timeout_seconds, j.concurrency_key";

const CLAIM_SELECT: &str = "SELECT claimed.*, modes.switches FROM claimed,
             (SELECT coalesce(jsonb_object_agg(name, enabled), '{}') AS switches FROM operating_modes) modes";

/// Each distinct concurrency key with pending jobs, found by skipping through
/// `jobs_keyed_pending` (one index probe per key, however many jobs each key holds).
const PENDING_KEYS: &str = "WITH RECURSIVE k(key) AS (
        (SELECT concurrency_key FROM jobs WHERE status = 'pending' AND concurrency_key IS NOT NULL
         ORDER BY concurrency_key LIMIT 1)
        UNION ALL
        SELECT (SELECT concurrency_key FROM jobs WHERE status = 'pending' AND concurrency_key IS NOT NULL
                  AND concurrency_key > k.key ORDER BY concurrency_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    )";

/// For each key in `keys`, the due pending jobs that fit in its free slots (running jobs of
/// the key counted from `jobs_keyed_running`; each job's own limit decides), oldest first.
/// `$1` bounds the rows; `{lock}` is `FOR UPDATE SKIP LOCKED` for a claim.
fn fitting(keys: &str, extra_filter: &str, lock: &str) -> String {
    format!(
        "SELECT c.id, c.run_at FROM ({keys}) k
         CROSS JOIN LATERAL (SELECT count(*) AS running FROM jobs
                             WHERE status = 'running' AND concurrency_key = k.key) r
         CROSS JOIN LATERAL (SELECT id, run_at, concurrency_limit,
                                    row_number() OVER (ORDER BY run_at, id) AS rn
                             FROM (SELECT id, run_at, concurrency_limit FROM jobs
                                   WHERE {CLAIMABLE} AND concurrency_key = k.key {extra_filter}
                                   ORDER BY run_at, id LIMIT $1 {lock}) q) c
         WHERE r.running + c.rn <= c.concurrency_limit"
    )
}

/// Claim up to `limit` due jobs that carry a concurrency key, never more per key than its
/// limit. One transaction of two statements: the first takes a transaction-scoped advisory
/// lock per key with due work (skipping keys another claimer holds right now), the second
/// counts each locked key's running jobs and claims what fits. The second statement's
/// snapshot is taken after the locks, so it sees every claim committed by the previous
/// holder: two claimers can never both fill the same free slot. `only`: claim just these ids
/// (a transport that delivers ids). `within`: claim only jobs whose `timeout_seconds` is at
/// most this (what fits in the time an invocation has left).
pub async fn claim_keyed(
    db: &mut deadpool_postgres::Client,
    limit: i64,
    lease_secs: f64,
    only: Option<&[JobId]>,
    within: Option<i32>,
) -> Result<Claim, StoreError> {
    let tx = db.transaction().await?;
    let lock = "pg_try_advisory_xact_lock(hashtextextended(current_schema() || ':relay.key:' || key, 0))";
    let keys: Vec<String> = match only {
        None => {
            // Keys whose oldest pending job is due and that look free, oldest head first.
            let stmt = tx
                .prepare_cached(&format!(
                    "{PENDING_KEYS}
                     SELECT key FROM (
                         SELECT k.key FROM k
                         CROSS JOIN LATERAL (SELECT run_at, concurrency_limit FROM jobs
                                             WHERE status = 'pending' AND concurrency_key = k.key
                                             ORDER BY run_at LIMIT 1) head
                         WHERE k.key IS NOT NULL AND head.run_at <= now()
                           AND (SELECT count(*) FROM jobs WHERE status = 'running' AND concurrency_key = k.key)
                               < head.concurrency_limit
                         ORDER BY head.run_at LIMIT $1
                     ) free WHERE {lock}"
                ))
                .await?;
            tx.query(&stmt, &[&limit]).await?.iter().map(|r| r.get(0)).collect()
        }
        Some(ids) => {
            let stmt = tx
                .prepare_cached(&format!(
                    "SELECT key FROM (SELECT DISTINCT concurrency_key AS key FROM jobs
                                      WHERE id = ANY($1) AND status = 'pending' AND concurrency_key IS NOT NULL) d
                     WHERE {lock}"
                ))
                .await?;
            tx.query(&stmt, &[&ids]).await?.iter().map(|r| r.get(0)).collect()
        }
    };
    if keys.is_empty() {
        tx.commit().await?;
        return Ok(Claim::default());
    }
    let extra = if only.is_some() { "AND id = ANY($4)" } else { "AND $4::uuid[] IS NULL" };
    let extra = format!("{extra} AND ($5::int4 IS NULL OR timeout_seconds <= $5)");
    let fits = fitting("SELECT unnest($3::text[]) AS key", &extra, "FOR UPDATE SKIP LOCKED");
    let stmt = tx
        .prepare_cached(&format!(
            "WITH due AS (SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1), claimed AS ({CLAIM_UPDATE})
             {CLAIM_SELECT}"
        ))
        .await?;
    let rows = tx.query(&stmt, &[&limit, &lease_secs, &keys, &only, &within]).await?;
    tx.commit().await?;
    let mut claim = Claim::from_rows(&rows);
    claim.more = rows.len() as i64 >= limit;
    Ok(claim)
}

/// Mark and return the due jobs of these keys that fit in their free slots now: the hand-on
/// after keyed jobs finish, so the next job of a key starts promptly on any transport.
pub async fn keyed_ready(db: &impl GenericClient, keys: &[String], limit: i64) -> Result<Vec<Dispatch>, StoreError> {
    let fits = fitting("SELECT DISTINCT unnest($2::text[]) AS key", "", "");
    let stmt = db
        .prepare_cached(&format!(
            "UPDATE jobs j SET dispatched_at = now()
             WHERE j.id = ANY (ARRAY(SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1))
             RETURNING j.id, j.run_at"
        ))
        .await?;
    let rows = db.query(&stmt, &[&limit, &keys]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1) }).collect())
}

/// The sweep's share of keyed jobs: due jobs that fit in a free slot of their key but whose
/// dispatch failed or was lost (`lost_dispatch`): a hand-on or its message was lost. Marked
/// dispatched now, each with a `redispatched` event.
pub async fn take_lost_keyed(db: &impl GenericClient, grace_secs: f64, limit: i64) -> Result<Vec<Dispatch>, StoreError> {
    let fits = fitting(
        &format!("{PENDING_KEYS} SELECT key FROM k WHERE key IS NOT NULL"),
        &format!("AND {}", lost_dispatch("$2")),
        "FOR UPDATE SKIP LOCKED",
    );
    let stmt = db
        .prepare_cached(&format!(
            "WITH lost AS (SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1), marked AS (
                 UPDATE jobs j SET {RESENT} WHERE j.id = ANY (ARRAY(SELECT id FROM lost))
                 RETURNING j.id, j.run_at, j.attempt
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'redispatched', 'pending', 'pending', attempt,
                        'a free slot of its concurrency key was not taken; sent again by the sweep' FROM marked
             )
             SELECT id, run_at FROM marked"
        ))
        .await?;
    let rows = db.query(&stmt, &[&limit, &grace_secs]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1) }).collect())
}

/// Jobs taken by one claim, with the operating modes read in the same statement.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    pub jobs: Vec<ClaimedJob>,
    pub modes: Modes,
    /// More jobs may be due right now: claim again rather than wait for a wake-up.
    pub more: bool,
}

impl Claim {
    fn from_rows(rows: &[Row]) -> Claim {
        let modes = rows.first().map(|r| Modes::from_json(&r.get::<_, Value>("switches"))).unwrap_or_default();
        Claim { jobs: rows.iter().map(claimed_from_row).collect(), modes, more: false }
    }

    /// Add the jobs of another claim; the modes are those of whichever claim took jobs first.
    pub fn merge(&mut self, other: Claim) {
        if self.jobs.is_empty() {
            self.modes = other.modes;
        }
        self.jobs.extend(other.jobs);
        self.more |= other.more;
    }
}

/// Claim up to `limit` due unkeyed jobs, fairly across tenants, under a lease of
/// `lease_secs` (the Postgres-native transport).
pub async fn claim_due(db: &impl GenericClient, limit: i64, lease_secs: f64) -> Result<Claim, StoreError> {
    let stmt = db.prepare_cached(&fair_claim_sql()).await?;
    let rows = db.query(&stmt, &[&limit, &lease_secs]).await?;
    let mut claim = Claim::from_rows(&rows);
    // More may be due when the claim is full, or when some tenant took its whole share.
    let share = rows.first().map_or(0, |r| r.get::<_, i64>("share"));
    let mut per_tenant: HashMap<TenantId, i64> = HashMap::new();
    for job in &claim.jobs {
        *per_tenant.entry(job.tenant_id).or_default() += 1;
    }
    claim.more = rows.len() as i64 >= limit || per_tenant.values().any(|&n| n >= share);
    Ok(claim)
}

/// Claim the named jobs if they are still claimable (a transport that delivers ids, like SQS).
/// A duplicate or stale delivery claims nothing. `within`: claim only jobs whose
/// `timeout_seconds` is at most this (see `defer_unfit` for the ones left).
pub async fn claim_ids(
    db: &impl GenericClient,
    ids: &[JobId],
    lease_secs: f64,
    within: Option<i32>,
) -> Result<Claim, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH due AS (
                 SELECT id FROM jobs WHERE {CLAIMABLE} AND concurrency_key IS NULL AND id = ANY($3)
                   AND ($4::int4 IS NULL OR timeout_seconds <= $4)
                 LIMIT $1 FOR UPDATE SKIP LOCKED
             ), claimed AS (
                 {CLAIM_UPDATE}
             )
             {CLAIM_SELECT}"
        ))
        .await?;
    let limit = i64::try_from(ids.len()).unwrap_or(i64::MAX);
    Ok(Claim::from_rows(&db.query(&stmt, &[&limit, &lease_secs, &ids, &within]).await?))
}

/// Of these ids, the pending jobs whose `timeout_seconds` exceeds `within` (they do not fit in
/// the time an invocation has left): marked dispatched now, each with a `redispatched` event
/// giving the reason, and returned for the caller to send again after commit. Nothing else
/// changes: no attempt is charged.
pub async fn defer_unfit(db: &impl GenericClient, ids: &[JobId], within: i32) -> Result<Vec<Dispatch>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH unfit AS (
                 SELECT id FROM jobs WHERE status = 'pending' AND id = ANY($1) AND timeout_seconds > $2
                 ORDER BY id FOR UPDATE SKIP LOCKED
             ), marked AS (
                 UPDATE jobs j SET dispatched_at = now() WHERE j.id = ANY (ARRAY(SELECT id FROM unfit))
                 RETURNING j.id, j.run_at, j.attempt, j.timeout_seconds
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'redispatched', 'pending', 'pending', attempt,
                        format('not started: its timeout (%s s) does not fit in the %s s the executor''s invocation had left; sent again for a later delivery',
                               timeout_seconds, $2) FROM marked
             )
             SELECT id, run_at FROM marked",
        )
        .await?;
    let rows = db.query(&stmt, &[&ids, &within]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1) }).collect())
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

/// What a terminal write wrote besides the transitions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Succeeded {
    /// The (id, attempt) pairs refused as stale.
    pub refused: Vec<(JobId, i32)>,
    /// Callback deliveries created in the same statement, for the caller to dispatch after
    /// commit.
    pub callbacks: Vec<Dispatch>,
}

/// Columns a terminal write returns for `callbacks::enqueue_ctes`.
const TERMINAL_RETURNING: &str =
    "j.id, j.attempt, j.started_at, j.tenant_id, j.status, j.correlation_id, j.parent_id, j.task_type, j.callback_url";

/// The callback deliveries among a terminal write's rows (`id, is_callback, run_at` last).
fn callbacks_of(rows: &[Row], flag: usize) -> Vec<Dispatch> {
    rows.iter()
        .filter(|r| r.get::<_, bool>(flag))
        .map(|r| Dispatch { id: r.get(0), run_at: r.get(flag + 1) })
        .collect()
}

/// Record successes (fenced). Returns the (id, attempt) pairs refused as stale.
pub async fn succeed(db: &impl GenericClient, done: &[(JobId, i32, Value)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    Ok(succeed_reporting(db, done).await?.refused)
}

/// Record successes (fenced), and create their callback deliveries in the same statement.
pub async fn succeed_reporting(db: &impl GenericClient, done: &[(JobId, i32, Value)]) -> Result<Succeeded, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH done AS (
                 UPDATE jobs j SET status = 'succeeded', result = d.result, lease_until = NULL,
                     last_error = NULL, finished_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::jsonb[]) AS d(id, attempt, result)
                 WHERE j.id = d.id AND j.attempt = d.attempt AND (j.status || '') = 'running'
                 RETURNING {TERMINAL_RETURNING}
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
             ), {callbacks}
             SELECT id, false, NULL::timestamptz FROM done
             UNION ALL SELECT id, true, run_at FROM callbacks",
            callbacks = super::callbacks::enqueue_ctes("done", true),
        ))
        .await?;
    let done = &by_id(done);
    let (ids, attempts) = split(done);
    let results: Vec<&Value> = done.iter().map(|d| &d.2).collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &results]).await?;
    Ok(Succeeded {
        refused: refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows),
        callbacks: callbacks_of(&rows, 1),
    })
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

/// Running jobs that continue themselves: pending again at once, with one more attempt allowed
/// (`max_attempts` raised, at most to 100), so a job making progress in slices does not use
/// up its retries. Fenced; returns the pairs refused as stale.
pub async fn continue_later(db: &impl GenericClient, jobs: &[(JobId, i32, String)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH continued AS (
                 UPDATE jobs j SET status = 'pending', run_at = now(), lease_until = NULL,
                     max_attempts = least(j.max_attempts + 1, 100), last_error = NULL,
                     dispatched_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::text[]) AS c(id, attempt, note)
                 WHERE j.id = c.id AND j.attempt = c.attempt AND (j.status || '') = 'running'
                 RETURNING j.id, j.attempt, j.started_at, c.note
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, 'continued', 'running', 'pending', attempt, started_at, note FROM continued
             )
             SELECT id FROM continued",
        )
        .await?;
    let jobs = &by_id(jobs);
    let (ids, attempts) = split(jobs);
    let notes: Vec<&str> = jobs.iter().map(|j| j.2.as_str()).collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &notes]).await?;
    Ok(refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows))
}

/// Running parents whose children all exist now wait for them (`children_total` set); the
/// sweep finishes them (`finish_parents`). Fenced; returns the pairs refused as stale.
pub async fn wait_running(db: &impl GenericClient, jobs: &[(JobId, i32, i32)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH waiting AS (
                 UPDATE jobs j SET status = 'waiting', children_total = w.total, lease_until = NULL, updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::int[]) AS w(id, attempt, total)
                 WHERE j.id = w.id AND j.attempt = w.attempt AND (j.status || '') = 'running'
                 RETURNING j.id, j.attempt, j.started_at, w.total
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, 'waiting', 'running', 'waiting', attempt, started_at, 'waiting for ' || total || ' children'
                 FROM waiting
             )
             SELECT id FROM waiting",
        )
        .await?;
    let jobs = &by_id(jobs);
    let (ids, attempts) = split(jobs);
    let totals: Vec<i32> = jobs.iter().map(|j| j.2).collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &totals]).await?;
    Ok(refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows))
}

/// Declare how many children a running job will have, before it creates them (fenced), so
/// its progress never counts against a moving total.
pub async fn declare_children(db: &impl GenericClient, id: JobId, attempt: i32, total: i32) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE jobs SET children_total = $3, updated_at = now() WHERE id = $1 AND attempt = $2 AND status = 'running'",
            &[&id, &attempt, &total],
        )
        .await?;
    Ok(n == 1)
}

/// A held job falls due now (a campaign whose last recipient page arrived). Returns the
/// dispatch to send after commit, or `None` when it was no longer pending.
pub async fn release(db: &impl GenericClient, id: JobId) -> Result<Option<Dispatch>, StoreError> {
    let row = db
        .query_opt(
            "UPDATE jobs SET run_at = now(), dispatched_at = now(), updated_at = now()
             WHERE id = $1 AND status = 'pending' RETURNING run_at",
            &[&id],
        )
        .await?;
    Ok(row.map(|r| Dispatch { id, run_at: r.get(0) }))
}

/// How many children a job has.
pub async fn count_children(db: &impl GenericClient, id: JobId) -> Result<i64, StoreError> {
    let stmt = db.prepare_cached("SELECT count(*) FROM jobs WHERE parent_id = $1").await?;
    Ok(db.query_one(&stmt, &[&id]).await?.get(0))
}

/// Why a job fails for good: the kind of exception it opens and the error.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: ExceptionKind,
    pub error: String,
    /// Whose failure it is. A tenant's own (`Fault::Tenant`: a callback URL it set) opens no
    /// operator exception; it is counted in `tenant_faults` instead.
    pub fault: Fault,
}

impl Failure {
    /// A failure operators act on (an exception opens).
    pub fn platform(kind: ExceptionKind, error: impl Into<String>) -> Failure {
        Failure { kind, error: error.into(), fault: Fault::Platform }
    }
}

/// What the terminal-failure path wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failed {
    /// The (id, attempt) pairs refused as stale.
    pub refused: Vec<(JobId, i32)>,
    /// Exceptions newly opened, as (exception id, job id). A job failing again while its
    /// exception is still open (an operator's retry that failed) opens none.
    pub opened: Vec<(Uuid, JobId)>,
    /// Callback deliveries created in the same statement, for the caller to dispatch.
    pub callbacks: Vec<Dispatch>,
}

/// The one terminal-failure path (see `fail_reporting`); returns the pairs refused as stale.
pub async fn fail(db: &impl GenericClient, failures: &[(JobId, i32, Failure)]) -> Result<Vec<(JobId, i32)>, StoreError> {
    Ok(fail_reporting(db, failures).await?.refused)
}

/// The one terminal-failure path: the job becomes `failed` and an exception opens, in one
/// statement, for every task type (a tenant's own failure is counted in `tenant_faults`
/// instead). Fenced. The caller alerts on `opened` after commit
/// (`crate::exceptions::alert_opened`).
pub async fn fail_reporting(db: &impl GenericClient, failures: &[(JobId, i32, Failure)]) -> Result<Failed, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH failed AS (
                 UPDATE jobs j SET status = 'failed', lease_until = NULL, last_error = f.error,
                     finished_at = now(), updated_at = now()
                 FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::uuid[])
                     AS f(id, attempt, kind, error, at_fault)
                 WHERE j.id = f.id AND j.attempt = f.attempt AND (j.status || '') = 'running'
                 RETURNING {TERMINAL_RETURNING}, f.kind, f.error, f.at_fault
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, 'failed', 'running', 'failed', attempt, started_at, kind || ': ' || error FROM failed
             ), opened AS (
                 INSERT INTO exceptions (id, job_id, tenant_id, task_type, kind, cause)
                 SELECT gen_random_uuid(), id, tenant_id, task_type, kind, error FROM failed WHERE at_fault IS NULL
                 ON CONFLICT (job_id) WHERE status = 'open' DO NOTHING
                 RETURNING id, job_id
             ), {faults}, {callbacks}
             SELECT f.id, o.id, false, NULL::timestamptz FROM failed f LEFT JOIN opened o ON o.job_id = f.id
             UNION ALL SELECT id, NULL, true, run_at FROM callbacks",
            callbacks = super::callbacks::enqueue_ctes("failed", true),
            faults = super::tenant_faults::count_cte("failed"),
        ))
        .await?;
    let failures = &by_id(failures);
    let (ids, attempts) = split(failures);
    let kinds: Vec<&str> = failures.iter().map(|f| f.2.kind.as_str()).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.2.error.as_str()).collect();
    let at_fault: Vec<Option<TenantId>> = failures
        .iter()
        .map(|f| match f.2.fault {
            Fault::Platform => None,
            Fault::Tenant(t) => Some(t),
        })
        .collect();
    let rows = db.query(&stmt, &[&ids, &attempts, &kinds, &errors, &at_fault]).await?;
    let opened = rows.iter().filter_map(|r| Some((r.get::<_, Option<Uuid>>(1)?, r.get::<_, JobId>(0)))).collect();
    Ok(Failed {
        refused: refused(&ids.into_iter().zip(attempts).collect::<Vec<_>>(), &rows),
        opened,
        callbacks: callbacks_of(&rows, 2),
    })
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

/// A due pending row whose dispatch failed (`dispatched_at` NULL), or that was sent and not
/// claimed within the grace period (`grace`: a parameter, in seconds) after falling due: its
/// message is presumed lost. Each earlier re-send of the row doubles the wait (`resends`,
/// migration 0011), so a queue that is only behind is not flooded with copies.
fn lost_dispatch(grace: &str) -> String {
    format!(
        "(dispatched_at IS NULL
          OR (dispatched_at < now() - make_interval(secs => {grace}::float8 * (1 << least(resends, 5)))
              AND run_at < now() - make_interval(secs => {grace})))"
    )
}

/// Marks a row sent again by the sweep, counting the re-send when the row had been sent before
/// (a row whose dispatch failed is only now sent for the first time).
const RESENT: &str = "dispatched_at = now(),
    resends = CASE WHEN j.dispatched_at IS NULL THEN j.resends ELSE least(j.resends + 1, 100) END";

/// Find due pending jobs without a concurrency key (keyed ones: `take_lost_keyed`) whose
/// dispatch failed or was lost (`lost_dispatch`), mark them dispatched now and record a
/// `redispatched` event each. Paused task types wait. A fresh row is never taken: its own
/// dispatch is still in flight.
pub async fn take_lost_dispatches(
    db: &impl GenericClient,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Dispatch>, StoreError> {
    let lost = lost_dispatch("$1");
    let stmt = db
        .prepare_cached(&format!(
            "WITH lost AS (
                 SELECT id, dispatched_at IS NULL AS never FROM jobs
                 WHERE {CLAIMABLE} AND concurrency_key IS NULL AND {lost}
                 ORDER BY run_at LIMIT $2 FOR UPDATE SKIP LOCKED
             ), marked AS (
                 UPDATE jobs j SET {RESENT}
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

// ---- fan-out: a parent waits for its children ----

/// Move a pending or running job to `waiting` for `total` children (declared before they are
/// created, so its progress never counts against a moving total). Children are created with
/// `NewJob::child_of` through the intake, in as many chunks as suit. False when the job is in
/// another state or not this tenant's.
pub async fn wait_for_children(db: &impl GenericClient, tenant_id: TenantId, id: JobId, total: i32) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE jobs SET status = 'waiting', children_total = $3, lease_until = NULL, updated_at = now()
             WHERE id = $1 AND tenant_id = $2 AND status IN ('pending', 'running') AND $3 >= 0",
            &[&id, &tenant_id, &total],
        )
        .await?;
    Ok(n == 1)
}

/// Finish waiting parents whose declared children all exist and have all reached a terminal
/// state: each succeeds with `{total, succeeded, failed, cancelled}` (failed children opened
/// their own exceptions), in one statement with its events and callback deliveries. Returns
/// the callback deliveries to dispatch and how many parents finished.
pub async fn finish_parents(db: &impl GenericClient, limit: i64) -> Result<(usize, Vec<Dispatch>), StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH ready AS (
                 SELECT p.id, p.children_total FROM jobs p
                 WHERE p.status = 'waiting'
                   AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.id
                                   AND c.status NOT IN ('succeeded', 'failed', 'cancelled'))
                   AND (SELECT count(*) FROM jobs c WHERE c.parent_id = p.id) >= coalesce(p.children_total, 0)
                 ORDER BY p.updated_at LIMIT $1 FOR UPDATE SKIP LOCKED
             ), counts AS (
                 SELECT r.id, jsonb_build_object(
                            'total', count(c.id),
                            'succeeded', count(c.id) FILTER (WHERE c.status = 'succeeded'),
                            'failed', count(c.id) FILTER (WHERE c.status = 'failed'),
                            'cancelled', count(c.id) FILTER (WHERE c.status = 'cancelled')) AS result
                 FROM ready r LEFT JOIN jobs c ON c.parent_id = r.id GROUP BY r.id
             ), done AS (
                 UPDATE jobs j SET status = 'succeeded', result = counts.result, finished_at = now(), updated_at = now()
                 FROM counts WHERE j.id = counts.id AND j.status = 'waiting'
                 RETURNING {TERMINAL_RETURNING}
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'succeeded', 'waiting', 'succeeded', attempt, 'every child finished' FROM done
             ), {callbacks}
             SELECT id, false, NULL::timestamptz FROM done
             UNION ALL SELECT id, true, run_at FROM callbacks",
            callbacks = super::callbacks::enqueue_ctes("done", true),
        ))
        .await?;
    let rows = db.query(&stmt, &[&limit]).await?;
    let callbacks = callbacks_of(&rows, 1);
    Ok((rows.len() - callbacks.len(), callbacks))
}

/// Which of these ids name no job at all.
pub async fn missing(db: &impl GenericClient, ids: &[JobId]) -> Result<Vec<JobId>, StoreError> {
    let rows = db
        .query("SELECT id FROM unnest($1::uuid[]) AS i(id) WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = i.id)", &[&ids])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
