//! Retention: deletes terminal jobs that finished before a cutoff, with their events, keys,
//! callback attempts, messages and the messages' provider events, in bounded batches. Run by the `relay.retention` task on a built-in schedule.
//!
//! Old rows are found through the primary key: ids are UUIDv7, so every job created before the
//! cutoff sorts below the smallest id of the cutoff's millisecond, and no index on
//! `finished_at` is needed. A job with children waits until its children are gone (the
//! `parent_id` foreign key), and a job with an open exception stays; `job_keys` has no index on `job_id`, so keys are deleted by
//! (tenant_id, idempotency_key) read from the jobs being deleted. The audit of exception
//! actions is kept. A job with unresolved dependents stays (a failed job holding its
//! ordering key); a key whose last job goes loses its `ordering_tails` row.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::job::JobId;
use crate::store::{GenericClient, StoreError};

/// The smallest UUIDv7 of the millisecond `at`: every id minted before `at` sorts below it.
pub fn first_id_at(at: DateTime<Utc>) -> JobId {
    let ms = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6] = 0x70;
    b[8] = 0x80;
    JobId::from_uuid(Uuid::from_bytes(b))
}

/// Delete up to `limit` terminal jobs created and finished before `cutoff` (with their
/// events, keys, callback attempts, messages and message events) in one statement. Returns how many jobs were deleted; rows
/// locked by someone else are skipped.
pub async fn delete_terminal_before(
    db: &impl GenericClient,
    cutoff: DateTime<Utc>,
    limit: i64,
) -> Result<u64, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH old AS (
                 SELECT id, tenant_id, idempotency_key FROM jobs j
                 WHERE id < $1 AND status IN ('succeeded', 'failed', 'cancelled') AND finished_at < $2
                   AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = j.id)
                   AND NOT EXISTS (SELECT 1 FROM exceptions x WHERE x.job_id = j.id AND x.status = 'open')
                   -- A failed job that holds its ordering key keeps its queue's edges.
                   AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.after_id = j.id)
                 ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED
             ), events AS (
                 DELETE FROM job_events WHERE job_id = ANY (ARRAY(SELECT id FROM old))
             ), keys AS (
                 DELETE FROM job_keys k USING old
                 WHERE k.tenant_id = old.tenant_id AND k.idempotency_key = old.idempotency_key
             ), tails AS (
                 DELETE FROM ordering_tails WHERE job_id = ANY (ARRAY(SELECT id FROM old))
             ), calls AS (
                 DELETE FROM callback_attempts WHERE job_id = ANY (ARRAY(SELECT id FROM old))
             ), sent AS (
                 SELECT id FROM messages WHERE job_id = ANY (ARRAY(SELECT id FROM old))
             ), provider_events AS (
                 DELETE FROM message_events WHERE message_id = ANY (ARRAY(SELECT id FROM sent))
             ), messages_gone AS (
                 DELETE FROM messages WHERE id = ANY (ARRAY(SELECT id FROM sent))
             ), gone AS (
                 DELETE FROM jobs WHERE id = ANY (ARRAY(SELECT id FROM old)) RETURNING id
             )
             SELECT count(*) FROM gone",
        )
        .await?;
    let n: i64 = db.query_one(&stmt, &[&first_id_at(cutoff), &cutoff, &limit]).await?.get(0);
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_minted_before_the_cutoff_sort_below_its_first_id() {
        let before = JobId::new();
        let cutoff = Utc::now() + chrono::Duration::milliseconds(2);
        let bound = first_id_at(cutoff);
        assert!(before < bound);
        assert_eq!(bound.as_uuid().get_version_num(), 7);
        assert!(first_id_at(cutoff + chrono::Duration::seconds(1)) > bound);
    }
}
