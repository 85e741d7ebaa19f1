//! The sweep's side: expired leases (locked, then returned or failed), dispatches that failed
//! or were lost (sent again), and waiting parents whose children have all finished.

use super::claim::{CLAIMABLE, PENDING_KEYS, fitting};
use super::fence::{self, Transition};
use super::{TERMINAL_RETURNING, callbacks_of};
use crate::job::{Dispatch, Fence};
use crate::store::{GenericClient, StoreError, callbacks};

/// A running job whose lease has expired, locked for the sweep's transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredLease {
    pub fence: Fence,
    pub max_attempts: i32,
}

/// Lock up to `limit` expired leases; rows another sweeper holds are skipped.
pub async fn lock_expired_leases(db: &impl GenericClient, limit: i64) -> Result<Vec<ExpiredLease>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT id, attempt, max_attempts FROM jobs
             WHERE status = 'running' AND lease_until < now()
             ORDER BY lease_until LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .await?;
    let rows = db.query(&stmt, &[&limit]).await?;
    Ok(rows
        .iter()
        .map(|r| ExpiredLease { fence: Fence { job: r.get(0), attempt: r.get(1) }, max_attempts: r.get(2) })
        .collect())
}

const RETURN_EXPIRED: Transition = Transition {
    rows: "returned",
    set: "status = 'pending', run_at = now(), lease_until = NULL,
                     last_error = 'lease expired: the worker stopped heartbeating',
                     dispatched_at = now(), updated_at = now()",
    inputs: &[],
    kind: "lease_expired",
    to: "pending",
    reason: "'lease expired; returned to pending by the sweep'",
};

/// Return expired leases to pending, due now, with a `lease_expired` event each (fenced).
/// Returns the fences refused as stale.
pub async fn return_expired(db: &impl GenericClient, fences: &[Fence]) -> Result<Vec<Fence>, StoreError> {
    let mut sorted = fences.to_vec();
    sorted.sort();
    let sql = RETURN_EXPIRED.sql("\n             SELECT id FROM returned");
    Ok(fence::write(db, &sql, &sorted, &[]).await?.1)
}

/// A due pending row whose dispatch failed (`dispatched_at` NULL), or that was sent and not
/// claimed within the grace period (`grace`: a parameter, in seconds) after falling due: its
/// message is presumed lost. Each earlier re-send of the row doubles the wait (`resends`,
/// migration 0011), so a queue that is only behind is not flooded with copies.
fn lost_dispatch(grace: &str) -> String {
    format!(
        "(dispatched_at IS NULL
          OR (dispatched_at < now() - make_interval(secs => {grace}::float8 * (1 << least(resends, 5)))
              AND run_at < now() - make_interval(secs => {grace})))"
    )
}

/// Marks a row sent again by the sweep, counting the re-send when the row had been sent before
/// (a row whose dispatch failed is only now sent for the first time).
const RESENT: &str = "dispatched_at = now(),
    resends = CASE WHEN j.dispatched_at IS NULL THEN j.resends ELSE least(j.resends + 1, 100) END";

/// Find due pending jobs without a concurrency key (keyed ones: `take_lost_keyed`) whose
/// dispatch failed or was lost (`lost_dispatch`), mark them dispatched now and record a
/// `redispatched` event each. Paused task types wait. A fresh row is never taken: its own
/// dispatch is still in flight.
pub async fn take_lost_dispatches(
    db: &impl GenericClient,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Dispatch>, StoreError> {
    let lost = lost_dispatch("$1");
    let stmt = db
        .prepare_cached(&format!(
            "WITH lost AS (
                 SELECT id, dispatched_at IS NULL AS never FROM jobs
                 WHERE {CLAIMABLE} AND concurrency_key IS NULL AND {lost}
                 ORDER BY run_at LIMIT $2 FOR UPDATE SKIP LOCKED
             ), marked AS (
                 UPDATE jobs j SET {RESENT}
                 WHERE j.id = ANY (ARRAY(SELECT id FROM lost))
                 RETURNING j.id, j.run_at, j.attempt
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT m.id, 'redispatched', 'pending', 'pending', m.attempt,
                        CASE WHEN l.never THEN 'dispatch failed; sent by the sweep'
                             ELSE 'dispatch lost; sent again by the sweep' END
                 FROM marked m JOIN lost l ON l.id = m.id
             )
             SELECT id, run_at FROM marked"
        ))
        .await?;
    let rows = db.query(&stmt, &[&grace_secs, &limit]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1) }).collect())
}

