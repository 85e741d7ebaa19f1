//! `callback.deliver`: POSTs a job's resource to its callback URL, signed in the Standard
//! Webhooks form, as a durable platform job created in the same statement as the job's
//! terminal write (`store::callbacks::enqueue_ctes`); or a message event (bounce, delivery,
//! suppression...) to its tenant's URL, created in the transaction that applies the event
//! (`store::callbacks::enqueue_message_event`). Every attempt is recorded, on the job (for a
//! message event: its message's job).
//!
//! Retries follow `RetryPolicy::CALLBACKS` (about three days over 16 attempts), never sooner
//! than a `Retry-After`; a 410 stops them (the job succeeds with `gone`); an address the guard
//! refuses fails the delivery for good; exhausted attempts too. Both are the tenant's to see
//! (its callback attempts, the delivery job): they open no operator exception, and are
//! counted per tenant and cause in `tenant_faults` (`Fault::Tenant`). Shadow
//! mode or `write:callbacks` off: the attempt is recorded as `shadowed`, nothing is sent.

use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::callbacks;
use crate::job::{ClaimedJob, Ending, Fault, JobId, TaskError, TenantId};
use crate::outbound::{self, AllowList, Refusal};
use crate::retry::RetryPolicy;
use crate::store::callbacks::{self as store, Attempt, Outcome};
use crate::store::{jobs, message_events};
use crate::task::{Task, TaskContext};
use crate::view;

/// Delivers callbacks; `allow` is the operator's allow-list (`RELAY_CALLBACK_ALLOW`).
#[derive(Debug, Clone, Default)]
pub struct Deliver {
    pub allow: AllowList,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliverParams {
    /// The job the callback reports on.
    #[schema(value_type = uuid::Uuid)]
    pub job_id: JobId,
    #[schema(value_type = uuid::Uuid)]
    pub tenant_id: TenantId,
    /// `job.<status>`: the state that caused it; or `message.<event>` for a message event.
    pub event: String,
    /// For a message event: its row (`message_events.id`); `job_id` is then its message's job.
    #[serde(default)]
    pub message_event: Option<i64>,
}

impl Task for Deliver {
    type Params = DeliverParams;
    const NAME: &'static str = store::TASK_TYPE;
    const DESCRIPTION: &'static str = "POSTs a job's resource, signed, to its callback URL (platform only)";
    const PLATFORM_ONLY: bool = true;
    const RETRY: Option<RetryPolicy> = Some(RetryPolicy::CALLBACKS);

    /// The URL and the endpoint are the tenant's: a refused address or an endpoint that never
    /// answers is recorded on its job's callback attempts, not opened as an operator exception.
    fn fault(_job: &ClaimedJob, _end: Ending<'_>, p: &DeliverParams) -> Fault {
        Fault::Tenant(p.tenant_id)
    }

