//! The ingress function: each record from a provider queue becomes a `provider.event` job of
//! the platform's own tenant, idempotent by the provider's message id (`sns:<MessageId>` for
//! an SNS notification, `sqs:<messageId>` for a message written to the queue directly). It
//! never processes inline. A record it cannot parse is kept whole in `dead_letters` with the
//! reason and acknowledged; only a failure to reach the database returns records to the queue.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use deadpool_postgres::Pool;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::catalogue::Catalogue;
use crate::intake::Intake;
use crate::job::TenantId;
use crate::job::terms::{CorrelationId, IdempotencyKey};
use crate::platform::Platform;
use crate::provider::ProviderEvent;
use crate::store::dead_letters::{self, NewDeadLetter};
use crate::store::jobs::NewJob;
use crate::store::{StoreError, tenants};
use crate::task::Task;

/// The task type ingress creates.
pub const TASK_TYPE: &str = ProviderEvent::NAME;

/// What ingress holds per container. The tenant is looked up (or created) on first use and
/// then remembered; a failure is not remembered.
pub struct Ingress {
    pub pool: Pool,
    pub intake: Intake,
    pub catalogue: Catalogue,
    pub tenant_name: String,
    tenant: OnceCell<TenantId>,
}

/// An SNS notification as SNS delivers it to an SQS queue (raw delivery off).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SnsEnvelope {
    #[serde(rename = "Type")]
    kind: String,
    message_id: String,
    topic_arn: String,
    message: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    timestamp: Option<String>,
}

/// Why a record cannot be a job (kept in `dead_letters` with this reason).
#[derive(Debug, thiserror::Error)]
pub enum Unparseable {
    #[error("the record has no body")]
    NoBody,
    #[error("the body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("not a valid SNS envelope: {0}")]
    BadEnvelope(serde_json::Error),
    #[error("SNS message of type {0:?}, not a Notification (confirm or ignore it by hand)")]
    NotANotification(String),
    #[error("the record has no messageId")]
    NoMessageId,
    #[error("the message contains a NUL character, which Postgres cannot store in JSON")]
    Nul,
    #[error("not a provider event: {0}")]
    NotAProviderEvent(crate::catalogue::ParamError),
    #[error("the provider's message id is longer than 195 characters")]
    LongMessageId,
}

impl Ingress {
    pub fn new(platform: &Platform, tenant_name: impl Into<String>) -> Self {
        Self {
            pool: platform.pool.clone(),
            intake: platform.intake.clone(),
            catalogue: platform.catalogue.clone(),
            tenant_name: tenant_name.into(),
            tenant: OnceCell::new(),
        }
    }

    async fn tenant(&self) -> Result<TenantId, StoreError> {
        let id = self
            .tenant
            .get_or_try_init(|| async {
                Ok::<_, StoreError>(tenants::ensure(&self.pool.get().await?, &self.tenant_name).await?.id)
            })
            .await?;
        Ok(*id)
    }

