//! Progress and waiting reasons of the job resource: pure decisions from counted rows. No I/O.
//!
//! Two shapes, on purpose (deferred outcomes such as opens and deliveries stay on messages):
//! - `count`, a fan-out: the numerator comes from the children's own rows (terminal states
//!   counted), against the total the parent declared before creating them, so a child that
//!   dies without reporting cannot corrupt it and creating children in chunks cannot move it
//!   backwards.
//! - `elapsed`, an opaque single unit: time since its attempt started, against the median and
//!   p95 of earlier successful runs of the same task type; `stuck` past `STUCK_FACTOR` × p95.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::job::JobStatus;
use crate::store::jobs::Job;
use crate::store::progress::{Baseline, ChildCounts};

/// A running job is `stuck` once its elapsed time passes this multiple of its baseline's p95.
pub const STUCK_FACTOR: f64 = 3.0;
/// Fewer earlier runs than this make no baseline worth judging by: `stuck` stays false.
pub const MIN_BASELINE_RUNS: i32 = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Progress {
    /// A fan-out parent. `pending` = `total` minus the children in a terminal state (children
    /// not yet created, waiting or running). `succeeded`: children that did their work (an
    /// email sent). `shadowed`: children that ran in shadow mode, recording what they would
    /// have done (an email not sent). `skipped`: children that succeeded without doing their
    /// work, on purpose (an email to a suppressed recipient). The three never overlap.
    Count { total: i64, succeeded: i64, shadowed: i64, skipped: i64, failed: i64, cancelled: i64, pending: i64 },
    /// A single unit running for `elapsed_s`. The baseline fields are null until its task type
    /// has finished runs.
    Elapsed {
        elapsed_s: f64,
        baseline_p50_s: Option<f64>,
        baseline_p95_s: Option<f64>,
        runs_in_baseline: i32,
        stuck: bool,
    },
}

/// Why a non-terminal job is not running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingReason {
    /// `run_at` is in the future (a delay or a retry's backoff).
    NotDue,
    /// A rate held it (`waiting_rate` says which: an SES account's, a tenant's, a
    /// configuration set's, a destination's): pending until a slot is free, no attempt used.
    RateLimited,
    /// Its task type is paused by an operator.
    Paused,
    /// An email held because its tenant's reputation guard paused the tenant's sends
    /// (`waiting_rate` names the pause): pending, no attempt used, until an operator resumes.
    ReputationPaused,
    /// An email held because its tenant's SES tenant could not be set up yet
    /// (`write:ses_tenants`; `waiting_rate` `ses_tenant:<tenant>`, the job's last error says
    /// why): pending, no attempt used, tried again a minute later.
    SesTenantPending,
    /// As many jobs of its concurrency key as its limit allows are running.
    ConcurrencyKeyBusy,
    /// A fan-out parent whose children have not all finished.
    WaitingForChildren,
    /// Waiting for an outside party's completion, until its deadline (`waiting_until`).
    WaitingForCompletion,
    /// Pending until every job it runs after (`after`) has succeeded; no attempt used.
    WaitingForDependency,
    /// Pending behind the job ahead of it on its ordering key (`ordered_behind` names it)
    /// until that one has succeeded; no attempt used.
    OrderedBehind,
    /// Due and free to run, but no worker has taken it yet.
    NotClaimed,
}

/// A fan-out's count: the declared total (or the children that exist, if more or none was
/// declared), and what the children's rows say.
pub fn count(declared: Option<i32>, c: ChildCounts) -> Progress {
    let total = c.total.max(declared.map_or(0, i64::from));
    Progress::Count {
        total,
        succeeded: c.succeeded,
        shadowed: c.shadowed,
        skipped: c.skipped,
        failed: c.failed,
        cancelled: c.cancelled,
        pending: total - c.terminal(),
    }
}

/// A running single unit's elapsed time against its task type's baseline.
pub fn elapsed(now: DateTime<Utc>, started: DateTime<Utc>, baseline: Option<Baseline>) -> Progress {
    let elapsed_s = ((now - started).num_milliseconds().max(0) as f64) / 1000.0;
    let stuck = baseline.is_some_and(|b| b.runs >= MIN_BASELINE_RUNS && elapsed_s > STUCK_FACTOR * b.p95_s);
    Progress::Elapsed {
        elapsed_s,
        baseline_p50_s: baseline.map(|b| b.p50_s),
        baseline_p95_s: baseline.map(|b| b.p95_s),
        runs_in_baseline: baseline.map_or(0, |b| b.runs),
        stuck,
    }
}

/// The progress of a job: counted when it is a fan-out (declared children or children), its
/// elapsed time while a single unit runs, nothing otherwise.
pub fn of(
    job: &Job,
    children: Option<ChildCounts>,
    baseline: Option<Baseline>,
    now: DateTime<Utc>,
) -> Option<Progress> {
    if job.children_total.is_some() || children.is_some() {
        return Some(count(job.children_total, children.unwrap_or_default()));
    }
    match (job.status, job.started_at) {
        (JobStatus::Running, Some(started)) => Some(elapsed(now, started, baseline)),
        _ => None,
    }
}

