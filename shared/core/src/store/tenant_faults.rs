//! Tenant faults: a tenant's own failures counted per tenant and cause instead of one operator
//! exception per job. Rows are written by the terminal-failure path (`jobs::fail_reporting`)
//! for task types whose failures are the tenant's; operators read them here, and the sweep
//! signals each row at most once per `SIGNAL_EVERY`, only when it grew since its last signal.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::{ExceptionKind, JobId, TenantId};

/// The shortest time between two signals about one tenant and cause.
pub const SIGNAL_EVERY: chrono::Duration = chrono::Duration::hours(1);

/// One tenant's failures of one kind, for one task type.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TenantFault {
    #[schema(value_type = uuid::Uuid)]
    pub tenant_id: TenantId,
    pub task_type: String,
    /// fatal_error, attempts_exhausted, ...
    #[schema(value_type = String)]
    pub kind: ExceptionKind,
    /// Jobs failed this way, in all.
    pub count: i64,
    pub last_error: String,
    #[schema(value_type = uuid::Uuid)]
    pub last_job_id: JobId,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
    /// When operators were last told about it.
    pub signalled_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "tenant_id, task_type, kind, count, last_error, last_job_id, first_at, last_at, signalled_at";

impl TenantFault {
    fn from_row(r: &Row) -> Result<TenantFault, StoreError> {
        Ok(TenantFault {
            tenant_id: r.get(0),
            task_type: r.get(1),
            kind: r.get::<_, &str>(2).parse()?,
            count: r.get(3),
            last_error: r.get(4),
            last_job_id: r.get(5),
            first_at: r.get(6),
            last_at: r.get(7),
            signalled_at: r.get(8),
        })
    }
}

/// The statement part that counts failed rows (`source`: a CTE with `id, task_type, kind,
/// error, at_fault`, the tenant whose fault it is or NULL) into `tenant_faults`, for
/// `jobs::fail_reporting`.
pub(super) fn count_cte(source: &str) -> String {
    format!(
        "faults AS (
             INSERT INTO tenant_faults AS t (tenant_id, task_type, kind, count, last_error, last_job_id)
             SELECT at_fault, task_type, kind, count(*), max(error), max(id::text)::uuid FROM {source}
             WHERE at_fault IS NOT NULL
             GROUP BY at_fault, task_type, kind
             ON CONFLICT (tenant_id, task_type, kind) DO UPDATE
             SET count = t.count + excluded.count, last_error = excluded.last_error,
                 last_job_id = excluded.last_job_id, last_at = now()
         )"
    )
}

/// Every tenant fault, most recent first; `tenant` narrows to one tenant.
pub async fn list(
    db: &impl GenericClient,
    tenant: Option<TenantId>,
    limit: i64,
) -> Result<Vec<TenantFault>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM tenant_faults WHERE ($1::uuid IS NULL OR tenant_id = $1) ORDER BY last_at DESC LIMIT $2"
    );
    db.query(&sql, &[&tenant, &limit]).await?.iter().map(TenantFault::from_row).collect()
}

/// Take the rows due a signal (new since their last one, and none in `SIGNAL_EVERY`), marking
/// them signalled in the same statement, so concurrent sweepers signal each once.
pub async fn take_due_signals(db: &impl GenericClient, limit: i64) -> Result<Vec<TenantFault>, StoreError> {
    let sql = format!(
        "UPDATE tenant_faults t SET signalled_at = now()
         FROM (SELECT tenant_id, task_type, kind FROM tenant_faults
               WHERE signalled_at IS NULL OR (last_at > signalled_at AND signalled_at < now() - make_interval(secs => $1))
               ORDER BY last_at LIMIT $2 FOR UPDATE SKIP LOCKED) due
         WHERE (t.tenant_id, t.task_type, t.kind) = (due.tenant_id, due.task_type, due.kind)
         RETURNING {}",
        COLUMNS.split(", ").map(|c| format!("t.{c}")).collect::<Vec<_>>().join(", ")
    );
    let every = SIGNAL_EVERY.num_seconds() as f64;
    db.query(&sql, &[&every, &limit]).await?.iter().map(TenantFault::from_row).collect()
}
