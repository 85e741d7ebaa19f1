//! Reading jobs: one tenant's job, its change feed and its history; children counted; ids
//! that name no job.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{JOB_COLUMNS, Job};
use crate::job::{JobId, JobStatus, TenantId};
use crate::store::{GenericClient, StoreError, decode};

/// One job of one tenant; another tenant's job is indistinguishable from a missing one.
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::get"))]
pub async fn get(db: &impl GenericClient, tenant_id: TenantId, id: JobId) -> Result<Option<Job>, StoreError> {
    let stmt = db.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 AND tenant_id = $2")).await?;
    db.query_opt(&stmt, &[&id, &tenant_id]).await?.as_ref().map(Job::from_row).transpose()
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
            &[&tenant_id, &status, &f.task_type, &f.correlation_id, &f.updated_since, &after_at, &after_id, &f.limit],
        )
        .await?;
    rows.iter().map(Job::from_row).collect::<Result<_, _>>()
}

/// One step of a job's history. `submitted`, `claimed` and the `succeeded` that ends a running
/// attempt are not rows of `job_events`: they are read from the job row (`created_at`; its
/// status, attempt, `started_at` and `finished_at`) and from the `started_at` of the event
/// that ends each earlier attempt, so the hot path writes no extra row.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobEvent {
    pub at: DateTime<Utc>,
    /// `submitted`, `claimed` (one per attempt), then what ends an attempt or acts outside one:
    /// `succeeded`, `retry_scheduled`, `failed`, `cancelled`, `lease_expired`, `redispatched`,
    /// `waiting`, `continued`, and the operator's `operator_retry`, `force_finished`,
    /// `exception_ignored`.
    #[schema(value_type = String)]
    pub kind: EventKind,
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    pub attempt: i32,
    /// When the attempt this event ends (or, for `claimed`, begins) was claimed.
    pub started_at: Option<DateTime<Utc>>,
    pub reason: Option<String>,
}

/// What a step of a job's history is. Stored as text (`job_events.kind`, whose CHECK lists the
/// recorded ones), the names serde writes; text no variant names is `StoreError::UnknownValue`
/// when read. `Submitted` and `Claimed` are never stored: they are derived from the job row.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EventKind {
    Submitted,
    Claimed,
    Succeeded,
    RetryScheduled,
    Failed,
    Cancelled,
    LeaseExpired,
    Redispatched,
    Waiting,
    Continued,
    OperatorRetry,
    ForceFinished,
    ExceptionIgnored,
    /// A fenced write refused as stale. The table's CHECK still allows it and a history written
    /// by an early build may hold it; no current write records it.
    StaleWriteRefused,
}

impl EventKind {
    /// Every kind a job's history can hold, in the order a job first meets them.
    pub const ALL: [EventKind; 14] = [
        Self::Submitted,
        Self::Claimed,
        Self::Succeeded,
        Self::RetryScheduled,
        Self::Failed,
        Self::Cancelled,
        Self::LeaseExpired,
        Self::Redispatched,
        Self::Waiting,
        Self::Continued,
        Self::OperatorRetry,
        Self::ForceFinished,
        Self::ExceptionIgnored,
        Self::StaleWriteRefused,
    ];

    /// The name serde writes, stored as the row's text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Strict: only the names `as_str` gives.
    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

impl JobEvent {
    /// From a row of `at, kind, from_status, to_status, attempt, started_at, reason`.
    pub(crate) fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(JobEvent {
            at: r.get(0),
            kind: decode("job_events.kind", r.get(1), EventKind::parse)?,
            from_status: r.get(2),
            to_status: r.get(3),
            attempt: r.get(4),
            started_at: r.get(5),
            reason: r.get(6),
        })
    }

    fn derived(
        at: DateTime<Utc>,
        kind: EventKind,
        from: Option<&str>,
        to: &str,
        attempt: i32,
        started_at: Option<DateTime<Utc>>,
    ) -> Self {
        let from_status = from.map(str::to_owned);
        JobEvent { at, kind, from_status, to_status: Some(to.into()), attempt, started_at, reason: None }
    }
}

/// A job's recorded events (in their order) with its submission, each attempt's claim and a
/// running attempt's success merged in by time. `job` is the row's `created_at, status,
/// attempt, started_at, finished_at` (`ORIGIN`).
pub(crate) fn with_derived(job: Option<&Row>, recorded: Vec<JobEvent>) -> Vec<JobEvent> {
    let Some(job) = job else { return recorded };
    let (status, attempt): (&str, i32) = (job.get(1), job.get(2));
    let started: Option<DateTime<Utc>> = job.get(3);
    // A success no row records ended the current attempt: fenced successes write none.
    let success = (status == "succeeded"
        && !recorded.iter().any(|e| e.attempt == attempt && e.to_status.as_deref() == Some("succeeded")))
    .then(|| job.get::<_, Option<DateTime<Utc>>>(4))
    .flatten()
    .map(|at| JobEvent::derived(at, EventKind::Succeeded, Some("running"), "succeeded", attempt, started));
    let mut claims: Vec<(DateTime<Utc>, i32)> =
        recorded.iter().filter_map(|e| e.started_at.map(|s| (s, e.attempt))).collect();
    if (status == "running" || success.is_some())
        && let Some(started) = started
    {
        claims.push((started, attempt));
    }
    claims.sort();
    claims.dedup();
    let derived = std::iter::once(JobEvent::derived(job.get(0), EventKind::Submitted, None, "pending", 0, None))
        .chain(claims.into_iter().map(|(at, attempt)| {
            JobEvent::derived(at, EventKind::Claimed, Some("pending"), "running", attempt, Some(at))
        }))
        .chain(success);
    let mut derived = derived.peekable();
    let mut out = Vec::with_capacity(recorded.len() * 2 + 2);
    for e in recorded {
        while let Some(d) = derived.next_if(|d| d.at <= e.at) {
            out.push(d);
        }
        out.push(e);
    }
    out.extend(derived);
    out
}

/// The job row's part of its history (see `with_derived`).
pub(crate) const ORIGIN: &str = "SELECT created_at, status, attempt, started_at, finished_at FROM jobs WHERE id = $1";

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
    let job = db.query_opt(&format!("{ORIGIN} AND tenant_id = $2"), &[&id, &tenant_id]).await?;
    let recorded = rows.iter().map(JobEvent::from_row).collect::<Result<_, _>>()?;
    Ok(with_derived(job.as_ref(), recorded))
}

/// How many children a job has.
pub async fn count_children(db: &impl GenericClient, id: JobId) -> Result<i64, StoreError> {
    let stmt = db.prepare_cached("SELECT count(*) FROM jobs WHERE parent_id = $1").await?;
    Ok(db.query_one(&stmt, &[&id]).await?.get(0))
}

/// The tenant of each of these jobs (those that exist).
pub async fn tenants_of(
    db: &impl GenericClient,
    ids: &[JobId],
) -> Result<std::collections::HashMap<JobId, TenantId>, StoreError> {
    let stmt = db.prepare_cached("SELECT id, tenant_id FROM jobs WHERE id = ANY($1)").await?;
    Ok(db.query(&stmt, &[&ids]).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored, shown and parsed by the name serde writes, and by no other spelling.
    #[test]
    fn each_eventkind_is_its_serde_name() {
        for v in EventKind::ALL {
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
            assert_eq!(v.to_string(), v.as_str());
            assert_eq!(EventKind::parse(v.as_str()), Some(v));
        }
        assert_eq!(EventKind::parse("RetryScheduled"), None);
        assert_eq!(EventKind::parse(""), None);
    }
}
