//! External completions: a task ends an attempt waiting for an outside party, which completes
//! it later (the API, or a provider event naming the wait's token). The words of a wait, and
//! the pure decisions of how it ends for its job: on a completion, or when its deadline passes
//! with none (the overdue policy). No I/O here.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::{ExceptionKind, Fence};

/// The longest a wait may last.
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);
/// The longest error text a failure completion may carry.
pub const MAX_ERROR_CHARS: usize = 4000;

/// What the sweep does with a wait whose deadline passed with no completion. Chosen by the
/// task when it opens the wait (a task type may let its parameters choose).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OverduePolicy {
    /// Another attempt, after the retry policy's backoff: the attempt is used up. On the last
    /// attempt the job fails with one `completion_overdue` exception.
    Retry,
    /// Pending again `after` the deadline passed, without using an attempt (`max_attempts` is
    /// raised by one, as a continuing task's is, never past 100 attempts in all; past that the
    /// job fails with one `completion_overdue` exception).
    Reschedule { after: Duration },
    /// Fails for good with one `completion_overdue` exception.
    Fail,
}

impl OverduePolicy {
    /// The stored name (`completion_waits.on_overdue`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Reschedule { .. } => "reschedule",
            Self::Fail => "fail",
        }
    }

    /// From the stored name and `reschedule_seconds`; `None` for a name this build does not know.
    pub fn parse(name: &str, reschedule_seconds: Option<f64>) -> Option<Self> {
        match name {
            "retry" => Some(Self::Retry),
            "reschedule" => {
                Some(Self::Reschedule { after: Duration::from_secs_f64(reschedule_seconds.unwrap_or(0.0).max(0.0)) })
            }
            "fail" => Some(Self::Fail),
            _ => None,
        }
    }
}

/// How the outside party says the work went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CompletionOutcome {
    Success,
    Failure,
}

impl CompletionOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Success, Self::Failure].into_iter().find(|o| o.as_str() == s)
    }
}

/// A completion as received (checked by whoever received it: `result` storable, `error`
/// bounded and NUL-free).
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub outcome: CompletionOutcome,
    /// The job's result on success.
    pub result: Value,
    /// Why it failed, on failure.
    pub error: Option<String>,
    /// On failure: whether another attempt may help (the retry policy decides when); false
    /// fails the job for good.
    pub retryable: bool,
}

impl Completion {
    /// The completion's fingerprint: the same completion sent again is a replay, any other
    /// one a conflict.
    pub fn hash(&self) -> Vec<u8> {
        let canonical = serde_json::json!([self.outcome.as_str(), self.result, self.error, self.retryable]);
        Sha256::digest(canonical.to_string().as_bytes()).to_vec()
    }
}

/// An open wait, locked with its job, as the completion path and the sweep decide on it.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenWait {
    /// The job and the attempt that opened the wait.
    pub fence: Fence,
    pub max_attempts: i32,
    pub deadline: DateTime<Utc>,
    pub on_overdue: OverduePolicy,
    /// The backoff a retry of this attempt waits (drawn from the retry policy at opening).
    pub retry_delay: Duration,
}

/// What a wait's end does to its job.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitEnd {
    Succeed(Value),
    /// Pending again at `run_at`, the attempt used up.
    Retry {
        run_at: DateTime<Utc>,
        error: String,
    },
    /// Pending again at `run_at`, the attempt not counted.
    Reschedule {
        run_at: DateTime<Utc>,
        note: String,
    },
    Fail {
        kind: ExceptionKind,
        error: String,
    },
}

fn after(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(d.min(MAX_WAIT)).unwrap_or(chrono::Duration::zero())
}

/// A completion applied to its open wait: success succeeds the job with the result; a failure
/// retries (after the retry backoff) while attempts are left, and fails for good otherwise
/// (`attempts_exhausted`), or at once when the party says no retry can help (`fatal_error`).
pub fn on_completion(w: &OpenWait, c: &Completion, now: DateTime<Utc>) -> WaitEnd {
    let error = c.error.clone().unwrap_or_else(|| "the outside party reported a failure".into());
    match c.outcome {
        CompletionOutcome::Success => WaitEnd::Succeed(c.result.clone()),
        CompletionOutcome::Failure if !c.retryable => {
            WaitEnd::Fail { kind: ExceptionKind::FatalError, error: format!("completion: {error}") }
        }
        CompletionOutcome::Failure if w.fence.attempt < w.max_attempts => {
            WaitEnd::Retry { run_at: after(now, w.retry_delay), error: format!("completion: {error}") }
        }
        CompletionOutcome::Failure => WaitEnd::Fail {
            kind: ExceptionKind::AttemptsExhausted,
            error: format!("completion: {error} (attempt {} of {})", w.fence.attempt, w.max_attempts),
        },
    }
}

