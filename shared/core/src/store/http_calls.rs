//! Every `http.request` call (`http_calls`): recorded as `sending` under the job's fence before
//! the request leaves, then settled with what happened; shadowed calls with what would have
//! been sent.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::{Fence, JobId, TenantId};

/// One call as a tenant reads it (`GET /v1/jobs/{id}/http-calls`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Call {
    pub id: i64,
    pub destination: String,
    pub attempt: i32,
    /// `sending` (no outcome recorded: the worker stopped mid-call), `succeeded`, `retryable`,
    /// `fatal`, `ambiguous`, `shadowed` (not sent) or `refused` (the address guard).
    pub outcome: String,
    /// Method, URL, headers (the secret redacted) and body: what was, or would have been, sent.
    pub request: Value,
    pub http_status: Option<i32>,
    /// Status, recorded headers and the body (truncated) of the answer, when there was one.
    pub response: Option<Value>,
    pub error: Option<String>,
    pub duration_ms: Option<i32>,
    pub at: DateTime<Utc>,
}

const COLUMNS: &str = "id, destination, attempt, outcome, request, http_status, response, error, duration_ms, at";

impl Call {
    fn from_row(r: &Row) -> Self {
        Call {
            id: r.get(0),
            destination: r.get(1),
            attempt: r.get(2),
            outcome: r.get(3),
            request: r.get(4),
            http_status: r.get(5),
            response: r.get(6),
            error: r.get(7),
            duration_ms: r.get(8),
            at: r.get(9),
        }
    }
}

/// A call about to be made (or shadowed).
#[derive(Debug, Clone)]
pub struct NewCall<'a> {
    pub fence: Fence,
    pub tenant_id: TenantId,
    pub destination: &'a str,
    pub outcome: &'a str,
    pub request: &'a Value,
    pub error: Option<&'a str>,
}

/// Record a call under the job's fence; `None` when this attempt no longer holds the job (it
/// must not call).
pub async fn record(db: &impl GenericClient, c: &NewCall<'_>) -> Result<Option<i64>, StoreError> {
    let row = db
        .query_opt(
            "INSERT INTO http_calls (job_id, tenant_id, destination, attempt, outcome, request, error)
             SELECT $1, $2, $3, $4, $5, $6, $7
             WHERE EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND attempt = $4 AND status = 'running')
             RETURNING id",
            &[&c.fence.job, &c.tenant_id, &c.destination, &c.fence.attempt, &c.outcome, c.request, &c.error],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// What `record_sending` came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sending {
    /// The call is on record as `sending`: it may leave.
    Recorded(i64),
    /// The destination already has `max_in_flight` calls in flight: not recorded, not to call.
    Full { in_flight: i64 },
    /// This attempt no longer holds the job: not recorded, not to call.
    Fenced,
}

/// Below this many places from its `max_in_flight`, a destination's calls are recorded under
/// its lock (`record_sending`); further below, without it: the lock is held to the commit, so
/// it allows one call per commit. Far from the limit the count is taken without it: the limit
/// then holds as long as fewer than this many connections record calls to one destination in
/// the same instant (each can add one call the others' counts miss).
pub const LOCK_MARGIN: i64 = 32;

/// Record a call as `sending` under the job's fence, if its destination has fewer than
/// `max_in_flight` calls in flight: those recorded `sending` whose attempt still runs (a call
/// whose worker died stops counting when its lease is returned). Near the limit (within
/// `LOCK_MARGIN`) one transaction holds the destination's advisory lock and counts after it,
/// so concurrent workers never put more than `max_in_flight` calls in flight together.
pub async fn record_sending(
    db: &mut deadpool_postgres::Client,
    c: &NewCall<'_>,
    max_in_flight: i32,
) -> Result<Sending, StoreError> {
    let max = i64::from(max_in_flight);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&c.fence.job, &c.tenant_id, &c.destination, &c.fence.attempt, c.request, &(max - LOCK_MARGIN)];
    // Far from the limit: one statement, no lock.
    let row = db.query_one(RECORD_IF_ROOM, &params).await?;
    let (id, in_flight): (Option<i64>, i64) = (row.get(0), row.get(1));
    if let Some(id) = id {
        return Ok(Sending::Recorded(id));
    }
    if in_flight < max - LOCK_MARGIN {
        return Ok(Sending::Fenced);
    }
    let tx = db.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || ':relay.destination:' || $1::uuid::text || ':' || $2::text, 0))",
        &[&c.tenant_id, &c.destination],
    )
    .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&c.fence.job, &c.tenant_id, &c.destination, &c.fence.attempt, c.request, &max];
    let row = tx.query_one(RECORD_IF_ROOM, &params).await?;
    tx.commit().await?;
    let (id, in_flight): (Option<i64>, i64) = (row.get(0), row.get(1));
    Ok(match id {
        Some(id) => Sending::Recorded(id),
        None if in_flight >= max => Sending::Full { in_flight },
        None => Sending::Fenced,
    })
}

