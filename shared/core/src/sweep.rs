//! The sweep: returns expired leases to pending (or fails them for good when no attempt is
//! left), re-dispatches due jobs whose dispatch failed or was lost, and fires due schedule
//! slots (`crate::schedules`), applies the overdue policy of waits for a completion whose
//! deadline passed (`crate::completions`), reads the SES account's rate and quota
//! (`crate::email::pace`), and queues alert emails for new exceptions (`crate::alerts`). Every recovery is a
//! job event and a counter. Any number of sweepers may run at once: rows are locked with
//! `SKIP LOCKED`, so two sweepers never recover the same row.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use serde::Serialize;
use tokio::sync::watch;

use crate::alerts::AlertConfig;
use crate::intake::Intake;
use crate::job::{Dispatch, ExceptionKind, Fence};
use crate::liveness::Liveness;
use crate::metrics;
use crate::store::jobs::{self, ExpiredLease, Failure};
use crate::store::{StoreError, workers};
use crate::transport::{self, Transport};

#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// Rows handled per statement; a pass loops until a batch comes back short.
    pub batch: i64,
    /// A dispatched job not claimed this long after falling due counts as lost.
    pub redispatch_grace: Duration,
    /// Upper bound on batches per pass, so one pass always ends.
    pub max_batches: usize,
    /// Alert emails for new exceptions (`crate::alerts`); `None`: the log line only.
    pub alerts: Option<AlertConfig>,
    /// Read Relay's SES account's rate and quota (`GetAccount`) with this configuration,
    /// at most once per `ACCOUNT_READ_EVERY` across every sweeper; `None`: never.
    pub ses_account: Option<aws_config::SdkConfig>,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            batch: 1000,
            redispatch_grace: Duration::from_secs(30),
            max_batches: 100,
            alerts: None,
            ses_account: None,
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    pub leases_returned: usize,
    pub leases_failed: usize,
    pub redispatched: usize,
    /// Schedule slots this pass created jobs for.
    pub schedules_fired: usize,
    /// Alert emails queued for new exceptions.
    pub alerts_queued: usize,
    /// Waiting fan-out parents finished because every child had.
    pub parents_finished: usize,
    /// Waits for a completion past their deadline whose overdue policy this pass applied.
    pub completions_overdue: usize,
    /// Open waits closed because their job had left their attempt (cancelled, retried).
    pub waits_superseded: usize,
    /// Tenant faults signalled to operators (`relay.tenant_fault`).
    pub tenant_faults_signalled: usize,
    /// Whether this pass read the SES account's rate and quota.
    pub ses_account_read: bool,
    /// Jobs released or cancelled (down a chain too) for dependencies whose end did not
    /// resolve them: a crash between the two, or a chain longer than one release takes on
    /// (`dependencies::RELEASE_BUDGET`). At most ten batches a pass; the rest the next.
    pub dependents_healed: usize,
}

#[derive(Clone)]
pub struct Sweeper {
    pub pool: Pool,
    pub transport: Arc<dyn Transport>,
    /// Creates the jobs of schedule slots.
    pub intake: Intake,
    pub config: SweepConfig,
    /// Shared by the clones of one sweeper (its loop, a Lambda container's invocations).
    pub resend: Arc<Mutex<ResendBackoff>>,
}

/// While the transport keeps refusing the sweep's re-sends (a queue outage), later passes
/// skip re-sending: after 3 failing passes in a row one pass is skipped, then 3, 7, 15, at
/// most 30. Without it every pass sent every pending row again, each with an event: 32,298
/// re-sends for 1,141 jobs in a 60 s outage (`relay chaos queue-outage`). One or two failures
/// in a row (a flaky transport) are retried on the very next pass. A re-send that goes out
/// resets it.
#[derive(Debug, Default)]
pub struct ResendBackoff {
    failures: u32,
    skip: u32,
}

impl ResendBackoff {
    const MAX_SKIP: u32 = 30;

