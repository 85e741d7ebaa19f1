//! Jobs that run after other jobs (`after`, same tenant; migration 0029). A dependent whose
//! dependencies have not all succeeded is pending but held out of the claim: its `run_at` is
//! far ahead (`crate::job::HELD_FOR`) and `job_holds` keeps the time it asked for and how many
//! dependencies it still waits for; `job_dependencies` holds one row per unresolved edge.
//!
//! A dependency carries `has_dependents`, set under its row lock by the submit of a dependent,
//! so the write that ends it knows, from its own row, to call `release` on the same connection
//! (in the same transaction when the caller has one). A job no other job runs after pays
//! nothing: no statement, no index entry, no predicate. A release changes at most a bounded
//! number of jobs (`RELEASE_BUDGET`, or its caller's), a chain of any length in a few
//! statements; `heal` (the sweep) resolves what a crash between a dependency's end and its
//! release left behind, and goes on where a release stopped at its budget.
//!
//! The rule: when every dependency has succeeded, the dependent is due at the time it asked
//! for; when one ends otherwise (`failed` or `cancelled`), the dependent is `cancelled` with a
//! reason naming that dependency and its status, its callback fires, no exception opens, and
//! its own dependents follow, down the chain. Cycles cannot arise: `after` names jobs that
//! exist already.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::job::terms::OnFailure;
use crate::job::{Dispatch, JobId, JobStatus, TenantId};
use crate::store::callbacks::{self, TERMINAL_RETURNING};
use crate::store::{GenericClient, StoreError, decode};

/// Most jobs one job may run after.
pub const MAX_AFTER: usize = 100;

/// The jobs among `ids` that are this tenant's, with their status (another tenant's job is
/// not among them: the caller answers it as unknown).
pub async fn statuses(
    db: &impl GenericClient,
    tenant_id: TenantId,
    ids: &[JobId],
) -> Result<HashMap<JobId, JobStatus>, StoreError> {
    let stmt = db.prepare_cached("SELECT id, status FROM jobs WHERE id = ANY ($1) AND tenant_id = $2").await?;
    db.query(&stmt, &[&ids, &tenant_id])
        .await?
        .iter()
        .map(|r| Ok((r.get(0), decode("jobs.status", r.get(1), JobStatus::parse)?)))
        .collect()
}

/// Inside the submit's transaction: mark the live jobs among `ids` as having dependents,
/// locking them (in id order) until commit so none can end unseen, then read every one's
/// status. A dependency that ended before this saw it is resolved at submit. With `failed`,
/// failed jobs are marked and locked too (a failed job ahead on an ordering key that holds
/// its key: an operator's retry must find its dependents when it ends).
pub async fn lock(
    db: &impl GenericClient,
    tenant_id: TenantId,
    ids: &[JobId],
    failed: bool,
) -> Result<HashMap<JobId, JobStatus>, StoreError> {
    let stmt = db
        .prepare_cached(
            "WITH locked AS (
                 SELECT id, has_dependents FROM jobs
                 WHERE id = ANY ($1) AND tenant_id = $2
                   AND (status IN ('pending', 'running', 'waiting') OR ($3 AND status = 'failed'))
                 ORDER BY id FOR NO KEY UPDATE
             )
             -- A row already marked is only locked (no new row version).
             UPDATE jobs j SET has_dependents = true FROM locked l
             WHERE j.id = l.id AND l.has_dependents IS NOT TRUE",
        )
        .await?;
    db.execute(&stmt, &[&ids, &tenant_id, &failed]).await?;
    // A second statement: its snapshot sees a dependency that ended while the first waited.
    statuses(db, tenant_id, ids).await
}

/// A dependent just inserted, and the dependencies it waits for (those not succeeded).
#[derive(Debug, Clone)]
pub struct Held {
    pub job_id: JobId,
    /// When it is due once released.
    pub run_at: DateTime<Utc>,
    pub after: Vec<JobId>,
    /// The job ahead of it on its ordering key, and what that job's failure does to it
    /// (`store::ordering`).
    pub behind: Option<(JobId, OnFailure)>,
}

