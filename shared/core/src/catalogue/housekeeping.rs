//! Platform housekeeping tasks, run by built-in schedules; never submitted by clients.

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::job::TaskError;
use crate::plain::ParamError;
use crate::store::jobs::retention;
use crate::task::{Task, TaskContext};

pub const RETENTION: &str = "relay.retention";

/// Deletes terminal jobs (with their events, keys and closed exceptions) that finished more
/// than `older_than_days` ago, in bounded batches.
pub struct Retention;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetentionParams {
    /// Keep terminal jobs this many days (1 to 3650); default 30.
    #[serde(default = "default_days")]
    #[schema(minimum = 1, maximum = 3650)]
    pub older_than_days: u32,
    /// Jobs deleted per statement (1 to 10000); default 1000.
    #[serde(default = "default_batch")]
    #[schema(minimum = 1, maximum = 10_000)]
    pub batch: i64,
    /// Statements per run (1 to 10000); default 100. What is left waits for the next run.
    #[serde(default = "default_max_batches")]
    #[schema(minimum = 1, maximum = 10_000)]
    pub max_batches: u32,
}

fn default_days() -> u32 {
    30
}
fn default_batch() -> i64 {
    1000
}
fn default_max_batches() -> u32 {
    100
}

impl Task for Retention {
    type Params = RetentionParams;
    const NAME: &'static str = RETENTION;
    const DESCRIPTION: &'static str = "Platform only: deletes terminal jobs older than `older_than_days`.";
    const PLATFORM_ONLY: bool = true;

    fn check(p: &RetentionParams) -> Result<(), ParamError> {
        if !(1..=3650).contains(&p.older_than_days) {
            return Err(ParamError::new("older_than_days", "between 1 and 3650"));
        }
        if !(1..=10_000).contains(&p.batch) {
            return Err(ParamError::new("batch", "between 1 and 10000"));
        }
        if !(1..=10_000).contains(&p.max_batches) {
            return Err(ParamError::new("max_batches", "between 1 and 10000"));
        }
        Ok(())
    }

    async fn run(&self, ctx: &TaskContext, p: RetentionParams) -> Result<Value, TaskError> {
        let cutoff = chrono::Utc::now() - chrono::Duration::days(p.older_than_days.into());
        let mut deleted = 0u64;
        for _ in 0..p.max_batches {
            let db = ctx.db.get().await.map_err(|e| TaskError::Retryable(e.to_string()))?;
            let n = retention::delete_terminal_before(&db, cutoff, p.batch)
                .await
                .map_err(|e| TaskError::Retryable(e.to_string()))?;
            deleted += n;
            if n < u64::try_from(p.batch).unwrap_or(0) {
                break;
            }
        }
        tracing::info!(event = "relay.retention.deleted", jobs = deleted, cutoff = %cutoff, "retention pass");
        Ok(json!({ "deleted_jobs": deleted, "cutoff": cutoff }))
    }
}
