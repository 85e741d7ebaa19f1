//! The effects ledger: one row per effect a test-only task really performed.

use super::{GenericClient, StoreError};
use crate::job::JobId;

pub async fn record(db: &impl GenericClient, job_id: JobId, attempt: i32) -> Result<(), StoreError> {
    db.execute("INSERT INTO effects_ledger (job_id, attempt) VALUES ($1, $2)", &[&job_id, &attempt])
        .await?;
    Ok(())
}

/// How many effects this job performed.
pub async fn count(db: &impl GenericClient, job_id: JobId) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT count(*) FROM effects_ledger WHERE job_id = $1", &[&job_id]).await?.get(0))
}
