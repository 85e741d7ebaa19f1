//! Waits for an outside party's completion past their deadline: each one's overdue policy
//! applied (`crate::completions::sweep_overdue`); waits whose job left their attempt closed.

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::StoreError;

pub(super) struct Overdue;

#[async_trait::async_trait]
impl Service for Overdue {
    fn name(&self) -> &'static str {
        "completions"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule::every_pass(config)
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let b = crate::completions::sweep_overdue(cx.pool, cx.transport, limit).await?;
        report.completions_overdue += b.handled;
        report.waits_superseded += b.superseded;
        Ok(b.handled + b.superseded)
    }
}
