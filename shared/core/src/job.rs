//! The job's vocabulary: ids, states and the values a claim hands to a worker; the terms a new
//! job is made on are in `terms`. No I/O here.
//!
//! The lifecycle (drawn once, in `shared/docs/state_machine.md`):
//! - `pending`: committed and due at `run_at`. In: intake, a retry, the sweep returning an
//!   expired lease. Out: a claim (worker), cancel (client or operator, or the end of a job it
//!   runs after other than success: `store::dependencies`). Held, not due, while a job it runs
//!   after has not succeeded.
//! - `running`: claimed under a lease; the attempt number is the fence. Out: success, retry,
//!   continue (back to pending), wait for children, terminal failure (worker); lease expiry
//!   (sweep).
//! - `waiting`: a fan-out parent waiting for its children, or a job waiting for an outside
//!   party's completion. In: its task says so (`TaskError::WaitForChildren`,
//!   `TaskError::WaitForCompletion`). Out: the sweep, once every declared child is terminal;
//!   a completion (API or ingress), or the sweep once its deadline passed (`completion`).
//! - `succeeded`, `failed` (an exception is open), `cancelled`: terminal.

use chrono::{DateTime, Utc};
use postgres_types::{FromSql, ToSql};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub mod completion;
pub mod terms;

/// An id that is a UUID on the wire and in Postgres, and a type of its own in Rust, so a job's
/// id cannot be passed where a tenant's is meant. Serialises, stores, prints (`Display` and
/// `Debug`) and parses exactly as the UUID does; new ids are UUIDv7, so they sort by creation
/// time. The API documents id fields as plain UUIDs (`#[schema(value_type = Uuid)]`).
macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSql, FromSql)]
        #[serde(transparent)]
        #[postgres(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new id (UUIDv7).
            #[allow(clippy::new_without_default)]
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub const fn from_uuid(id: Uuid) -> Self {
                Self(id)
            }

            pub const fn as_uuid(self) -> Uuid {
                self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.0, f)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&self.0, f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// A job's id: a UUIDv7, so ids sort by creation time.
    JobId
);
uuid_id!(
    /// A tenant's id.
    TenantId
);

/// A new id, as `JobId::new` (so a `NewJob` can fill its fields from `Default`).
impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

/// How far ahead a held job's `run_at` is put until it is released: a campaign awaiting its
/// recipient pages, a job awaiting its dependencies (`store::dependencies`).
pub const HELD_FOR: chrono::Duration = chrono::Duration::days(366);

/// Where a job is in its lifecycle.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    ToSchema,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum JobStatus {
    Pending,
    Running,
    Waiting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 6] =
        [Self::Pending, Self::Running, Self::Waiting, Self::Succeeded, Self::Failed, Self::Cancelled];

    /// The name serde writes, stored as the row's text.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Strict: only the names `as_str` gives.
    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
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
    /// When it was due: with its id, its place in its key's queue (`jobs::Lane`).
    pub run_at: DateTime<Utc>,
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
    /// The job's tenant where the dispatcher has it at hand (the SQS transport sends it as the
    /// message group, `transport::sqs`; it looks up the rest).
    pub tenant: Option<TenantId>,
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
    /// Not a failure: the task may not act yet (a destination's rate is used up, or its
    /// writes are switched off). Pending again after the delay, in a new attempt that does not
    /// count against its attempts (the cap of 100 attempts still holds). The note says why.
    #[error("deferred for {1:?}: {0}")]
    Defer(String, std::time::Duration),
    /// A `Defer` because a rate is used up: the job shows `waiting_reason` `rate_limited`
    /// and `waiting_rate` (which rate: `account:default`, `tenant:<id>`,
    /// `configuration_set:<name>`, `destination:<name>`) until it is due again.
    #[error("rate limited by {rate} for {wait:?}: {note}")]
    RateLimited { rate: String, note: String, wait: std::time::Duration },
    /// Not a failure: every declared child exists; the job waits for them to finish (the sweep
    /// finishes it, with counts, when they all have).
    #[error("waiting for {0} children")]
    WaitForChildren(i32),
    /// Not a failure: the task opened a wait for an outside party
    /// (`TaskContext::await_completion`) and handed its token out; the job waits until this
    /// deadline for the completion (see `completion`).
    #[error("waiting for a completion until {0}")]
    WaitForCompletion(DateTime<Utc>),
    /// The failure inside is the tenant's own (its endpoint, input, sender, template data or
    /// completion): retried as the inner error says, and when it ends the job, counted per
    /// tenant and shown on the job as the tenant's, with no operator exception. Made with
    /// `TaskError::tenants`.
    #[error("{0}")]
    Tenant(Box<TaskError>),
}

impl TaskError {
    /// This failure is the tenant's own (see `TaskError::Tenant`).
    pub fn tenants(self) -> TaskError {
        match self {
            TaskError::Tenant(_) => self,
            e => TaskError::Tenant(Box::new(e)),
        }
    }
}

impl TaskError {
    /// A retryable error from anything that says what went wrong (a store or pool error, an
    /// SDK error): the one way a task turns a transient failure into another attempt.
    pub fn retryable(e: impl std::fmt::Display) -> Self {
        TaskError::Retryable(e.to_string())
    }
}