/// Inside the submit's transaction, after `lock`: record the holds and their edges, then
/// resolve those whose dependency has ended already (`release`): a dependent of a failed job
/// is cancelled at once. Returns the deliveries to dispatch after commit.
pub async fn hold(db: &impl GenericClient, tenant_id: TenantId, held: &[Held]) -> Result<Vec<Dispatch>, StoreError> {
    if held.is_empty() {
        return Ok(vec![]);
    }
    let held: Vec<Held> = held
        .iter()
        .map(|h| {
            let mut after = h.after.clone();
            after.sort();
            after.dedup();
            // One edge per pair: the ordered one says more.
            after.retain(|a| h.behind.is_none_or(|(b, _)| b != *a));
            Held { after, ..h.clone() }
        })
        .collect();
    let ids: Vec<JobId> = held.iter().map(|h| h.job_id).collect();
    let run_ats: Vec<DateTime<Utc>> = held.iter().map(|h| h.run_at).collect();
    let waiting: Vec<i32> = held.iter().map(|h| (h.after.len() + usize::from(h.behind.is_some())) as i32).collect();
    let (mut dependents, mut after, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
    for h in &held {
        for a in &h.after {
            dependents.push(h.job_id);
            after.push(*a);
            kinds.push(None);
        }
        if let Some((b, on_failure)) = h.behind {
            dependents.push(h.job_id);
            after.push(b);
            kinds.push(Some(on_failure.as_str()));
        }
    }
    let stmt = db
        .prepare_cached(
            "WITH holds AS (
                 INSERT INTO job_holds (job_id, tenant_id, run_at, waiting)
                 SELECT id, $1, run_at, waiting FROM unnest($2::uuid[], $3::timestamptz[], $4::int[]) AS t(id, run_at, waiting)
             )
             INSERT INTO job_dependencies (after_id, job_id, on_failure)
             SELECT * FROM unnest($5::uuid[], $6::uuid[], $7::text[]) ON CONFLICT DO NOTHING",
        )
        .await?;
    db.execute(&stmt, &[&tenant_id, &ids, &run_ats, &waiting, &after, &dependents, &kinds]).await?;
    after.sort();
    after.dedup();
    Ok(release(db, &after, true, RELEASE_BUDGET).await?.dispatch)
}

/// Most jobs one `release` changes, for a caller with no bound of its own (a job's end, a
/// submit, an operator's cancel): what is left is still held by its edges, and the sweep
/// (`heal`) goes on from there. A chain of any length costs its ender a bounded time.
pub const RELEASE_BUDGET: usize = 10_000;
/// Most jobs one statement cancels down a chain.
const CASCADE_CHUNK: usize = 5_000;

/// What a `release` did.
#[derive(Debug, Default)]
pub struct Released {
    /// The released jobs and the callback deliveries, to dispatch after commit (empty when
    /// `release` was told they are not dispatched).
    pub dispatch: Vec<Dispatch>,
    /// Dependents now due, their last dependency having succeeded.
    pub released: usize,
    /// Dependents cancelled, down the chain.
    pub cancelled: usize,
    /// The budget ran out with dependents left unresolved: the sweep resolves them.
    pub left: bool,
}

impl Released {
    /// Jobs this release changed.
    pub fn changed(&self) -> usize {
        self.released + self.cancelled
    }
}

