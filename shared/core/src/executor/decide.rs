//! The one decision of what an attempt leads to (`decide`), from how its run ended (`Ran`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::job::{ClaimedJob, ExceptionKind, Outcome, TaskError};
use crate::retry::RetryPolicy;

/// How a task run ended, before the decision.
#[derive(Debug)]
pub enum Ran {
    Finished(Result<Value, TaskError>),
    TimedOut(Duration),
    Panicked(String),
    UnknownType,
}

/// The one decision of what an attempt leads to. Pure: `now` and the policy come in.
pub fn decide(job: &ClaimedJob, ran: Ran, now: DateTime<Utc>, policy: &RetryPolicy) -> Outcome {
    let retry_or_fail_after = |error: String, asked: Option<Duration>| {
        if job.attempts_left() {
            Outcome::Retry { run_at: policy.next_run_at_after(now, job.attempt, asked), error }
        } else {
            let error = format!("{error} (attempt {} of {})", job.attempt, job.max_attempts);
            Outcome::Failed { kind: ExceptionKind::AttemptsExhausted, error, tenants: false }
        }
    };
    let retry_or_fail = |error: String| retry_or_fail_after(error, None);
    match ran {
        Ran::Finished(Ok(result)) => match crate::job::storable(&result) {
            Ok(()) => Outcome::Succeeded { result },
            Err(why) => Outcome::Failed { kind: ExceptionKind::FatalError, error: why.to_string(), tenants: false },
        },
        Ran::Finished(Err(TaskError::Tenant(inner))) => match decide(job, Ran::Finished(Err(*inner)), now, policy) {
            Outcome::Failed { kind, error, .. } => Outcome::Failed { kind, error, tenants: true },
            other => other,
        },
        Ran::Finished(Err(TaskError::Retryable(e))) => retry_or_fail(clean(&e)),
        Ran::Finished(Err(TaskError::RetryAfter(e, after))) => retry_or_fail_after(clean(&e), Some(after)),
        Ran::Finished(Err(TaskError::Fatal(e))) => {
            Outcome::Failed { kind: ExceptionKind::FatalError, error: clean(&e), tenants: false }
        }
        Ran::Finished(Err(TaskError::Ambiguous(e))) => {
            Outcome::Failed { kind: ExceptionKind::AmbiguousOutcome, error: clean(&e), tenants: false }
        }
        Ran::Finished(Err(TaskError::Continue(note))) => {
            Outcome::Continue { note: clean(&note), run_at: now, rate: None }
        }
        // At the cap of attempts a deferral is charged as a retry, so attempts stay bounded.
        Ran::Finished(Err(TaskError::Defer(note, after))) if job.max_attempts >= crate::job::terms::MAX_ATTEMPTS => {
            retry_or_fail_after(clean(&note), Some(after))
        }
        Ran::Finished(Err(TaskError::RateLimited { note, wait, .. }))
            if job.max_attempts >= crate::job::terms::MAX_ATTEMPTS =>
        {
            retry_or_fail_after(clean(&note), Some(wait))
        }
        Ran::Finished(Err(TaskError::Defer(note, after))) => Outcome::Continue {
            note: clean(&note),
            run_at: now + chrono::Duration::from_std(after).unwrap_or_default(),
            rate: None,
        },
        Ran::Finished(Err(TaskError::RateLimited { rate, note, wait })) => Outcome::Continue {
            note: clean(&note),
            run_at: now + chrono::Duration::from_std(wait).unwrap_or_default(),
            rate: Some(clean(&rate)),
        },
        Ran::Finished(Err(TaskError::WaitForChildren(total))) => Outcome::Wait { total },
        Ran::Finished(Err(TaskError::WaitForCompletion(until))) => Outcome::AwaitCompletion { until },
        Ran::TimedOut(t) => retry_or_fail(format!("timed out after {}s", t.as_secs())),
        Ran::Panicked(msg) => retry_or_fail(format!("task panicked: {}", clean(&msg))),
        Ran::UnknownType => Outcome::Failed {
            kind: ExceptionKind::UnknownTaskType,
            error: format!("task type {:?} is not in this executor's catalogue", job.task_type),
            tenants: false,
        },
    }
}

/// Error text as Postgres can store it (no NUL), bounded.
fn clean(e: &str) -> String {
    e.replace('\0', "\u{FFFD}").chars().take(4000).collect()
}

pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;
    use crate::job::TenantId;
    use serde_json::json;

    fn job(attempt: i32, max_attempts: i32) -> ClaimedJob {
        ClaimedJob {
            id: JobId::new(),
            tenant_id: TenantId::new(),
            task_type: "noop".into(),
            params: json!({}),
            correlation_id: "c".into(),
            attempt,
            max_attempts,
            timeout_seconds: 10,
            concurrency_key: None,
            run_at: Utc::now(),
        }
    }

    #[test]
    fn retryable_errors_retry_until_attempts_run_out() {
        let p = RetryPolicy::default();
        let now = Utc::now();
        let err = || Ran::Finished(Err(TaskError::Retryable("throttled".into())));
        assert!(matches!(decide(&job(1, 3), err(), now, &p), Outcome::Retry { run_at, .. } if run_at > now));
        match decide(&job(3, 3), err(), now, &p) {
            Outcome::Failed { kind, error, .. } => {
                assert_eq!(kind, ExceptionKind::AttemptsExhausted);
                assert!(error.contains("attempt 3 of 3"), "{error}");
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn fatal_ambiguous_and_unknown_fail_at_once() {
        let p = RetryPolicy::default();
        let now = Utc::now();
        let kind = |ran| match decide(&job(1, 5), ran, now, &p) {
            Outcome::Failed { kind, .. } => kind,
            o => panic!("{o:?}"),
        };
        assert_eq!(kind(Ran::Finished(Err(TaskError::Fatal("no".into())))), ExceptionKind::FatalError);
        assert_eq!(kind(Ran::Finished(Err(TaskError::Ambiguous("?".into())))), ExceptionKind::AmbiguousOutcome);
        assert_eq!(kind(Ran::UnknownType), ExceptionKind::UnknownTaskType);
    }

    #[test]
    fn timeouts_and_panics_are_retried() {
        let p = RetryPolicy::default();
        let now = Utc::now();
        assert!(matches!(decide(&job(1, 2), Ran::TimedOut(Duration::from_secs(3)), now, &p),
            Outcome::Retry { error, .. } if error == "timed out after 3s"));
        assert!(matches!(decide(&job(1, 2), Ran::Panicked("boom".into()), now, &p), Outcome::Retry { .. }));
    }

    #[test]
    fn unstorable_results_fail_instead_of_breaking_the_batch() {
        let p = RetryPolicy::default();
        let now = Utc::now();
        let nul = Ran::Finished(Ok(json!({"s": "a\u{0}b"})));
        assert!(matches!(decide(&job(1, 2), nul, now, &p), Outcome::Failed { .. }));
        let huge = Ran::Finished(Ok(json!("x".repeat(crate::job::MAX_RESULT_BYTES + 1))));
        assert!(matches!(decide(&job(1, 2), huge, now, &p), Outcome::Failed { .. }));
        assert_eq!(clean("a\0b"), "a\u{FFFD}b");
    }
}
