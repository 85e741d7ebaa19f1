//! A running job's transitions, each fenced (see `fence`) and batched: heartbeat, success,
//! retry, continue, wait for children or for a completion, terminal failure; the end of a wait
//! for a completion (success, retry, reschedule, failure: the same transitions from the state
//! the job is in, `*_from`); and a client's cancel and a parent's wait, which match on the
//! state instead.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::fence::{self, Transition, by_id, fences};
use super::{EventKind, TERMINAL_RETURNING, callbacks_of};
use crate::job::{Dispatch, ExceptionKind, Fault, Fence, JobId, JobStatus, TenantId};
use crate::store::{GenericClient, StoreError, callbacks, dependencies, tenant_faults};

/// Extend the leases of jobs still running under these attempts; returns the ones lost.
pub async fn heartbeat(db: &impl GenericClient, fences: &[Fence], lease_secs: f64) -> Result<Vec<Fence>, StoreError> {
    let mut sorted = fences.to_vec();
    sorted.sort();
    let sql = fence::update("lease_until = now() + make_interval(secs => $3)", &[], "j.id");
    Ok(fence::write(db, &sql, &sorted, &[&lease_secs]).await?.1)
}

/// What a terminal write wrote besides the transitions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Succeeded {
    /// The fences refused as stale.
    pub refused: Vec<Fence>,
    /// Callback deliveries created in the same statement, for the caller to dispatch after
    /// commit.
    pub callbacks: Vec<Dispatch>,
    /// The parents of the jobs that ended, once each: after commit, the caller finishes those
    /// whose last child this was (`finish_parents_of`).
    pub parents: Vec<JobId>,
}

/// The distinct parents in column `at` of a terminal write's rows.
fn parents_of(rows: &[tokio_postgres::Row], at: usize) -> Vec<JobId> {
    let mut parents: Vec<JobId> = rows.iter().filter_map(|r| r.get::<_, Option<JobId>>(at)).collect();
    parents.sort();
    parents.dedup();
    parents
}

/// A success writes no event row: the job row holds it (status, attempt, `started_at`,
/// `finished_at`), and a job's history derives it from there (`read::with_derived`). One
/// insert and one index entry fewer per job on the hottest path.
const SUCCEED: Transition = Transition {
    rows: "done",
    set: "status = 'succeeded', result = i.result, lease_until = NULL,
                     last_error = NULL, finished_at = now(), updated_at = now()",
    inputs: &[("result", "jsonb")],
    kind: None,
    to: "succeeded",
    reason: "NULL",
};

/// Record successes (fenced). Returns the fences refused as stale.
pub async fn succeed(db: &impl GenericClient, done: &[(Fence, Value)]) -> Result<Vec<Fence>, StoreError> {
    Ok(succeed_reporting(db, done).await?.refused)
}

/// Record successes (fenced), and create their callback deliveries in the same statement.
pub async fn succeed_reporting(db: &impl GenericClient, done: &[(Fence, Value)]) -> Result<Succeeded, StoreError> {
    succeed_from(db, JobStatus::Running, done).await
}

/// `succeed_reporting` for jobs in state `from` under the fenced attempt.
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::succeed_from"))]
pub async fn succeed_from(
    db: &impl GenericClient,
    from: JobStatus,
    done: &[(Fence, Value)],
) -> Result<Succeeded, StoreError> {
    let sql = SUCCEED.sql_from(
        from,
        &format!(
            ", resolved AS (
                 -- A job with an open exception (retried by an operator) that now succeeds
                 -- closes it: the condition cleared. A probe of the small open-exception index.
                 UPDATE exceptions x SET status = 'resolved', closed_at = now(), closed_by = 'system',
                     close_reason = 'the job succeeded'
                 WHERE x.job_id = ANY (ARRAY(SELECT id FROM done)) AND x.status = 'open'
                 RETURNING x.id, x.job_id
             ), audit AS (
                 INSERT INTO exception_actions (exception_id, job_id, action, actor, reason)
                 SELECT id, job_id, 'resolve', 'system', 'the job succeeded' FROM resolved
             ), {callbacks}
             SELECT id, false, NULL::timestamptz, parent_id, has_dependents FROM done
             UNION ALL SELECT id, true, run_at, NULL::uuid, NULL::bool FROM callbacks",
            callbacks = callbacks::enqueue_ctes("done", true),
        ),
    );
    let done = &by_id(done);
    let results: Vec<&Value> = done.iter().map(|d| &d.1).collect();
    let (rows, refused) = fence::write(db, &sql, &fences(done), &[&results]).await?;
    let callbacks = with_dependents(db, &rows, 4, callbacks_of(&rows, 1)).await?;
    Ok(Succeeded { refused, callbacks, parents: parents_of(&rows, 3) })
}

