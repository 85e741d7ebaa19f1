//! The sweep's side: expired leases (locked, then returned or failed), dispatches that failed
//! or were lost (sent again), and waiting parents whose children have all finished.

use super::claim::{CLAIMABLE, PENDING_KEYS, TENANTS_PENDING, fitting, from_heads, in_queue_order};
use super::fence::{self, Transition};
use super::{EventKind, TERMINAL_RETURNING, callbacks_of};
use uuid::Uuid;

use crate::job::{Dispatch, Fence, JobId};
use crate::store::{GenericClient, StoreError, callbacks, dependencies, tenant_faults};

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
    kind: Some(EventKind::LeaseExpired),
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
/// dispatch is still in flight. Read tenant by tenant along `jobs_due_free`, each one's oldest
/// first, until `limit` rows are found.
pub async fn take_lost_dispatches(
    db: &impl GenericClient,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Dispatch>, StoreError> {
    let lost = lost_dispatch("$1");
    let stmt = db
        .prepare_cached(&format!(
            "WITH RECURSIVE {TENANTS_PENDING}, lost AS (
                 SELECT l.id, l.never FROM tenants t
                 CROSS JOIN LATERAL (SELECT id, dispatched_at IS NULL AS never FROM jobs
                                     WHERE {CLAIMABLE} AND concurrency_key IS NULL AND tenant_id = t.tenant_id AND {lost}
                                     ORDER BY tenant_id, run_at LIMIT $2 FOR UPDATE SKIP LOCKED) l
                 WHERE t.tenant_id IS NOT NULL
                 LIMIT $2
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
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1), tenant: None }).collect())
}

/// The sweep's share of keyed jobs: due jobs that fit in a free slot of their key but whose
/// dispatch failed or was lost (`lost_dispatch`): a hand-on or its message was lost. Marked
/// dispatched now, each with a `redispatched` event.
pub async fn take_lost_keyed(
    db: &mut deadpool_postgres::Client,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Dispatch>, StoreError> {
    let fits = fitting(
        &from_heads(&format!("{PENDING_KEYS} SELECT key FROM k WHERE key IS NOT NULL")),
        &format!("AND {}", lost_dispatch("$2")),
        "FOR UPDATE SKIP LOCKED",
    );
    let sql = format!(
        "WITH lost AS (SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1), marked AS (
                 UPDATE jobs j SET {RESENT} WHERE j.id = ANY (ARRAY(SELECT id FROM lost))
                 RETURNING j.id, j.run_at, j.attempt
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'redispatched', 'pending', 'pending', attempt,
                        'a free slot of its concurrency key was not taken; sent again by the sweep' FROM marked
             )
             SELECT id, run_at FROM marked"
    );
    let rows = in_queue_order(db, &sql, &[&limit, &grace_secs]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1), tenant: None }).collect())
}

/// Parents finished by one statement (`finish_parents`, `finish_parents_of`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Finished {
    pub parents: usize,
    /// Callback deliveries to dispatch after commit.
    pub callbacks: Vec<Dispatch>,
    /// Exceptions opened, as (exception id, parent id, cause): one per parent whose children
    /// failed, never one per child.
    pub opened: Vec<(Uuid, JobId, String)>,
}

