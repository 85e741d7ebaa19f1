//! The task contract: what a task type implements (`Task`) and what it is given to run
//! (`TaskContext`); a run ends in a value or a `TaskError` (the job's vocabulary, `crate::job`).
//! The task types (`catalogue/`, `email`) and the registry that holds them (`catalogue`) both
//! depend on this; a task never names the registry.

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::ToSchema;

use crate::credentials::JobAws;
use crate::intake::Intake;
use crate::job::{Fault, JobId, TaskError, TenantId};
use crate::retry::RetryPolicy;
use crate::store::modes::Modes;

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
    /// Creates jobs (a fan-out parent's children): insert, commit, then dispatch.
    pub intake: Intake,
    pub(crate) aws: JobAws,
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
    fn check(_params: &Self::Params) -> Result<(), (String, String)> {
        Ok(())
    }

    /// Whose failure a job with these parameters is when it fails for good: the platform's (an
    /// exception opens) or a tenant's own (counted per tenant and cause; no exception).
    fn fault(_params: &Self::Params) -> Fault {
        Fault::Platform
    }

    /// The stored template these parameters name, as (field under `params`, name): intake
    /// refuses a name the tenant has not stored, naming that field.
    fn template(_params: &Self::Params) -> Option<(&'static str, String)> {
        None
    }

    /// The destination these parameters call, as (field under `params`, name): intake refuses
    /// a name the tenant has not registered, naming that field.
    fn destination(_params: &Self::Params) -> Option<(&'static str, String)> {
        None
    }

    /// Whether a job with these parameters is held (not due) when submitted, until something
    /// releases it (a campaign waiting for its recipient pages).
    fn held(_params: &Self::Params) -> bool {
        false
    }

    fn run(&self, ctx: &TaskContext, params: Self::Params) -> impl Future<Output = Result<Value, TaskError>> + Send;
}
