//! Alert emails for new exceptions, when the sweep is given an alert configuration
//! (`crate::alerts::queue_due`).

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::StoreError;

pub(super) struct Alerts;

#[async_trait::async_trait]
impl Service for Alerts {
    fn name(&self) -> &'static str {
        "alerts"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule { batches: 1, ..Schedule::every_pass(config) }
    }

    async fn batch(&self, cx: &Context<'_>, _: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        if let Some(alerts) = &cx.config.alerts {
            report.alerts_queued += crate::alerts::queue_due(cx.pool, cx.intake, alerts).await?;
        }
        Ok(0)
    }
}
