//! Claiming due jobs for a worker: fairly across tenants (`claim_due`), key by key within
//! concurrency limits (`claim_keyed`), or by id for a transport that delivers ids
//! (`claim_ids`); and the hand-on of keyed jobs once a slot frees. A claimed id whose job does
//! not fit the time an invocation has left goes on through `defer`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;

use crate::job::{ClaimedJob, Dispatch, JobId, TenantId};
use crate::store::modes::Modes;
use crate::store::{GenericClient, StoreError};

fn claimed_from_row(r: &Row) -> ClaimedJob {
    ClaimedJob {
        id: r.get(0),
        tenant_id: r.get(1),
        task_type: r.get(2),
        params: r.get(3),
        correlation_id: r.get(4),
        attempt: r.get(5),
        max_attempts: r.get(6),
        timeout_seconds: r.get(7),
        concurrency_key: r.get(8),
        run_at: r.get(9),
    }
}

/// The rows a claim takes: due, pending, not of a paused task type (the pauses read by their
/// partial index, `operating_modes_pauses`), not locked by another claimer. Shared by every
/// claim shape so they cannot disagree.
pub(super) const CLAIMABLE: &str = "status = 'pending' AND run_at <= now()
    AND task_type <> ALL (SELECT substr(name, 7) FROM operating_modes
                          WHERE name LIKE 'pause:%' AND enabled)";

