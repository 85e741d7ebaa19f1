//! Operator actions on exceptions: retry now or at a time, cancel (the job, its children and
//! its schedule's future runs), force finish, ignore; one by one or in bulk by filter. Each
//! action is one transaction holding the job's transition, its job event and the audit row
//! (who, when, what, why); a retry is dispatched after commit. The system resolves an
//! exception itself when its job later succeeds (`store::jobs::succeed`).
//!
//! One alert per new exception: `alert_opened` logs `relay.exception.opened` once, where the
//! terminal-failure path reports an exception it opened (a failing retry of a job whose
//! exception is still open opens none).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::job::terms::IdempotencyKey;
use crate::job::{Dispatch, ExceptionKind, JobId, JobStatus};
use crate::store::exceptions::{self, Exception, ExceptionFilter, ExceptionStatus};
use crate::store::jobs::operator;
use crate::store::schedules as schedule_store;
use crate::store::{GenericClient, StoreError};
use crate::transport::{self, Transport};
use crate::view::JobView;

/// Most exceptions one bulk action touches.
pub const MAX_BULK: i64 = 1000;

/// What an operator asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Back to pending at `at` (now when absent).
    Retry {
        at: Option<DateTime<Utc>>,
    },
    Cancel,
    /// Succeeded, with a result recording who and why (and `result` when given).
    Finish {
        result: Option<Value>,
    },
    Ignore,
}

impl Action {
    pub fn name(&self) -> &'static str {
        match self {
            Action::Retry { .. } => "retry",
            Action::Cancel => "cancel",
            Action::Finish { .. } => "finish",
            Action::Ignore => "ignore",
        }
    }

    /// Finishing and ignoring need a reason; retry and cancel take one optionally.
    pub fn needs_reason(&self) -> bool {
        matches!(self, Action::Finish { .. } | Action::Ignore)
    }
}

/// Why an action was refused.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("no such exception")]
    NotFound,
    #[error("the exception is {0}; only open exceptions take actions")]
    NotOpen(ExceptionStatus),
    #[error("the job is {0}; this action needs it {1}")]
    JobState(String, &'static str),
    #[error("the job has used {0} attempts, the most a job may have")]
    AttemptLimit(i32),
    #[error("this action needs a reason")]
    ReasonRequired,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ActionError {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ActionError::NotFound => "not_found",
            ActionError::NotOpen(_) => "exception_closed",
            ActionError::JobState(..) => "job_state",
            ActionError::AttemptLimit(_) => "attempt_limit",
            ActionError::ReasonRequired => "reason_required",
            ActionError::Store(_) => "internal",
        }
    }
}

/// What an action did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ActionOutcome {
    pub exception: Exception,
    pub job: Option<JobView>,
    /// Jobs this action cancelled (the job, its children, its schedule's pending run).
    #[schema(value_type = Vec<Uuid>)]
    pub cancelled: Vec<JobId>,
    /// The schedule disabled by a cancel, when the job was fired by one.
    pub schedule_disabled: Option<Uuid>,
}

