//! `provider.event`: a provider notification (an SES event through SNS, an inbound message)
//! handed over by the ingress function. Ingress never processes inline; this task is where
//! the work happens: an SES event is applied to its message once (`email::record_event`);
//! anything else is kept on the job with the reason.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::job::TaskError;
use crate::task::{Task, TaskContext};

pub struct ProviderEvent;

/// How the message reached the ingress queue.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Envelope {
    /// An SNS notification delivered to SQS (`message` is the SNS `Message`).
    Sns,
    /// A message written to the queue directly (`message` is the SQS body).
    Sqs,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderEventParams {
    /// Where it came from: the SNS topic ARN, or the SQS queue ARN.
    pub source: String,
    pub envelope: Envelope,
    /// The provider's message id (SNS `MessageId` or SQS `messageId`): the job's idempotency key
    /// is derived from it.
    pub message_id: String,
    /// The payload: parsed JSON when it is JSON, otherwise the text as received.
    pub message: Value,
    /// SNS `Subject`, when there was one.
    #[serde(default)]
    pub subject: Option<String>,
    /// When the provider sent it (SNS `Timestamp` or SQS `SentTimestamp`), as given.
    #[serde(default)]
    pub sent_at: Option<String>,
}

impl Task for ProviderEvent {
    type Params = ProviderEventParams;
    const NAME: &'static str = "provider.event";
    const DESCRIPTION: &'static str =
        "A provider notification received by ingress (SES events via SNS, inbound mail); acknowledged and kept on the job.";
    /// Only ingress creates these: an event names messages and addresses of any tenant, so a
    /// client submitting one could suppress another tenant's recipients.
    const PLATFORM_ONLY: bool = true;

    fn check(p: &ProviderEventParams) -> Result<(), (String, String)> {
        if p.source.is_empty() {
            return Err(("source".into(), "must not be empty".into()));
        }
        if p.message_id.is_empty() {
            return Err(("message_id".into(), "must not be empty".into()));
        }
        Ok(())
    }

    async fn run(&self, ctx: &TaskContext, p: ProviderEventParams) -> Result<Value, TaskError> {
        let out = crate::email::record_event(ctx, &p.message_id, &p.message).await?;
        tracing::info!(event = "relay.provider_event.recorded", source = %p.source, message_id = %p.message_id,
            outcome = %out, "provider event recorded");
        Ok(out)
    }
}