/// Claiming has two paths. Jobs without a concurrency key (the hot path) are claimed by
/// `claim_due`, fairly across tenants; jobs with a key by `claim_keyed`, key by key, under a
/// per-key lock (see there).
///
/// `claim_due` is one statement: find each tenant with pending unkeyed jobs by skipping
/// through `jobs_due_free` (tenant_id, run_at), one index probe per tenant, keep those with a
/// job due now, give each an equal share of the claim, and take each one's share of due jobs,
/// oldest first (tenants in random order, which matters only when there are more tenants than
/// jobs to claim). A tenant flooding the queue holds back only itself: a quiet tenant's job is
/// in the very next claim, however deep the flood's backlog. One tenant alone gets the whole
/// claim, as before.
///
/// The worker's running slots are shared the same way (`Shares`): while two or more tenants
/// have due work, a tenant takes no more than its fair share of the worker's slots
/// (`ceil(slots / tenants with due work)`) less what it already runs there, so a tenant whose
/// jobs hold their slots long cannot keep every slot while another waits; one tenant alone may
/// take every slot. `capped` comes back when a tenant was held to its share, so the worker
/// waits for a slot to free rather than for a wake-up.
///
/// The long lane (`LongLane`): a job whose `timeout_seconds` exceeds `$7` is long; long jobs
/// hold at most `$8` of the worker's slots, shared the same way (`ceil($8 / tenants with due
/// work)` each, all of them alone); short jobs may use any slot. A tenant's long jobs past its
/// or the lane's room are left (`capped`) and as many of its short ones read instead
/// (`short_instead`: a walk over its due long jobs, only while the lane holds it back). Up to
/// twice `$1` rows are read, `$1` claimed, tenants in their random turn as before.
/// `share` comes back so the worker can tell a short claim (nothing more due) from a fair one
/// (some tenant had more). The tenant probes walk the index backwards, from each tenant's
/// newest entry: the oldest entries are those of rows just claimed, dead until vacuum, and
/// only the claim itself should have to step over them. The statement always returns one row
/// (a claim of nothing: a row of NULLs with the shares), `$3`/`$4`/`$6` the tenants running on
/// the worker, how many each and how many of those are long, `$5` the worker's slots.
pub(crate) fn fair_claim_sql() -> String {
    format!(
        "WITH RECURSIVE {TENANTS_PENDING}, here AS (
            SELECT * FROM unnest($3::uuid[], $4::int8[], $6::int8[]) AS h(tenant_id, running, long_running)
        ), due_tenants AS (
            SELECT t.tenant_id, coalesce(h.running, 0) AS running, coalesce(h.long_running, 0) AS long_running
            FROM tenants t LEFT JOIN here h ON h.tenant_id = t.tenant_id
            WHERE t.tenant_id IS NOT NULL
              AND EXISTS (SELECT 1 FROM jobs WHERE {CLAIMABLE} AND concurrency_key IS NULL AND tenant_id = t.tenant_id)
        ), share AS (
            SELECT ceil($1::int8::float8 / greatest(count(*), 1))::int8 AS n,
                   ceil($5::int8::float8 / greatest(count(*), 1))::int8 AS fair,
                   CASE WHEN count(*) > 1 THEN ceil($8::int8::float8 / count(*))::int8 ELSE $8::int8 END AS long_fair,
                   greatest($8::int8 - (SELECT coalesce(sum(long_running), 0) FROM here), 0)::int8 AS long_room,
                   count(*) AS tenants
            FROM due_tenants
        ), takes AS (
            SELECT d.tenant_id, CASE WHEN s.tenants > 1 THEN least(s.n, greatest(s.fair - d.running, 0)) ELSE s.n END AS take,
                   greatest(s.long_fair - d.long_running, 0) AS long_take, row_number() OVER (ORDER BY random()) AS turn
            FROM due_tenants d, share s
        ), picked AS (
            SELECT f.id, f.run_at, t.tenant_id, t.turn, t.long_take, coalesce(f.timeout_seconds > $7, false) AS long
            FROM (SELECT tenant_id, take, long_take, turn FROM takes ORDER BY turn) t
            CROSS JOIN LATERAL (SELECT id, run_at, timeout_seconds FROM jobs
                                WHERE {CLAIMABLE} AND concurrency_key IS NULL AND tenant_id = t.tenant_id
                                ORDER BY tenant_id, run_at LIMIT t.take FOR UPDATE SKIP LOCKED) f
            LIMIT CASE WHEN $7::int4 IS NULL THEN $1 ELSE 2 * $1 END
        ), in_tenant_share AS (
            SELECT id, run_at, turn, long FROM (
                SELECT *, row_number() OVER (PARTITION BY tenant_id, long ORDER BY run_at) AS nth FROM picked
            ) p WHERE NOT long OR nth <= long_take
        ), kept AS (
            SELECT id, run_at, turn FROM (
                SELECT id, run_at, turn, long, row_number() OVER (PARTITION BY long ORDER BY run_at) AS nth FROM in_tenant_share
            ) p, share WHERE NOT long OR nth <= share.long_room
        ), left_long AS (
            SELECT tenant_id, turn, count(*) AS n FROM picked WHERE id <> ALL (ARRAY(SELECT id FROM kept))
            GROUP BY tenant_id, turn
        ), short_instead AS (
            SELECT f.id, f.run_at, l.turn FROM left_long l
            CROSS JOIN LATERAL (SELECT id, run_at FROM jobs
                                WHERE {CLAIMABLE} AND concurrency_key IS NULL AND tenant_id = l.tenant_id
                                  AND timeout_seconds <= $7 AND id <> ALL (ARRAY(SELECT id FROM picked))
                                ORDER BY tenant_id, run_at LIMIT l.n FOR UPDATE SKIP LOCKED) f
        ), due AS (
            SELECT id FROM (SELECT id, run_at, turn FROM kept UNION ALL SELECT id, run_at, turn FROM short_instead) u
            ORDER BY turn, run_at LIMIT $1
        ), claimed AS (
            {CLAIM_UPDATE}
        )
        SELECT c.*, share.n AS share,
               (SELECT coalesce(bool_or(take < share.n), false) FROM takes)
                 OR EXISTS (SELECT 1 FROM left_long) AS capped
        FROM share LEFT JOIN ({CLAIM_SELECT}) c ON true"
    )
}

