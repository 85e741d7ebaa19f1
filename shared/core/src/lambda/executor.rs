//! The executor function: an SQS batch of work messages becomes one `run_dispatched_until`
//! call under the invocation's deadline.
//!
//! The answer is a partial batch response, read from what became of each record's job
//! (`executor::Fate`): only records that met a real failure to reach the database (the claim,
//! or the flush of their outcome), or whose job was still running at the deadline (nothing
//! recorded), go back to the queue. A job whose timeout did not fit in the time left was sent again and is
//! acknowledged. A job that cannot be claimed (done, duplicate, not yet due,
//! paused) is acknowledged: the row decides, and the sweep re-sends what is still due. A body
//! that is not a work message, or that names a job that does not exist (a message without a
//! row cannot come from Relay), is kept in `dead_letters` with the reason and acknowledged.
//!
//! Besides SQS batches, the pre-traffic hook invokes a new version directly with
//! `{"relay_deploy_check": {"job_id"}}`: that version alone claims and runs the hook's check
//! job (`Executor::run_check`), and answers what it did (`deploy_check`).

use std::time::{Instant, SystemTime};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use serde_json::{Value, json};

use crate::executor::{Executor, Fate};
use crate::store::dead_letters::{self, NewDeadLetter};
use crate::transport::sqs::WorkMessage;

/// The key of the pre-traffic hook's check event.
pub const DEPLOY_CHECK: &str = "relay_deploy_check";
/// The tenant whose jobs are the hook's check jobs (`pretraffic::TENANT`): the only jobs a
/// check event claims.
pub const DEPLOY_CHECK_TENANT: &str = "relay-deploy-check";

/// Any event the executor function takes: the hook's check, else an SQS batch (its partial
/// batch response). `Err` when it is neither.
pub async fn handle_event(
    exec: &Executor,
    event: Value,
    deadline: Option<SystemTime>,
) -> Result<Value, super::EventError> {
    if let Some(check) = event.get(DEPLOY_CHECK) {
        return Ok(deploy_check(exec, check, deadline).await);
    }
    let batch: SqsEvent = serde_json::from_value(event).map_err(super::EventError::NotSqs)?;
    serde_json::to_value(handle(exec, batch, deadline).await).map_err(super::EventError::Answer)
}

/// The hook's check: claim the check job (of the deploy-check tenant only, whether or not it
/// is due) and run it here. The answer says whether this version claimed and finished it, and
/// which version this is.
pub async fn deploy_check(exec: &Executor, check: &Value, deadline: Option<SystemTime>) -> Value {
    let version = std::env::var("AWS_LAMBDA_FUNCTION_VERSION").unwrap_or_default();
    let Some(id) = check["job_id"].as_str().and_then(|i| i.parse::<crate::job::JobId>().ok()) else {
        return json!({"deploy_check": {"version": version, "error": format!("no job_id in {check}")}});
    };
    let deadline = deadline.map(|d| Instant::now() + d.duration_since(SystemTime::now()).unwrap_or_default());
    let answer = match exec.run_check(id, DEPLOY_CHECK_TENANT, deadline).await {
        Ok(d) => json!({
            "job_id": id, "version": version, "claimed": d.claimed, "succeeded": d.report.succeeded,
            "failed": d.report.failed, "retried": d.report.retried, "unfinished": d.count(Fate::Unfinished),
        }),
        Err(e) => json!({"job_id": id, "version": version, "error": format!("could not claim or record: {e}")}),
    };
    tracing::info!(event = "relay.executor.deploy_check", answer = %answer, "deploy check job handled");
    json!({"deploy_check": answer})
}

