//! The executor function: an SQS batch of work messages becomes one `run_dispatched` call.
//!
//! The answer is a partial batch response: only records that met a real failure to reach the
//! database go back to the queue. A job that cannot be claimed (done, duplicate, not yet due,
//! paused) is acknowledged: the row decides, and the sweep re-sends what is still due. A body
//! that is not a work message is kept in `dead_letters` with the reason and acknowledged.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};

use crate::executor::Executor;
use crate::store::dead_letters::{self, NewDeadLetter};
use crate::transport::sqs::WorkMessage;

pub async fn handle(exec: &Executor, event: SqsEvent) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    let mut ids = Vec::new();
    let mut carrying = Vec::new();
    let mut letters = Vec::new();
    for record in event.records {
        let message_id = record.message_id.unwrap_or_default();
        let body = record.body.unwrap_or_default();
        match WorkMessage::parse(&body) {
            Ok(m) => {
                ids.push(m.job_id);
                carrying.push(message_id);
            }
            Err(reason) => {
                let source = format!("executor:{}", record.event_source_arn.as_deref().unwrap_or("unknown"));
                tracing::warn!(event = "relay.executor.malformed_message", message_id, reason,
                    "work message kept in dead_letters");
                letters.push(NewDeadLetter { source, message_id: Some(message_id), body, reason });
            }
        }
    }
    if !letters.is_empty() {
        let kept = async { dead_letters::insert_many(&exec.pool.get().await?, &letters).await };
        if let Err(e) = kept.await {
            tracing::warn!(event = "relay.executor.dead_letter_failed", error = %e, "could not keep malformed messages; they return to the queue");
            for l in letters {
                response.add_failure(l.message_id.unwrap_or_default());
            }
        }
    }
    if ids.is_empty() {
        return response;
    }
    match exec.run_dispatched(&ids).await {
        Ok((report, claimed)) => {
            tracing::info!(event = "relay.executor.batch", messages = ids.len(), claimed,
                acknowledged_unclaimed = ids.len() - claimed, succeeded = report.succeeded,
                retried = report.retried, failed = report.failed, stale = report.stale, "batch done");
        }
        Err(e) => {
            tracing::warn!(event = "relay.executor.batch_failed", error = %e, messages = ids.len(),
                "could not claim or record; the messages return to the queue");
            for message_id in carrying {
                response.add_failure(message_id);
            }
        }
    }
    response
}
