//! Writing jobs in: the intake's batched insert, keyed by idempotency key, and the dispatch
//! marks around it (cleared when a dispatch fails, set when a held job is released).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{JOB_COLUMNS, Job};
use crate::job::terms::{Concurrency, CorrelationId, IdempotencyKey, Limits, RequestHash};
use crate::job::{Dispatch, JobId, TenantId};
use crate::store::{GenericClient, StoreError};

/// A job to insert. Its terms hold their bounds by type (`job::terms`), so the `jobs` table
/// keeps no checks of its own for them.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub task_type: String,
    pub params: Value,
    pub correlation_id: CorrelationId,
    pub idempotency_key: IdempotencyKey,
    pub request_hash: RequestHash,
    pub parent_id: Option<JobId>,
    pub run_at: DateTime<Utc>,
    pub limits: Limits,
    /// At most `limit` jobs of this key run at once.
    pub concurrency: Option<Concurrency>,
    pub callback_url: Option<String>,
}

impl NewJob {
    /// A job of `task_type` due now, on the default limits, correlated by its own id, its
    /// request hashed from `params`. Fields not named here are set by struct update.
    pub fn new(task_type: &str, params: Value, idempotency_key: IdempotencyKey) -> NewJob {
        let id = JobId::new();
        NewJob {
            id,
            task_type: task_type.to_owned(),
            request_hash: RequestHash::of(params.to_string().as_bytes()),
            params,
            correlation_id: CorrelationId::of_job(id),
            idempotency_key,
            parent_id: None,
            run_at: Utc::now(),
            limits: Limits::DEFAULT,
            concurrency: None,
            callback_url: None,
        }
    }

    /// A child of the parent `parent_id`: it carries the parent's correlation id. Fields not
    /// named here are the request's own.
    pub fn child_of(parent_id: JobId, correlation_id: &CorrelationId, mut child: NewJob) -> NewJob {
        child.parent_id = Some(parent_id);
        child.correlation_id = correlation_id.clone();
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
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::insert_many"))]
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
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    let types: Vec<&str> = jobs.iter().map(|j| j.task_type.as_str()).collect();
    let params: Vec<&Value> = jobs.iter().map(|j| &j.params).collect();
    let corr: Vec<&str> = jobs.iter().map(|j| j.correlation_id.as_str()).collect();
    let keys: Vec<&str> = jobs.iter().map(|j| j.idempotency_key.as_str()).collect();
    let hashes: Vec<&[u8]> = jobs.iter().map(|j| j.request_hash.as_bytes()).collect();
    let parents: Vec<Option<JobId>> = jobs.iter().map(|j| j.parent_id).collect();
    let run_ats: Vec<DateTime<Utc>> = jobs.iter().map(|j| j.run_at).collect();
    let max_attempts: Vec<i32> = jobs.iter().map(|j| j.limits.max_attempts()).collect();
    let timeouts: Vec<i32> = jobs.iter().map(|j| j.limits.timeout_seconds()).collect();
    let ckeys: Vec<Option<&str>> = jobs.iter().map(|j| j.concurrency.as_ref().map(Concurrency::key)).collect();
    let climits: Vec<Option<i32>> = jobs.iter().map(|j| j.concurrency.as_ref().map(Concurrency::limit)).collect();
    let callbacks: Vec<Option<&str>> = jobs.iter().map(|j| j.callback_url.as_deref()).collect();
    let rows = db
        .query(
            &stmt,
            &[
                &tenants,
                &ids,
                &types,
                &params,
                &corr,
                &keys,
                &hashes,
                &parents,
                &run_ats,
                &max_attempts,
                &timeouts,
                &ckeys,
                &climits,
                &callbacks,
                &wake,
            ],
        )
        .await?;
    let mut created: std::collections::HashMap<String, Job> =
        rows.iter().map(|r| Job::from_row(r).map(|j| (j.idempotency_key.clone(), j))).collect::<Result<_, _>>()?;
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
        let key = job.idempotency_key.as_str();
        if let Some(j) = created.remove(key) {
            existing.insert(key.to_owned(), j.clone());
            out.push(Inserted::Created(j));
        } else if let Some(j) = existing.get(key) {
            out.push(Inserted::Existing(j.clone()));
        } else {
            // ON CONFLICT waited for any concurrent insert of the key, so the row existed a
            // moment ago; only a deletion in between (retention) lands here.
            return Err(StoreError::Vanished(format!("idempotency key {:?}", key)));
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
    db.query(&stmt, &[&tenant_id, &keys]).await?.iter().map(Job::from_row).collect::<Result<_, _>>()
}

/// Clear the dispatch mark of jobs whose dispatch failed, so the sweep sends them at once.
pub async fn undispatch(db: &impl GenericClient, ids: &[JobId]) -> Result<(), StoreError> {
    db.execute("UPDATE jobs SET dispatched_at = NULL WHERE id = ANY($1) AND status = 'pending'", &[&ids]).await?;
    Ok(())
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
    Ok(row.map(|r| Dispatch { id, run_at: r.get(0), tenant: None }))
}