/// The CTE `tenants(tenant_id)`: each tenant with pending unkeyed jobs, found by skipping
/// through `jobs_due_free` (tenant_id, run_at) from its newest entry (see `fair_claim_sql`),
/// then a NULL row. For a `WITH RECURSIVE`.
pub(super) const TENANTS_PENDING: &str = "tenants(tenant_id) AS (
            (SELECT tenant_id FROM jobs WHERE status = 'pending' AND concurrency_key IS NULL
             ORDER BY tenant_id DESC, run_at DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT tenant_id FROM jobs WHERE status = 'pending' AND concurrency_key IS NULL
                      AND tenant_id < t.tenant_id ORDER BY tenant_id DESC, run_at DESC LIMIT 1)
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        )";

/// `started_at` is the moment of the claim (`clock_timestamp()`), not the start of its
/// transaction: a keyed claim's transaction begins before it takes its key's lock, and the
/// recorded start must not precede the end of the job whose slot it took.
const CLAIM_UPDATE: &str = "UPDATE jobs j SET status = 'running', attempt = j.attempt + 1, resends = 0,
                 lease_until = now() + make_interval(secs => $2), started_at = clock_timestamp(), updated_at = now()
             WHERE j.id = ANY (ARRAY(SELECT id FROM due))
             RETURNING j.id, j.tenant_id, j.task_type, j.params, j.correlation_id, j.attempt,
                 j.max_attempts, j.timeout_seconds, j.concurrency_key, j.run_at";

/// The claimed rows, each with the switches that apply to every job (`modes::GLOBAL`: a
/// handful of rows, read by their partial index; never the per-destination ones).
const CLAIM_SELECT: &str = "SELECT claimed.*, modes.switches FROM claimed,
             (SELECT coalesce(jsonb_object_agg(name, enabled), '{}') AS switches FROM operating_modes
              WHERE name NOT LIKE 'write:http:%') modes";

/// Each distinct concurrency key with pending jobs, found by skipping through
/// `jobs_keyed_pending` (one index probe per key, however many jobs each key holds).
pub(super) const PENDING_KEYS: &str = "WITH RECURSIVE k(key) AS (
        (SELECT concurrency_key FROM jobs WHERE status = 'pending' AND concurrency_key IS NOT NULL
         ORDER BY concurrency_key LIMIT 1)
        UNION ALL
        SELECT (SELECT concurrency_key FROM jobs WHERE status = 'pending' AND concurrency_key IS NOT NULL
                  AND concurrency_key > k.key ORDER BY concurrency_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    )";

/// For each key in `keys` (rows of `key, after_at, after_id`), the due pending jobs that fit in
/// its free slots (running jobs of the key counted from `jobs_keyed_running`), oldest first,
/// read from the key's head or, given a place `(after_at, after_id)`, from there: the entries
/// before it are of jobs already claimed, dead until vacuum, and walking them cost every claim
/// in proportion to a key's progress. A key's free slots are counted
/// against the limit of its oldest pending job, and each job's own limit still bounds it, so
/// no job ever runs above its limit. `$1` bounds the rows; `{lock}` is `FOR UPDATE SKIP
/// LOCKED` for a claim. Every step is an index probe or a walk of at most the free slots along
/// `jobs_keyed_pending` (key, run_at, id): the cost does not grow with the jobs waiting
/// behind the key (ordering by (run_at, id) without that index sorted them all; locking `$1`
/// rows when ten fit locked a hundred times too many).
pub(super) fn fitting(keys: &str, extra_filter: &str, lock: &str) -> String {
    // The key's queue from its place on: one row comparison over the whole index key, and
    // `concurrency_key <= k.key` as the end, so the scan starts at the place. (Adding
    // `concurrency_key = k.key`, which the two imply, would make the planner start at the
    // key's head and filter; and the order must be the index's, key first.)
    let queue = "concurrency_key <= k.key AND (concurrency_key, run_at, id) >
                 (k.key, coalesce(k.after_at, '-infinity'), coalesce(k.after_id, '00000000-0000-0000-0000-000000000000'))";
    format!(
        "SELECT c.id, c.run_at FROM ({keys}) k
         CROSS JOIN LATERAL (SELECT count(*) AS running FROM jobs
                             WHERE status = 'running' AND concurrency_key = k.key) r
         CROSS JOIN LATERAL (SELECT concurrency_limit AS lim FROM jobs
                             WHERE status = 'pending' AND {queue}
                             ORDER BY concurrency_key, run_at, id LIMIT 1) head
         CROSS JOIN LATERAL (SELECT id, run_at, concurrency_limit,
                                    row_number() OVER (ORDER BY run_at, id) AS rn
                             FROM (SELECT id, run_at, concurrency_limit FROM jobs
                                   WHERE {CLAIMABLE} AND {queue} {extra_filter}
                                   ORDER BY concurrency_key, run_at, id LIMIT least($1, greatest(head.lim - r.running, 0)) {lock}) q) c
         WHERE r.running + c.rn <= c.concurrency_limit"
    )
}

