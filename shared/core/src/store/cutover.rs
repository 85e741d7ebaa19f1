//! Email cut-over stages (`cutover_stages`): one per tenant and task type, set by an operator,
//! halted back to `shadow` by the stage's own judgement (`email::cutover`). The rules are there.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// A tenant's stage for one task type.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Stage {
    #[schema(value_type = String)]
    pub tenant_id: TenantId,
    /// `email.send`, or `email.campaign` for a campaign's children.
    pub task_type: String,
    /// `shadow`, `share` or `live`.
    pub stage: String,
    /// The fraction of recipients live in the `share` stage (0.1 is 10 %).
    pub share: f64,
    /// The rates over the tenant's sends since `started_at` that halt a `share` stage back to
    /// `shadow`: permanent bounces, complaints, sends SES refused.
    pub halt_bounce: f64,
    pub halt_complaint: f64,
    pub halt_failure: f64,
    /// Fewer sends than this since `started_at`: not judged.
    pub min_sends: i64,
    pub started_at: DateTime<Utc>,
    /// Set when the stage halted itself, with why; cleared by the operator's next change.
    pub halted_at: Option<DateTime<Utc>>,
    pub halted_reason: Option<String>,
    pub updated_by: String,
}

pub(super) const COLUMNS: &str = "tenant_id, task_type, stage, share, halt_bounce, halt_complaint, halt_failure, min_sends, \
                       started_at, halted_at, halted_reason, updated_by";

fn stage(r: &Row) -> Stage {
    stage_at(r, 0)
}

/// A stage from `COLUMNS` read at `at` onwards.
pub(super) fn stage_at(r: &Row, at: usize) -> Stage {
    Stage {
        tenant_id: r.get(at),
        task_type: r.get(at + 1),
        stage: r.get(at + 2),
        share: r.get(at + 3),
        halt_bounce: r.get(at + 4),
        halt_complaint: r.get(at + 5),
        halt_failure: r.get(at + 6),
        min_sends: r.get(at + 7),
        started_at: r.get(at + 8),
        halted_at: r.get(at + 9),
        halted_reason: r.get(at + 10),
        updated_by: r.get(at + 11),
    }
}

/// The tenant's stage for a task type; None: no stage, the global modes alone decide.
pub async fn get(db: &impl GenericClient, tenant: TenantId, task_type: &str) -> Result<Option<Stage>, StoreError> {
    let stmt = db
        .prepare_cached(&format!("SELECT {COLUMNS} FROM cutover_stages WHERE tenant_id = $1 AND task_type = $2"))
        .await?;
    Ok(db.query_opt(&stmt, &[&tenant, &task_type]).await?.as_ref().map(stage))
}

/// Every stage of a tenant (`None`: of every tenant), newest change first, at most `limit`.
pub async fn list(db: &impl GenericClient, tenant: Option<TenantId>, limit: i64) -> Result<Vec<Stage>, StoreError> {
    let rows = db
        .query(
            &format!(
                "SELECT {COLUMNS} FROM cutover_stages WHERE $1::uuid IS NULL OR tenant_id = $1
                 ORDER BY updated_at DESC LIMIT $2"
            ),
            &[&tenant, &limit],
        )
        .await?;
    Ok(rows.iter().map(stage).collect())
}

/// An operator's change: the stage, its share and thresholds; it starts now (the rates a
/// `share` stage is judged by are counted from here) and any earlier halt is cleared.
pub async fn set(db: &impl GenericClient, tenant: TenantId, s: &Stage, by: &str) -> Result<Stage, StoreError> {
    let row = db
        .query_one(
            &format!(
                "INSERT INTO cutover_stages (tenant_id, task_type, stage, share, halt_bounce, halt_complaint,
                     halt_failure, min_sends, updated_by)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (tenant_id, task_type) DO UPDATE SET stage = $3, share = $4, halt_bounce = $5,
                     halt_complaint = $6, halt_failure = $7, min_sends = $8, updated_by = $9,
                     started_at = now(), halted_at = NULL, halted_reason = NULL, updated_at = now()
                 RETURNING {COLUMNS}"
            ),
            &[
                &tenant,
                &s.task_type,
                &s.stage,
                &s.share,
                &s.halt_bounce,
                &s.halt_complaint,
                &s.halt_failure,
                &s.min_sends,
                &by,
            ],
        )
        .await?;
    Ok(stage(&row))
}

/// The tenant's stages in `share` (the ones a rise in its rates may halt).
pub async fn sharing(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<Stage>, StoreError> {
    let stmt = db
        .prepare_cached(&format!("SELECT {COLUMNS} FROM cutover_stages WHERE tenant_id = $1 AND stage = 'share'"))
        .await?;
    Ok(db.query(&stmt, &[&tenant]).await?.iter().map(stage).collect())
}

/// Halt a `share` stage back to `shadow`, unless an operator changed it since it was read
/// (`started_at` differs: the operator wins). True when it halted.
pub async fn halt(db: &impl GenericClient, s: &Stage, reason: &str) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE cutover_stages SET stage = 'shadow', halted_at = now(), halted_reason = $4,
                 updated_by = 'system', updated_at = now()
             WHERE tenant_id = $1 AND task_type = $2 AND stage = 'share' AND started_at = $3",
            &[&s.tenant_id, &s.task_type, &s.started_at, &reason],
        )
        .await?;
    Ok(n == 1)
}