/// A wait whose deadline passed with no completion: its policy applied (see `OverduePolicy`).
pub fn on_overdue(w: &OpenWait, now: DateTime<Utc>) -> WaitEnd {
    let late =
        format!("no completion by the deadline {}", w.deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let fail = |why: &str| WaitEnd::Fail { kind: ExceptionKind::CompletionOverdue, error: format!("{late}{why}") };
    match w.on_overdue {
        OverduePolicy::Fail => fail(""),
        OverduePolicy::Retry if w.fence.attempt < w.max_attempts => {
            WaitEnd::Retry { run_at: after(now, w.retry_delay), error: format!("{late}; retrying") }
        }
        OverduePolicy::Retry => fail(&format!(" (attempt {} of {})", w.fence.attempt, w.max_attempts)),
        OverduePolicy::Reschedule { after: d } if w.fence.attempt < super::terms::MAX_ATTEMPTS => {
            WaitEnd::Reschedule { run_at: after(now, d), note: format!("{late}; rescheduled (no attempt used)") }
        }
        OverduePolicy::Reschedule { .. } => {
            fail(&format!(" (rescheduled up to {} attempts)", super::terms::MAX_ATTEMPTS))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;
    use serde_json::json;

    fn wait(attempt: i32, max_attempts: i32, on_overdue: OverduePolicy) -> OpenWait {
        OpenWait {
            fence: Fence { job: JobId::new(), attempt },
            max_attempts,
            deadline: Utc::now(),
            on_overdue,
            retry_delay: Duration::from_secs(4),
        }
    }

    fn failure(retryable: bool) -> Completion {
        Completion { outcome: CompletionOutcome::Failure, result: Value::Null, error: Some("busy".into()), retryable }
    }

    #[test]
    fn a_completion_succeeds_retries_or_fails_by_the_retry_policy() {
        let now = Utc::now();
        let ok =
            Completion { outcome: CompletionOutcome::Success, result: json!({"a": 1}), error: None, retryable: true };
        assert_eq!(on_completion(&wait(1, 3, OverduePolicy::Fail), &ok, now), WaitEnd::Succeed(json!({"a": 1})));
        assert_eq!(
            on_completion(&wait(1, 3, OverduePolicy::Fail), &failure(true), now),
            WaitEnd::Retry { run_at: now + chrono::Duration::seconds(4), error: "completion: busy".into() }
        );
        assert!(matches!(
            on_completion(&wait(3, 3, OverduePolicy::Retry), &failure(true), now),
            WaitEnd::Fail { kind: ExceptionKind::AttemptsExhausted, .. }
        ));
        assert!(matches!(
            on_completion(&wait(1, 3, OverduePolicy::Retry), &failure(false), now),
            WaitEnd::Fail { kind: ExceptionKind::FatalError, .. }
        ));
    }

    #[test]
    fn each_overdue_policy_ends_the_wait_its_own_way() {
        let now = Utc::now();
        assert!(
            matches!(on_overdue(&wait(1, 3, OverduePolicy::Retry), now), WaitEnd::Retry { run_at, .. } if run_at > now)
        );
        assert!(matches!(
            on_overdue(&wait(3, 3, OverduePolicy::Retry), now),
            WaitEnd::Fail { kind: ExceptionKind::CompletionOverdue, .. }
        ));
        let later = OverduePolicy::Reschedule { after: Duration::from_secs(60) };
        assert!(
            matches!(on_overdue(&wait(3, 3, later), now),
            WaitEnd::Reschedule { run_at, .. } if run_at == now + chrono::Duration::seconds(60)),
            "no attempt used"
        );
        assert!(matches!(
            on_overdue(&wait(100, 100, later), now),
            WaitEnd::Fail { kind: ExceptionKind::CompletionOverdue, .. }
        ));
        assert!(matches!(
            on_overdue(&wait(1, 3, OverduePolicy::Fail), now),
            WaitEnd::Fail { kind: ExceptionKind::CompletionOverdue, .. }
        ));
    }

    #[test]
    fn policies_and_outcomes_round_trip_and_hashes_tell_completions_apart() {
        for p in
            [OverduePolicy::Retry, OverduePolicy::Fail, OverduePolicy::Reschedule { after: Duration::from_secs(5) }]
        {
            assert_eq!(OverduePolicy::parse(p.as_str(), Some(5.0)), Some(p));
        }
        assert_eq!(OverduePolicy::parse("ignore", None), None);
        assert_eq!(CompletionOutcome::parse("failure"), Some(CompletionOutcome::Failure));
        assert_eq!(failure(true).hash(), failure(true).hash());
        assert_ne!(failure(true).hash(), failure(false).hash());
    }
}