/// Run before a statement built on `fitting` (for the rest of its transaction): read `jobs`
/// along its indexes, each key's queue in order, never gathered and sorted, never a whole
/// table scanned. A plan made while the table was small (a worker's connection keeps its
/// generic plan, or statistics from before a fan-out) sorted every job behind a key after a
/// bitmap scan, and found the claimed rows by a sequential scan: ~100 ms and a spill to disk
/// per claim once a campaign's 95,000 children stood behind its key, until the next ANALYZE.
const IN_QUEUE_ORDER: &str = "SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off";

/// Run `sql`, a statement built on `fitting`, in a transaction of its own under
/// `IN_QUEUE_ORDER` (a keyed claim sets its own: `plan_keyed_claim`).
pub(super) async fn in_queue_order(
    db: &mut deadpool_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    let tx = db.transaction().await?;
    tx.batch_execute(IN_QUEUE_ORDER).await?;
    let stmt = tx.prepare_cached(sql).await?;
    let rows = tx.query(&stmt, params).await?;
    tx.commit().await?;
    Ok(rows)
}

/// A key's queue read from its head (no place to resume from), for `fitting`.
pub(super) fn from_heads(keys: &str) -> String {
    format!("SELECT key, NULL::timestamptz AS after_at, NULL::uuid AS after_id FROM ({keys}) heads")
}

/// A key whose freed slots a worker refills (`Keyed::Lanes`), and where to read its queue
/// from: the place (`run_at`, id) of the first of its jobs that just ended. Every job before
/// that place was claimed before it, or is pending there only because it was locked by
/// another claimer, paused, or submitted late with an earlier `run_at`: a claim from the head
/// (`after: None`, which a worker makes at least every `KEYED_TURN`) takes those.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    pub key: String,
    pub after: Option<(DateTime<Utc>, JobId)>,
}