/// The decision the executor records for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded {
        result: serde_json::Value,
    },
    Retry {
        run_at: DateTime<Utc>,
        error: String,
    },
    /// Fails for good and opens an exception of the given kind (unless it is a tenant's fault).
    Failed {
        kind: ExceptionKind,
        error: String,
        /// The task said the failure is the tenant's own (`TaskError::Tenant`).
        tenants: bool,
    },
    /// Pending again at `run_at` (at once for `TaskError::Continue`, later for
    /// `TaskError::Defer`), with one more attempt allowed.
    Continue {
        note: String,
        run_at: DateTime<Utc>,
        /// The rate that held it (`TaskError::RateLimited`), if one did.
        rate: Option<String>,
    },
    /// Waiting for `total` children (`TaskError::WaitForChildren`).
    Wait {
        total: i32,
    },
    /// Waiting for an outside party's completion until `until` (`TaskError::WaitForCompletion`).
    AwaitCompletion {
        until: DateTime<Utc>,
    },
}

/// The largest result a task may return, serialised.
pub const MAX_RESULT_BYTES: usize = 256 * 1024;

/// Why a task's result cannot be stored (the job fails for good).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unstorable {
    #[error("result is {0} bytes; the limit is {MAX_RESULT_BYTES}")]
    TooLarge(usize),
    #[error("result contains a NUL character, which cannot be stored")]
    Nul,
}

/// A result must be plain JSON that Postgres can store: no NUL characters, bounded size (a
/// completion's result is held to the same).
pub fn storable(result: &serde_json::Value) -> Result<(), Unstorable> {
    let text = result.to_string();
    if text.len() > MAX_RESULT_BYTES {
        return Err(Unstorable::TooLarge(text.len()));
    }
    if text.contains("\\u0000") {
        return Err(Unstorable::Nul);
    }
    Ok(())
}

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

impl Fault {
    /// The name stored in `jobs.fault` and written in a job's view: `platform` or `tenant`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Platform => "platform",
            Fault::Tenant(_) => "tenant",
        }
    }

    /// A stored name read back for a job of `tenant`; `None` for a name this build does not know.
    pub fn parse(s: &str, tenant: TenantId) -> Option<Self> {
        match s {
            "platform" => Some(Fault::Platform),
            "tenant" => Some(Fault::Tenant(tenant)),
            _ => None,
        }
    }
}

impl Serialize for Fault {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// How a job ended for good, as its task type's `Task::fault` judges whose failure it is.
#[derive(Debug, Clone, Copy)]
pub struct Ending<'a> {
    pub kind: ExceptionKind,
    pub error: &'a str,
    /// The task marked the failure as the tenant's own (`TaskError::Tenant`).
    pub tenants: bool,
}

/// Why a job failed for good: the kind of exception the terminal-failure path opens (or of
/// tenant fault it counts). Stored as text (`exceptions.kind`, `tenant_faults.kind`), the same
/// names serde writes. Text no variant names (a newer build's kind) is `UnknownExceptionKind`,
/// an error for whoever reads it; there is no catch-all variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExceptionKind {
    /// Every attempt failed with a retryable error.
    AttemptsExhausted,
    /// The task said it can never succeed, or its result could not be stored.
    FatalError,
    /// The effect may or may not have happened; never retried automatically.
    AmbiguousOutcome,
    /// The executor's catalogue has no task of the job's type.
    UnknownTaskType,
    /// The lease of the last attempt expired: the worker died or hung.
    LeaseExpired,
    /// Children of a fan-out parent failed: one exception for the parent, with the most
    /// common cause (its children open none of their own).
    ChildrenFailed,
    /// An outside party's completion did not arrive by its deadline, and the task's overdue
    /// policy fails the job (or had no attempt left to retry with).
    CompletionOverdue,
}

impl ExceptionKind {
    pub const ALL: [ExceptionKind; 7] = [
        Self::AttemptsExhausted,
        Self::FatalError,
        Self::AmbiguousOutcome,
        Self::UnknownTaskType,
        Self::LeaseExpired,
        Self::ChildrenFailed,
        Self::CompletionOverdue,
    ];

    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AttemptsExhausted => "attempts_exhausted",
            Self::FatalError => "fatal_error",
            Self::AmbiguousOutcome => "ambiguous_outcome",
            Self::UnknownTaskType => "unknown_task_type",
            Self::LeaseExpired => "lease_expired",
            Self::ChildrenFailed => "children_failed",
            Self::CompletionOverdue => "completion_overdue",
        }
    }
}

impl std::fmt::Display for ExceptionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ExceptionKind {
    type Err = UnknownExceptionKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| UnknownExceptionKind(s.to_owned()))
    }
}

/// Stored text that names no `ExceptionKind` (written by a newer build, or by hand).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an exception kind this build knows")]
pub struct UnknownExceptionKind(pub String);

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
        assert_eq!(JobStatus::parse("Pending"), None, "strict: the stored name only");
        assert_eq!(JobStatus::Cancelled.to_string(), "cancelled");
    }

    #[test]
    fn exception_kinds_round_trip_through_their_stored_text() {
        for k in ExceptionKind::ALL {
            assert_eq!(k.as_str().parse::<ExceptionKind>(), Ok(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
            assert_eq!(k.to_string(), k.as_str());
        }
        let names: Vec<&str> = ExceptionKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "attempts_exhausted",
                "fatal_error",
                "ambiguous_outcome",
                "unknown_task_type",
                "lease_expired",
                "children_failed",
                "completion_overdue"
            ]
        );
        assert_eq!("disk_on_fire".parse::<ExceptionKind>(), Err(UnknownExceptionKind("disk_on_fire".into())));
        assert!(serde_json::from_value::<ExceptionKind>(serde_json::json!("disk_on_fire")).is_err());
    }

    #[test]
    fn only_three_states_are_terminal() {
        let terminal: Vec<_> = JobStatus::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled]);
    }
}
