//! Jobs that do not fit the time an invocation has left (`claim_ids` with `within`): sent
//! again later, sent on to a longer lane, or left for the caller to fail (`defer_unfit`).

use crate::job::{Dispatch, JobId};
use crate::store::{GenericClient, StoreError};

/// Where a job that does not fit in an invocation goes (`defer_unfit`).
#[derive(Debug, Clone, Copy, Default)]
pub struct DeferBounds {
    /// A longer lane takes jobs whose timeout exceeds this (`None`: this is the longest lane).
    pub onward_above: Option<i32>,
    /// No invocation of any lane can give more than this (`None`: no bound).
    pub longest: Option<i32>,
}

/// What `defer_unfit` decided for the ids that did not fit.
#[derive(Debug, Default)]
pub struct Deferred {
    /// Fit a fresh invocation of this lane: send again to this lane (after a backoff).
    pub again: Vec<Dispatch>,
    /// Fit only a longer lane: send there.
    pub onward: Vec<Dispatch>,
    /// Fit no lane at all: the caller fails them for good (not marked here).
    pub never: Vec<JobId>,
}

/// Of these ids, the pending jobs whose `timeout_seconds` exceeds `within` (they do not fit in
/// the time an invocation has left). Those that fit no lane (`DeferBounds::longest`) are returned as
/// `never`, untouched. The others are marked dispatched now, each with a `redispatched` event
/// giving the reason, and returned for the caller to send after commit: to a longer lane when
/// one takes them (at once), else to this lane again with a backoff that doubles per re-send
/// (`resends`: 0 s, 1 s, 3 s, 7 s ... at most 5 minutes; a claim resets it), so a row that keeps
/// missing the time left is not re-sent in a tight loop. No attempt is charged.
pub async fn defer_unfit(
    db: &impl GenericClient,
    ids: &[JobId],
    within: i32,
    bounds: DeferBounds,
) -> Result<Deferred, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH unfit AS (
                 SELECT id, timeout_seconds > coalesce($3::int4, 2147483647) AS onward FROM jobs
                 WHERE status = 'pending' AND id = ANY($1) AND timeout_seconds > $2
                   AND timeout_seconds <= coalesce($4::int4, 2147483647)
                 ORDER BY id FOR UPDATE SKIP LOCKED
             ), marked AS (
                 UPDATE jobs j SET dispatched_at = now(),
                        run_at = CASE WHEN u.onward THEN j.run_at
                                      ELSE greatest(j.run_at, now() + make_interval(secs => least(power(2, j.resends) - 1, 300))) END,
                        resends = CASE WHEN u.onward THEN j.resends ELSE least(j.resends + 1, 30) END
                 FROM unfit u WHERE j.id = u.id
                 RETURNING j.id, j.run_at, j.attempt, j.timeout_seconds, u.onward
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'redispatched', 'pending', 'pending', attempt,
                        CASE WHEN onward
                             THEN format('not started: its timeout (%s s) is longer than this lane takes (%s s); sent to the long-job lane',
                                         timeout_seconds, $3)
                             ELSE format('not started: its timeout (%s s) does not fit in the %s s the executor''s invocation had left; sent again for a later delivery',
                                         timeout_seconds, $2) END
                 FROM marked
             )
             SELECT id, run_at, onward FROM marked
             UNION ALL
             SELECT id, NULL, NULL FROM jobs
             WHERE status = 'pending' AND id = ANY($1) AND timeout_seconds > coalesce($4::int4, 2147483647)",
        )
        .await?;
    let rows = db.query(&stmt, &[&ids, &within, &bounds.onward_above, &bounds.longest]).await?;
    let mut out = Deferred::default();
    for r in rows {
        match r.get::<_, Option<bool>>(2) {
            None => out.never.push(r.get(0)),
            Some(true) => out.onward.push(Dispatch { id: r.get(0), run_at: r.get(1), tenant: None }),
            Some(false) => out.again.push(Dispatch { id: r.get(0), run_at: r.get(1), tenant: None }),
        }
    }
    Ok(out)
}