/// Resolve the dependents of jobs that have ended (`ended`: ids whose row says
/// `has_dependents`; one not ended is skipped), changing at most `budget` jobs. Each edge is
/// deleted and counted against its hold in one statement, so two dependencies ending at once
/// cannot both miss the last one. A dependent whose last dependency succeeded is due at the
/// time it asked for; one with a dependency that ended otherwise is cancelled, and so are the
/// jobs that run after it, down the chain, in one statement per `CASCADE_CHUNK` jobs however
/// long the chain. With `dispatched` false the deliveries are left to the sweep, which sends
/// them on its next pass. In the caller's transaction this applies whole or not at all.
pub async fn release(
    db: &impl GenericClient,
    ended: &[JobId],
    dispatched: bool,
    budget: usize,
) -> Result<Released, StoreError> {
    let mut out = Released::default();
    if ended.is_empty() || budget == 0 {
        out.left = !ended.is_empty();
        return Ok(out);
    }
    let mut chain = resolve_edges(db, ended, dispatched, budget, &mut out).await?;
    while !chain.is_empty() {
        let room = budget.saturating_sub(out.changed()).min(CASCADE_CHUNK);
        if room == 0 {
            out.left = true;
            break;
        }
        let (next, picked) = cascade(db, &chain, dispatched, room, &mut out).await?;
        if picked < room {
            break;
        }
        // Cut short: the next statement starts again from every cancelled job so far, so
        // dependents of this chain that did not fit are not missed.
        chain.extend(next);
        chain.sort();
        chain.dedup();
    }
    Ok(out)
}

/// One statement: resolve up to `limit` edges of the ended jobs `ended`. Returns the
/// cancelled dependents that other jobs run after (the chain to cancel next).
async fn resolve_edges(
    db: &impl GenericClient,
    ended: &[JobId],
    dispatched: bool,
    limit: usize,
    out: &mut Released,
) -> Result<Vec<JobId>, StoreError> {
    let dispatched_at = if dispatched { "now()" } else { "NULL::timestamptz" };
    let stmt = db
        .prepare_cached(&format!(
            "WITH picked AS (
                 SELECT d.after_id, d.job_id, a.status, d.on_failure FROM job_dependencies d JOIN jobs a ON a.id = d.after_id
                 WHERE d.after_id = ANY ($1) AND a.status IN ('succeeded', 'failed', 'cancelled')
                   -- A failed job ahead on an ordering key that holds it keeps its edges.
                   AND (a.status <> 'failed' OR d.on_failure IS DISTINCT FROM 'hold')
                 LIMIT $2
             ), gone AS (
                 DELETE FROM job_dependencies d USING picked p
                 WHERE d.after_id = p.after_id AND d.job_id = p.job_id
                 RETURNING d.job_id, d.after_id, p.status, p.on_failure
             ), tally AS (
                 SELECT job_id, count(*)::int AS n,
                        min(CASE WHEN on_failure IS NULL THEN 'dependency ' ELSE 'ordered behind ' END
                            || after_id || ' ended ' || status) FILTER (WHERE status <> 'succeeded') AS why
                 FROM gone GROUP BY job_id
             ), counted AS (
                 UPDATE job_holds h SET waiting = h.waiting - t.n FROM tally t WHERE h.job_id = t.job_id
                 RETURNING h.job_id, h.waiting, h.run_at, t.why
             ), released AS (
                 UPDATE jobs j SET run_at = c.run_at, dispatched_at = {dispatched_at}, updated_at = now()
                 FROM counted c WHERE j.id = c.job_id AND c.waiting <= 0 AND c.why IS NULL AND j.status = 'pending'
                 RETURNING j.id, j.run_at
             ), cancelled AS (
                 UPDATE jobs j SET status = 'cancelled', run_at = c.run_at, last_error = c.why,
                     finished_at = now(), updated_at = now()
                 FROM counted c WHERE j.id = c.job_id AND c.why IS NOT NULL AND j.status = 'pending'
                 RETURNING {TERMINAL_RETURNING}, j.last_error
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'cancelled', 'pending', 'cancelled', attempt, last_error FROM cancelled
             ), {callbacks}
             SELECT id, 'released', run_at, NULL::bigint FROM released
             UNION ALL SELECT id, CASE WHEN has_dependents THEN 'chain' ELSE 'cancelled' END, NULL, NULL FROM cancelled
             UNION ALL SELECT id, 'callback', run_at, NULL FROM callbacks
             UNION ALL SELECT NULL, 'picked', NULL, count(*) FROM picked",
            callbacks = callbacks::enqueue_ctes("cancelled", dispatched),
        ))
        .await?;
    let mut ended = ended.to_vec();
    ended.sort();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = db.query(&stmt, &[&ended, &limit]).await?;
    let (chain, picked) = tally(rows, dispatched, out);
    // As many edges as it could take: there may be more, for the sweep.
    out.left |= picked >= limit;
    Ok(chain)
}

