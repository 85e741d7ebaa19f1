//! External completions, applied: a completion (from the API or a provider event) and the
//! sweep's overdue pass each lock a wait with its job, decide how the wait ends
//! (`crate::job::completion`), write the job's transition through the one fenced transition
//! code (`store::jobs`, from the state the job is in) and close the wait, in one transaction.
//! Whichever comes first applies; the other finds the wait closed. After commit: alerts for
//! opened exceptions, parents finished, retries and callbacks dispatched.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::job::completion::{self, Completion, CompletionOutcome, MAX_ERROR_CHARS, OverduePolicy, WaitEnd};
use crate::job::{Dispatch, Fence, JobId, JobStatus, TenantId};
use crate::store::completions::{self as waits, Completed, Locked};
use crate::store::jobs::{self, Failure, Retry};
use crate::store::{GenericClient, StoreError, tenants};
use crate::transport::{self, Transport};

/// Where a completion came from (kept on the wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Api,
    Ingress,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Api => "api",
            Via::Ingress => "ingress",
        }
    }
}

/// The longest token accepted (tokens Relay hands out are 46 characters).
pub const MAX_TOKEN_CHARS: usize = 200;

/// A completion, as the outside party (or the tenant on its behalf) reports it.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The token the job's task handed out.
    #[schema(min_length = 1, max_length = 200)]
    pub token: String,
    pub outcome: CompletionOutcome,
    /// The job's result, with `success` only: plain JSON, at most 256 KiB serialised.
    #[serde(default)]
    pub result: Option<Value>,
    /// Why it failed, with `failure` only (at most 4000 characters).
    #[serde(default)]
    #[schema(max_length = 4000)]
    pub error: Option<String>,
    /// With `failure`: whether another attempt may help (default true: the job retries under
    /// its retry policy while attempts are left, and fails with `attempts_exhausted` after);
    /// false fails it for good at once (`fatal_error`).
    #[serde(default)]
    pub retryable: Option<bool>,
}

impl CompletionRequest {
    /// The token and the completion it reports, or the field at fault.
    pub fn into_completion(self) -> Result<(String, Completion), Invalid> {
        let bad = |field: &str, message: String| Invalid { field: field.to_owned(), message };
        if self.token.is_empty() || self.token.chars().count() > MAX_TOKEN_CHARS {
            return Err(bad("token", format!("token: 1 to {MAX_TOKEN_CHARS} characters")));
        }
        match self.outcome {
            CompletionOutcome::Success if self.error.is_some() || self.retryable.is_some() => {
                return Err(bad("error", "error and retryable go with outcome failure only".into()));
            }
            CompletionOutcome::Failure if self.result.is_some() => {
                return Err(bad("result", "result goes with outcome success only".into()));
            }
            _ => {}
        }
        let result = self.result.unwrap_or(Value::Null);
        crate::job::storable(&result).map_err(|why| bad("result", format!("result: {why}")))?;
        if self.error.as_ref().is_some_and(|e| e.chars().count() > MAX_ERROR_CHARS) {
            return Err(bad("error", format!("error: at most {MAX_ERROR_CHARS} characters")));
        }
        let c =
            Completion { outcome: self.outcome, result, error: self.error, retryable: self.retryable.unwrap_or(true) };
        Ok((self.token, c))
    }
}

/// A completion request that breaks a rule, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

/// What a completion came to. Only `Applied` changed anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// It ended the wait: the job succeeded, or failed or retries by the retry policy.
    Applied { job: JobId, outcome: CompletionOutcome },
    /// The same completion had been applied before: nothing changed.
    Replayed { job: JobId, outcome: CompletionOutcome, at: DateTime<Utc> },
    /// Another completion had been applied before: nothing changed.
    AlreadyCompleted { job: JobId, outcome: CompletionOutcome, at: DateTime<Utc> },
    /// The deadline had passed and the sweep had applied the overdue policy.
    Overdue { job: JobId, deadline: DateTime<Utc>, policy: OverduePolicy, at: DateTime<Utc> },
    /// The job had left the attempt this token was for (cancelled, or another attempt).
    Superseded { job: JobId },
    /// No wait has this token (for this job, with a scope).
    UnknownToken,
}

