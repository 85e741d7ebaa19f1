//! The SQS transport: after commit, each due job becomes one message on the work queue, sent
//! with `SendMessageBatch` (10 per call). A message carries only the job id and a hint of when
//! it is due; the executor claims the row, and the row decides. Every SQS call Relay makes at
//! run time lives in this file.
//!
//! Each message carries its job's tenant as its `MessageGroupId`: on a standard queue that makes
//! the queue a fair queue (SQS, 2025), which keeps a tenant with a backlog (a campaign's
//! children) from delaying the other tenants' messages, without dropping or reordering its own.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Transport, TransportError};
use crate::job::{Dispatch, JobId};

/// Most entries SQS accepts in one `SendMessageBatch`.
pub const BATCH: usize = 10;
/// The longest delay SQS supports on a message.
pub const MAX_DELAY_SECONDS: i64 = 900;
/// Batches sent at once by one dispatch.
const PARALLEL_BATCHES: usize = 4;
/// An SQS call that takes longer fails the dispatch (the sweep sends the jobs later) rather
/// than holding up the API answer.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// The body of a work-queue message. Nothing else travels: parameters stay in the row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkMessage {
    pub job_id: JobId,
    pub run_at: DateTime<Utc>,
}

/// A message body that is not a `WorkMessage`; the text is the dead-letter record's reason.
#[derive(Debug, thiserror::Error)]
#[error("not a work message ({{\"job_id\", \"run_at\"}}): {0}")]
pub struct NotAWorkMessage(serde_json::Error);

impl WorkMessage {
    /// Parse a message body; the error says what is wrong, for the dead-letter record.
    pub fn parse(body: &str) -> Result<Self, NotAWorkMessage> {
        serde_json::from_str(body).map_err(NotAWorkMessage)
    }
}

/// How long SQS should hold a message back: until the job is due, at most 15 minutes. A job
/// due later is claimed when its message arrives if due by then; otherwise the sweep sends it
/// again once it falls due.
pub fn delay_seconds(run_at: DateTime<Utc>, now: DateTime<Utc>) -> i32 {
    let ms = (run_at - now).num_milliseconds().max(0);
    let secs = (ms + 999) / 1000;
    i32::try_from(secs.min(MAX_DELAY_SECONDS)).unwrap_or(0)
}

pub struct SqsTransport {
    client: Client,
    queue_url: String,
}

impl SqsTransport {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into() }
    }

    /// A client from the shared SDK configuration (credentials and region from the
    /// environment; `endpoint` for a local server), with a bounded operation time. Resolves
    /// nothing over the network until the first call.
    pub fn client(sdk: &aws_config::SdkConfig) -> Client {
        let timeouts = aws_config::timeout::TimeoutConfig::builder().operation_timeout(OPERATION_TIMEOUT).build();
        Client::from_conf(aws_sdk_sqs::config::Builder::from(sdk).timeout_config(timeouts).build())
    }

    /// A client for a local AWS-protocol server (moto) with explicit dummy credentials, so
    /// nothing depends on the process environment.
    pub fn local_client(endpoint: &str) -> Client {
        let conf = aws_sdk_sqs::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("testing", "testing", None, None, "relay-local"))
            .endpoint_url(endpoint)
            .build();
        Client::from_conf(conf)
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// One `SendMessageBatch`; on failure, the reason and the jobs not sent (entries SQS
    /// refused, or all of them when the call failed).
    async fn send_batch(&self, jobs: &[Dispatch], now: DateTime<Utc>) -> Result<(), TransportError> {
        let all = |e: String| TransportError::nothing_sent("sqs", e, jobs);
        let mut entries = Vec::with_capacity(jobs.len());
        for (i, d) in jobs.iter().enumerate() {
            let body = serde_json::to_string(&WorkMessage { job_id: d.id, run_at: d.run_at })
                .map_err(|e| all(e.to_string()))?;
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(body)
                .delay_seconds(delay_seconds(d.run_at, now))
                .set_message_group_id(d.tenant.map(|t| t.to_string()))
                .build()
                .map_err(|e| all(e.to_string()))?;
            entries.push(entry);
        }
        let out = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| all(DisplayErrorContext(e).to_string()))?;
        let Some(f) = out.failed().first() else { return Ok(()) };
        let message = format!(
            "{} of {} entries refused; first: {} {}",
            out.failed().len(),
            jobs.len(),
            f.code(),
            f.message().unwrap_or("")
        );
        // An entry's id is its index in this batch.
        let unsent =
            out.failed().iter().filter_map(|f| jobs.get(f.id().parse::<usize>().ok()?)).map(|d| d.id).collect();
        Err(TransportError { transport: "sqs", message, unsent })
    }
}