/// One statement: cancel up to `limit` pending jobs that run, directly or down the chain,
/// after the cancelled jobs `chain`, each with the reason naming a cancelled dependency, its
/// event and its callback; the edges between them go. Returns those cancelled that other jobs
/// run after, and how many it took on (fewer than `limit`: the whole chain).
async fn cascade(
    db: &impl GenericClient,
    chain: &[JobId],
    dispatched: bool,
    limit: usize,
    out: &mut Released,
) -> Result<(Vec<JobId>, usize), StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH RECURSIVE reach (id) AS (
                 SELECT d.job_id FROM job_dependencies d
                 WHERE d.after_id = ANY ($1) AND (SELECT j.status FROM jobs j WHERE j.id = d.job_id) = 'pending'
                 UNION
                 -- Each step by the edges' index and each job by its id: OFFSET 0 keeps the
                 -- lateral, the scalar subquery the id lookup (joined whole, the planner
                 -- scanned every edge, or every open job, at each step of a chain).
                 SELECT n.id FROM reach r, LATERAL (
                     SELECT d.job_id AS id FROM job_dependencies d
                     WHERE d.after_id = r.id AND (SELECT j.status FROM jobs j WHERE j.id = d.job_id) = 'pending'
                     OFFSET 0
                 ) n
             ), picked AS (
                 SELECT id FROM reach LIMIT $2
             ), gone AS (
                 DELETE FROM job_dependencies d
                 WHERE d.after_id IN (SELECT unnest($1::uuid[]) UNION ALL SELECT id FROM picked)
                   AND d.job_id IN (SELECT id FROM picked)
                 RETURNING d.job_id, d.after_id
             ), why AS (
                 SELECT job_id, min('dependency ' || after_id || ' ended cancelled') AS why FROM gone GROUP BY job_id
             ), cancelled AS (
                 UPDATE jobs j SET status = 'cancelled', run_at = coalesce(h.run_at, j.run_at), last_error = w.why,
                     finished_at = now(), updated_at = now()
                 FROM why w LEFT JOIN job_holds h ON h.job_id = w.job_id
                 WHERE j.id = w.job_id AND j.status = 'pending'
                 RETURNING {TERMINAL_RETURNING}, j.last_error
             ), events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, reason)
                 SELECT id, 'cancelled', 'pending', 'cancelled', attempt, last_error FROM cancelled
             ), {callbacks}
             SELECT id, CASE WHEN has_dependents THEN 'chain' ELSE 'cancelled' END, NULL::timestamptz, NULL::bigint
             FROM cancelled
             UNION ALL SELECT id, 'callback', run_at, NULL FROM callbacks
             UNION ALL SELECT NULL, 'picked', NULL, count(*) FROM picked",
            callbacks = callbacks::enqueue_ctes("cancelled", dispatched),
        ))
        .await?;
    let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut chain = chain.to_vec();
    chain.sort();
    let rows = db.query(&stmt, &[&chain, &limit_sql]).await?;
    let (chain, picked) = tally(rows, dispatched, out);
    Ok((chain, usize::try_from(picked).unwrap_or(0)))
}