/// A retry to schedule: back to pending at `run_at`, with the error that caused it.
#[derive(Debug, Clone)]
pub struct Retry {
    pub run_at: DateTime<Utc>,
    pub error: String,
}

const RETRY: Transition = Transition {
    rows: "retried",
    set: "status = 'pending', run_at = i.run_at, lease_until = NULL,
                     last_error = i.error, dispatched_at = now(), updated_at = now()",
    inputs: &[("run_at", "timestamptz"), ("error", "text")],
    kind: Some(EventKind::RetryScheduled),
    to: "pending",
    reason: "error",
};

/// Send jobs back to pending for another attempt (fenced); marked dispatched now, since the
/// caller dispatches them after commit. Returns the fences refused as stale.
#[tracing::instrument(level = "debug", name = "postgres", skip_all, fields(xray.namespace = "remote", xray.name = "postgres", sql.operation = "jobs::retry"))]
pub async fn retry(db: &impl GenericClient, retries: &[(Fence, Retry)]) -> Result<Vec<Fence>, StoreError> {
    retry_from(db, JobStatus::Running, &RETRY, retries).await
}

/// A retry, or a reschedule (`RESCHEDULE`), of jobs in state `from` under the fenced attempt.
async fn retry_from(
    db: &impl GenericClient,
    from: JobStatus,
    how: &Transition,
    retries: &[(Fence, Retry)],
) -> Result<Vec<Fence>, StoreError> {
    let retries = &by_id(retries);
    let run_ats: Vec<DateTime<Utc>> = retries.iter().map(|r| r.1.run_at).collect();
    let errors: Vec<&str> = retries.iter().map(|r| r.1.error.as_str()).collect();
    let sql = how.sql_from(from, &format!("\n             SELECT id FROM {}", how.rows));
    Ok(fence::write(db, &sql, &fences(retries), &[&run_ats, &errors]).await?.1)
}

const RESCHEDULE: Transition = Transition {
    rows: "rescheduled",
    set: "status = 'pending', run_at = i.run_at, lease_until = NULL,
                     max_attempts = least(j.max_attempts + 1, 100), last_error = i.error,
                     dispatched_at = now(), updated_at = now()",
    inputs: &[("run_at", "timestamptz"), ("error", "text")],
    kind: Some(EventKind::RetryScheduled),
    to: "pending",
    reason: "error",
};

/// Jobs whose wait for a completion ended (`crate::job::completion`), in state `from`
/// (`waiting`, or `running` when the completion came before the task returned): a retry uses
/// up the attempt; a reschedule does not (`max_attempts` raised by one, at most to 100).
/// Fenced; returns the fences refused as stale.
pub async fn retry_wait(
    db: &impl GenericClient,
    from: JobStatus,
    retries: &[(Fence, Retry)],
    reschedule: bool,
) -> Result<Vec<Fence>, StoreError> {
    retry_from(db, from, if reschedule { &RESCHEDULE } else { &RETRY }, retries).await
}

/// A continuation: its note, when it is due again, and the rate that held it, if one did.
pub type Continued = (String, DateTime<Utc>, Option<String>);

const CONTINUE: Transition = Transition {
    rows: "continued",
    set: "status = 'pending', run_at = i.run_at, lease_until = NULL,
                     max_attempts = least(j.max_attempts + 1, 100), last_error = NULL,
                     dispatched_at = now(), updated_at = now()",
    inputs: &[("note", "text"), ("run_at", "timestamptz"), ("rate", "text")],
    kind: Some(EventKind::Continued),
    to: "pending",
    reason: "note",
};