/// Why a non-terminal job is not running; `None` while it runs or once it has finished.
/// `paused`: its task type is paused; `key_running`: how many jobs of its key run now;
/// `completion_until`: the deadline of its open wait for a completion, if it has one;
/// `rate_until`: until when a rate holds it, if one held it; `held`: it waits for jobs it runs
/// after.
pub fn waiting_reason(
    job: &Job,
    now: DateTime<Utc>,
    paused: bool,
    key_running: i64,
    completion_until: Option<DateTime<Utc>>,
    rate_until: Option<DateTime<Utc>>,
    held: bool,
) -> Option<WaitingReason> {
    match job.status {
        JobStatus::Pending if held => Some(WaitingReason::WaitingForDependency),
        JobStatus::Waiting if completion_until.is_some() => Some(WaitingReason::WaitingForCompletion),
        JobStatus::Waiting => Some(WaitingReason::WaitingForChildren),
        JobStatus::Pending if job.run_at > now && rate_until == Some(job.run_at) => Some(WaitingReason::RateLimited),
        JobStatus::Pending if job.run_at > now => Some(WaitingReason::NotDue),
        JobStatus::Pending if paused => Some(WaitingReason::Paused),
        JobStatus::Pending if job.concurrency_limit.is_some_and(|l| key_running >= i64::from(l)) => {
            Some(WaitingReason::ConcurrencyKeyBusy)
        }
        JobStatus::Pending => Some(WaitingReason::NotClaimed),
        _ => None,
    }
}

/// The status contract's flattened form of a job's progress.
impl From<&Progress> for relay_status::Progress {
    fn from(p: &Progress) -> Self {
        use Progress as P;
        match *p {
            // Shadowed and skipped children count in `done` too (1.0 readers know no others).
            P::Count { total, succeeded, shadowed, skipped, failed, cancelled, pending } => {
                let done = total - pending;
                relay_status::Progress {
                    kind: "count".into(),
                    total: Some(total),
                    succeeded: Some(succeeded),
                    shadowed: Some(shadowed),
                    skipped: Some(skipped),
                    failed: Some(failed),
                    cancelled: Some(cancelled),
                    pending: Some(pending),
                    done: Some(done),
                    fraction: Some(if total == 0 { 0.0 } else { done as f64 / total as f64 }),
                    ..relay_status::Progress::default()
                }
            }
            P::Elapsed { elapsed_s, baseline_p50_s, baseline_p95_s, runs_in_baseline, stuck } => {
                relay_status::Progress {
                    kind: "elapsed".into(),
                    elapsed_s: Some(elapsed_s),
                    baseline_p50_s,
                    baseline_p95_s,
                    runs_in_baseline: Some(runs_in_baseline),
                    stuck: Some(stuck),
                    ..relay_status::Progress::default()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_uses_the_declared_total_and_only_terminal_children() {
        let c = ChildCounts { total: 5, succeeded: 1, shadowed: 1, skipped: 1, failed: 1, cancelled: 0 };
        assert_eq!(
            count(Some(10), c),
            Progress::Count { total: 10, succeeded: 1, shadowed: 1, skipped: 1, failed: 1, cancelled: 0, pending: 6 }
        );
        // More children than declared: the total is never below what exists.
        assert_eq!(
            count(Some(2), c),
            Progress::Count { total: 5, succeeded: 1, shadowed: 1, skipped: 1, failed: 1, cancelled: 0, pending: 1 }
        );
        assert_eq!(
            count(None, ChildCounts::default()),
            Progress::Count { total: 0, succeeded: 0, shadowed: 0, skipped: 0, failed: 0, cancelled: 0, pending: 0 }
        );
        // The contract keeps each apart, and `done` counts them all.
        let flat = relay_status::Progress::from(&count(Some(10), c));
        assert_eq!((flat.succeeded, flat.shadowed, flat.skipped, flat.done), (Some(1), Some(1), Some(1), Some(4)));
    }

    #[test]
    fn stuck_needs_a_baseline_and_three_times_its_p95() {
        let now = Utc::now();
        let b = Baseline { p50_s: 1.0, p95_s: 2.0, runs: 20 };
        let stuck = |secs: i64, b| match elapsed(now, now - chrono::Duration::seconds(secs), b) {
            Progress::Elapsed { stuck, .. } => stuck,
            p => panic!("{p:?}"),
        };
        assert!(!stuck(5, Some(b)));
        assert!(stuck(7, Some(b)));
        assert!(!stuck(7, Some(Baseline { runs: 4, ..b })), "too few runs to judge");
        assert!(!stuck(1000, None));
        let json = serde_json::to_value(elapsed(now, now, None)).unwrap();
        assert_eq!(json["kind"], "elapsed");
        assert_eq!(json["baseline_p95_s"], serde_json::Value::Null);
    }
}
