//! `noop` and `sleep`: the smallest tasks, for health checks and benchmarks.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::job::{ClaimedJob, Ending, Fault, TaskError};
use crate::plain::ParamError;
use crate::task::{Task, TaskContext};

/// Does nothing and succeeds; returns `echo` when given.
pub struct Noop;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoopParams {
    /// Any JSON value, returned as the result.
    #[serde(default)]
    pub echo: Option<Value>,
}

impl Task for Noop {
    type Params = NoopParams;
    const NAME: &'static str = "noop";
    const DESCRIPTION: &'static str = "Does nothing and succeeds; returns `echo` when given.";

    async fn run(&self, _ctx: &TaskContext, params: NoopParams) -> Result<Value, TaskError> {
        Ok(params.echo.map_or_else(|| json!({}), |e| json!({ "echo": e })))
    }
}

/// Sleeps for a while, then succeeds: a stand-in for long work (heartbeats, timeouts).
pub struct Sleep;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SleepParams {
    /// Seconds to sleep, 0 to 3600.
    #[schema(minimum = 0, maximum = 3600)]
    pub seconds: f64,
}

impl Task for Sleep {
    type Params = SleepParams;
    const NAME: &'static str = "sleep";
    const DESCRIPTION: &'static str = "Sleeps for `seconds`, then succeeds.";

    fn check(p: &SleepParams) -> Result<(), ParamError> {
        if (0.0..=3600.0).contains(&p.seconds) {
            Ok(())
        } else {
            Err(ParamError::new("seconds", "must be between 0 and 3600"))
        }
    }

    /// Asked to sleep at least as long as the job's own timeout, it can only time out: the
    /// tenant's input, not the platform's failure.
    fn fault(job: &ClaimedJob, _end: Ending<'_>, p: &SleepParams) -> Fault {
        if p.seconds >= f64::from(job.timeout_seconds) { Fault::Tenant(job.tenant_id) } else { Fault::Platform }
    }

    async fn run(&self, _ctx: &TaskContext, p: SleepParams) -> Result<Value, TaskError> {
        tokio::time::sleep(Duration::from_secs_f64(p.seconds)).await;
        Ok(json!({ "slept_seconds": p.seconds }))
    }
}