    pub async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        let mut jobs = Vec::new();
        let mut carrying = Vec::new();
        let mut letters = Vec::new();
        for record in event.records {
            let message_id = record.message_id.clone().unwrap_or_default();
            match self.to_job(&record) {
                Ok(job) => {
                    jobs.push(job);
                    carrying.push(message_id);
                }
                Err(why) => {
                    let reason = why.to_string();
                    tracing::warn!(
                        event = "relay.ingress.unparseable",
                        message_id,
                        reason,
                        "record kept in dead_letters"
                    );
                    letters.push(NewDeadLetter {
                        source: format!("ingress:{}", record.event_source_arn.as_deref().unwrap_or("unknown")),
                        message_id: Some(message_id),
                        body: record.body.unwrap_or_default(),
                        reason,
                    });
                }
            }
        }
        let mut kept_letters = letters.len();
        let mut database_errors = 0;
        if !letters.is_empty() {
            let kept = async { dead_letters::insert_many(&self.pool.get().await?, &letters).await };
            if let Err(e) = kept.await {
                (kept_letters, database_errors) = (0, 1);
                tracing::warn!(event = "relay.ingress.dead_letter_failed", error = %e, "could not keep records; they return to the queue");
                for l in letters {
                    response.add_failure(l.message_id.unwrap_or_default());
                }
            }
        }
        let n = jobs.len();
        // Duplicates are known only when the batch was stored: in an outage nothing was
        // created and nothing was found to exist already (the records return to the queue).
        let (mut created, mut duplicates) = (0, 0);
        if n > 0 {
            match self.store(jobs).await {
                Ok(c) => (created, duplicates) = (c, n - c),
                Err(()) => {
                    database_errors += 1;
                    for message_id in carrying {
                        response.add_failure(message_id);
                    }
                }
            }
        }
        crate::metrics::emf::record(&[
            ("Received", n as f64),
            ("Created", created as f64),
            ("Duplicates", duplicates as f64),
            ("DeadLetters", kept_letters as f64),
            ("BatchItemFailures", response.batch_item_failures.len() as f64),
            ("DatabaseErrors", f64::from(database_errors)),
        ]);
        response
    }

    /// Store the jobs (idempotently); how many were new, or `Err` when the database refused.
    async fn store(&self, jobs: Vec<NewJob>) -> Result<usize, ()> {
        let n = jobs.len();
        let enqueued = async { self.intake.enqueue(self.tenant().await?, jobs).await };
        match enqueued.await {
            Ok(inserted) => {
                let created = inserted.iter().filter(|i| matches!(i, crate::store::jobs::Inserted::Created(_))).count();
                tracing::info!(
                    event = "relay.ingress.batch",
                    records = n,
                    created,
                    duplicates = n - created,
                    "provider records handed to the task system"
                );
                Ok(created)
            }
            Err(e) => {
                tracing::warn!(event = "relay.ingress.batch_failed", error = %e, records = n,
                    "could not store; the records return to the queue");
                Err(())
            }
        }
    }

    /// Any event the ingress function takes: the pre-traffic hook's check
    /// (`{"relay_deploy_check": {}}`, `deploy_check`), else an SQS batch.
    pub async fn handle_event(&self, event: Value) -> Result<Value, super::EventError> {
        if event.get(super::executor::DEPLOY_CHECK).is_some() {
            return Ok(self.deploy_check().await);
        }
        let batch: SqsEvent = serde_json::from_value(event).map_err(super::EventError::NotSqs)?;
        serde_json::to_value(self.handle(batch).await).map_err(super::EventError::Answer)
    }

    /// The hook's check of this version: an SES event in its SNS envelope, as the queue
    /// delivers one, becomes a job here (parsed and checked against the catalogue) and the
    /// ingress tenant is reached in the database; nothing is stored, so no job, dead letter or
    /// metric comes of it.
    pub async fn deploy_check(&self) -> Value {
        let version = std::env::var("AWS_LAMBDA_FUNCTION_VERSION").unwrap_or_default();
        let nonce = uuid::Uuid::now_v7();
        let message = json!({"eventType": "Delivery", "mail": {"messageId": format!("relay-deploy-check-{nonce}")}});
        let record = json!({
            "messageId": nonce.to_string(), "receiptHandle": "relay-deploy-check", "eventSource": "aws:sqs",
            "eventSourceARN": "relay-deploy-check", "attributes": {}, "messageAttributes": {},
            "body": json!({"Type": "Notification", "MessageId": format!("relay-deploy-check-{nonce}"),
                "TopicArn": "relay-deploy-check", "Message": message.to_string(),
                "Timestamp": chrono::Utc::now().to_rfc3339()}).to_string(),
        });
        let parsed = serde_json::from_value::<SqsMessage>(record)
            .map_err(|e| e.to_string())
            .and_then(|r| self.to_job(&r).map_err(|e| e.to_string()));
        let answer = match (parsed, self.tenant().await) {
            (Ok(job), Ok(tenant)) => json!({"version": version, "task_type": job.task_type, "tenant": tenant}),
            (Err(e), _) => json!({"version": version, "error": format!("an SES event did not parse: {e}")}),
            (_, Err(e)) => json!({"version": version, "error": format!("the ingress tenant: {e}")}),
        };
        tracing::info!(event = "relay.ingress.deploy_check", answer = %answer, "deploy check handled");
        json!({"deploy_check": answer})
    }

    /// One record as a job, or the reason it cannot be one.
    fn to_job(&self, record: &SqsMessage) -> Result<NewJob, Unparseable> {
        let body = record.body.as_deref().ok_or(Unparseable::NoBody)?;
        let source_queue = record.event_source_arn.clone().unwrap_or_else(|| "unknown".into());
        let value: Value = serde_json::from_str(body).map_err(Unparseable::NotJson)?;
        let is_sns = value.get("Type").is_some() && value.get("TopicArn").is_some();
        let params = if is_sns {
            let sns: SnsEnvelope = serde_json::from_value(value).map_err(Unparseable::BadEnvelope)?;
            if sns.kind != "Notification" {
                return Err(Unparseable::NotANotification(sns.kind));
            }
            let message = serde_json::from_str(&sns.message).unwrap_or(Value::String(sns.message));
            json!({
                "source": sns.topic_arn, "envelope": "sns", "message_id": sns.message_id,
                "message": message, "subject": sns.subject, "sent_at": sns.timestamp,
            })
        } else {
            let message_id = record.message_id.clone().ok_or(Unparseable::NoMessageId)?;
            json!({
                "source": source_queue, "envelope": "sqs", "message_id": message_id, "message": value,
                "subject": null, "sent_at": record.attributes.get("SentTimestamp"),
            })
        };
        if params.to_string().contains("\\u0000") {
            return Err(Unparseable::Nul);
        }
        self.catalogue.check(TASK_TYPE, &params).map_err(Unparseable::NotAProviderEvent)?;
        let envelope = if is_sns { "sns" } else { "sqs" };
        let key = IdempotencyKey::provider_message(envelope, params["message_id"].as_str().unwrap_or_default())
            .ok_or(Unparseable::LongMessageId)?;
        // An SES event carries the correlation id of the message it is about.
        // (`correlation_tag` bounds its length; one with a control character is no correlation
        // id, and the message's key stands in for it.)
        let correlation_id = crate::email::events::correlation_tag(&params["message"])
            .and_then(|tag| CorrelationId::parse(&tag).ok())
            .unwrap_or_else(|| CorrelationId::of_key(&key));
        Ok(NewJob { correlation_id, ..NewJob::new(TASK_TYPE, params, key) })
    }
}
