//! The fenced write, written once: every write after a claim joins a batch of fences
//! (`unnest` arrays of ids and attempts) to `jobs` by id and applies only to a job still
//! running under that attempt (or, for the end of a wait for a completion, still waiting
//! under it: `Transition::sql_from`). A transition writes its event in the same statement.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{EventKind, TERMINAL_RETURNING};
use crate::job::{Fence, JobId, JobStatus};
use crate::store::{GenericClient, StoreError};

/// `UPDATE jobs j SET {set}` for the fenced rows. The arrays are `$1` ids and `$2` attempts,
/// then one per `inputs` column (`(name, type)`), `$3` on, read as `i.<name>`.
pub(super) fn update(set: &str, inputs: &[(&str, &str)], returning: &str) -> String {
    update_from(JobStatus::Running, set, inputs, returning)
}

/// `update` for jobs in state `from` under the fenced attempt.
fn update_from(from: JobStatus, set: &str, inputs: &[(&str, &str)], returning: &str) -> String {
    let from = from.as_str();
    let arrays: String = inputs.iter().enumerate().map(|(n, (_, ty))| format!(", ${}::{ty}[]", n + 3)).collect();
    let names: String = inputs.iter().map(|(name, _)| format!(", {name}")).collect();
    format!(
        "UPDATE jobs j SET {set}
                 FROM unnest($1::uuid[], $2::int[]{arrays}) AS i(id, attempt{names})
                 WHERE j.id = i.id AND j.attempt = i.attempt AND (j.status || '') = '{from}'
                 RETURNING {returning}"
    )
}

/// A fenced transition of running jobs and the event each writes.
pub(super) struct Transition {
    /// The CTE of the rows moved, as `TERMINAL_RETURNING` and the input columns: the
    /// statement's later CTEs and its SELECT read it.
    pub rows: &'static str,
    pub set: &'static str,
    /// The input columns after id and attempt (see `update`).
    pub inputs: &'static [(&'static str, &'static str)],
    /// The event's kind and the state moved to. `None`: a success, which from `running` writes
    /// no event row, because the job row itself holds it (see `read::with_derived`).
    pub kind: Option<EventKind>,
    pub to: &'static str,
    /// The event's reason: an expression over the moved rows, or `NULL`.
    pub reason: &'static str,
}

impl Transition {
    /// The statement: the transition and its event (if it records one) as its first CTEs,
    /// then `rest` (any further CTEs, each led by a comma, and the final SELECT, led by its id).
    pub fn sql(&self, rest: &str) -> String {
        self.sql_from(JobStatus::Running, rest)
    }

    /// The same transition of jobs in state `from` (a wait for a completion ends from
    /// `waiting`, or from `running` when it arrived before the task returned), fenced alike.
    pub fn sql_from(&self, from: JobStatus, rest: &str) -> String {
        let Transition { rows, set, inputs, kind, to, reason } = self;
        let returning: String = [TERMINAL_RETURNING.to_owned()]
            .into_iter()
            .chain(inputs.iter().map(|(name, _)| format!("i.{name}")))
            .collect::<Vec<_>>()
            .join(", ");
        // The history derives only a running attempt's success; from any other state (a
        // completion ending a wait) a success is recorded like every other transition.
        let kind = kind.or((from != JobStatus::Running).then_some(EventKind::Succeeded));
        let events = match kind {
            Some(kind) => format!(
                ", events AS (
                 INSERT INTO job_events (job_id, kind, from_status, to_status, attempt, started_at, reason)
                 SELECT id, '{kind}', '{from}', '{to}', attempt, started_at, {reason} FROM {rows}
             )",
                from = from.as_str()
            ),
            None => String::new(),
        };
        format!(
            "WITH {rows} AS (
                 {update}
             ){events}{rest}",
            update = update_from(from, set, inputs, &returning),
        )
    }
}

/// Run a fenced statement for `fences` (in id order: see `by_id`), with `params` as `$3` on:
/// the input columns' arrays in the same order, then any other parameter. Returns its rows,
/// each led by a job's id, and the fences it did not reach (in id order), which the caller
/// treats as stale, never as done.
pub(super) async fn write(
    db: &impl GenericClient,
    sql: &str,
    fences: &[Fence],
    params: &[&(dyn ToSql + Sync)],
) -> Result<(Vec<Row>, Vec<Fence>), StoreError> {
    let stmt = db.prepare_cached(sql).await?;
    let ids: Vec<JobId> = fences.iter().map(|f| f.job).collect();
    let attempts: Vec<i32> = fences.iter().map(|f| f.attempt).collect();
    let all: Vec<&(dyn ToSql + Sync)> =
        [&ids as &(dyn ToSql + Sync), &attempts].into_iter().chain(params.iter().copied()).collect();
    let rows = db.query(&stmt, &all).await?;
    let written: std::collections::HashSet<JobId> = rows.iter().map(|r| r.get(0)).collect();
    let refused = fences.iter().copied().filter(|f| !written.contains(&f.job)).collect();
    Ok((rows, refused))
}

/// Lock these jobs' rows in id order (`ids` sorted), for a transaction that then writes them
/// in more than one statement: its locks are then taken in the one order every single fenced
/// statement takes them (`by_id`), so it cannot deadlock with one (a heartbeat).
pub async fn lock_in_order(db: &impl GenericClient, ids: &[JobId]) -> Result<(), StoreError> {
    let stmt = db.prepare_cached("SELECT 1 FROM jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE").await?;
    db.query(&stmt, &[&ids]).await?;
    Ok(())
}

/// Multi-row writes lock rows in the order of their input arrays. Every batch goes in sorted
/// by id, so two statements touching the same rows (a heartbeat and a completion that raced
/// it) wait for each other instead of deadlocking.
pub(super) fn by_id<T: Clone>(items: &[(Fence, T)]) -> Vec<(Fence, T)> {
    let mut sorted = items.to_vec();
    sorted.sort_by_key(|(f, _)| f.job);
    sorted
}

/// The fences of a batch sorted by `by_id`.
pub(super) fn fences<T>(items: &[(Fence, T)]) -> Vec<Fence> {
    items.iter().map(|(f, _)| *f).collect()
}
