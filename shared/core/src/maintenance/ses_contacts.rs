//! The tenant's own topic opt-outs and resubscribes (through the API) of topics mapped onto SES
//! contact lists, written to the SES contact's topic preference (`email::list_management::
//! write_contact`) with Relay's SES account (the sweep's `ses_account` configuration). The API
//! kept each change in its own transaction (`store::topics::queue_ses_change`); here a batch of
//! due changes is taken (each held while its calls run, no connection held across them), written,
//! and kept as applied, or kept with why and tried again after a backoff (`RetryPolicy`'s).

use std::time::Duration;

use super::{Context, Schedule, Service, SweepConfig, SweepReport};
use crate::email::list_management;
use crate::retry::RetryPolicy;
use crate::store::{StoreError, topics};

/// How long a taken change waits before another sweep may take it, should this one never report.
const HOLD: Duration = Duration::from_secs(300);
/// How long an applied change is kept (then forgotten).
const KEEP: Duration = Duration::from_secs(7 * 86_400);
/// Changes written per batch (each is two SES calls).
const BATCH: i64 = 50;

pub(super) struct Contacts;

#[async_trait::async_trait]
impl Service for Contacts {
    fn name(&self) -> &'static str {
        "ses_contacts"
    }

    fn schedule(&self, config: &SweepConfig) -> Schedule {
        Schedule { batch: BATCH, batches: 10, ..Schedule::every_pass(config) }
    }

    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
        let Some(sdk) = &cx.config.ses_account else { return Ok(0) };
        let taken = topics::take_ses_changes(&cx.pool.get().await?, limit, HOLD.as_secs_f64()).await?;
        if taken.is_empty() {
            return Ok(0);
        }
        let client = crate::email::ses::client(sdk);
        let retry = RetryPolicy::default();
        for change in &taken {
            let written = list_management::write_contact(&client, change).await;
            let db = cx.pool.get().await?;
            match written {
                Ok(()) => {
                    topics::ses_change_applied(&db, change, KEEP.as_secs_f64()).await?;
                    report.ses_contacts_written += 1;
                }
                Err(why) => {
                    tracing::warn!(event = "relay.email.ses_contact_failed", tenant_id = %change.tenant_id,
                        contact_list = %change.contact_list, tries = change.tries, error = %why,
                        "a topic change could not be written to the SES contact; it is tried again");
                    let wait = retry.jittered(retry.backoff(change.tries), &mut rand::rng());
                    topics::ses_change_failed(&db, change, &why.to_string(), wait.as_secs_f64()).await?;
                    report.ses_contacts_failed += 1;
                }
            }
        }
        Ok(taken.len())
    }
}
