//! Operator transitions of a job, each in the caller's transaction beside its audit row
//! (`crate::exceptions` drives them): retry a failed job, cancel a job with its children,
//! force-finish a failed job, and a plain event for actions that leave the state alone.
//! Each writes a job event and matches on the expected state, so a job that moved on is
//! left alone (the caller reads `None`/empty and says why).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{JOB_COLUMNS, Job};
use crate::job::JobId;
use crate::store::{GenericClient, StoreError};

/// Most attempts a job may have (the CHECK on `jobs.max_attempts`).
pub const MAX_ATTEMPTS: i32 = 100;

/// Any job of any tenant (operators see every tenant).
pub async fn get_any(db: &impl GenericClient, id: JobId) -> Result<Option<Job>, StoreError> {
    let row = db.query_opt(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"), &[&id]).await?;
    row.as_ref().map(Job::from_row).transpose()
}

/// `failed` → `pending` at `run_at`, with one more attempt allowed when none is left
/// (`max_attempts` raised to `attempt + 1` at most, so attempts stay bounded). Marked
/// dispatched now: the caller dispatches after commit. `None` when the job is not failed or
/// has used the most attempts a job may have.
pub async fn retry_failed(
    db: &impl GenericClient,
    id: JobId,
    run_at: DateTime<Utc>,
    reason: &str,
) -> Result<Option<Job>, StoreError> {
    let row = db
        .query_opt(
            &format!(
                "WITH retried AS (
                     UPDATE jobs SET status = 'pending', run_at = $2,
                         max_attempts = GREATEST(max_attempts, attempt + 1),
                         finished_at = NULL, dispatched_at = now(), updated_at = now()
                     WHERE id = $1 AND status = 'failed' AND attempt < {MAX_ATTEMPTS}
                     RETURNING *
                 ), events AS (
                     INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                     SELECT id, 'operator_retry', 'failed', 'pending', attempt, $3 FROM retried
                 )
                 SELECT {JOB_COLUMNS} FROM retried"
            ),
            &[&id, &run_at, &reason],
        )
        .await?;
    row.as_ref().map(Job::from_row).transpose()
}

/// Cancel a job that is failed, pending or waiting, and its pending or waiting children.
/// Returns the ids cancelled (the job first when it was cancelled).
pub async fn cancel_tree(db: &impl GenericClient, id: JobId, reason: &str) -> Result<Vec<JobId>, StoreError> {
    let rows = db
        .query(
            &format!(
                "WITH target AS (
                 SELECT id, status FROM jobs
                 WHERE (id = $1 AND status IN ('failed', 'pending', 'waiting'))
                    OR (parent_id = $1 AND status IN ('pending', 'waiting'))
                 FOR UPDATE
             ), cancelled AS (
                 UPDATE jobs j SET status = 'cancelled', finished_at = now(), updated_at = now()
                 WHERE j.id = ANY (ARRAY(SELECT id FROM target))
                 RETURNING j.*
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT c.id, 'cancelled', t.status, 'cancelled', c.attempt, $2
                 FROM cancelled c JOIN target t ON t.id = c.id
             ), {callbacks}
             SELECT id, has_dependents FROM cancelled ORDER BY id <> $1, id",
                callbacks = super::super::callbacks::enqueue_ctes("cancelled", false)
            ),
            &[&id, &reason],
        )
        .await?;
    let ended = crate::store::dependencies::flagged(&rows, 0, 1);
    if !ended.is_empty() {
        crate::store::dependencies::release(db, &ended, false, crate::store::dependencies::RELEASE_BUDGET).await?;
    }
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// `failed` → `succeeded` with the given result (which records who and why). `None` when
/// the job is not failed.
pub async fn force_finish(
    db: &impl GenericClient,
    id: JobId,
    result: &Value,
    reason: &str,
) -> Result<Option<Job>, StoreError> {
    let row = db
        .query_opt(
            &format!(
                "WITH finished AS (
                     UPDATE jobs SET status = 'succeeded', result = $2, finished_at = now(), updated_at = now()
                     WHERE id = $1 AND status = 'failed'
                     RETURNING *
                 ), events AS (
                     INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                     SELECT id, 'force_finished', 'failed', 'succeeded', attempt, $3 FROM finished
                 ), {callbacks}
                 SELECT {JOB_COLUMNS}, has_dependents FROM finished",
                callbacks = super::super::callbacks::enqueue_ctes("finished", false)
            ),
            &[&id, result, &reason],
        )
        .await?;
    // The jobs that run after it (or queue behind it on its ordering key) go on.
    if let Some(r) = &row
        && r.get::<_, Option<bool>>("has_dependents") == Some(true)
    {
        crate::store::dependencies::release(db, &[id], false, crate::store::dependencies::RELEASE_BUDGET).await?;
    }
    row.as_ref().map(Job::from_row).transpose()
}

/// An event that records an action without a transition (e.g. `exception_ignored`).
pub async fn note(db: &impl GenericClient, id: JobId, kind: &str, reason: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
         SELECT id, $2, status, status, attempt, $3 FROM jobs WHERE id = $1",
        &[&id, &kind, &reason],
    )
    .await?;
    Ok(())
}

/// Every job's history, oldest first, with its submission and claims (the operator's view; no
/// tenant scope).
pub async fn events_any(db: &impl GenericClient, id: JobId) -> Result<Vec<super::JobEvent>, StoreError> {
    let rows = db
        .query(
            "SELECT at, kind, from_status, to_status, attempt, started_at, reason
             FROM job_events WHERE job_id = $1 ORDER BY id",
            &[&id],
        )
        .await?;
    let job = db.query_opt(super::read::ORIGIN, &[&id]).await?;
    let recorded = rows.iter().map(super::JobEvent::from_row).collect::<Result<_, _>>()?;
    Ok(super::read::with_derived(job.as_ref(), recorded))
}
