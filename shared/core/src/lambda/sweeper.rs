//! The sweeper function: an EventBridge schedule (at most once a minute) runs `passes` sweep
//! passes `gap` apart, so recovery runs about every 30 s. Each pass runs the maintenance
//! services that are due (`Sweeper::pass_due`); a service that fails does not stop the others,
//! but it fails the invocation, which the function-errors alarm sees.
//!
//! The payload decides nothing, so any JSON is accepted: EventBridge Scheduler's default
//! notification (`source: aws.scheduler`, `detail` the string `"{}"`), an EventBridge rule's
//! event (`detail` an object), a schedule's custom input, or an empty one (`{}`). The
//! pre-traffic hook's check (`{"relay_deploy_check": {}}`) runs one pass.

use std::time::Duration;

use serde_json::Value;

use crate::maintenance::{SweepError, SweepReport, Sweeper};

pub async fn handle(
    sweeper: &Sweeper,
    event: &Value,
    passes: u32,
    gap: Duration,
) -> Result<Vec<SweepReport>, SweepError> {
    // The pre-traffic hook's check of a new version: one pass, no gap.
    let passes = if event.get(super::executor::DEPLOY_CHECK).is_some() { 1 } else { passes };
    let mut reports = Vec::new();
    for n in 0..passes.max(1) {
        if n > 0 {
            tokio::time::sleep(gap).await;
        }
        let report = match sweeper.pass_due().await {
            Ok(r) => r,
            Err(e) => {
                crate::metrics::emf::record(&[("SweepFailed", 1.0), ("DatabaseErrors", e.failed.len() as f64)]);
                return Err(e);
            }
        };
        crate::metrics::emf::record(&[
            ("SweepFailed", 0.0),
            ("LeasesReturned", report.leases_returned as f64),
            ("LeasesFailed", report.leases_failed as f64),
            ("Redispatched", report.redispatched as f64),
        ]);
        tracing::info!(
            event = "relay.sweep.pass",
            scheduled_at = event.get("time").and_then(|t| t.as_str()),
            pass = n + 1,
            leases_returned = report.leases_returned,
            leases_failed = report.leases_failed,
            redispatched = report.redispatched,
            "sweep pass done"
        );
        reports.push(report);
    }
    Ok(reports)
}