/// The statement that finishes the waiting parents `ready` selects (ids, locked) once all
/// their declared children exist and have ended. A parent succeeds only when every child
/// did (a skipped child succeeded: it ended on purpose, see `progress::SKIPPED_CHILD`; so did
/// a shadowed one, `progress::SHADOWED_CHILD`), with its children counted by outcome as its
/// result (`{total, succeeded, shadowed, skipped, failed, cancelled}`; `succeeded` did their
/// work). Otherwise it fails, its `last_error` counting the children that failed (or
/// were cancelled) and naming the most common cause, and, when any child failed, one
/// `children_failed` exception with that cause opens for the parent: children of a parent
/// open no exceptions of their own (`fail_reporting`), so a cause all of them share reaches
/// operators once. When every failed child was the tenant's own fault (`jobs.fault`), so is
/// the parent's failure: counted in `tenant_faults`, no exception. Events and callback
/// deliveries are written in the same statement.
fn finish_sql(ready: &str) -> String {
    format!(
        "WITH ready AS (
             {ready}
         ), counts AS (
             SELECT r.id, count(c.id) AS total,
                    count(c.id) FILTER (WHERE c.status = 'succeeded' AND NOT ({skipped}) AND NOT ({shadowed})) AS succeeded,
                    count(c.id) FILTER (WHERE {shadowed}) AS shadowed,
                    count(c.id) FILTER (WHERE {skipped}) AS skipped,
                    count(c.id) FILTER (WHERE c.status = 'failed') AS failed,
                    count(c.id) FILTER (WHERE c.status = 'cancelled') AS cancelled,
                    count(c.id) FILTER (WHERE c.status = 'failed' AND c.fault IS DISTINCT FROM 'tenant') AS platform_failed
             FROM ready r LEFT JOIN jobs c ON c.parent_id = r.id GROUP BY r.id
         ), failures AS (
             -- A child's error with ids blanked (each names its own message): what it shares.
             SELECT c.parent_id AS id,
                    regexp_replace(coalesce(c.last_error, 'no error recorded'),
                                   '[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}', '<id>', 'g') AS cause
             FROM ready r JOIN jobs c ON c.parent_id = r.id AND c.status = 'failed'
         ), by_cause AS (
             SELECT id, cause, count(*) AS n,
                    row_number() OVER (PARTITION BY id ORDER BY count(*) DESC, cause) AS rank,
                    count(*) OVER (PARTITION BY id) AS causes
             FROM failures GROUP BY id, cause
         ), outcome AS (
             SELECT k.id, k.succeeded + k.shadowed + k.skipped = k.total AS ok,
                    jsonb_build_object('total', k.total, 'succeeded', k.succeeded, 'shadowed', k.shadowed,
                                       'skipped', k.skipped,
                                       'failed', k.failed, 'cancelled', k.cancelled) AS result,
                    CASE WHEN k.failed > 0 THEN
                        k.failed || ' of ' || k.total || ' children failed; ' || top.n || ' with: ' || top.cause
                        || CASE WHEN top.causes > 1 THEN ' (and ' || (top.causes - 1) || ' other causes)' ELSE '' END
                        || CASE WHEN k.cancelled > 0 THEN '; ' || k.cancelled || ' cancelled' ELSE '' END
                    WHEN k.cancelled > 0 THEN k.cancelled || ' of ' || k.total || ' children were cancelled'
                    END AS error,
                    k.failed > 0 AS children_failed, k.platform_failed = 0 AS tenants
             FROM counts k LEFT JOIN by_cause top ON top.id = k.id AND top.rank = 1
         ), done AS (
             UPDATE jobs j SET status = CASE WHEN o.ok THEN 'succeeded' ELSE 'failed' END,
                 result = CASE WHEN o.ok THEN o.result END,
                 last_error = o.error, finished_at = now(), updated_at = now(),
                 fault = CASE WHEN o.ok THEN NULL WHEN o.tenants THEN 'tenant' ELSE 'platform' END
             FROM outcome o WHERE j.id = o.id AND j.status = 'waiting'
             RETURNING {TERMINAL_RETURNING}, o.error, o.children_failed, o.tenants
         ), events AS (
             INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
             SELECT id, status, 'waiting', status, attempt, coalesce(error, 'every child succeeded') FROM done
         ), opened AS (
             INSERT INTO exceptions (id, job_id, tenant_id, task_type, kind, cause)
             SELECT gen_random_uuid(), id, tenant_id, task_type, 'children_failed', error FROM done
             WHERE children_failed AND NOT tenants
             ON CONFLICT (job_id) WHERE status = 'open' DO NOTHING
             RETURNING id, job_id, cause
         ), blamed AS (
             -- Every failed child the tenant's own: so is the parent's failure.
             SELECT id, task_type, 'children_failed' AS kind, error, tenant_id AS at_fault FROM done
             WHERE children_failed AND tenants
         ), {faults}, {callbacks}
         SELECT id, false, NULL::timestamptz, NULL::uuid, NULL::text, has_dependents FROM done
         UNION ALL SELECT id, true, run_at, NULL::uuid, NULL::text, NULL::bool FROM callbacks
         UNION ALL SELECT job_id, false, NULL::timestamptz, id, cause, NULL::bool FROM opened",
        callbacks = callbacks::enqueue_ctes("done", true),
        faults = tenant_faults::count_cte("blamed"),
        skipped = crate::store::progress::SKIPPED_CHILD,
        shadowed = crate::store::progress::SHADOWED_CHILD,
    )
}

