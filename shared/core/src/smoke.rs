//! The smoke check: submit a `noop` job as a tenant and wait for it to succeed. One loop, two
//! ways to reach the API: `relay smoke` over HTTP (`client::Client`), and the pre-traffic hook
//! by invoking the new intake version directly (`lambda::pretraffic`), which also hands the job
//! to the new executor version (`SmokeApi::submitted`). Anything but success within the bound
//! is a `SmokeError` that says what was seen.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::catalogue::Noop;
use crate::client::{Client, ClientError};
use crate::job::JobId;
use crate::task::Task;

/// The smoke job's `timeout_seconds`.
pub const SMOKE_TIMEOUT_SECONDS: u32 = 30;

/// How the check reaches Relay's API as one tenant.
#[async_trait::async_trait]
pub trait SmokeApi: Send + Sync {
    /// `POST /v1/jobs`: the job as the API answered it (202), or why not.
    async fn submit(&self, idempotency_key: &str, request: &Value) -> Result<Value, ClientError>;
    /// `GET /v1/jobs/{id}`: `None` when the API does not know it.
    async fn job(&self, id: JobId) -> Result<Option<Value>, ClientError>;
    /// Called once the job is accepted: a check that drives the executor itself does it here.
    async fn submitted(&self, _job: &Value) -> Result<(), SmokeError> {
        Ok(())
    }
    /// Submit the job to run a day later, so no live executor or sweep takes it: a check that
    /// hands it to one executor itself (the pre-traffic hook) says so.
    fn hold(&self) -> bool {
        false
    }
}

#[async_trait::async_trait]
impl SmokeApi for Client {
    async fn submit(&self, idempotency_key: &str, request: &Value) -> Result<Value, ClientError> {
        Client::submit(self, idempotency_key, request).await
    }
    async fn job(&self, id: JobId) -> Result<Option<Value>, ClientError> {
        Client::job(self, id).await
    }
}

/// Why the check failed; the text is what an operator reads in the deploy's log.
#[derive(Debug, thiserror::Error)]
pub enum SmokeError {
    #[error("submit: {0}")]
    Submit(ClientError),
    #[error("submit: no job id in the answer: {0}")]
    NoId(Value),
    #[error("the executor: {0}")]
    Executor(String),
    #[error("job {id} ended {status}: {job}")]
    Ended { id: JobId, status: String, job: Value },
    #[error(
        "job {id} did not succeed within {} s (is an executor running and reaching the queue?); last seen: {last}",
        within.as_secs()
    )]
    TimedOut { id: JobId, within: Duration, last: Value },
    #[error("job {0} is not found after it was accepted")]
    Vanished(JobId),
    #[error("reading job {id}: {error}")]
    Read { id: JobId, error: ClientError },
}

/// A check that passed: the job and how long it took.
#[derive(Debug, Clone)]
pub struct Smoked {
    pub id: JobId,
    pub took: Duration,
}

/// Submit a `noop` (one attempt, correlation id `relay-smoke-<uuid>`) and poll it every
/// `poll` until it succeeds or `within` passes.
pub async fn run(api: &dyn SmokeApi, within: Duration, poll: Duration) -> Result<Smoked, SmokeError> {
    let started = Instant::now();
    let nonce = uuid::Uuid::now_v7();
    let request = json!({
        "task_type": Noop::NAME,
        "params": {"echo": format!("smoke {nonce}")},
        "correlation_id": format!("relay-smoke-{nonce}"),
        "max_attempts": 1,
        // Short enough for any executor lane and any invocation's time left: the short lane
        // runs it (a longer one would be sent to the long lane, which the check does not drive).
        "timeout_seconds": SMOKE_TIMEOUT_SECONDS,
    });
    let mut request = request;
    if api.hold() {
        request["run_at"] = json!((chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339());
    }
    let submitted = api.submit(&format!("relay-smoke-{nonce}"), &request).await.map_err(SmokeError::Submit)?;
    let Some(id) = submitted["id"].as_str().and_then(|i| i.parse::<JobId>().ok()) else {
        return Err(SmokeError::NoId(submitted));
    };
    tracing::info!(event = "relay.smoke.submitted", job_id = %id, "smoke job submitted");
    api.submitted(&submitted).await?;
    let mut last = submitted;
    loop {
        match last["status"].as_str() {
            Some("succeeded") => return Ok(Smoked { id, took: started.elapsed() }),
            Some(status @ ("failed" | "cancelled")) => {
                return Err(SmokeError::Ended { id, status: status.to_owned(), job: last });
            }
            _ => {}
        }
        if started.elapsed() >= within {
            return Err(SmokeError::TimedOut { id, within, last });
        }
        tokio::time::sleep(poll).await;
        last = match api.job(id).await {
            Ok(Some(job)) => job,
            Ok(None) => return Err(SmokeError::Vanished(id)),
            Err(error) => return Err(SmokeError::Read { id, error }),
        };
    }
}
