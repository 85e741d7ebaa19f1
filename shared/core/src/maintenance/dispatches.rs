//! Lost dispatches: a due job whose dispatch failed, or that nobody claimed within the grace
//! period (each further re-send of the same row waits twice as long), is sent again. While
//! the transport keeps refusing, runs are skipped (`ResendBackoff`).

use std::sync::Mutex;

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::metrics;
use crate::store::StoreError;
use crate::store::jobs;
use crate::transport;

#[derive(Default)]
pub(super) struct Dispatches {
    backoff: Mutex<ResendBackoff>,
}

#[async_trait::async_trait]
impl Service for Dispatches {
    fn name(&self) -> &'static str {
        "dispatches"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule::every_pass(config)
    }

    fn ready(&self) -> bool {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner()).ready()
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let lost = {
            let mut db = cx.pool.get().await?;
            let grace = cx.config.redispatch_grace.as_secs_f64();
            let mut lost = jobs::take_lost_dispatches(&db, grace, limit).await?;
            lost.extend(jobs::take_lost_keyed(&mut db, grace, limit).await?);
            lost
        };
        report.redispatched += lost.len();
        metrics::REDISPATCHED.add(lost.len());
        // Tried twice: one refusal of a flaky transport is not a failing pass.
        let sent = transport::send_tries(cx.transport, cx.pool, &lost, 2).await;
        if !lost.is_empty() {
            self.backoff.lock().unwrap_or_else(|p| p.into_inner()).record(sent);
        }
        // A failing transport: the rest waits for a later pass.
        Ok(if sent { lost.len() } else { 0 })
    }
}

/// While the transport keeps refusing the sweep's re-sends (a queue outage), later passes
/// skip re-sending: after 3 failing passes in a row one pass is skipped, then 3, 7, 15, at
/// most 30 (a pass fails when its re-send was refused twice). Without it every pass sent every pending row again, each with an event: 32,298
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