/// Which keyed jobs `claim_keyed` may take.
#[derive(Debug, Clone, Copy)]
pub enum Keyed<'a> {
    /// Any due keyed job, keys with the oldest heads first.
    Due,
    /// Only these ids (a transport that delivers ids).
    Ids(&'a [JobId]),
    /// Only jobs of these keys: the slots a worker's own keyed jobs just freed, refilled by
    /// that worker at once instead of handed on through a dispatch and a wake-up.
    Lanes(&'a [Lane]),
}

/// Claim up to `limit` due jobs that carry a concurrency key, never more per key than its
/// limit. One transaction of two statements: the first takes a transaction-scoped advisory
/// lock per key with due work (skipping keys another claimer holds right now), the second
/// counts each locked key's running jobs and claims what fits. The second statement's
/// snapshot is taken after the locks, so it sees every claim committed by the previous
/// holder: two claimers can never both fill the same free slot. `within`: claim only jobs
/// whose `timeout_seconds` is at most this (what fits in the time an invocation has left).
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::claim_keyed"))]
pub async fn claim_keyed(
    db: &mut deadpool_postgres::Client,
    limit: i64,
    lease_secs: f64,
    which: Keyed<'_>,
    within: Option<i32>,
) -> Result<Claim, StoreError> {
    let only_ids = matches!(which, Keyed::Ids(_));
    let tx = db.transaction().await?;
    plan_keyed_claim(&tx, only_ids).await?;
    let keys = lock_keys(&tx, limit, which).await?;
    let claim = if keys.is_empty() {
        Claim::default()
    } else {
        let stmt = tx.prepare_cached(&keyed_claim_sql(only_ids)).await?;
        claim_locked(&tx, &stmt, limit, lease_secs, which, within).await?
    };
    tx.commit().await?;
    Ok(claim)
}

/// Where `lock_keys` leaves the keys it locked, for the claim later in the same transaction
/// (`keyed_claim_sql`): a setting local to the transaction, so the claim needs no answer from
/// the lock before it is sent, and takes no key this transaction does not hold.
const LOCKED_KEYS: &str = "relay.locked_keys";

/// A keyed claim's first statement: take the transaction-scoped advisory lock of each key with
/// due work (of `which`'s keys) that no other claimer holds now; returns the keys locked, and
/// leaves them in `LOCKED_KEYS`.
pub async fn lock_keys(tx: &impl GenericClient, limit: i64, which: Keyed<'_>) -> Result<Vec<String>, StoreError> {
    let lock = "pg_try_advisory_xact_lock(hashtextextended(current_schema() || ':relay.key:' || key, 0))";
    let keys: Vec<String> = match which {
        Keyed::Due => {
            // Keys whose oldest pending job is due and that look free, oldest head first.
            let stmt = tx
                .prepare_cached(&noting_locked(&format!(
                    "{PENDING_KEYS}
                     SELECT key FROM (
                         SELECT k.key FROM k
                         CROSS JOIN LATERAL (SELECT run_at, concurrency_limit FROM jobs
                                             WHERE status = 'pending' AND concurrency_key = k.key
                                             ORDER BY run_at, id LIMIT 1) head
                         WHERE k.key IS NOT NULL AND head.run_at <= now()
                           AND (SELECT count(*) FROM jobs WHERE status = 'running' AND concurrency_key = k.key)
                               < head.concurrency_limit
                         ORDER BY head.run_at LIMIT $1
                     ) free WHERE {lock}"
                )))
                .await?;
            tx.query_one(&stmt, &[&limit]).await?.get(0)
        }
        Keyed::Ids(ids) => {
            let stmt = tx
                .prepare_cached(&noting_locked(&format!(
                    "SELECT key FROM (SELECT DISTINCT concurrency_key AS key FROM jobs
                                      WHERE id = ANY($1) AND status = 'pending' AND concurrency_key IS NOT NULL) d
                     WHERE {lock}"
                )))
                .await?;
            tx.query_one(&stmt, &[&ids]).await?.get(0)
        }
        Keyed::Lanes(lanes) => {
            let keys: Vec<&str> = lanes.iter().map(|l| l.key.as_str()).collect();
            let stmt = tx
                .prepare_cached(&noting_locked(&format!(
                    "SELECT key FROM (SELECT DISTINCT unnest($1::text[]) AS key) d WHERE {lock}"
                )))
                .await?;
            tx.query_one(&stmt, &[&keys]).await?.get(0)
        }
    };
    Ok(keys)
}

/// `locking` (rows of the keys it locked) as one row: the keys as an array, also left in
/// `LOCKED_KEYS` (one row, so the setting is made even when no key was locked).
fn noting_locked(locking: &str) -> String {
    format!(
        "SELECT keys, set_config('{LOCKED_KEYS}', keys::text, true)
         FROM (SELECT coalesce(array_agg(key), '{{}}') AS keys FROM ({locking}) locked) a"
    )
}

