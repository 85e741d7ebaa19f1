//! Exceptions: opened only by the terminal-failure path (`jobs::fail`), read here.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{GenericClient, StoreError};
use crate::job::JobId;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Exception {
    pub id: Uuid,
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub task_type: String,
    pub kind: String,
    pub cause: String,
    pub status: String,
    pub opened_at: DateTime<Utc>,
}

/// The exceptions of one job, newest first.
pub async fn for_job(db: &impl GenericClient, job_id: JobId) -> Result<Vec<Exception>, StoreError> {
    let rows = db
        .query(
            "SELECT id, job_id, tenant_id, task_type, kind, cause, status, opened_at
             FROM exceptions WHERE job_id = $1 ORDER BY opened_at DESC",
            &[&job_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Exception {
            id: r.get(0),
            job_id: r.get(1),
            tenant_id: r.get(2),
            task_type: r.get(3),
            kind: r.get(4),
            cause: r.get(5),
            status: r.get(6),
            opened_at: r.get(7),
        })
        .collect())
}

/// How many exceptions are open.
pub async fn count_open(db: &impl GenericClient) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT count(*) FROM exceptions WHERE status = 'open'", &[]).await?.get(0))
}