/// Apply one action to one exception as `actor`.
pub async fn act(
    pool: &Pool,
    transport: &Arc<dyn Transport>,
    id: Uuid,
    action: &Action,
    reason: Option<&str>,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<ActionOutcome, ActionError> {
    let mut db = pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let (outcome, dispatch) = act_in(&tx, id, action, reason, actor, now).await?;
    tx.commit().await.map_err(StoreError::from)?;
    tracing::info!(event = "relay.exception.action", exception_id = %id, job_id = %outcome.exception.job_id,
        action = action.name(), actor, reason, "operator action on an exception");
    if let Some(d) = dispatch {
        transport::send(transport, pool, &[d]).await;
    }
    Ok(outcome)
}

/// An action inside the caller's transaction; returns what to dispatch after commit.
async fn act_in(
    tx: &impl GenericClient,
    id: Uuid,
    action: &Action,
    reason: Option<&str>,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<(ActionOutcome, Option<Dispatch>), ActionError> {
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if action.needs_reason() && reason.is_none() {
        return Err(ActionError::ReasonRequired);
    }
    let exc = exceptions::lock(tx, id).await?.ok_or(ActionError::NotFound)?;
    if exc.status != ExceptionStatus::Open {
        return Err(ActionError::NotOpen(exc.status));
    }
    let job = operator::get_any(tx, exc.job_id).await?;
    let job_status = job.as_ref().map_or("deleted".to_owned(), |j| j.status.as_str().to_owned());
    let said = |what: &str| match reason {
        Some(r) => format!("{what} by {actor}: {r}"),
        None => format!("{what} by {actor}"),
    };
    let mut outcome = ActionOutcome { exception: exc.clone(), job: None, cancelled: vec![], schedule_disabled: None };
    let mut dispatch = None;
    let detail: Value = match action {
        Action::Retry { at } => {
            let run_at = at.map_or(now, |a| a.max(now));
            let retried = operator::retry_failed(tx, exc.job_id, run_at, &said("retried")).await?;
            let Some(j) = retried else {
                return Err(match &job {
                    Some(j) if j.status == JobStatus::Failed => ActionError::AttemptLimit(j.attempt),
                    _ => ActionError::JobState(job_status, "failed"),
                });
            };
            dispatch = Some(Dispatch { id: j.id, run_at: j.run_at, tenant: None });
            outcome.job = Some(JobView::bare(j));
            json!({ "run_at": run_at })
        }
        Action::Cancel => {
            let cancelled = operator::cancel_tree(tx, exc.job_id, &said("cancelled")).await?;
            if cancelled.first() != Some(&exc.job_id) {
                return Err(ActionError::JobState(job_status, "failed, pending or waiting"));
            }
            outcome.cancelled = cancelled;
            if let Some(j) = &job
                && let Some(sid) = IdempotencyKey::schedule_of(&j.idempotency_key)
                && let Some(last) = schedule_store::disable(tx, sid, j.tenant_id, actor).await?
            {
                outcome.schedule_disabled = Some(sid);
                if let Some(last) = last.filter(|l| *l != j.id)
                    && operator::get_any(tx, last).await?.is_some_and(|l| l.status == JobStatus::Pending)
                {
                    outcome.cancelled.extend(operator::cancel_tree(tx, last, &said("cancelled")).await?);
                }
            }
            exceptions::close(tx, id, ExceptionStatus::Resolved, actor, &said("cancelled")).await?;
            json!({ "cancelled": outcome.cancelled, "schedule_disabled": outcome.schedule_disabled })
        }
        Action::Finish { result } => {
            let recorded = json!({ "forced": true, "by": actor, "reason": reason, "result": result });
            let finished = operator::force_finish(tx, exc.job_id, &recorded, &said("finished")).await?;
            let Some(j) = finished else { return Err(ActionError::JobState(job_status, "failed")) };
            outcome.job = Some(JobView::bare(j));
            exceptions::close(tx, id, ExceptionStatus::Resolved, actor, &said("force finished")).await?;
            json!({ "result": recorded })
        }
        Action::Ignore => {
            if job.is_some() {
                operator::note(tx, exc.job_id, "exception_ignored", &said("exception ignored")).await?;
            }
            exceptions::close(tx, id, ExceptionStatus::Ignored, actor, &said("ignored")).await?;
            Value::Null
        }
    };
    let detail = (!detail.is_null()).then_some(detail);
    exceptions::record_action(tx, id, exc.job_id, action.name(), actor, reason, detail.as_ref()).await?;
    outcome.exception = exceptions::get(tx, id).await?.ok_or(ActionError::NotFound)?;
    if outcome.job.is_none() {
        outcome.job = operator::get_any(tx, exc.job_id).await?.map(JobView::bare);
    }
    Ok((outcome, dispatch))
}

/// The system's own settlement of an ambiguous outcome that turned out well (an SES event
/// proved an `unknown` send happened): each open `ambiguous_outcome` exception of the job is
/// force-finished by `system` with `result`, audited like an operator's action, in the
/// caller's transaction. Returns the exceptions it resolved.
pub async fn settle_ambiguous(
    tx: &impl GenericClient,
    job_id: JobId,
    result: Value,
    why: &str,
) -> Result<Vec<Uuid>, StoreError> {
    let mut resolved = Vec::new();
    for e in exceptions::for_job(tx, job_id).await? {
        if e.status != ExceptionStatus::Open || e.kind != ExceptionKind::AmbiguousOutcome {
            continue;
        }
        let finish = Action::Finish { result: Some(result.clone()) };
        match act_in(tx, e.id, &finish, Some(why), "system", Utc::now()).await {
            Ok(_) => resolved.push(e.id),
            Err(ActionError::Store(s)) => return Err(s),
            // The job moved on meanwhile (an operator acted): nothing to settle.
            Err(other) => {
                tracing::info!(event = "relay.exception.settle_skipped", exception_id = %e.id, reason = %other)
            }
        }
    }
    Ok(resolved)
}

/// What a bulk action did.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct BulkReport {
    /// Open exceptions the filter matched (at most 1000 per call).
    pub matched: usize,
    /// Actions applied.
    pub count: usize,
    /// Those refused, each with its exception id and the error code.
    pub refused: Vec<BulkRefusal>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BulkRefusal {
    pub exception_id: Uuid,
    pub code: String,
    pub message: String,
}

/// Apply one action to every open exception the filter matches, each in its own transaction.
pub async fn bulk(
    pool: &Pool,
    transport: &Arc<dyn Transport>,
    filter: &ExceptionFilter,
    action: &Action,
    reason: Option<&str>,
    actor: &str,
    now: DateTime<Utc>,
) -> Result<BulkReport, ActionError> {
    if action.needs_reason() && reason.is_none_or(|r| r.trim().is_empty()) {
        return Err(ActionError::ReasonRequired);
    }
    let filter =
        ExceptionFilter { status: Some(ExceptionStatus::Open), limit: MAX_BULK, before: None, ..filter.clone() };
    let matched = exceptions::list(&pool.get().await.map_err(StoreError::from)?, &filter).await?;
    let mut report = BulkReport { matched: matched.len(), ..BulkReport::default() };
    for e in matched {
        match act(pool, transport, e.id, action, reason, actor, now).await {
            Ok(_) => report.count += 1,
            Err(ActionError::Store(s)) => return Err(ActionError::Store(s)),
            Err(err) => report.refused.push(BulkRefusal {
                exception_id: e.id,
                code: err.code().into(),
                message: err.to_string(),
            }),
        }
    }
    Ok(report)
}

/// The immediate alert of a new exception: a log line with a stable event name. The alert
/// email follows from the sweep (`crate::alerts`).
pub fn alert_opened(exception_id: Uuid, job_id: JobId, kind: ExceptionKind, cause: &str) {
    tracing::error!(event = "relay.exception.opened", exception_id = %exception_id, job_id = %job_id,
        kind = kind.as_str(), cause, "exception opened: a job failed for good and needs an operator");
}

/// Alert on the exceptions finished parents opened (one per parent whose children failed).
pub fn alert_parents(finished: &crate::store::jobs::Finished) {
    for (exception_id, job_id, cause) in &finished.opened {
        alert_opened(*exception_id, *job_id, ExceptionKind::ChildrenFailed, cause);
    }
}
