//! `provider.event`: a provider notification (an SES event through SNS, an inbound message, an
//! outside party's completion) handed over by the ingress function. Ingress never processes
//! inline; this task is where the work happens: a completion event (`{"relay_completion":
//! {...}}`, see `COMPLETION_KEY`) is applied to the wait its token names, once
//! (`crate::completions`); an SES event is applied to its message once
//! (`email::record_event`, the send it proves settled here); anything else is kept on the job with the reason.

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::completions::{self, Applied, CompletionRequest, Via};

use crate::job::TaskError;
use crate::plain::ParamError;
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
    const DESCRIPTION: &'static str = "A provider notification received by ingress (SES events via SNS, inbound mail); acknowledged and kept on the job.";
    /// Only ingress creates these: an event names messages and addresses of any tenant, so a
    /// client submitting one could suppress another tenant's recipients.
    const PLATFORM_ONLY: bool = true;

    fn check(p: &ProviderEventParams) -> Result<(), ParamError> {
        if p.source.is_empty() {
            return Err(ParamError::new("source", "must not be empty"));
        }
        if p.message_id.is_empty() {
            return Err(ParamError::new("message_id", "must not be empty"));
        }
        Ok(())
    }

    async fn run(&self, ctx: &TaskContext, p: ProviderEventParams) -> Result<Value, TaskError> {
        if let Some(completion) = p.message.get(COMPLETION_KEY) {
            let out = complete(ctx, completion).await?;
            tracing::info!(event = "relay.provider_event.completion", source = %p.source, message_id = %p.message_id,
                outcome = %out, "completion event handled");
            return Ok(out);
        }
        let out = record_email_event(ctx, &p.message_id, &p.message).await?;
        tracing::info!(event = "relay.provider_event.recorded", source = %p.source, message_id = %p.message_id,
            outcome = %out, "provider event recorded");
        Ok(out)
    }
}

/// An SES event applied to its message (`email::record_event`) and the ambiguous send it
/// proves settled (`exceptions::settle_ambiguous`), in one transaction.
async fn record_email_event(ctx: &TaskContext, event_key: &str, message: &Value) -> Result<Value, TaskError> {
    let mut db = ctx.db.get().await.map_err(TaskError::retryable)?;
    let tx = db.transaction().await.map_err(TaskError::retryable)?;
    let mut recorded = crate::email::record_event(&tx, event_key, message).await?;
    if let Some(proved) = recorded.proves_sent {
        let settled = crate::exceptions::settle_ambiguous(&tx, proved.job_id, proved.result, &proved.why)
            .await
            .map_err(TaskError::retryable)?;
        recorded.out["exceptions_resolved"] = json!(settled);
    }
    tx.commit().await.map_err(TaskError::retryable)?;
    Ok(recorded.out)
}

/// A completion event: a provider message whose JSON body holds this key, its value a
/// completion as `POST /v1/jobs/{id}/complete` takes it (`token`, `outcome`, `result` or
/// `error`, `retryable`). The token alone names the wait.
pub const COMPLETION_KEY: &str = "relay_completion";

/// Apply a completion event; what it came to is kept on this job. A malformed one, or one the
/// wait refuses (another completion came first, the deadline passed, no wait has the token),
/// is kept with the reason and not retried: trying again cannot change it.
async fn complete(ctx: &TaskContext, body: &Value) -> Result<Value, TaskError> {
    let parsed = serde_path_to_error::deserialize::<_, CompletionRequest>(body)
        .map_err(|e| crate::plain::field_error(e.path(), e.inner()).message)
        .and_then(|r| r.into_completion().map_err(|e| e.message));
    let (token, c) = match parsed {
        Ok(ok) => ok,
        Err(why) => return Ok(json!({ "completion": false, "kept": true, "reason": why })),
    };
    let applied = completions::apply(&ctx.db, ctx.jobs.transport(), &token, None, &c, Via::Ingress)
        .await
        .map_err(|e| TaskError::Retryable(format!("applying a completion: {e}")))?;
    Ok(match applied {
        Applied::Applied { job, outcome } => json!({ "completion": "applied", "job_id": job, "outcome": outcome }),
        Applied::Replayed { job, outcome, .. } => json!({ "completion": "replayed", "job_id": job, "outcome": outcome,
            "note": "the same completion was applied before; nothing changed" }),
        Applied::AlreadyCompleted { job, outcome, .. } => json!({ "completion": "refused", "job_id": job,
            "reason": format!("already completed ({})", outcome.as_str()) }),
        Applied::Overdue { job, policy, .. } => json!({ "completion": "refused", "job_id": job,
            "reason": format!("the deadline passed; the overdue policy ({}) was applied", policy.as_str()) }),
        Applied::Superseded { job } => json!({ "completion": "refused", "job_id": job,
            "reason": "the job left the attempt this token was for" }),
        Applied::UnknownToken => json!({ "completion": "refused", "reason": "no wait has this token" }),
    })
}
