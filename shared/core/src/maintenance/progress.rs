//! The baselines progress is measured from (`store::progress::refresh_baselines`).

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::StoreError;

pub(super) struct Baselines;

#[async_trait::async_trait]
impl Service for Baselines {
    fn name(&self) -> &'static str {
        "progress"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule { batches: 1, ..Schedule::every_pass(config) }
    }

    async fn batch(&self, cx: &Context<'_>, _: i64, _: &mut SweepReport) -> Result<usize, StoreError> {
        crate::store::progress::refresh_baselines(&cx.pool.get().await?).await?;
        Ok(0)
    }
}