/// Running jobs that continue themselves (or wait their turn): pending again at their
/// `run_at`, with one more attempt allowed (`max_attempts` raised, at most to 100), so a job
/// making progress in slices, or deferred, does not use up its retries. Fenced; returns the
/// fences refused as stale. A job a rate held (its third part, which rate) keeps why in
/// `job_rate_waits` until it is due again (`waiting_reason` `rate_limited`).
pub async fn continue_later(db: &impl GenericClient, jobs: &[(Fence, Continued)]) -> Result<Vec<Fence>, StoreError> {
    let jobs = &by_id(jobs);
    let notes: Vec<&str> = jobs.iter().map(|j| j.1.0.as_str()).collect();
    let run_ats: Vec<DateTime<Utc>> = jobs.iter().map(|j| j.1.1).collect();
    let rates: Vec<Option<&str>> = jobs.iter().map(|j| j.1.2.as_deref()).collect();
    let sql = CONTINUE.sql(
        ", held AS (
                 INSERT INTO job_rate_waits (job_id, rate, until)
                 SELECT id, rate, run_at FROM continued WHERE rate IS NOT NULL
                 ON CONFLICT (job_id) DO UPDATE SET rate = excluded.rate, until = excluded.until
             )
             SELECT id FROM continued",
    );
    Ok(fence::write(db, &sql, &fences(jobs), &[&notes, &run_ats, &rates]).await?.1)
}

const WAIT: Transition = Transition {
    rows: "waiting",
    set: "status = 'waiting', children_total = i.total, lease_until = NULL, updated_at = now()",
    inputs: &[("total", "int")],
    kind: Some(EventKind::Waiting),
    to: "waiting",
    reason: "'waiting for ' || total || ' children'",
};

/// Running parents whose children all exist now wait for them (`children_total` set); the
/// sweep finishes them (`finish_parents`). Fenced; returns the fences refused as stale.
pub async fn wait_running(db: &impl GenericClient, jobs: &[(Fence, i32)]) -> Result<Vec<Fence>, StoreError> {
    let jobs = &by_id(jobs);
    let totals: Vec<i32> = jobs.iter().map(|j| j.1).collect();
    let sql = WAIT.sql("\n             SELECT id FROM waiting");
    Ok(fence::write(db, &sql, &fences(jobs), &[&totals]).await?.1)
}

const AWAIT: Transition = Transition {
    rows: "awaiting",
    set: "status = 'waiting', lease_until = NULL, updated_at = now()",
    inputs: &[("until", "timestamptz")],
    kind: Some(EventKind::Waiting),
    to: "waiting",
    reason: "'waiting for a completion until ' || to_char(until AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
};

/// Running jobs whose task opened a wait for an outside party's completion now wait for it
/// until its deadline (the wait's own row, `store::completions`, holds the token's hash and
/// the overdue policy). Fenced; a fence refused is a job that left `running` first (the
/// completion arrived before the task returned, or its lease expired).
pub async fn await_completion(
    db: &impl GenericClient,
    jobs: &[(Fence, DateTime<Utc>)],
) -> Result<Vec<Fence>, StoreError> {
    let jobs = &by_id(jobs);
    let until: Vec<DateTime<Utc>> = jobs.iter().map(|j| j.1).collect();
    let sql = AWAIT.sql("\n             SELECT id FROM awaiting");
    Ok(fence::write(db, &sql, &fences(jobs), &[&until]).await?.1)
}

/// Declare how many children a running job will have, before it creates them (fenced), so
/// its progress never counts against a moving total.
pub async fn declare_children(db: &impl GenericClient, fence: Fence, total: i32) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE jobs SET children_total = $3, updated_at = now() WHERE id = $1 AND attempt = $2 AND status = 'running'",
            &[&fence.job, &fence.attempt, &total],
        )
        .await?;
    Ok(n == 1)
}

/// Why a job fails for good: the kind of exception it opens and the error.
#[derive(Debug, Clone)]
pub struct Failure {
    pub kind: ExceptionKind,
    pub error: String,
    /// Whose failure it is. A tenant's own (`Fault::Tenant`: a callback URL it set) opens no
    /// operator exception; it is counted in `tenant_faults` instead.
    pub fault: Fault,
    /// The failure is the tenant's that owns the job, whatever `fault` says (`owners`).
    pub owners: bool,
}

impl Failure {
    /// A failure operators act on (an exception opens).
    pub fn platform(kind: ExceptionKind, error: impl Into<String>) -> Failure {
        Failure { kind, error: error.into(), fault: Fault::Platform, owners: false }
    }

    /// A failure that is the job's own tenant's (its completion, its outside party).
    pub fn owners(kind: ExceptionKind, error: impl Into<String>) -> Failure {
        Failure { kind, error: error.into(), fault: Fault::Platform, owners: true }
    }
}

