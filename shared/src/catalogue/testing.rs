//! Test-only tasks, registered only when the catalogue is built with test tasks (tests, the
//! chaos suite, `relay dev --test-tasks`): they force failures and count effects.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{Task, TaskContext};
use crate::job::TaskError;
use crate::store::effects;

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
        let db = ctx.db.get().await.map_err(|e| TaskError::Retryable(e.to_string()))?;
        effects::record(&db, ctx.job_id, ctx.attempt)
            .await
            .map_err(|e| TaskError::Retryable(e.to_string()))?;
        tokio::time::sleep(Duration::from_secs_f64(p.sleep_seconds.clamp(0.0, 3600.0))).await;
        Ok(json!({ "effect": "recorded" }))
    }
}