    async fn run(&self, ctx: &TaskContext, p: DeliverParams) -> Result<Value, TaskError> {
        let now = chrono::Utc::now();
        let (settings, data, url) = match read(ctx, &p, now).await? {
            Ok(found) => found,
            Err(skipped) => return Ok(skipped),
        };
        let mut attempt = Attempt {
            job_id: p.job_id,
            tenant_id: p.tenant_id,
            delivery_job_id: ctx.job_id,
            attempt: ctx.attempt,
            event: p.event.clone(),
            url: url.clone().unwrap_or_default(),
            outcome: Outcome::Skipped,
            http_status: None,
            error: None,
            duration_ms: None,
            at: None,
        };
        let record = |a: Attempt| async move { store::record_attempt(&connect(ctx).await?, &a).await.map_err(db_err) };
        let (Some(url), Some(settings)) = (url, settings) else {
            attempt.error = Some("no callback URL or no signing secret (PUT /v1/callbacks)".into());
            record(attempt).await?;
            return Ok(json!({"delivered": false, "skipped": "no callback URL or signing secret"}));
        };
        let target = match outbound::parse_url(&url) {
            Ok(t) => t,
            Err(why) => {
                attempt.outcome = Outcome::Refused;
                attempt.error = Some(format!("invalid callback URL: {why}"));
                record(attempt).await?;
                return Err(TaskError::Fatal(format!("invalid callback URL: {why}")));
            }
        };
        if !ctx.modes.writes_enabled("callbacks") {
            attempt.outcome = Outcome::Shadowed;
            record(attempt).await?;
            return Ok(json!({"delivered": false, "shadowed": true}));
        }
        let addr = match outbound::resolve(&target, &self.allow).await {
            Ok(a) => a,
            Err(refusal) => {
                attempt.error = Some(refusal.to_string());
                return match refusal {
                    Refusal::Address { .. } => {
                        attempt.outcome = Outcome::Refused;
                        record(attempt).await?;
                        Err(TaskError::Fatal(refusal.to_string()))
                    }
                    Refusal::Resolve { .. } => {
                        attempt.outcome = Outcome::Failed;
                        record(attempt).await?;
                        Err(TaskError::Retryable(refusal.to_string()))
                    }
                };
            }
        };
        let body = serde_json::to_vec(&json!({
            "type": p.event,
            "timestamp": now,
            "data": data,
        }))
        .map_err(|e| TaskError::Fatal(e.to_string()))?;
        // The same id on every attempt of this delivery, so a receiver can drop repeats.
        let msg_id = format!("cb_{}", ctx.job_id);
        let ts = now.timestamp();
        let headers = [
            ("webhook-id", msg_id.clone()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", callbacks::signature_header(&settings.signing_secrets(now), &msg_id, ts, &body)),
            ("user-agent", "relay-callbacks/1".into()),
        ];
        let started = std::time::Instant::now();
        let answer = outbound::post(&target, addr, &headers, body.into()).await;
        attempt.duration_ms = Some(i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX));
        let result = settle(&mut attempt, answer);
        record(attempt).await?;
        result
    }
}

/// A callback's settings, payload and URL.
type Found = (Option<store::Settings>, Value, Option<String>);

/// What to send, read on a connection given back before the address is resolved and the POST
/// made (a receiver that never answers holds no pooled connection); `Err` is the result of a
/// delivery whose job or message event no longer exists.
async fn read(
    ctx: &TaskContext,
    p: &DeliverParams,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Result<Found, Value>, TaskError> {
    let db = connect(ctx).await?;
    let settings = store::get(&db, p.tenant_id).await.map_err(db_err)?;
    // A job's callback carries the job (to its own URL, or the tenant's); a message
    // event's carries the event, to the tenant's URL.
    let (data, url) = match p.message_event {
        Some(id) => {
            let Some(event) = message_events::tenant_event_by_id(&db, p.tenant_id, id).await.map_err(db_err)? else {
                return Ok(Err(json!({"delivered": false, "skipped": "the message event no longer exists"})));
            };
            let data = serde_json::to_value(event).map_err(|e| TaskError::Fatal(e.to_string()))?;
            (data, settings.as_ref().and_then(|s| s.url.clone()))
        }
        None => {
            let Some(job) = jobs::get(&db, p.tenant_id, p.job_id).await.map_err(db_err)? else {
                return Ok(Err(json!({"delivered": false, "skipped": "the job no longer exists"})));
            };
            let job = view::annotate_one(&db, job, now).await.map_err(db_err)?;
            let url = job.callback_url.clone().or_else(|| settings.as_ref().and_then(|s| s.url.clone()));
            (serde_json::to_value(job).map_err(|e| TaskError::Fatal(e.to_string()))?, url)
        }
    };
    Ok(Ok((settings, data, url)))
}

/// The attempt's outcome from the receiver's answer, and the run's result.
fn settle(attempt: &mut Attempt, answer: Result<outbound::Answer, outbound::PostError>) -> Result<Value, TaskError> {
    match answer {
        Ok(a) => {
            attempt.http_status = Some(i32::from(a.status));
            match a.status {
                200..=299 => {
                    attempt.outcome = Outcome::Delivered;
                    Ok(json!({"delivered": true, "status": a.status}))
                }
                410 => {
                    attempt.outcome = Outcome::Gone;
                    Ok(json!({"delivered": false, "gone": true, "status": 410}))
                }
                s => {
                    let why = if (300..400).contains(&s) { "a redirect (not followed)" } else { "not a 2xx answer" };
                    attempt.outcome = Outcome::Failed;
                    attempt.error = Some(format!("{s}: {why}"));
                    let error = format!("callback answered {s}: {why}");
                    Err(match a.retry_after {
                        Some(after) => TaskError::RetryAfter(error, after),
                        None => TaskError::Retryable(error),
                    })
                }
            }
        }
        Err(e) => {
            attempt.outcome = Outcome::Failed;
            attempt.error = Some(e.to_string());
            Err(TaskError::Retryable(e.to_string()))
        }
    }
}

fn db_err(e: crate::store::StoreError) -> TaskError {
    TaskError::Retryable(e.to_string())
}

async fn connect(ctx: &TaskContext) -> Result<deadpool_postgres::Client, TaskError> {
    ctx.db.get().await.map_err(|e| TaskError::Retryable(format!("database: {e}")))
}
