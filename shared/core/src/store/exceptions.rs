//! Exceptions and their audit (`exception_actions`). Exceptions are opened only by the
//! terminal-failure path (`jobs::fail_reporting`) and resolved by the system in
//! `jobs::succeed`; operators read, list and close them here, each close with an audit row.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{GenericClient, StoreError, decode};
use crate::job::{ExceptionKind, JobId, TenantId};

// Stored as text (`exceptions.status`), the names serde writes; text no variant names is
// `StoreError::UnknownValue` when read. (Not a doc comment: the OpenAPI document shows that.)
/// An exception's status: open until an operator (or the system, when its job later succeeds)
/// closes it as resolved or ignored.
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
pub enum ExceptionStatus {
    Open,
    Resolved,
    Ignored,
}

impl ExceptionStatus {
    pub const ALL: [ExceptionStatus; 3] = [Self::Open, Self::Resolved, Self::Ignored];

    /// The name serde writes, stored as the row's text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Strict: only the names `as_str` gives.
    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Exception {
    pub id: Uuid,
    #[schema(value_type = Uuid)]
    pub job_id: JobId,
    #[schema(value_type = Uuid)]
    pub tenant_id: TenantId,
    pub task_type: String,
    /// Why the job failed for good: attempts_exhausted, fatal_error, ambiguous_outcome, ...
    #[schema(value_type = String)]
    pub kind: ExceptionKind,
    /// The error that opened it.
    pub cause: String,
    /// open, resolved or ignored.
    #[schema(value_type = String)]
    pub status: ExceptionStatus,
    pub opened_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    /// `system` or the operator's name.
    pub closed_by: Option<String>,
    pub close_reason: Option<String>,
}

const COLUMNS: &str =
    "id, job_id, tenant_id, task_type, kind, cause, status, opened_at, closed_at, closed_by, close_reason";

impl Exception {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(Exception {
            id: r.get(0),
            job_id: r.get(1),
            tenant_id: r.get(2),
            task_type: r.get(3),
            kind: r.get::<_, &str>(4).parse()?,
            cause: r.get(5),
            status: decode("exceptions.status", r.get(6), ExceptionStatus::parse)?,
            opened_at: r.get(7),
            closed_at: r.get(8),
            closed_by: r.get(9),
            close_reason: r.get(10),
        })
    }
}

/// The exceptions of one job, newest first.
pub async fn for_job(db: &impl GenericClient, job_id: JobId) -> Result<Vec<Exception>, StoreError> {
    let rows = db
        .query(&format!("SELECT {COLUMNS} FROM exceptions WHERE job_id = $1 ORDER BY opened_at DESC"), &[&job_id])
        .await?;
    rows.iter().map(Exception::from_row).collect()
}

/// How many exceptions are open.
pub async fn count_open(db: &impl GenericClient) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT count(*) FROM exceptions WHERE status = 'open'", &[]).await?.get(0))
}

/// Filters for listing exceptions, newest first. All optional but `limit`.
#[derive(Debug, Clone, Default)]
pub struct ExceptionFilter {
    pub status: Option<ExceptionStatus>,
    pub kind: Option<String>,
    pub task_type: Option<String>,
    pub tenant_id: Option<TenantId>,
    /// A substring of the cause (case-insensitive).
    pub cause: Option<String>,
    /// Resume before this (opened_at, id): the cursor of the previous page.
    pub before: Option<(DateTime<Utc>, Uuid)>,
    pub limit: i64,
}

pub async fn list(db: &impl GenericClient, f: &ExceptionFilter) -> Result<Vec<Exception>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM exceptions
             WHERE ($1::text IS NULL OR status = $1)
               AND ($2::text IS NULL OR kind = $2)
               AND ($3::text IS NULL OR task_type = $3)
               AND ($4::uuid IS NULL OR tenant_id = $4)
               AND ($5::text IS NULL OR strpos(lower(cause), lower($5)) > 0)
               AND ($6::timestamptz IS NULL OR (opened_at, id) < ($6, $7::uuid))
             ORDER BY opened_at DESC, id DESC
             LIMIT $8"
        ))
        .await?;
    let (before_at, before_id) = f.before.map_or((None, None), |(a, i)| (Some(a), Some(i)));
    let status = f.status.map(ExceptionStatus::as_str);
    let rows = db
        .query(&stmt, &[&status, &f.kind, &f.task_type, &f.tenant_id, &f.cause, &before_at, &before_id, &f.limit])
        .await?;
    rows.iter().map(Exception::from_row).collect()
}

pub async fn get(db: &impl GenericClient, id: Uuid) -> Result<Option<Exception>, StoreError> {
    let row = db.query_opt(&format!("SELECT {COLUMNS} FROM exceptions WHERE id = $1"), &[&id]).await?;
    row.as_ref().map(Exception::from_row).transpose()
}