/// A keyed claim's second statement, `stmt` (`keyed_claim_sql`, prepared): claim what fits in
/// the free slots of the keys `lock_keys` locked earlier in the same transaction (read from
/// `LOCKED_KEYS`), after `plan_keyed_claim`. It needs nothing from the lock's answer and sends
/// its statement when first polled, so a caller may pipeline it behind those, in the same
/// flight (the lanes do: `executor::worker`).
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::claim_locked"))]
pub async fn claim_locked(
    tx: &impl GenericClient,
    stmt: &tokio_postgres::Statement,
    limit: i64,
    lease_secs: f64,
    which: Keyed<'_>,
    within: Option<i32>,
) -> Result<Claim, StoreError> {
    let only = match which {
        Keyed::Ids(ids) => Some(ids),
        _ => None,
    };
    // Where to read each lane's queue from; a locked key without a place reads from its head.
    let lanes = match which {
        Keyed::Lanes(lanes) => lanes,
        _ => &[],
    };
    let keys: Vec<&str> = lanes.iter().map(|l| l.key.as_str()).collect();
    let after_at: Vec<Option<DateTime<Utc>>> = lanes.iter().map(|l| l.after.map(|a| a.0)).collect();
    let after_id: Vec<Option<JobId>> = lanes.iter().map(|l| l.after.map(|a| a.1)).collect();
    let rows = tx.query(stmt, &[&limit, &lease_secs, &keys, &only, &within, &after_at, &after_id]).await?;
    let mut claim = Claim::from_rows(&rows);
    claim.more = rows.len() as i64 >= limit;
    Ok(claim)
}

/// How a keyed claim's transaction plans its statements: its generic plan, the plan every
/// custom one comes to, without re-planning a statement of this many joins on each claim
/// (half a millisecond, more than it runs). Any claim reads its keys' queues in order
/// (`IN_QUEUE_ORDER`), except one of given ids (`only`): that starts from the ids and sorts
/// the few it finds (still never scanning the whole table).
pub(crate) async fn plan_keyed_claim(tx: &impl GenericClient, only: bool) -> Result<(), StoreError> {
    let generic = "SET LOCAL plan_cache_mode = force_generic_plan";
    let order = if only { "SET LOCAL enable_seqscan = off" } else { IN_QUEUE_ORDER };
    tx.batch_execute(&format!("{generic}; {order}")).await?;
    Ok(())
}

/// The claim of `claim_keyed` once its keys are locked: `$1` the most jobs, `$2` the lease in
/// seconds, `$4` just these ids (when `only`), `$5` the longest timeout that fits, `$3`, `$6`
/// and `$7` keys and where to read each one's queue from (`Lane`; a key not given, or NULL:
/// its head). The keys are those `lock_keys` locked in this transaction (`LOCKED_KEYS`; none
/// when it has not run), so the claim never takes a key another claimer may be filling.
pub(crate) fn keyed_claim_sql(only: bool) -> String {
    let extra = if only { "AND id = ANY($4)" } else { "AND $4::uuid[] IS NULL" };
    let extra = format!("{extra} AND ($5::int4 IS NULL OR timeout_seconds <= $5)");
    let keys = format!(
        "SELECT l.key, p.after_at, p.after_id
         FROM unnest(nullif(current_setting('{LOCKED_KEYS}', true), '')::text[]) AS l(key)
         LEFT JOIN LATERAL (SELECT after_at, after_id FROM unnest($3::text[], $6::timestamptz[], $7::uuid[]) AS p(key, after_at, after_id)
                            WHERE p.key = l.key ORDER BY after_at NULLS FIRST, after_id NULLS FIRST LIMIT 1) p ON true"
    );
    let fits = fitting(&keys, &extra, "FOR UPDATE SKIP LOCKED");
    format!(
        "WITH due AS (SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1), claimed AS ({CLAIM_UPDATE})
         {CLAIM_SELECT}"
    )
}

/// Mark and return the due jobs of these keys that fit in their free slots now: the hand-on
/// after keyed jobs finish, so the next job of a key starts promptly on any transport.
pub async fn keyed_ready(
    db: &mut deadpool_postgres::Client,
    keys: &[String],
    limit: i64,
) -> Result<Vec<Dispatch>, StoreError> {
    // Rows another transaction holds are skipped, never waited for: a claimer or another
    // hand-on has them. Waiting here, holding the rows already marked, two hand-ons of one key
    // deadlocked (their UPDATEs met the rows in different orders).
    let fits = fitting(&from_heads("SELECT DISTINCT unnest($2::text[]) AS key"), "", "FOR UPDATE SKIP LOCKED");
    let sql = format!(
        "UPDATE jobs j SET dispatched_at = now()
         WHERE j.id = ANY (ARRAY(SELECT id FROM ({fits}) f ORDER BY run_at LIMIT $1))
         RETURNING j.id, j.run_at"
    );
    let rows = in_queue_order(db, &sql, &[&limit, &keys]).await?;
    Ok(rows.iter().map(|r| Dispatch { id: r.get(0), run_at: r.get(1), tenant: None }).collect())
}