/// What `finish_sql` wrote; a parent that other jobs run after releases them
/// (`dependencies::release`) on the same connection.
async fn finished(db: &impl GenericClient, rows: &[tokio_postgres::Row]) -> Result<Finished, StoreError> {
    let mut callbacks = callbacks_of(rows, 1);
    let opened: Vec<(Uuid, JobId, String)> =
        rows.iter().filter_map(|r| Some((r.get::<_, Option<Uuid>>(3)?, r.get(0), r.get(4)))).collect();
    let parents = rows.len() - callbacks.len() - opened.len();
    let ended = dependencies::flagged(rows, 0, 5);
    if !ended.is_empty() {
        callbacks.extend(dependencies::release(db, &ended, true, dependencies::RELEASE_BUDGET).await?.dispatch);
    }
    Ok(Finished { parents, callbacks, opened })
}

/// A waiting parent's declared children all exist and have ended. The probe for a child not
/// yet ended reads `jobs_open_children` (live children only), so it costs the same however
/// many children have ended; the children are counted (a walk of all of them) only once none
/// is open, which `CASE` makes sure of.
const ALL_CHILDREN_ENDED: &str = "CASE WHEN EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p.id
                                                AND c.status IN ('pending', 'running', 'waiting'))
                    THEN false
                    ELSE (SELECT count(*) FROM jobs c WHERE c.parent_id = p.id) >= coalesce(p.children_total, 0) END";

/// A waiting job that waits for an outside party's completion, not (only) for children: the
/// completion or the sweep's overdue pass ends its wait, never `finish_sql`.
const OPEN_WAIT: &str =
    "SELECT 1 FROM completion_waits w WHERE w.job_id = p.id AND w.attempt = p.attempt AND w.closed_at IS NULL";

/// The sweep's pass over waiting parents whose children have all ended (the safety net:
/// `finish_parents_of` finishes a parent as its last child ends). See `finish_sql`.
pub async fn finish_parents(db: &impl GenericClient, limit: i64) -> Result<Finished, StoreError> {
    let stmt = db
        .prepare_cached(&finish_sql(&format!(
            "SELECT p.id FROM jobs p
             WHERE p.status = 'waiting'
               AND NOT EXISTS ({OPEN_WAIT})
               AND {ALL_CHILDREN_ENDED}
             ORDER BY p.updated_at LIMIT $1 FOR UPDATE SKIP LOCKED"
        )))
        .await?;
    finished(db, &db.query(&stmt, &[&limit]).await?).await
}

/// Finish these parents if their children have all ended: called after a commit that ended
/// children of theirs, so a parent closes as its last child ends, not on the next sweep.
/// Run after (not inside) the children's commit, the last of several children ending at once
/// always sees the others ended; a parent another caller is finishing is skipped.
///
/// A probe along `jobs_open_children` comes first: while a parent still has live children
/// (all but the last time), the whole finishing statement, costly to plan, is not run. The
/// probe is a subquery with `LIMIT 1`, run only for a parent that waits: as `NOT EXISTS` the
/// planner made it an anti-join that read every live child of a parent still creating them.
pub async fn finish_parents_of(db: &impl GenericClient, parents: &[JobId]) -> Result<Finished, StoreError> {
    let probe = db
        .prepare_cached(
            "SELECT p.id FROM jobs p WHERE p.id = ANY ($1) AND p.status = 'waiting'
               AND (SELECT 1 FROM jobs c WHERE c.parent_id = p.id AND c.status IN ('pending', 'running', 'waiting') LIMIT 1) IS NULL",
        )
        .await?;
    let parents: Vec<JobId> = db.query(&probe, &[&parents]).await?.iter().map(|r| r.get(0)).collect();
    if parents.is_empty() {
        return Ok(Finished::default());
    }
    let stmt = db
        .prepare_cached(&finish_sql(&format!(
            "SELECT p.id FROM jobs p
             WHERE p.id = ANY ($1) AND p.status = 'waiting'
               AND NOT EXISTS ({OPEN_WAIT})
               AND {ALL_CHILDREN_ENDED}
             FOR UPDATE SKIP LOCKED"
        )))
        .await?;
    finished(db, &db.query(&stmt, &[&parents]).await?).await
}