/// Lock an exception for an action in the caller's transaction (concurrent actions on one
/// exception take turns; the second sees what the first did).
pub async fn lock(db: &impl GenericClient, id: Uuid) -> Result<Option<Exception>, StoreError> {
    let row = db.query_opt(&format!("SELECT {COLUMNS} FROM exceptions WHERE id = $1 FOR UPDATE"), &[&id]).await?;
    row.as_ref().map(Exception::from_row).transpose()
}

/// Close an open exception as `resolved` or `ignored`. Returns false when it was not open.
pub async fn close(
    db: &impl GenericClient,
    id: Uuid,
    status: ExceptionStatus,
    closed_by: &str,
    reason: &str,
) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE exceptions SET status = $2, closed_at = now(), closed_by = $3, close_reason = $4
             WHERE id = $1 AND status = 'open'",
            &[&id, &status.as_str(), &closed_by, &reason],
        )
        .await?;
    Ok(n == 1)
}

/// One audited action on an exception.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExceptionAction {
    pub exception_id: Uuid,
    #[schema(value_type = Uuid)]
    pub job_id: JobId,
    /// retry, cancel, finish, ignore, or resolve (the system's own).
    pub action: String,
    /// The operator's name, or `system`.
    pub actor: String,
    pub reason: Option<String>,
    pub detail: Option<Value>,
    pub at: DateTime<Utc>,
}

/// Write an audit row (in the caller's transaction, beside the change it records).
pub async fn record_action(
    db: &impl GenericClient,
    exception_id: Uuid,
    job_id: JobId,
    action: &str,
    actor: &str,
    reason: Option<&str>,
    detail: Option<&Value>,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO exception_actions (exception_id, job_id, action, actor, reason, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[&exception_id, &job_id, &action, &actor, &reason, &detail],
    )
    .await?;
    Ok(())
}

/// An exception's audit trail, oldest first.
pub async fn actions(db: &impl GenericClient, exception_id: Uuid) -> Result<Vec<ExceptionAction>, StoreError> {
    let rows = db
        .query(
            "SELECT exception_id, job_id, action, actor, reason, detail, at FROM exception_actions
             WHERE exception_id = $1 ORDER BY id",
            &[&exception_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ExceptionAction {
            exception_id: r.get(0),
            job_id: r.get(1),
            action: r.get(2),
            actor: r.get(3),
            reason: r.get(4),
            detail: r.get(5),
            at: r.get(6),
        })
        .collect())
}

/// An open exception no alert email has gone out for.
#[derive(Debug, Clone)]
pub struct Unalerted {
    pub id: Uuid,
    pub job_id: JobId,
    pub tenant: String,
    pub task_type: String,
    pub kind: ExceptionKind,
    pub cause: String,
    pub opened_at: DateTime<Utc>,
    pub correlation_id: String,
}

/// Open exceptions opened since `since` without an alert, oldest first. Exceptions of alert
/// jobs themselves (correlation `relay-alert:...`) never alert: no alert about an alert.
pub async fn unalerted(
    db: &impl GenericClient,
    since: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<Unalerted>, StoreError> {
    let rows = db
        .query(
            "SELECT e.id, e.job_id, t.name, e.task_type, e.kind, e.cause, e.opened_at, j.correlation_id
             FROM exceptions e JOIN jobs j ON j.id = e.job_id JOIN tenants t ON t.id = e.tenant_id
             WHERE e.status = 'open' AND e.alerted_at IS NULL AND e.opened_at > $1
               AND j.correlation_id NOT LIKE 'relay-alert:%'
             ORDER BY e.opened_at LIMIT $2",
            &[&since, &limit],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Unalerted {
                id: r.get(0),
                job_id: r.get(1),
                tenant: r.get(2),
                task_type: r.get(3),
                kind: r.get::<_, &str>(4).parse()?,
                cause: r.get(5),
                opened_at: r.get(6),
                correlation_id: r.get(7),
            })
        })
        .collect()
}

/// Record that these exceptions' alerts are queued.
pub async fn mark_alerted(db: &impl GenericClient, ids: &[Uuid]) -> Result<(), StoreError> {
    db.execute("UPDATE exceptions SET alerted_at = now() WHERE id = ANY($1) AND alerted_at IS NULL", &[&ids]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored, shown and parsed by the name serde writes, and by no other spelling.
    #[test]
    fn each_exceptionstatus_is_its_serde_name() {
        for v in ExceptionStatus::ALL {
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
            assert_eq!(v.to_string(), v.as_str());
            assert_eq!(ExceptionStatus::parse(v.as_str()), Some(v));
        }
        assert_eq!(ExceptionStatus::parse("Open"), None);
        assert_eq!(ExceptionStatus::parse(""), None);
    }
}