/// Apply a completion presented with `token`. With `scope` (the API: the caller's tenant and
/// the job named in the path) only that job's wait can match; ingress has none (the token
/// alone names the wait: it is random and unguessable).
pub async fn apply(
    pool: &Pool,
    transport: &Arc<dyn Transport>,
    token: &str,
    scope: Option<(TenantId, JobId)>,
    c: &Completion,
    via: Via,
) -> Result<Applied, StoreError> {
    let hash = c.hash();
    let mut db = pool.get().await?;
    let tx = db.transaction().await?;
    let Some(w) = waits::lock_by_token(&tx, &tenants::hash_key(token), scope).await? else {
        return Ok(Applied::UnknownToken);
    };
    let job = w.wait.fence.job;
    if let Some(closed) = &w.closed {
        return Ok(match (closed.by.as_str(), closed.outcome) {
            ("completion", Some(outcome)) if closed.completion_hash.as_deref() == Some(hash.as_slice()) => {
                Applied::Replayed { job, outcome, at: closed.at }
            }
            ("completion", Some(outcome)) => Applied::AlreadyCompleted { job, outcome, at: closed.at },
            ("overdue", _) => {
                Applied::Overdue { job, deadline: w.wait.deadline, policy: w.wait.on_overdue, at: closed.at }
            }
            _ => Applied::Superseded { job },
        });
    }
    if !w.current() {
        waits::close(&tx, &[w.wait.fence], "superseded", None).await?;
        tx.commit().await?;
        return Ok(Applied::Superseded { job });
    }
    let end = completion::on_completion(&w.wait, c, Utc::now());
    let ended = end_waits(&tx, w.job_status, &[(w.wait.fence, end)]).await?;
    if !ended.refused.is_empty() {
        // Locked with the wait, the job cannot have moved; were it to, nothing is written.
        return Err(StoreError::StaleWrite { job_id: job, attempt: w.wait.fence.attempt });
    }
    let completed = Completed { outcome: c.outcome, hash: &hash, via: via.as_str() };
    waits::close(&tx, &[w.wait.fence], "completion", Some(&completed)).await?;
    tx.commit().await?;
    drop(db);
    tracing::info!(event = "relay.completion.applied", job_id = %job, attempt = w.wait.fence.attempt,
        outcome = c.outcome.as_str(), via = via.as_str(), "completion applied");
    ended.after_commit(pool, transport).await;
    Ok(Applied::Applied { job, outcome: c.outcome })
}

/// What the sweep's overdue pass did in one batch.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OverdueBatch {
    /// Waits past their deadline whose policy was applied.
    pub handled: usize,
    /// Waits closed because their job had left their attempt.
    pub superseded: usize,
}

/// One batch of the sweep's overdue pass: lock up to `limit` open waits past their deadline
/// (skipping any a completion holds), apply each one's overdue policy, close them, commit.
pub async fn sweep_overdue(
    pool: &Pool,
    transport: &Arc<dyn Transport>,
    limit: i64,
) -> Result<OverdueBatch, StoreError> {
    let mut db = pool.get().await?;
    let tx = db.transaction().await?;
    let locked = waits::lock_overdue(&tx, limit).await?;
    if locked.is_empty() {
        return Ok(OverdueBatch::default());
    }
    let now = Utc::now();
    let (due, gone): (Vec<&Locked>, Vec<&Locked>) =
        locked.iter().partition(|w| w.job_status == JobStatus::Waiting && w.current());
    let ends: Vec<(Fence, WaitEnd)> =
        due.iter().map(|w| (w.wait.fence, completion::on_overdue(&w.wait, now))).collect();
    let ended = end_waits(&tx, JobStatus::Waiting, &ends).await?;
    let handled: Vec<Fence> = due.iter().map(|w| w.wait.fence).filter(|f| !ended.refused.contains(f)).collect();
    let gone: Vec<Fence> = gone.iter().map(|w| w.wait.fence).collect();
    waits::close(&tx, &handled, "overdue", None).await?;
    waits::close(&tx, &gone, "superseded", None).await?;
    tx.commit().await?;
    drop(db);
    for (fence, end) in ends.iter().filter(|e| handled.contains(&e.0)) {
        tracing::warn!(event = "relay.completion.overdue", job_id = %fence.job, attempt = fence.attempt, applied = end.name(),
            "no completion arrived by the deadline; the task's overdue policy applied");
    }
    ended.after_commit(pool, transport).await;
    Ok(OverdueBatch { handled: handled.len(), superseded: gone.len() })
}