/// What the terminal-failure path wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failed {
    /// The fences refused as stale.
    pub refused: Vec<Fence>,
    /// Exceptions newly opened, as (exception id, job id). A job failing again while its
    /// exception is still open (an operator's retry that failed) opens none, and neither does
    /// a child of a parent: its parent's outcome reports it (`finish_parents`).
    pub opened: Vec<(Uuid, JobId)>,
    /// Callback deliveries created in the same statement, for the caller to dispatch.
    pub callbacks: Vec<Dispatch>,
    /// The parents of the jobs that failed, once each (see `Succeeded::parents`).
    pub parents: Vec<JobId>,
}

const FAIL: Transition = Transition {
    rows: "failed",
    set: "status = 'failed', lease_until = NULL, last_error = i.error,
                     fault = CASE WHEN i.at_fault IS NULL AND NOT i.owners THEN 'platform' ELSE 'tenant' END,
                     finished_at = now(), updated_at = now()",
    inputs: &[("kind", "text"), ("error", "text"), ("at_fault", "uuid"), ("owners", "bool")],
    kind: Some(EventKind::Failed),
    to: "failed",
    reason: "kind || ': ' || error",
};

/// The one terminal-failure path (see `fail_reporting`); returns the fences refused as stale.
pub async fn fail(db: &impl GenericClient, failures: &[(Fence, Failure)]) -> Result<Vec<Fence>, StoreError> {
    Ok(fail_reporting(db, failures).await?.refused)
}

/// The one terminal-failure path: the job becomes `failed` and an exception opens, in one
/// statement, for every task type (a tenant's own failure is counted in `tenant_faults`
/// instead). Fenced. The caller alerts on `opened` after commit
/// (`crate::exceptions::alert_opened`).
pub async fn fail_reporting(db: &impl GenericClient, failures: &[(Fence, Failure)]) -> Result<Failed, StoreError> {
    fail_from(db, JobStatus::Running, failures).await
}

/// `fail_reporting` for jobs in state `from` under the fenced attempt.
pub async fn fail_from(
    db: &impl GenericClient,
    from: JobStatus,
    failures: &[(Fence, Failure)],
) -> Result<Failed, StoreError> {
    let sql = FAIL.sql_from(
        from,
        &format!(
            ", opened AS (
                 INSERT INTO exceptions (id, job_id, tenant_id, task_type, kind, cause)
                 SELECT gen_random_uuid(), id, tenant_id, task_type, kind, error FROM failed
                 WHERE at_fault IS NULL AND NOT owners AND parent_id IS NULL
                 ON CONFLICT (job_id) WHERE status = 'open' DO NOTHING
                 RETURNING id, job_id
             ), blamed AS (
                 SELECT id, task_type, kind, error, CASE WHEN owners THEN tenant_id ELSE at_fault END AS at_fault
                 FROM failed
             ), {faults}, {callbacks}
             SELECT f.id, o.id, false, NULL::timestamptz, f.parent_id, f.has_dependents
             FROM failed f LEFT JOIN opened o ON o.job_id = f.id
             UNION ALL SELECT id, NULL, true, run_at, NULL::uuid, NULL::bool FROM callbacks",
            callbacks = callbacks::enqueue_ctes("failed", true),
            faults = tenant_faults::count_cte("blamed"),
        ),
    );
    let failures = &by_id(failures);
    let kinds: Vec<&str> = failures.iter().map(|f| f.1.kind.as_str()).collect();
    let errors: Vec<&str> = failures.iter().map(|f| f.1.error.as_str()).collect();
    let at_fault: Vec<Option<TenantId>> = failures
        .iter()
        .map(|f| match f.1.fault {
            Fault::Platform => None,
            Fault::Tenant(t) => Some(t),
        })
        .collect();
    let owners: Vec<bool> = failures.iter().map(|f| f.1.owners).collect();
    let (rows, refused) = fence::write(db, &sql, &fences(failures), &[&kinds, &errors, &at_fault, &owners]).await?;
    let opened = rows.iter().filter_map(|r| Some((r.get::<_, Option<Uuid>>(1)?, r.get::<_, JobId>(0)))).collect();
    let callbacks = with_dependents(db, &rows, 5, callbacks_of(&rows, 2)).await?;
    Ok(Failed { refused, opened, callbacks, parents: parents_of(&rows, 4) })
}

