//! The effects ledger: one row per effect a test-only task really performed.

use super::{GenericClient, StoreError};
use crate::job::JobId;

pub async fn record(db: &impl GenericClient, job_id: JobId, attempt: i32) -> Result<(), StoreError> {
    db.execute("INSERT INTO effects_ledger (job_id, attempt) VALUES ($1, $2)", &[&job_id, &attempt]).await?;
    Ok(())
}

/// Record an effect with a note: what a test-only task handed out (a completion token), for
/// the test playing the outside party.
pub async fn record_note(db: &impl GenericClient, job_id: JobId, attempt: i32, note: &str) -> Result<(), StoreError> {
    db.execute("INSERT INTO effects_ledger (job_id, attempt, note) VALUES ($1, $2, $3)", &[&job_id, &attempt, &note])
        .await?;
    Ok(())
}

/// The notes this job's effects carry, as (attempt, note), oldest first.
pub async fn notes(db: &impl GenericClient, job_id: JobId) -> Result<Vec<(i32, String)>, StoreError> {
    let rows = db
        .query(
            "SELECT attempt, note FROM effects_ledger WHERE job_id = $1 AND note IS NOT NULL ORDER BY id",
            &[&job_id],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// How many effects this job performed.
pub async fn count(db: &impl GenericClient, job_id: JobId) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT count(*) FROM effects_ledger WHERE job_id = $1", &[&job_id]).await?.get(0))
}

/// Every effect performed, as (job, attempt).
pub async fn all(db: &impl GenericClient) -> Result<Vec<(JobId, i32)>, StoreError> {
    Ok(db
        .query("SELECT job_id, attempt FROM effects_ledger", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// How many jobs performed their effect more than once.
pub async fn jobs_with_repeats(db: &impl GenericClient) -> Result<i64, StoreError> {
    let sql = "SELECT count(*) FROM (SELECT job_id FROM effects_ledger GROUP BY job_id HAVING count(*) > 1) d";
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// How many effects these jobs performed, together.
pub async fn count_among(db: &impl GenericClient, ids: &[JobId]) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT count(*) FROM effects_ledger WHERE job_id = ANY($1)", &[&ids]).await?.get(0))
}
