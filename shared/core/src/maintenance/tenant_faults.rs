//! A tenant's own failures reach operators as one signal per tenant and cause, at most
//! hourly, and only when they grew: never one per job.

use std::time::Duration;

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::{StoreError, tenant_faults};

pub(super) struct Signals;

/// Signals a run takes at most.
const SIGNALS: i64 = 100;

#[async_trait::async_trait]
impl Service for Signals {
    fn name(&self) -> &'static str {
        "tenant_faults"
    }

    fn schedule(&self, _: &SweepConfig) -> Schedule {
        Schedule::once(Duration::ZERO, SIGNALS)
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let due = tenant_faults::take_due_signals(&cx.pool.get().await?, limit).await?;
        for f in &due {
            tracing::warn!(event = "relay.tenant_fault", tenant_id = %f.tenant_id, task_type = %f.task_type,
                kind = %f.kind, count = f.count, last_error = %f.last_error, last_job_id = %f.last_job_id,
                "a tenant's jobs keep failing for a reason of its own (GET /v1/admin/tenant-faults)");
        }
        report.tenant_faults_signalled += due.len();
        Ok(due.len())
    }
}
