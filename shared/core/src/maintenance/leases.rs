//! Expired leases: a job whose worker died or hung goes back to pending while it has attempts
//! left, and fails for good (an exception) on its last.

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::job::{Dispatch, ExceptionKind, Fence};
use crate::metrics;
use crate::store::StoreError;
use crate::store::jobs::{self, ExpiredLease, Failure};
use crate::transport;

pub(super) struct Leases;

#[async_trait::async_trait]
impl Service for Leases {
    fn name(&self) -> &'static str {
        "leases"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule::every_pass(config)
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let (send, returned, failed) = recover(cx, limit).await?;
        report.leases_returned += returned;
        report.leases_failed += failed;
        metrics::LEASES_RECOVERED.add(returned + failed);
        transport::send(cx.transport, cx.pool, &send).await;
        Ok(returned + failed)
    }
}

/// What to do with expired leases: return those with attempts left, fail the rest. Pure.
pub fn decide_expired(leases: &[ExpiredLease]) -> (Vec<Fence>, Vec<(Fence, Failure)>) {
    let mut back = Vec::new();
    let mut fail = Vec::new();
    for l in leases {
        if l.fence.attempt < l.max_attempts {
            back.push(l.fence);
        } else {
            let error = format!(
                "lease expired on the last attempt ({} of {}); the worker died or hung",
                l.fence.attempt, l.max_attempts
            );
            fail.push((l.fence, Failure::platform(ExceptionKind::LeaseExpired, error)));
        }
    }
    (back, fail)
}

/// Lock one batch of expired leases, decide, write, commit. Returns the jobs to dispatch
/// (after commit: those returned, and the failed ones' callbacks), how many were returned and
/// how many failed for good.
async fn recover(cx: &Context<'_>, limit: i64) -> Result<(Vec<Dispatch>, usize, usize), StoreError> {
    let mut db = cx.pool.get().await?;
    let tx = db.transaction().await?;
    let expired = jobs::lock_expired_leases(&tx, limit).await?;
    if expired.is_empty() {
        return Ok((vec![], 0, 0));
    }
    let (back, fail) = decide_expired(&expired);
    // The rows are locked by this transaction, so neither write can be refused.
    if !back.is_empty() {
        jobs::return_expired(&tx, &back).await?;
    }
    let failed = if fail.is_empty() { jobs::Failed::default() } else { jobs::fail_reporting(&tx, &fail).await? };
    tx.commit().await?;
    for (exception_id, job_id) in &failed.opened {
        if let Some((_, f)) = fail.iter().find(|f| f.0.job == *job_id) {
            crate::exceptions::alert_opened(*exception_id, *job_id, f.kind, &f.error);
        }
    }
    for fence in &back {
        tracing::info!(event = "relay.sweep.lease_returned", job_id = %fence.job, attempt = fence.attempt, "expired lease returned to pending");
    }
    for (fence, f) in &fail {
        tracing::warn!(event = "relay.job.failed", job_id = %fence.job, attempt = fence.attempt, kind = f.kind.as_str(), error = %f.error,
            "job failed for good");
    }
    let now = chrono::Utc::now();
    let returned = back.len();
    let mut send: Vec<Dispatch> =
        back.into_iter().map(|fence| Dispatch { id: fence.job, run_at: now, tenant: None }).collect();
    send.extend(failed.callbacks);
    Ok((send, returned, fail.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;

    #[test]
    fn expired_leases_go_back_while_attempts_remain() {
        let l = |attempt, max_attempts| ExpiredLease { fence: Fence { job: JobId::new(), attempt }, max_attempts };
        let leases = [l(1, 3), l(3, 3), l(2, 3)];
        let (back, fail) = decide_expired(&leases);
        assert_eq!(back, vec![leases[0].fence, leases[2].fence]);
        assert_eq!(fail.len(), 1);
        assert_eq!(fail[0].0, leases[1].fence);
        assert_eq!(fail[0].1.kind, ExceptionKind::LeaseExpired);
    }
}