/// The destination's calls in flight now (`record_sending`'s count, read alone): a job that
/// would find no place defers before it takes a rate slot or writes anything.
pub async fn in_flight(db: &impl GenericClient, tenant: TenantId, destination: &str) -> Result<i64, StoreError> {
    let row = db.query_one(&format!("{FLYING} SELECT n FROM flying"), &[&tenant, &destination]).await?;
    Ok(row.get(0))
}

/// The calls in flight to destination (`$1` tenant, `$2` name), as the CTE `flying(n)`.
const FLYING: &str = "WITH flying AS (
         SELECT count(*) AS n FROM http_calls h
         JOIN jobs j ON j.id = h.job_id AND j.attempt = h.attempt AND (j.status || '') = 'running'
         WHERE h.tenant_id = $1 AND h.destination = $2 AND h.outcome = 'sending'
     )";

/// Insert the call as `sending` if the job's attempt still runs and its destination has fewer
/// than `$6` calls in flight; returns the new id (or NULL) and the count.
const RECORD_IF_ROOM: &str = "WITH flying AS (
         SELECT count(*) AS n FROM http_calls h
         JOIN jobs j ON j.id = h.job_id AND j.attempt = h.attempt AND (j.status || '') = 'running'
         WHERE h.tenant_id = $2 AND h.destination = $3 AND h.outcome = 'sending'
     ), added AS (
         INSERT INTO http_calls (job_id, tenant_id, destination, attempt, outcome, request, error)
         SELECT $1, $2, $3, $4, 'sending', $5, NULL
         WHERE EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND attempt = $4 AND status = 'running')
           AND (SELECT n FROM flying) < $6
         RETURNING id
     )
     SELECT (SELECT id FROM added), (SELECT n FROM flying)";

/// How a call ended.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    pub outcome: &'static str,
    pub http_status: Option<i32>,
    pub response: Option<Value>,
    pub error: Option<String>,
    pub duration_ms: Option<i32>,
}

/// Settle a call recorded as `sending`.
pub async fn settle(db: &impl GenericClient, id: i64, s: &Settled) -> Result<(), StoreError> {
    db.execute(
        "UPDATE http_calls SET outcome = $2, http_status = $3, response = $4, error = $5, duration_ms = $6
         WHERE id = $1 AND outcome = 'sending'",
        &[&id, &s.outcome, &s.http_status, &s.response, &s.error, &s.duration_ms],
    )
    .await?;
    Ok(())
}

/// A call of an earlier attempt of this job with no recorded outcome (its worker stopped
/// mid-call): whether it reached the destination is unknown.
pub async fn unsettled(db: &impl GenericClient, job: JobId, before_attempt: i32) -> Result<Option<Call>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM http_calls WHERE job_id = $1 AND attempt < $2 AND outcome = 'sending' ORDER BY id LIMIT 1"
    );
    Ok(db.query_opt(&sql, &[&job, &before_attempt]).await?.as_ref().map(Call::from_row))
}

/// A job's calls, oldest first (the caller has checked the job is the tenant's).
pub async fn for_job(db: &impl GenericClient, tenant: TenantId, job: JobId) -> Result<Vec<Call>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM http_calls WHERE job_id = $1 AND tenant_id = $2 ORDER BY id");
    Ok(db.query(&sql, &[&job, &tenant]).await?.iter().map(Call::from_row).collect())
}

/// The last call to each of a tenant's destinations: (destination, outcome, http status, at).
pub async fn last_per_destination(
    db: &impl GenericClient,
    tenant: TenantId,
) -> Result<Vec<(String, String, Option<i32>, DateTime<Utc>)>, StoreError> {
    let rows = db
        .query(
            "SELECT d.name, c.outcome, c.http_status, c.at FROM http_destinations d
             CROSS JOIN LATERAL (SELECT outcome, http_status, at FROM http_calls
                                 WHERE tenant_id = d.tenant_id AND destination = d.name ORDER BY id DESC LIMIT 1) c
             WHERE d.tenant_id = $1",
            &[&tenant],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect())
}