/// Jobs taken by one claim, with the operating modes read in the same statement.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    pub jobs: Vec<ClaimedJob>,
    pub modes: Modes,
    /// More jobs may be due right now: claim again rather than wait for a wake-up.
    pub more: bool,
    /// A tenant with due work was held to its share of the worker's slots (`Shares`): claim
    /// again when a slot frees.
    pub capped: bool,
    /// Of the ids asked for (`claim_ids`), those that name no job at all.
    pub missing: Vec<JobId>,
}

impl Claim {
    fn from_rows(rows: &[Row]) -> Claim {
        let modes = rows.first().map(|r| Modes::from_json(&r.get::<_, Value>("switches"))).unwrap_or_default();
        Claim {
            jobs: rows.iter().map(claimed_from_row).collect(),
            modes,
            more: false,
            capped: false,
            missing: Vec::new(),
        }
    }

    /// Add the jobs of another claim; the modes are those of whichever claim took jobs first.
    pub fn merge(&mut self, other: Claim) {
        if self.jobs.is_empty() {
            self.modes = other.modes;
        }
        self.jobs.extend(other.jobs);
        self.more |= other.more;
        self.capped |= other.capped;
        self.missing.extend(other.missing);
    }
}

/// Claim up to `limit` due unkeyed jobs, fairly across tenants, under a lease of
/// `lease_secs` (the Postgres-native transport), for a claimer with `limit` slots and nothing
/// running (`claim_shared` for a worker's).
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::claim_due"))]
pub async fn claim_due(db: &impl GenericClient, limit: i64, lease_secs: f64) -> Result<Claim, StoreError> {
    claim_shared(db, limit, lease_secs, &Shares { slots: limit, running: Vec::new(), long_lane: None }).await
}

/// What a worker runs, for the share of its slots each tenant may take (`fair_claim_sql`).
#[derive(Debug, Clone, Default)]
pub struct Shares {
    /// The worker's running slots (its concurrency).
    pub slots: i64,
    /// The tenants with jobs running on it: how many each, and how many of those are long.
    pub running: Vec<Running>,
    /// The slots long jobs may hold; `None`: no lane, any job may take any slot.
    pub long_lane: Option<LongLane>,
}

/// One tenant's jobs running on a worker (`Shares`), and how many of them are long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Running {
    pub tenant: TenantId,
    pub jobs: i64,
    pub long: i64,
}

/// A worker's long lane: jobs whose `timeout_seconds` exceeds `above` hold at most `slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongLane {
    pub above: i32,
    pub slots: i64,
}

impl LongLane {
    /// Whether a job of this timeout runs in the long lane.
    pub fn holds(&self, timeout_seconds: i32) -> bool {
        timeout_seconds > self.above
    }
}

