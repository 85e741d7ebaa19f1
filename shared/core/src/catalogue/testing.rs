//! Test-only tasks, registered only when the catalogue is built with test tasks (tests, the
//! chaos suite, `relay dev --test-tasks`): they force failures, count effects, show which
//! AWS identity a task runs under, and wait for an outside party's completion.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::job::TaskError;
use crate::job::completion::{MAX_WAIT, OverduePolicy};
use crate::plain::ParamError;
use crate::store::effects;
use crate::task::{Task, TaskContext};

/// Fails its first `times` attempts with the given kind of error, then succeeds.
pub struct Fail;

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailKind {
    Retryable,
    Fatal,
    Ambiguous,
    Panic,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailParams {
    /// How many attempts fail before one succeeds.
    pub times: i32,
    pub kind: FailKind,
}

impl Task for Fail {
    type Params = FailParams;
    const NAME: &'static str = "test.fail";
    const DESCRIPTION: &'static str = "Test only: fails its first `times` attempts, then succeeds.";

    async fn run(&self, ctx: &TaskContext, p: FailParams) -> Result<Value, TaskError> {
        if ctx.attempt > p.times {
            return Ok(json!({ "failed_attempts": p.times }));
        }
        let msg = format!("forced failure on attempt {}", ctx.attempt);
        Err(match p.kind {
            FailKind::Retryable => TaskError::Retryable(msg),
            FailKind::Fatal => TaskError::Fatal(msg),
            FailKind::Ambiguous => TaskError::Ambiguous(msg),
            FailKind::Panic => panic!("{msg}"),
        })
    }
}

/// Records one row in the effects ledger per run, then optionally sleeps: lets tests count
/// how many times an effect really happened.
pub struct Effect;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EffectParams {
    /// Seconds to sleep after the effect.
    #[serde(default)]
    pub sleep_seconds: f64,
}

impl Task for Effect {
    type Params = EffectParams;
    const NAME: &'static str = "test.effect";
    const DESCRIPTION: &'static str = "Test only: writes one effects-ledger row, then sleeps.";

    async fn run(&self, ctx: &TaskContext, p: EffectParams) -> Result<Value, TaskError> {
        {
            // Give the connection back before sleeping: held through the sleep, 64 sleeping
            // jobs held a worker's whole pool and starved its heartbeat and claims (found by
            // `relay chaos zombie`: every lease expired, attempts ran out).
            let db = ctx.db.get().await.map_err(|e| TaskError::Retryable(e.to_string()))?;
            effects::record(&db, ctx.job_id, ctx.attempt).await.map_err(|e| TaskError::Retryable(e.to_string()))?;
        }
        tokio::time::sleep(Duration::from_secs_f64(p.sleep_seconds.clamp(0.0, 3600.0))).await;
        Ok(json!({ "effect": "recorded" }))
    }
}

/// Asks STS who it is (GetCallerIdentity) with this run's scoped credentials, `calls` times
/// `interval_seconds` apart, and returns the ARNs seen: lets tests check which role a task
/// really ran under, and that a long run keeps working across a credentials refresh.
pub struct WhoAmI;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhoAmIParams {
    /// How many calls (1 to 100, default 1).
    #[serde(default = "one")]
    pub calls: u32,
    /// Seconds between calls (0 to 60).
    #[serde(default)]
    pub interval_seconds: f64,
}

fn one() -> u32 {
    1
}

impl Task for WhoAmI {
    type Params = WhoAmIParams;
    const NAME: &'static str = "test.whoami";
    const DESCRIPTION: &'static str = "Test only: GetCallerIdentity under the task's own role; returns the ARNs seen.";

    fn check(p: &WhoAmIParams) -> Result<(), ParamError> {
        if !(1..=100).contains(&p.calls) {
            return Err(ParamError::new("calls", "must be between 1 and 100"));
        }
        if !(0.0..=60.0).contains(&p.interval_seconds) {
            return Err(ParamError::new("interval_seconds", "must be between 0 and 60"));
        }
        Ok(())
    }

    async fn run(&self, ctx: &TaskContext, p: WhoAmIParams) -> Result<Value, TaskError> {
        // Built per run from this job's credentials: never at module level or start-up.
        let sts = aws_sdk_sts::Client::new(&ctx.aws().await?);
        let mut arns = Vec::new();
        for n in 0..p.calls {
            if n > 0 {
                tokio::time::sleep(Duration::from_secs_f64(p.interval_seconds)).await;
            }
            let me = sts.get_caller_identity().send().await.map_err(|e| {
                TaskError::Retryable(format!("GetCallerIdentity: {}", aws_sdk_sts::error::DisplayErrorContext(e)))
            })?;
            arns.push(me.arn().unwrap_or_default().to_owned());
        }
        Ok(json!({ "arn": arns.last(), "arns": arns }))
    }
}

/// Opens a wait for an outside party's completion (`TaskContext::await_completion`) and hands
/// the token to the test playing that party: it is noted in the effects ledger beside the
/// attempt (`effects::notes`). Attempts after `wait_attempts` succeed at once.
pub struct Await;

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnOverdue {
    Retry,
    Reschedule,
    Fail,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AwaitParams {
    /// Seconds until the deadline (1 to a year).
    pub within_seconds: f64,
    /// What happens when the deadline passes with no completion (default `retry`).
    #[serde(default = "retry")]
    pub on_overdue: OnOverdue,
    /// With `reschedule`: seconds after the deadline the job runs again (default 0).
    #[serde(default)]
    pub reschedule_seconds: f64,
    /// How many attempts wait (default: all); later ones succeed at once.
    #[serde(default)]
    pub wait_attempts: Option<i32>,
}

fn retry() -> OnOverdue {
    OnOverdue::Retry
}

impl Task for Await {
    type Params = AwaitParams;
    const NAME: &'static str = "test.await";
    const DESCRIPTION: &'static str =
        "Test only: waits for an outside party's completion; the token is noted in the effects ledger.";

    fn check(p: &AwaitParams) -> Result<(), ParamError> {
        if !(1.0..=MAX_WAIT.as_secs_f64()).contains(&p.within_seconds) {
            return Err(ParamError::new("within_seconds", "must be between 1 and 31622400"));
        }
        if !(0.0..=MAX_WAIT.as_secs_f64()).contains(&p.reschedule_seconds) {
            return Err(ParamError::new("reschedule_seconds", "must be between 0 and 31622400"));
        }
        Ok(())
    }

    async fn run(&self, ctx: &TaskContext, p: AwaitParams) -> Result<Value, TaskError> {
        if p.wait_attempts.is_some_and(|n| ctx.attempt > n) {
            return Ok(json!({ "attempt": ctx.attempt, "waited": false }));
        }
        let policy = match p.on_overdue {
            OnOverdue::Retry => OverduePolicy::Retry,
            OnOverdue::Reschedule => OverduePolicy::Reschedule { after: Duration::from_secs_f64(p.reschedule_seconds) },
            OnOverdue::Fail => OverduePolicy::Fail,
        };
        let wait = ctx.await_completion(Duration::from_secs_f64(p.within_seconds), policy).await?;
        // Handing the token to the outside party.
        let db = ctx.db.get().await.map_err(|e| TaskError::Retryable(e.to_string()))?;
        effects::record_note(&db, ctx.job_id, ctx.attempt, &wait.token)
            .await
            .map_err(|e| TaskError::Retryable(e.to_string()))?;
        Err(wait.wait())
    }
}
