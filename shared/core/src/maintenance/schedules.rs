//! Due schedule slots: each fired once across every sweeper (`crate::schedules::fire_due`).

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::StoreError;

pub(super) struct Slots;

#[async_trait::async_trait]
impl Service for Slots {
    fn name(&self) -> &'static str {
        "schedules"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule { batches: 1, ..Schedule::every_pass(config) }
    }

    async fn batch(&self, cx: &Context<'_>, _: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        report.schedules_fired += crate::schedules::fire_due(cx.pool, cx.intake, chrono::Utc::now()).await?.fired;
        Ok(0)
    }
}
