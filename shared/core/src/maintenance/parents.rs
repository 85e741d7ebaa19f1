//! Fan-out parents whose children have all ended and that the executor did not finish right
//! after the last child's commit (`crate::parents`): finished here, with their callbacks.

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::StoreError;
use crate::store::jobs;
use crate::transport;

pub(super) struct Parents;

#[async_trait::async_trait]
impl Service for Parents {
    fn name(&self) -> &'static str {
        "parents"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule::every_pass(config)
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let finished = jobs::finish_parents(&cx.pool.get().await?, limit).await?;
        report.parents_finished += finished.parents;
        crate::exceptions::alert_parents(&finished);
        transport::send(cx.transport, cx.pool, &finished.callbacks).await;
        Ok(finished.parents)
    }
}