/// Count a release statement's rows into `out`; returns the cancelled jobs with dependents,
/// and the count its `picked` row carries (what the statement took on).
fn tally(rows: Vec<tokio_postgres::Row>, dispatched: bool, out: &mut Released) -> (Vec<JobId>, i64) {
    let (mut chain, mut picked) = (Vec::new(), 0);
    for r in rows {
        let (id, what, run_at): (Option<JobId>, &str, Option<DateTime<Utc>>) = (r.get(0), r.get(1), r.get(2));
        match (what, id) {
            ("picked", _) => picked = r.get::<_, Option<i64>>(3).unwrap_or(0),
            ("chain", Some(id)) => {
                out.cancelled += 1;
                chain.push(id);
            }
            ("cancelled", _) => out.cancelled += 1,
            ("released", Some(id)) => {
                out.released += 1;
                if let (true, Some(run_at)) = (dispatched, run_at) {
                    out.dispatch.push(Dispatch { id, run_at, tenant: None });
                }
            }
            ("callback", Some(id)) => {
                if let (true, Some(run_at)) = (dispatched, run_at) {
                    out.dispatch.push(Dispatch { id, run_at, tenant: None });
                }
            }
            _ => {}
        }
    }
    chain.sort();
    (chain, picked)
}

/// How long after a dependency's end its own release has to run before the sweep does it.
const SETTLE_SECS: f64 = 10.0;

/// The sweep's safety net: resolve the dependents of up to `limit` dependencies that ended
/// (more than `SETTLE_SECS` ago, so a release on its way is not raced) with edges still
/// unresolved, changing at most `budget` jobs: a release lost to a crash between the end and
/// its release, or one that stopped at its budget (a long chain). Deletes the holds that are
/// done. Reads only the unresolved edges and the holds: proportional to what is held, not to
/// the jobs table.
pub async fn heal(db: &impl GenericClient, limit: i64, budget: usize) -> Result<Released, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT DISTINCT d.after_id FROM job_dependencies d JOIN jobs a ON a.id = d.after_id
             WHERE a.status IN ('succeeded', 'failed', 'cancelled') AND a.finished_at < now() - make_interval(secs => $2)
               AND (a.status <> 'failed' OR d.on_failure IS DISTINCT FROM 'hold')
             LIMIT $1",
        )
        .await?;
    let mut ended: Vec<JobId> = db.query(&stmt, &[&limit, &SETTLE_SECS]).await?.iter().map(|r| r.get(0)).collect();
    ended.sort();
    let released = release(db, &ended, true, budget).await?;
    let done = db
        .prepare_cached(
            "DELETE FROM job_holds h WHERE h.waiting <= 0
                OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = h.job_id AND j.status = 'pending')",
        )
        .await?;
    db.execute(&done, &[]).await?;
    if released.changed() > 0 {
        tracing::warn!(
            event = "relay.dependencies.healed",
            dependencies = ended.len(),
            released = released.released,
            cancelled = released.cancelled,
            left = released.left,
            "resolved the dependents of jobs whose end did not (a crash between the two, or a chain longer than one release)"
        );
    }
    Ok(released)
}

/// A pending job held for its dependencies: the time it asked for, and the job ahead of it
/// on its ordering key while it waits for that one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hold {
    pub run_at: DateTime<Utc>,
    pub behind: Option<JobId>,
}

/// Which of these pending jobs are held for their dependencies, and how.
pub async fn held(db: &impl GenericClient, ids: &[JobId]) -> Result<Vec<(JobId, Hold)>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT h.job_id, h.run_at,
                    (SELECT d.after_id FROM job_dependencies d WHERE d.job_id = h.job_id AND d.on_failure IS NOT NULL LIMIT 1)
             FROM job_holds h JOIN jobs j ON j.id = h.job_id
             WHERE h.job_id = ANY ($1) AND h.waiting > 0 AND j.status = 'pending'",
        )
        .await?;
    Ok(db
        .query(&stmt, &[&ids])
        .await?
        .iter()
        .map(|r| (r.get(0), Hold { run_at: r.get(1), behind: r.get(2) }))
        .collect())
}

/// The ids in column `at` of a terminal write's rows whose `has_dependents` (a nullable bool
/// in column `flag`) is true.
pub(crate) fn flagged(rows: &[tokio_postgres::Row], at: usize, flag: usize) -> Vec<JobId> {
    let mut ids: Vec<JobId> =
        rows.iter().filter(|r| r.get::<_, Option<bool>>(flag) == Some(true)).map(|r| r.get(at)).collect();
    ids.sort();
    ids
}