/// `claim_due` for a worker that runs `shares.running` in `shares.slots` slots: a tenant takes
/// no more than its fair share of the slots while another tenant has due work.
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::claim_shared"))]
pub async fn claim_shared(
    db: &impl GenericClient,
    limit: i64,
    lease_secs: f64,
    shares: &Shares,
) -> Result<Claim, StoreError> {
    let stmt = db.prepare_cached(&fair_claim_sql()).await?;
    let tenants: Vec<TenantId> = shares.running.iter().map(|r| r.tenant).collect();
    let running: Vec<i64> = shares.running.iter().map(|r| r.jobs).collect();
    let long_running: Vec<i64> = shares.running.iter().map(|r| r.long).collect();
    let (long_above, long_slots) = shares.long_lane.map_or((None, 0), |l| (Some(l.above), l.slots));
    let rows = db
        .query(
            &stmt,
            &[&limit, &lease_secs, &tenants, &running, &shares.slots, &long_running, &long_above, &long_slots],
        )
        .await?;
    let (share, capped) = rows.first().map_or((0, false), |r| (r.get::<_, i64>("share"), r.get::<_, bool>("capped")));
    let rows: Vec<Row> = rows.into_iter().filter(|r| r.get::<_, Option<JobId>>(0).is_some()).collect();
    let mut claim = Claim::from_rows(&rows);
    // More may be due when the claim is full, or when some tenant took its whole share.
    let mut per_tenant: HashMap<TenantId, i64> = HashMap::new();
    for job in &claim.jobs {
        *per_tenant.entry(job.tenant_id).or_default() += 1;
    }
    claim.more = rows.len() as i64 >= limit || per_tenant.values().any(|&n| n >= share);
    claim.capped = capped;
    Ok(claim)
}

/// Claim the named jobs if they are still claimable (a transport that delivers ids, like SQS).
/// A duplicate or stale delivery claims nothing. `within`: claim only jobs whose
/// `timeout_seconds` is at most this (see `defer_unfit` for the ones left). The ids that name
/// no job at all come back in `Claim::missing`, from the same statement (an index probe for
/// each id not claimed).
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::claim_ids"))]
pub async fn claim_ids(
    db: &impl GenericClient,
    ids: &[JobId],
    lease_secs: f64,
    within: Option<i32>,
) -> Result<Claim, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH due AS (
                 SELECT id FROM jobs WHERE {CLAIMABLE} AND concurrency_key IS NULL AND id = ANY($3)
                   AND ($4::int4 IS NULL OR timeout_seconds <= $4)
                 LIMIT $1 FOR UPDATE SKIP LOCKED
             ), claimed AS (
                 {CLAIM_UPDATE}
             ), missing AS (
                 SELECT coalesce(array_agg(i.id), '{{}}') AS ids FROM unnest($3::uuid[]) AS i(id)
                 WHERE i.id <> ALL (ARRAY(SELECT id FROM due))
                   AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = i.id)
             )
             SELECT c.*, missing.ids AS missing FROM missing LEFT JOIN ({CLAIM_SELECT}) c ON true"
        ))
        .await?;
    let limit = i64::try_from(ids.len()).unwrap_or(i64::MAX);
    let rows = db.query(&stmt, &[&limit, &lease_secs, &ids, &within]).await?;
    let missing: Vec<JobId> = rows.first().map(|r| r.get("missing")).unwrap_or_default();
    let rows: Vec<Row> = rows.into_iter().filter(|r| r.get::<_, Option<JobId>>(0).is_some()).collect();
    Ok(Claim { missing, ..Claim::from_rows(&rows) })
}

/// Claim one pending job of the tenant named `tenant` whether or not it is due: the
/// pre-traffic hook's check job, submitted to run a day later so no live executor or sweep
/// takes it, and handed by the hook to the one new executor version it checks (this claim is
/// code only the new version has). `within` as in `claim_ids`: a job that does not fit the time
/// left is not claimed. Keyed jobs are not claimed here.
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::claim_check"))]
pub async fn claim_check(
    db: &impl GenericClient,
    id: JobId,
    tenant: &str,
    lease_secs: f64,
    within: Option<i32>,
) -> Result<Claim, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH due AS (
                 SELECT j.id FROM jobs j JOIN tenants t ON t.id = j.tenant_id
                 WHERE j.status = 'pending' AND j.id = $3 AND t.name = $5 AND j.concurrency_key IS NULL
                   AND ($4::int4 IS NULL OR j.timeout_seconds <= $4)
                 LIMIT $1 FOR UPDATE OF j SKIP LOCKED
             ), claimed AS (
                 {CLAIM_UPDATE}
             )
             {CLAIM_SELECT}"
        ))
        .await?;
    Ok(Claim::from_rows(&db.query(&stmt, &[&1_i64, &lease_secs, &id, &within, &tenant]).await?))
}