    /// Whether this pass may re-send (a skipped pass counts down).
    fn ready(&mut self) -> bool {
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    fn record(&mut self, sent: bool) {
        if sent {
            *self = Self::default();
            return;
        }
        self.failures += 1;
        if self.failures >= 3 {
            self.skip = (1u32 << (self.failures - 2).min(5)).saturating_sub(1).min(Self::MAX_SKIP);
        }
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

impl Sweeper {
    /// One pass over expired leases and lost dispatches.
    pub async fn pass(&self) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        for _ in 0..self.config.max_batches {
            let (back, failed) = self.recover_expired_batch().await?;
            report.leases_returned += back.len();
            report.leases_failed += failed;
            transport::send(&self.transport, &self.pool, &back).await;
            if back.len() + failed < usize::try_from(self.config.batch).unwrap_or(usize::MAX) {
                break;
            }
        }
        // While the transport keeps refusing re-sends, some passes skip them (`ResendBackoff`).
        let may_resend = self.resend.lock().unwrap_or_else(|p| p.into_inner()).ready();
        let resend_batches = if may_resend { self.config.max_batches } else { 0 };
        for _ in 0..resend_batches {
            let lost = {
                let mut db = self.pool.get().await?;
                let grace = self.config.redispatch_grace.as_secs_f64();
                let mut lost = jobs::take_lost_dispatches(&db, grace, self.config.batch).await?;
                lost.extend(jobs::take_lost_keyed(&mut db, grace, self.config.batch).await?);
                lost
            };
            report.redispatched += lost.len();
            let sent = transport::send(&self.transport, &self.pool, &lost).await;
            if !lost.is_empty() {
                self.resend.lock().unwrap_or_else(|p| p.into_inner()).record(sent);
            }
            // A failing transport: the rest waits for a later pass.
            if !sent || lost.len() < usize::try_from(self.config.batch).unwrap_or(usize::MAX) {
                break;
            }
        }
        for _ in 0..self.config.max_batches {
            let finished = jobs::finish_parents(&self.pool.get().await?, self.config.batch).await?;
            let n = finished.parents;
            report.parents_finished += n;
            crate::exceptions::alert_parents(&finished);
            transport::send(&self.transport, &self.pool, &finished.callbacks).await;
            if n < usize::try_from(self.config.batch).unwrap_or(usize::MAX) {
                break;
            }
        }
        let budget = usize::try_from(self.config.batch).unwrap_or(0).saturating_mul(10);
        let healed = crate::store::dependencies::heal(&self.pool.get().await?, self.config.batch, budget).await?;
        report.dependents_healed = healed.changed();
        transport::send(&self.transport, &self.pool, &healed.dispatch).await;
        for _ in 0..self.config.max_batches {
            let b = crate::completions::sweep_overdue(&self.pool, &self.transport, self.config.batch).await?;
            report.completions_overdue += b.handled;
            report.waits_superseded += b.superseded;
            if b.handled + b.superseded < usize::try_from(self.config.batch).unwrap_or(usize::MAX) {
                break;
            }
        }
        crate::store::progress::refresh_baselines(&self.pool.get().await?).await?;
        report.schedules_fired = crate::schedules::fire_due(&self.pool, &self.intake, chrono::Utc::now()).await?.fired;
        if let Some(sdk) = &self.config.ses_account {
            report.ses_account_read = crate::email::pace::refresh_account(&self.pool, sdk).await?;
        }
        if let Some(alerts) = &self.config.alerts {
            report.alerts_queued = crate::alerts::queue_due(&self.pool, &self.intake, alerts).await?;
        }
        // A tenant's own failures reach operators as one signal per tenant and cause, at most
        // hourly, and only when they grew: never one per job.
        for f in crate::store::tenant_faults::take_due_signals(&self.pool.get().await?, 100).await? {
            report.tenant_faults_signalled += 1;
            tracing::warn!(event = "relay.tenant_fault", tenant_id = %f.tenant_id, task_type = %f.task_type,
                kind = %f.kind, count = f.count, last_error = %f.last_error, last_job_id = %f.last_job_id,
                "a tenant's jobs keep failing for a reason of its own (GET /v1/admin/tenant-faults)");
        }
        // Lambda containers come and go: forget instances unseen for a week.
        workers::prune(&self.pool.get().await?, chrono::Utc::now() - chrono::Duration::days(7)).await?;
        metrics::LEASES_RECOVERED.add(report.leases_returned + report.leases_failed);
        metrics::REDISPATCHED.add(report.redispatched);
        if report != SweepReport::default() {
            tracing::info!(
                event = "relay.sweep.recovered",
                leases_returned = report.leases_returned,
                leases_failed = report.leases_failed,
                redispatched = report.redispatched,
                completions_overdue = report.completions_overdue,
                "sweep recovered work"
            );
        }
        Ok(report)
    }

    /// Lock one batch of expired leases, decide, write, commit. Returns the jobs to dispatch
    /// (after commit) and how many failed for good.
    async fn recover_expired_batch(&self) -> Result<(Vec<Dispatch>, usize), StoreError> {
        let mut db = self.pool.get().await?;
        let tx = db.transaction().await?;
        let expired = jobs::lock_expired_leases(&tx, self.config.batch).await?;
        if expired.is_empty() {
            return Ok((vec![], 0));
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
        let mut send: Vec<Dispatch> =
            back.into_iter().map(|fence| Dispatch { id: fence.job, run_at: now, tenant: None }).collect();
        send.extend(failed.callbacks);
        Ok((send, fail.len()))
    }

    /// Sweep every `interval` until `stop` turns true, recording liveness before each pass.
    pub async fn run(&self, interval: Duration, live: Option<Liveness>, mut stop: watch::Receiver<bool>) {
        // A pass starts every `interval` (not `interval` after the last one ended), so a failed
        // dispatch waits at most one interval, or one pass when a pass takes longer.
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*stop.borrow() {
            tokio::select! { _ = ticks.tick() => {}, _ = stop.changed() => break }
            if let Some(live) = &live {
                live.touch().await;
            }
            if let Err(e) = self.pass().await {
                tracing::warn!(event = "relay.sweep.failed", error = %e, "sweep pass failed; will try again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;

    #[test]
    fn resends_back_off_after_three_failing_passes_and_reset_on_success() {
        let mut b = ResendBackoff::default();
        let mut pattern = String::new();
        for _ in 0..40 {
            if b.ready() {
                b.record(false);
                pattern.push('x');
            } else {
                pattern.push('.');
            }
        }
        assert_eq!(pattern, "xxx.x...x.......x...............x.......");
        b.record(true);
        assert!(b.ready());
        b.record(false);
        assert!(b.ready(), "one failure is retried on the next pass");
    }

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