/// Handle one batch; `deadline` is the invocation's (`LambdaEvent::context.deadline()`).
pub async fn handle(exec: &Executor, event: SqsEvent, deadline: Option<SystemTime>) -> SqsBatchResponse {
    // The runtime gives wall-clock time; the executor measures on the monotonic clock.
    let deadline = deadline.map(|d| Instant::now() + d.duration_since(SystemTime::now()).unwrap_or_default());
    let mut response = SqsBatchResponse::default();
    let mut counts = Counts::default();
    let mut ids = Vec::new();
    let mut carrying = Vec::new();
    let mut letters = Vec::new();
    // Every record of a batch comes from the same queue.
    let arn = event.records.first().and_then(|r| r.event_source_arn.clone());
    for record in event.records {
        let message_id = record.message_id.unwrap_or_default();
        let body = record.body.unwrap_or_default();
        match WorkMessage::parse(&body) {
            Ok(m) => {
                ids.push(m.job_id);
                carrying.push((message_id, body));
            }
            Err(why) => {
                let reason = why.to_string();
                let source = source(arn.as_deref());
                tracing::warn!(
                    event = "relay.executor.malformed_message",
                    message_id,
                    reason,
                    "work message kept in dead_letters"
                );
                letters.push(NewDeadLetter { source, message_id: Some(message_id), body, reason });
            }
        }
    }
    if !ids.is_empty() {
        match exec.run_dispatched_until(&ids, deadline).await {
            Ok(done) => {
                let report = &done.report;
                tracing::info!(
                    event = "relay.executor.batch",
                    messages = ids.len(),
                    claimed = done.claimed,
                    deferred = done.count(Fate::Deferred),
                    unfinished = done.count(Fate::Unfinished),
                    unrecorded = done.count(Fate::Unrecorded),
                    flushes = done.flushes,
                    succeeded = report.succeeded,
                    retried = report.retried,
                    failed = report.failed,
                    stale = report.stale,
                    "batch done"
                );
                if done.count(Fate::Unrecorded) > 0 {
                    counts.database_errors += 1;
                }
                for (id, (message_id, body)) in ids.iter().zip(carrying) {
                    match done.fate(*id) {
                        // Nothing of these is recorded: do not acknowledge them.
                        Some(Fate::Unfinished | Fate::Unrecorded) => response.add_failure(message_id),
                        Some(Fate::Missing) => {
                            tracing::warn!(event = "relay.executor.unknown_job", message_id, job_id = %id,
                                "work message for no job kept in dead_letters");
                            letters.push(NewDeadLetter {
                                source: source(arn.as_deref()),
                                message_id: Some(message_id),
                                body,
                                reason: format!("no job {id} exists: a work message without a row"),
                            });
                        }
                        _ => {}
                    }
                }
                counts.done = Some(done);
            }
            Err(e) => {
                counts.database_errors += 1;
                tracing::warn!(event = "relay.executor.batch_failed", error = %e, messages = ids.len(),
                    "could not claim; the messages return to the queue");
                for (message_id, _) in carrying {
                    response.add_failure(message_id);
                }
            }
        }
    }
    if !letters.is_empty() {
        let kept = async { dead_letters::insert_many(&exec.pool.get().await?, &letters).await };
        counts.dead_letters = letters.len();
        if let Err(e) = kept.await {
            counts.database_errors += 1;
            counts.dead_letters = 0;
            tracing::warn!(event = "relay.executor.dead_letter_failed", error = %e, "could not keep poison messages; they return to the queue");
            for l in letters {
                response.add_failure(l.message_id.unwrap_or_default());
            }
        }
    }
    counts.record(response.batch_item_failures.len());
    response
}

/// What one invocation counts, printed as its metrics (`metrics::emf`).
#[derive(Default)]
struct Counts {
    done: Option<crate::executor::Dispatched>,
    dead_letters: usize,
    database_errors: usize,
}

impl Counts {
    fn record(&self, batch_item_failures: usize) {
        let d = self.done.clone().unwrap_or_default();
        let n = |x: usize| x as f64;
        crate::metrics::emf::record(&[
            ("Claimed", n(d.claimed)),
            ("Succeeded", n(d.report.succeeded)),
            ("Retried", n(d.report.retried)),
            ("FailedForGood", n(d.report.failed)),
            ("StaleWrites", n(d.report.stale)),
            ("Deferred", n(d.count(Fate::Deferred))),
            ("StoppedAtDeadline", n(d.count(Fate::Unfinished))),
            ("BatchItemFailures", n(batch_item_failures)),
            ("DeadLetters", n(self.dead_letters)),
            ("DatabaseErrors", n(self.database_errors) + crate::metrics::emf::database_errors()),
        ]);
    }
}

fn source(arn: Option<&str>) -> String {
    format!("executor:{}", arn.unwrap_or("unknown"))
}
