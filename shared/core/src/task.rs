//! The task contract: what a task type implements (`Task`) and what it is given to run
//! (`TaskContext`); a run ends in a value or a `TaskError` (the job's vocabulary, `crate::job`).
//! The task types (each feature's `task.rs`, the catalogue's own) and the registry that holds
//! them (`catalogue`) depend on this; a task never names the registry. This is a leaf above the
//! store: what a task may do beyond its rows it is given as a capability (`Jobs`, `AwsAccess`),
//! which the services behind them implement.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

use crate::job::completion::{MAX_WAIT, OverduePolicy};
use crate::job::{ClaimedJob, Ending, Fault, Fence, JobId, TaskError, TenantId};
use crate::plain::ParamError;
use crate::retry::RetryPolicy;
use crate::store::StoreError;
use crate::store::completions::{self, NewWait};
use crate::store::jobs::{Inserted, NewJob};
use crate::store::modes::Modes;
use crate::store::tenants;
use crate::transport::Transport;

/// What a task may do to other jobs: create them (a fan-out parent's children: insert, commit,
/// then dispatch) and hand follow-ups of jobs it ended to the transport. The platform's intake
/// (`crate::intake::Intake`) implements it.
#[async_trait::async_trait]
pub trait Jobs: Send + Sync {
    /// Insert jobs for one tenant (committed on return), then dispatch the new ones.
    async fn enqueue(&self, tenant_id: TenantId, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, Arc<StoreError>>;

    /// The transport jobs are dispatched through (for work that ends jobs outside the executor,
    /// such as a completion arriving by ingress, to dispatch their follow-ups).
    fn transport(&self) -> &Arc<dyn Transport>;
}

/// AWS access for one run: the task type's own role, assumed for this job and attempt
/// (`crate::credentials::JobAws` implements it).
#[async_trait::async_trait]
pub trait AwsAccess: Send + Sync {
    async fn sdk_config(&self) -> Result<aws_config::SdkConfig, TaskError>;
}

/// What a task sees of the job it runs for, and the platform it runs on.
#[derive(Clone)]
pub struct TaskContext {
    pub job_id: JobId,
    pub tenant_id: TenantId,
    pub task_type: String,
    pub attempt: i32,
    pub correlation_id: String,
    /// The modes read when this job was claimed.
    pub modes: Arc<Modes>,
    pub db: deadpool_postgres::Pool,
    /// Creates jobs (a fan-out parent's children) and dispatches follow-ups.
    pub jobs: Arc<dyn Jobs>,
    pub(crate) aws: Arc<dyn AwsAccess>,
    /// The retry policy this job's attempts follow (its task type's own, or the default).
    pub(crate) retry: RetryPolicy,
    /// Whether a send takes its tenant's share of a shared rate (`ExecutorConfig::send_shares`).
    pub(crate) send_shares: bool,
}

/// A wait for an outside party's completion, opened by `TaskContext::await_completion`.
#[derive(Debug, Clone)]
pub struct CompletionWait {
    /// The secret the outside party completes the job with (`POST /v1/jobs/{id}/complete`,
    /// or a provider event naming it). Shown here only: Relay keeps its hash.
    pub token: String,
    pub deadline: DateTime<Utc>,
}

impl CompletionWait {
    /// What the task returns once the token is handed out: the job waits until the deadline.
    pub fn wait(&self) -> TaskError {
        TaskError::WaitForCompletion(self.deadline)
    }
}

impl TaskContext {
    /// AWS access for this run only: an SDK configuration whose credentials are the task
    /// type's own role, assumed for this job and attempt and refreshed before expiry. Build
    /// every AWS client from it, per run (never at module level, in a static or at start-up).
    /// A task type with no mapped role gets a fatal error naming the missing mapping (default
    /// deny): return it with `?` and the job fails for good with an exception.
    pub async fn aws(&self) -> Result<aws_config::SdkConfig, TaskError> {
        self.aws.sdk_config().await
    }

