//! Relay's SES account's send rate and quota, for the pacing of sends (`email::pace`): read
//! when a sweep is given an SES configuration, at most once per `ACCOUNT_READ_EVERY` across
//! every sweeper (the row says when it was last read).

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::store::StoreError;

pub(super) struct Account;

#[async_trait::async_trait]
impl Service for Account {
    fn name(&self) -> &'static str {
        "ses_account"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule { batches: 1, ..Schedule::every_pass(config) }
    }

    async fn batch(&self, cx: &Context<'_>, _: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        if let Some(sdk) = &cx.config.ses_account {
            report.ses_account_read |= crate::email::pace::refresh_account(cx.pool, sdk).await?;
        }
        Ok(0)
    }
}
