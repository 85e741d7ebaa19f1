//! Dependencies whose end did not resolve their dependents (a crash between the two, or a
//! chain longer than one release takes on): released or cancelled here, at most ten batches'
//! worth of jobs a run (`store::dependencies::heal`); the rest the next.

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::{StoreError, dependencies};
use crate::transport;

pub(super) struct Dependents;

#[async_trait::async_trait]
impl Service for Dependents {
    fn name(&self) -> &'static str {
        "dependents"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        // One call, bounded by its budget: ten batches' worth of jobs changed.
        Schedule { batches: 1, ..Schedule::every_pass(config) }
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let budget = usize::try_from(limit).unwrap_or(0).saturating_mul(10);
        let healed = dependencies::heal(&cx.pool.get().await?, limit, budget).await?;
        report.dependents_healed += healed.changed();
        transport::send(cx.transport, cx.pool, &healed.dispatch).await;
        Ok(healed.changed())
    }
}