/// The sweep's share of keyed jobs: due jobs that fit in a free slot of their key but whose
/// dispatch failed or was lost (`lost_dispatch`): a hand-on or its message was lost. Marked
/// dispatched now, each with a `redispatched` event.
pub async fn take_lost_keyed(db: &impl GenericClient, grace_secs: f64, limit: i64) -> Result<Vec<Dispatch>, StoreError> {
    let fits = fitting(
        &format!("{PENDING_KEYS} SELECT key FROM k WHERE key IS NOT NULL"),
        &format!("AND {}", lost_dispatch("$2")),
        "FOR UPDATE SKIP LOCKED",
    );
    let stmt = db
        .prepare_cached(&format!(
            "WITH lost AS (SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1), marked AS (
                 UPDATE jobs j SET {RESENT} WHERE j.id = ANY (ARRAY(SELECT id FROM lost))
                 RETURNING j.id, j.run_at, j.attempt
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'redispatched', 'pending', 'pending', attempt,
                        'a free slot of its concurrency key was not taken; sent again by the sweep' FROM marked
             )
             SELECT id, run_at FROM marked"
        ))
        .await?;
    let rows = db.query(&stmt, &[&limit, &grace_secs]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1) }).collect())
}

/// state: each succeeds with `{total, succeeded, failed, cancelled}` (failed children opened
/// their own exceptions), in one statement with its events and callback deliveries. Returns
/// the callback deliveries to dispatch and how many parents finished.
pub async fn finish_parents(db: &impl GenericClient, limit: i64) -> Result<(usize, Vec<Dispatch>), StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH ready AS (
                 SELECT p.id, p.children_total FROM jobs p
                 WHERE p.status = 'waiting'
                   AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.id
                                   AND c.status NOT IN ('succeeded', 'failed', 'cancelled'))
                   AND (SELECT count(*) FROM jobs c WHERE c.parent_id = p.id) >= coalesce(p.children_total, 0)
                 ORDER BY p.updated_at LIMIT $1 FOR UPDATE SKIP LOCKED
             ), counts AS (
                 SELECT r.id, jsonb_build_object(
                            'total', count(c.id),
                            'succeeded', count(c.id) FILTER (WHERE c.status = 'succeeded'),
                            'failed', count(c.id) FILTER (WHERE c.status = 'failed'),
                            'cancelled', count(c.id) FILTER (WHERE c.status = 'cancelled')) AS result
                 FROM ready r LEFT JOIN jobs c ON c.parent_id = r.id GROUP BY r.id
             ), done AS (
                 UPDATE jobs j SET status = 'succeeded', result = counts.result, finished_at = now(), updated_at = now()
                 FROM counts WHERE j.id = counts.id AND j.status = 'waiting'
                 RETURNING {TERMINAL_RETURNING}
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'succeeded', 'waiting', 'succeeded', attempt, 'every child finished' FROM done
             ), {callbacks}
             SELECT id, false, NULL::timestamptz FROM done
             UNION ALL SELECT id, true, run_at FROM callbacks",
            callbacks = callbacks::enqueue_ctes("done", true),
        ))
        .await?;
    let rows = db.query(&stmt, &[&limit]).await?;
    let callbacks = callbacks_of(&rows, 1);
    Ok((rows.len() - callbacks.len(), callbacks))
}