/// What a client's cancel did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled {
    /// The job itself was cancelled by this call (false: it is in another state, or not this
    /// tenant's; the caller reads it to say why).
    pub job: bool,
    /// Jobs that run after it (or after its children), cancelled down the chain by this call.
    pub dependents: usize,
    /// More dependents were left than `budget` allowed: the sweep cancels them (`dependencies::heal`).
    pub dependents_left: bool,
}

/// Cancel a pending or waiting job (or a failed one that holds its ordering key, whose open
/// exception closes) and its pending or waiting children, and the jobs that run after them
/// down the chain, at most `budget` of those. Run it in a transaction: the cancel
/// and its dependents' then commit together or not at all. The callback deliveries are created
/// in the same statements and sent by the next sweep pass.
pub async fn cancel(
    db: &impl GenericClient,
    tenant_id: TenantId,
    id: JobId,
    budget: usize,
) -> Result<Cancelled, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "WITH cancelled AS (
                 UPDATE jobs j SET status = 'cancelled', finished_at = now(), updated_at = now()
                 WHERE (id = $1 OR parent_id = $1) AND tenant_id = $2
                   AND (status IN ('pending', 'waiting')
                        -- A failed job that holds its ordering key: its cancel cancels its queue.
                        OR (id = $1 AND status = 'failed' AND EXISTS (
                            SELECT 1 FROM job_dependencies d WHERE d.after_id = j.id AND d.on_failure = 'hold')))
                 RETURNING {TERMINAL_RETURNING}
             ), events AS (
                 INSERT INTO job_events (job_id, kind, to_status, attempt, reason)
                 SELECT id, 'cancelled', 'cancelled', attempt, 'cancelled by client' FROM cancelled
             ), resolved AS (
                 -- A failed job's open exception closes with its cancel.
                 UPDATE exceptions x SET status = 'resolved', closed_at = now(), closed_by = 'client',
                     close_reason = 'the job was cancelled by its tenant'
                 WHERE x.job_id = $1 AND x.status = 'open' AND EXISTS (SELECT 1 FROM cancelled WHERE id = $1)
                 RETURNING x.id, x.job_id
             ), audit AS (
                 INSERT INTO exception_actions (exception_id, job_id, action, actor, reason)
                 SELECT id, job_id, 'resolve', 'client', 'the job was cancelled by its tenant' FROM resolved
             ), {callbacks}
             SELECT count(*) FILTER (WHERE id = $1), coalesce(array_agg(id ORDER BY id) FILTER (WHERE has_dependents), '{{}}')
             FROM cancelled",
            callbacks = callbacks::enqueue_ctes("cancelled", false),
        ))
        .await?;
    let row = db.query_one(&stmt, &[&id, &tenant_id]).await?;
    let ended: Vec<JobId> = row.get(1);
    let mut out = Cancelled { job: row.get::<_, i64>(0) == 1, ..Cancelled::default() };
    if !ended.is_empty() {
        let released = dependencies::release(db, &ended, false, budget).await?;
        out.dependents = released.changed();
        out.dependents_left = released.left;
    }
    Ok(out)
}

/// The deliveries of a terminal write (`callbacks`), and those of the dependents it released
/// or cancelled: only a row whose `has_dependents` (column `flag`) is set costs a statement.
async fn with_dependents(
    db: &impl GenericClient,
    rows: &[tokio_postgres::Row],
    flag: usize,
    mut callbacks: Vec<Dispatch>,
) -> Result<Vec<Dispatch>, StoreError> {
    let ended = dependencies::flagged(rows, 0, flag);
    if !ended.is_empty() {
        callbacks.extend(dependencies::release(db, &ended, true, dependencies::RELEASE_BUDGET).await?.dispatch);
    }
    Ok(callbacks)
}

/// Move a pending or running job to `waiting` for `total` children (declared before they are
/// created, so its progress never counts against a moving total). Children are created with
/// `NewJob::child_of` through the intake, in as many chunks as suit. False when the job is in
/// another state or not this tenant's.
pub async fn wait_for_children(
    db: &impl GenericClient,
    tenant_id: TenantId,
    id: JobId,
    total: i32,
) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE jobs SET status = 'waiting', children_total = $3, lease_until = NULL, updated_at = now()
             WHERE id = $1 AND tenant_id = $2 AND status IN ('pending', 'running') AND $3 >= 0",
            &[&id, &tenant_id, &total],
        )
        .await?;
    Ok(n == 1)
}