/// Why a redrive (`move_messages`) stopped; messages moved before it stay moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedriveError {
    /// An SQS call failed (`step` is "receive from", "send to" or "delete from").
    #[error("{step} {queue}: {detail}")]
    Call { step: &'static str, queue: String, detail: String },
    #[error("send to {queue} refused {refused} of {of}: {code} {message}")]
    Refused { queue: String, refused: usize, of: usize, code: String, message: String },
}

/// Move up to `max` messages from a dead-letter queue back to the queue it serves (the
/// operator's redrive, `lambda::admin`): each is sent to `to` with its body unchanged, then
/// deleted from `from`. A message is never deleted before its copy was accepted, so a failure
/// can leave a duplicate (which claims nothing), never a loss. Returns how many moved.
pub async fn move_messages(client: &Client, from: &str, to: &str, max: usize) -> Result<usize, RedriveError> {
    let failed =
        |step: &'static str, queue: &str, detail: String| RedriveError::Call { step, queue: queue.to_owned(), detail };
    let mut moved = 0;
    while moved < max {
        let want = i32::try_from((max - moved).min(BATCH)).unwrap_or(10);
        let got = client
            .receive_message()
            .queue_url(from)
            .max_number_of_messages(want)
            .wait_time_seconds(1)
            .send()
            .await
            .map_err(|e| failed("receive from", from, DisplayErrorContext(e).to_string()))?;
        let messages = got.messages();
        if messages.is_empty() {
            break;
        }
        let mut entries = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let entry = SendMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .message_body(m.body().unwrap_or_default())
                .build()
                .map_err(|e| failed("send to", to, e.to_string()))?;
            entries.push(entry);
        }
        let sent = client
            .send_message_batch()
            .queue_url(to)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| failed("send to", to, DisplayErrorContext(e).to_string()))?;
        for ok in sent.successful() {
            let Some(m) = ok.id().parse::<usize>().ok().and_then(|i| messages.get(i)) else { continue };
            let Some(handle) = m.receipt_handle() else { continue };
            client
                .delete_message()
                .queue_url(from)
                .receipt_handle(handle)
                .send()
                .await
                .map_err(|e| failed("delete from", from, DisplayErrorContext(e).to_string()))?;
            moved += 1;
        }
        if let Some(f) = sent.failed().first() {
            return Err(RedriveError::Refused {
                queue: to.to_owned(),
                refused: sent.failed().len(),
                of: messages.len(),
                code: f.code().to_owned(),
                message: f.message().unwrap_or("").to_owned(),
            });
        }
    }
    Ok(moved)
}

#[async_trait::async_trait]
impl Transport for SqsTransport {
    fn name(&self) -> &'static str {
        "sqs"
    }

    fn groups_by_tenant(&self) -> bool {
        true
    }

    /// A refused entry or a failed call fails the dispatch for those jobs only:
    /// `transport::send` clears their dispatch marks and the sweep sends them again. (A call
    /// that timed out may still have sent its messages; a duplicate message claims nothing.)
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        let now = Utc::now();
        let chunks: Vec<&[Dispatch]> = jobs.chunks(BATCH).collect();
        let (mut errors, mut unsent) = (Vec::new(), Vec::new());
        for group in chunks.chunks(PARALLEL_BATCHES) {
            let sent = futures::future::join_all(group.iter().map(|chunk| self.send_batch(chunk, now))).await;
            for e in sent.into_iter().filter_map(Result::err) {
                errors.push(e.message);
                unsent.extend(e.unsent);
            }
        }
        match errors.first() {
            None => Ok(()),
            Some(first) => Err(TransportError {
                transport: "sqs",
                message: format!("{} of {} batches failed; first: {first}", errors.len(), jobs.len().div_ceil(BATCH)),
                unsent,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_is_until_due_rounded_up_and_capped_at_fifteen_minutes() {
        let now = Utc::now();
        assert_eq!(delay_seconds(now - chrono::Duration::seconds(5), now), 0);
        assert_eq!(delay_seconds(now, now), 0);
        assert_eq!(delay_seconds(now + chrono::Duration::milliseconds(1500), now), 2);
        assert_eq!(delay_seconds(now + chrono::Duration::seconds(600), now), 600);
        assert_eq!(delay_seconds(now + chrono::Duration::days(2), now), 900);
    }

    #[test]
    fn a_message_carries_only_the_id_and_the_due_time() {
        let m = WorkMessage { job_id: JobId::new(), run_at: Utc::now() };
        let v: serde_json::Value = serde_json::to_value(m).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 2);
        assert_eq!(WorkMessage::parse(&v.to_string()).unwrap(), m);
        assert!(WorkMessage::parse("{\"job_id\": 3}").unwrap_err().to_string().starts_with("not a work message"));
        assert!(WorkMessage::parse("hello").is_err());
    }
}
