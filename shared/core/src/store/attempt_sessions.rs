//! The `attempt_sessions` table: every AWS role session an attempt assumed (per-task
//! credentials), written when it is assumed, so "what could this job touch" has an answer
//! while the job runs and after.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::{JobId, TenantId};

/// A session to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSession {
    pub job_id: JobId,
    pub attempt: i32,
    pub role_arn: String,
    pub session_arn: String,
    pub external_id: bool,
    pub expires_at: DateTime<Utc>,
}

/// A recorded session, as `GET /v1/jobs/{id}/sessions` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Session {
    pub attempt: i32,
    /// The role assumed.
    pub role_arn: String,
    /// The assumed-role session (what CloudTrail names as the caller).
    pub session_arn: String,
    /// The tenant's external id was sent (a role in the tenant's own account).
    pub external_id: bool,
    pub assumed_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// Record one assumed session.
pub async fn record(db: &impl GenericClient, s: &NewSession) -> Result<(), StoreError> {
    let stmt = db
        .prepare_cached(
            "INSERT INTO attempt_sessions (job_id, attempt, role_arn, session_arn, external_id, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .await?;
    db.execute(&stmt, &[&s.job_id, &s.attempt, &s.role_arn, &s.session_arn, &s.external_id, &s.expires_at]).await?;
    Ok(())
}

/// The sessions of one of a tenant's jobs, oldest first; empty for another tenant's job.
pub async fn for_job(db: &impl GenericClient, tenant_id: TenantId, job_id: JobId) -> Result<Vec<Session>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT s.attempt, s.role_arn, s.session_arn, s.external_id, s.assumed_at, s.expires_at
             FROM attempt_sessions s JOIN jobs j ON j.id = s.job_id
             WHERE s.job_id = $1 AND j.tenant_id = $2
             ORDER BY s.attempt, s.assumed_at",
        )
        .await?;
    let rows = db.query(&stmt, &[&job_id, &tenant_id]).await?;
    Ok(rows
        .iter()
        .map(|r| Session {
            attempt: r.get(0),
            role_arn: r.get(1),
            session_arn: r.get(2),
            external_id: r.get(3),
            assumed_at: r.get(4),
            expires_at: r.get(5),
        })
        .collect())
}
