//! The job's vocabulary: ids, states and the values a claim hands to a worker. No I/O here.
//!
//! The lifecycle (drawn once, in `shared/docs/state_machine.md`):
//! - `pending`: committed and due at `run_at`. In: intake, a retry, the sweep returning an
//!   expired lease. Out: a claim (worker), cancel (client or operator).
//! - `running`: claimed under a lease; the attempt number is the fence. Out: success, retry,
//!   continue (back to pending), wait for children, terminal failure (worker); lease expiry
//!   (sweep).
//! - `waiting`: a fan-out parent waiting for its children. In: its task says so
//!   (`TaskError::WaitForChildren`). Out: the sweep, once every declared child is terminal.
//! - `succeeded`, `failed` (an exception is open), `cancelled`: terminal.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A job's id: a UUIDv7, so ids sort by creation time.
pub type JobId = Uuid;
pub type TenantId = Uuid;

/// Where a job is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Pending,
    Running,
    Waiting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 6] = [
        Self::Pending,
        Self::Running,
        Self::Waiting,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// What a worker holds after a claim. `attempt` is the fencing token for every later write.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: JobId,
    pub tenant_id: TenantId,
    pub task_type: String,
    pub params: serde_json::Value,
    pub correlation_id: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub timeout_seconds: i32,
    /// Its concurrency key, if any: finishing frees a slot of that key.
    pub concurrency_key: Option<String>,
}

impl ClaimedJob {
    pub fn attempts_left(&self) -> bool {
        self.attempt < self.max_attempts
    }

    /// The fence of every write this claim makes.
    pub fn fence(&self) -> Fence {
        Fence { job: self.id, attempt: self.attempt }
    }
}

/// A job and the attempt that claimed it: a write after a claim applies only while the job
/// still runs under that attempt, so a worker that lost its lease cannot overwrite a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fence {
    pub job: JobId,
    pub attempt: i32,
}

/// A job handed to the transport: a hint that a row is (or will be) due. The row decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dispatch {
    pub id: JobId,
    pub run_at: DateTime<Utc>,
}

/// How one run of a task ended, as the task reports it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskError {
    /// Worth another attempt (a timeout before the request left, throttling, a 5xx before send).
    #[error("retryable: {0}")]
    Retryable(String),
    /// Worth another attempt, but not before this delay (the other side's `Retry-After`); the
    /// retry policy's own backoff applies when it is longer.
    #[error("retryable after {1:?}: {0}")]
    RetryAfter(String, std::time::Duration),
    /// Will never succeed (bad parameters, a definite rejection).
    #[error("fatal: {0}")]
    Fatal(String),
    /// The effect may or may not have happened; never retried automatically.
    #[error("ambiguous: {0}")]
    Ambiguous(String),
    /// Not a failure: the task made progress and runs again at once, in a new attempt that
    /// does not count against its attempts (a long job continues itself across runs instead of
    /// running long — a campaign creating its children in slices). The note says how far it got.
    #[error("continuing: {0}")]
    Continue(String),
    /// Not a failure: every declared child exists; the job waits for them to finish (the sweep
    /// finishes it, with counts, when they all have).
    #[error("waiting for {0} children")]
    WaitForChildren(i32),
}

/// The decision the executor records for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded { result: serde_json::Value },
    Retry { run_at: DateTime<Utc>, error: String },
    /// Fails for good and opens an exception of the given kind.
    Failed { kind: &'static str, error: String },
    /// Pending again at once, with one more attempt allowed (`TaskError::Continue`).
    Continue { note: String },
    /// Waiting for `total` children (`TaskError::WaitForChildren`).
    Wait { total: i32 },
}

/// The kinds of exception the terminal-failure path opens.
/// Who can act on a job that failed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Operators: an exception opens.
    #[default]
    Platform,
    /// This tenant (a callback URL it set, refused or never answering): the job and its own
    /// records say why; the failure is counted per tenant and cause, and opens no exception.
    Tenant(TenantId),
}

pub mod exception_kind {
    pub const ATTEMPTS_EXHAUSTED: &str = "attempts_exhausted";
    pub const FATAL_ERROR: &str = "fatal_error";
    pub const AMBIGUOUS_OUTCOME: &str = "ambiguous_outcome";
    pub const UNKNOWN_TASK_TYPE: &str = "unknown_task_type";
    pub const LEASE_EXPIRED: &str = "lease_expired";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_its_name() {
        for st in JobStatus::ALL {
            assert_eq!(JobStatus::parse(st.as_str()), Some(st));
            assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        }
        assert_eq!(JobStatus::parse("done"), None);
    }

    #[test]
    fn only_three_states_are_terminal() {
        let terminal: Vec<_> = JobStatus::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled]);
    }
}