impl WaitEnd {
    fn name(&self) -> &'static str {
        match self {
            WaitEnd::Succeed(_) => "succeed",
            WaitEnd::Retry { .. } => "retry",
            WaitEnd::Reschedule { .. } => "reschedule",
            WaitEnd::Fail { .. } => "fail",
        }
    }
}

/// What ending waits wrote, for after the commit.
#[derive(Debug, Default)]
struct Ended {
    refused: Vec<Fence>,
    dispatch: Vec<Dispatch>,
    parents: Vec<JobId>,
    opened: Vec<(uuid::Uuid, JobId, String, crate::job::ExceptionKind)>,
}

/// End these waits of jobs in state `from`: each job's transition (fenced by the wait's
/// attempt) with its one event, its callback deliveries and any exception, in the caller's
/// transaction.
async fn end_waits(db: &impl GenericClient, from: JobStatus, ends: &[(Fence, WaitEnd)]) -> Result<Ended, StoreError> {
    let (mut done, mut retries, mut later, mut failures) = (vec![], vec![], vec![], vec![]);
    for (fence, end) in ends {
        match end {
            WaitEnd::Succeed(result) => done.push((*fence, result.clone())),
            WaitEnd::Retry { run_at, error } => retries.push((*fence, Retry { run_at: *run_at, error: error.clone() })),
            WaitEnd::Reschedule { run_at, note } => {
                later.push((*fence, Retry { run_at: *run_at, error: note.clone() }))
            }
            // The completion (or its absence) is the tenant's outside party's: its failure.
            WaitEnd::Fail { kind, error } => failures.push((*fence, Failure::owners(*kind, error.clone()))),
        }
    }
    let mut out = Ended::default();
    if !done.is_empty() {
        let s = jobs::succeed_from(db, from, &done).await?;
        out.refused.extend(s.refused);
        out.dispatch.extend(s.callbacks);
        out.parents.extend(s.parents);
    }
    for (batch, reschedule) in [(&retries, false), (&later, true)] {
        if batch.is_empty() {
            continue;
        }
        let refused = jobs::retry_wait(db, from, batch, reschedule).await?;
        out.dispatch.extend(batch.iter().filter(|r| !refused.contains(&r.0)).map(|(f, r)| Dispatch {
            id: f.job,
            run_at: r.run_at,
            tenant: None,
        }));
        out.refused.extend(refused);
    }
    if !failures.is_empty() {
        let f = jobs::fail_from(db, from, &failures).await?;
        out.refused.extend(f.refused);
        out.dispatch.extend(f.callbacks);
        out.parents.extend(f.parents);
        for (exception, job) in f.opened {
            if let Some((_, failure)) = failures.iter().find(|x| x.0.job == job) {
                out.opened.push((exception, job, failure.error.clone(), failure.kind));
            }
        }
    }
    Ok(out)
}

impl Ended {
    async fn after_commit(self, pool: &Pool, transport: &Arc<dyn Transport>) {
        for (exception, job, error, kind) in &self.opened {
            crate::exceptions::alert_opened(*exception, *job, *kind, error);
        }
        let mut send = self.dispatch;
        send.extend(crate::parents::finish_parents(pool, self.parents).await);
        transport::send(transport, pool, &send).await;
    }
}