    /// Open a wait for an outside party to complete this attempt within `within` (1 s to a
    /// year); `on_overdue` says what happens when the deadline passes with no completion. The
    /// wait exists (durably) before this returns, so hand the token out after it, then return
    /// `Err(wait.wait())`. A completion that arrives before the task has returned still
    /// applies (once); the task's own outcome is then refused as stale. One wait per attempt.
    pub async fn await_completion(
        &self,
        within: Duration,
        on_overdue: OverduePolicy,
    ) -> Result<CompletionWait, TaskError> {
        if within < Duration::from_secs(1) || within > MAX_WAIT {
            return Err(TaskError::Fatal(format!(
                "a completion deadline is 1 s to {} days away",
                MAX_WAIT.as_secs() / 86_400
            )));
        }
        let token = tenants::new_key("rc");
        let wait = NewWait {
            fence: Fence { job: self.job_id, attempt: self.attempt },
            token_hash: tenants::hash_key(&token),
            within_secs: within.as_secs_f64(),
            on_overdue,
            retry_delay_secs: self.retry.jittered(self.retry.backoff(self.attempt), &mut rand::rng()).as_secs_f64(),
        };
        let db = self.db.get().await.map_err(|e| TaskError::Retryable(format!("opening a completion wait: {e}")))?;
        match completions::open(&db, &wait).await {
            Ok(Some(deadline)) => Ok(CompletionWait { token, deadline }),
            Ok(None) => Err(TaskError::Fatal("this attempt already waits for a completion, or no longer runs".into())),
            Err(e) => Err(TaskError::Retryable(format!("opening a completion wait: {e}"))),
        }
    }
}

/// What intake settles before it admits a job (`Task::admit`); nothing by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Admission {
    /// Held (not due) when submitted, until something releases it (a campaign waiting for its
    /// recipient pages).
    pub held: bool,
    /// What the parameters name that the tenant must have stored: intake refuses a job naming
    /// one it has not, naming the field.
    pub names: Vec<Named>,
}

/// A stored thing that a job's parameters name, and the field that names it.
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    pub kind: Stored,
    /// The field's path under `params` (`message.template`).
    pub field: String,
    pub name: String,
}

/// The kinds of stored things parameters may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// A template (`PUT /v1/templates/{name}`).
    Template,
    /// A destination (`PUT /v1/destinations/{name}`).
    Destination,
    /// A run-time URL (`name`) that one of this destination's `url_patterns` must allow, and
    /// the address guard must not refuse when it is written as an address.
    UrlOf { destination: String },
}

/// A task type. `run` returns plain JSON: a task cannot hand back something unstorable.
pub trait Task: Send + Sync + 'static {
    type Params: DeserializeOwned + ToSchema + Send;
    const NAME: &'static str;
    const DESCRIPTION: &'static str;
    /// Run by the platform (built-in schedules) only: clients cannot submit it, nor see it.
    const PLATFORM_ONLY: bool = false;
    /// Its own schedule of retries, when the default one does not suit (still a `RetryPolicy`:
    /// every backoff comes from `retry.rs`).
    const RETRY: Option<RetryPolicy> = None;

    /// Checks serde cannot express (ranges, cross-field rules), as (field, message).
    fn check(_params: &Self::Params) -> Result<(), ParamError> {
        Ok(())
    }

    /// What `check` refuses that a client can know from the parameters alone, written into the
    /// parameter schema the task publishes (`GET /v1/tasks`); intake validates that very schema
    /// before `check`. Each rule is necessary (every value `check` takes, the rule takes), so a
    /// client applying the published schema refuses only what intake would.
    fn schema_rules(_schema: &mut Value) {}

    /// How the OpenAPI document narrows the published schema further (`api::constraints`; the
    /// schema is given with its `$defs` still in it): sufficient rules, every value they allow
    /// `check` takes, so that a request generated from the document is one intake admits. Not
    /// published to clients, who refuse only by the necessary rules of `schema_rules`.
    fn document_rules(_schema: &mut Value) {}

    /// Whose failure it is when `job` ends for good as `end` says: the platform's (Relay's
    /// bugs, AWS refusing Relay, a database outage: an exception opens) or a tenant's own (its
    /// endpoint, input, sender, template data or completion: counted per tenant and cause,
    /// shown on the job; no exception). By default, the tenant's when the task marked it so
    /// (`TaskError::tenants`).
    fn fault(job: &ClaimedJob, end: Ending<'_>, _params: &Self::Params) -> Fault {
        if end.tenants { Fault::Tenant(job.tenant_id) } else { Fault::Platform }
    }

    /// What intake settles before it admits a job with these parameters: whether it starts
    /// held, and what stored things it names that the tenant must have.
    fn admit(_params: &Self::Params) -> Admission {
        Admission::default()
    }

    /// The least `timeout_seconds` a job with these parameters needs (a call's own time limit
    /// and the time to record it): intake gives a job that names none at least this, and
    /// refuses one that names less. None: no need beyond the default.
    fn needs_seconds(_params: &Self::Params) -> Option<i32> {
        None
    }

    fn run(&self, ctx: &TaskContext, params: Self::Params) -> impl Future<Output = Result<Value, TaskError>> + Send;
}
