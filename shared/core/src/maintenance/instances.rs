//! Lambda containers and processes come and go: their `workers` rows unseen for a week are
//! forgotten, once an hour.

use std::time::Duration;

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::{StoreError, workers};

pub(super) struct Forget;

/// How often instances are forgotten, and after how long unseen.
const EVERY: Duration = Duration::from_secs(3600);
const UNSEEN_DAYS: i64 = 7;

#[async_trait::async_trait]
impl Service for Forget {
    fn name(&self) -> &'static str {
        "instances"
    }

    fn schedule(&self, _: &SweepConfig) -> Schedule {
        Schedule::once(EVERY, 0)
    }

    async fn batch(&self, cx: &Context<'_>, _: i64, _: &mut SweepReport) -> Result<usize, StoreError> {
        let before = chrono::Utc::now() - chrono::Duration::days(UNSEEN_DAYS);
        workers::prune(&cx.pool.get().await?, before).await?;
        Ok(0)
    }
}
