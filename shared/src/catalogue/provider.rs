//! `provider.event`: a provider notification (an SES event through SNS, an inbound message)
//! handed over by the ingress function. Ingress never processes inline; this task is where
//! the work happens. For now it acknowledges the stored event; the email work replaces the
//! body of `run` with the SES event handling.

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{Task, TaskContext};
use crate::job::TaskError;

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

    fn check(p: &ProviderEventParams) -> Result<(), (String, String)> {
        if p.source.is_empty() {
            return Err(("source".into(), "must not be empty".into()));
        }
        if p.message_id.is_empty() {
            return Err(("message_id".into(), "must not be empty".into()));
        }
        Ok(())
    }

    async fn run(&self, _ctx: &TaskContext, p: ProviderEventParams) -> Result<Value, TaskError> {
        tracing::info!(event = "relay.provider_event.acknowledged", source = %p.source, message_id = %p.message_id,
            "provider event acknowledged");
        Ok(json!({ "acknowledged": true, "source": p.source, "message_id": p.message_id }))
    }
}
