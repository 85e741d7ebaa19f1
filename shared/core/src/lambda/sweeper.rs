//! The sweeper function: an EventBridge schedule (at most once a minute) runs `passes` sweep
//! passes `gap` apart, so recovery runs about every 30 s. A failed pass fails the invocation,
//! which the function-errors alarm sees.
//!
//! The payload decides nothing, so any JSON is accepted: EventBridge Scheduler's default
//! notification (`source: aws.scheduler`, `detail` the string `"{}"`), an EventBridge rule's
//! event (`detail` an object), a schedule's custom input, or an empty one (`{}`).

use std::time::Duration;

use serde_json::Value;

use crate::store::StoreError;
use crate::sweep::{SweepReport, Sweeper};

pub async fn handle(
    sweeper: &Sweeper,
    event: &Value,
    passes: u32,
    gap: Duration,
) -> Result<Vec<SweepReport>, StoreError> {
    let mut reports = Vec::new();
    for n in 0..passes.max(1) {
        if n > 0 {
            tokio::time::sleep(gap).await;
        }
        let report = sweeper.pass().await?;
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
