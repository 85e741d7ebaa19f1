//! The job resource, as the API answers and callbacks send it (`data`): the stored row
//! (tenant and request hash left out) with its waiting reason and progress, decided in
//! `crate::progress` from what the store counts.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::email::task::SendCampaign;
use crate::job::{Fault, JobId, JobStatus};
use crate::progress::{self, Progress, WaitingReason};
use crate::store::completions::open_deadlines;
use crate::store::jobs::Job;
use crate::store::progress::{baselines, child_counts, running_per_key};
use crate::store::{GenericClient, StoreError, dependencies, modes, send_rates};
use crate::task::Task;

/// The job resource. Its schema keeps the name and description it was published with.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = Job, description = "A job as stored. Serialises as the API's job resource (tenant and request hash omitted).")]
pub struct JobView {
    #[schema(value_type = uuid::Uuid)]
    pub id: JobId,
    pub task_type: String,
    pub status: JobStatus,
    pub params: Value,
    pub correlation_id: String,
    pub idempotency_key: String,
    #[schema(value_type = Option<uuid::Uuid>)]
    pub parent_id: Option<JobId>,
    pub run_at: DateTime<Utc>,
    pub attempt: i32,
    pub max_attempts: i32,
    pub timeout_seconds: i32,
    pub lease_until: Option<DateTime<Utc>>,
    /// When the current (or last) attempt was claimed.
    pub started_at: Option<DateTime<Utc>>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// No more than `concurrency_limit` jobs with this key run at once.
    pub concurrency_key: Option<String>,
    pub concurrency_limit: Option<i32>,
    /// A fan-out parent's declared number of children.
    pub children_total: Option<i32>,
    /// Where this job's callbacks go, instead of the tenant's callback URL.
    pub callback_url: Option<String>,
    /// Whose failure a failed job is (null otherwise): `tenant` (its own endpoint, input,
    /// sender, template data or completion: counted per tenant, no operator exception; an
    /// ambiguous call to its own destination is its to decide) or `platform` (operators act).
    #[schema(value_type = Option<String>, pattern = "^(tenant|platform)$")]
    pub fault: Option<Fault>,
    /// Why a pending or waiting job is not running (null when running or finished): `not_due`,
    /// `paused`, `concurrency_key_busy`, `waiting_for_dependency` (a job it runs after has not
    /// succeeded yet), `ordered_behind` (the job ahead on its ordering key, `ordered_behind`,
    /// has not succeeded yet), `waiting_for_children`, `waiting_for_completion` (an
    /// outside party's, until `waiting_until`) or `not_claimed` (due, but no worker has taken
    /// it yet), or `rate_limited` (which rate: `waiting_rate`). Filled on reads (`annotate`),
    /// not in a submit's answer.
    pub waiting_reason: Option<WaitingReason>,
    /// The rate that holds a `rate_limited` job: `account:<account>`, `account_quota:<account>`,
    /// `tenant:<tenant id>`, `configuration_set:<name>` or `destination:<name>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_rate: Option<String>,
    /// What will hold this job back: for a campaign, when Relay's SES account's 24-hour quota
    /// will not cover the recipients it has still to send. Filled on reads.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Until when it waits: the deadline of its wait for a completion (after which the sweep
    /// applies the task's overdue policy); null otherwise. Filled on reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_until: Option<DateTime<Utc>>,
    /// The job ahead of this one on its ordering key, while this one waits for it (a failed
    /// job ahead that holds its key included). Filled on reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<uuid::Uuid>)]
    pub ordered_behind: Option<JobId>,
    /// How far it has got (see `progress`): counted children for a fan-out, elapsed time
    /// against a baseline for a single unit. Filled on reads, not in a submit's answer.
    pub progress: Option<Progress>,
}

impl JobView {
    /// The row with its waiting reason and progress.
    pub fn new(job: Job, waiting_reason: Option<WaitingReason>, progress: Option<Progress>) -> JobView {
        JobView {
            id: job.id,
            task_type: job.task_type,
            status: job.status,
            params: job.params,
            correlation_id: job.correlation_id,
            idempotency_key: job.idempotency_key,
            parent_id: job.parent_id,
            run_at: job.run_at,
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            timeout_seconds: job.timeout_seconds,
            lease_until: job.lease_until,
            started_at: job.started_at,
            result: job.result,
            last_error: job.last_error,
            created_at: job.created_at,
            updated_at: job.updated_at,
            finished_at: job.finished_at,
            concurrency_key: job.concurrency_key,
            concurrency_limit: job.concurrency_limit,
            children_total: job.children_total,
            callback_url: job.callback_url,
            fault: job.fault,
            waiting_reason,
            waiting_rate: None,
            warnings: Vec::new(),
            waiting_until: None,
            ordered_behind: None,
            progress,
        }
    }

    /// The row alone, without waiting reason or progress (a submit's answer, an operator's
    /// action).
    pub fn bare(job: Job) -> JobView {
        JobView::new(job, None, None)
    }
}

/// Jobs read for a client, with their waiting reasons and progress as of `now`. Each input is
/// read only when some job needs it, so a page of finished single jobs costs one query
/// (children).
pub async fn annotate(db: &impl GenericClient, jobs: Vec<Job>, now: DateTime<Utc>) -> Result<Vec<JobView>, StoreError> {
    if jobs.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    let children = child_counts(db, &ids).await?;
    let running_types: Vec<&str> = jobs
        .iter()
        .filter(|j| j.status == JobStatus::Running && !children.contains_key(&j.id) && j.children_total.is_none())
        .map(|j| j.task_type.as_str())
        .collect();
    let baselines = if running_types.is_empty() { HashMap::new() } else { baselines(db, &running_types).await? };
    let due_now = |j: &Job| j.status == JobStatus::Pending && j.run_at <= now;
    let modes = if jobs.iter().any(due_now) { modes::load_global(db).await? } else { modes::Modes::default() };
    let keys: Vec<&str> = jobs.iter().filter(|j| due_now(j)).filter_map(|j| j.concurrency_key.as_deref()).collect();
    let running = if keys.is_empty() { HashMap::new() } else { running_per_key(db, &keys).await? };
    let waiting: Vec<JobId> = jobs.iter().filter(|j| j.status == JobStatus::Waiting).map(|j| j.id).collect();
    let deadlines = if waiting.is_empty() { HashMap::new() } else { open_deadlines(db, &waiting).await? };
    let not_due: Vec<JobId> =
        jobs.iter().filter(|j| j.status == JobStatus::Pending && j.run_at > now).map(|j| j.id).collect();
    let held = if not_due.is_empty() { HashMap::new() } else { send_rates::rate_waits(db, &not_due).await? };
    let after: HashMap<JobId, dependencies::Hold> =
        if not_due.is_empty() { HashMap::new() } else { dependencies::held(db, &not_due).await?.into_iter().collect() };
    let campaigning = jobs.iter().any(|j| j.task_type == SendCampaign::NAME && !j.status.is_terminal());
    let account = if campaigning { send_rates::get(db, send_rates::Scope::Account, "default").await? } else { None };
    Ok(jobs
        .into_iter()
        .map(|j| {
            let busy = j.concurrency_key.as_ref().and_then(|k| running.get(k)).copied().unwrap_or(0);
            let until = deadlines.get(&j.id).copied().filter(|_| j.status == JobStatus::Waiting);
            let (rate, rate_until) = held.get(&j.id).cloned().unzip();
            let dependent = after.get(&j.id).copied();
            let paused = modes.paused(&j.task_type);
            let ordered_behind = dependent.and_then(|h| h.behind);
            let waiting =
                progress::waiting_reason(&j, now, paused, busy, until, rate_until, dependent.is_some()).map(|w| {
                    match &rate {
                        Some(r) if w == WaitingReason::RateLimited && r.starts_with("reputation:") => {
                            WaitingReason::ReputationPaused
                        }
                        Some(r) if w == WaitingReason::RateLimited && r.starts_with("ses_tenant:") => {
                            WaitingReason::SesTenantPending
                        }
                        _ if w == WaitingReason::WaitingForDependency && ordered_behind.is_some() => {
                            WaitingReason::OrderedBehind
                        }
                        _ => w,
                    }
                });
            let progress = progress::of(&j, children.get(&j.id).copied(), baselines.get(&j.task_type).copied(), now);
            let waiting_rate = rate.filter(|_| {
                matches!(
                    waiting,
                    Some(
                        WaitingReason::RateLimited | WaitingReason::ReputationPaused | WaitingReason::SesTenantPending
                    )
                )
            });
            let warnings = match (&account, &progress) {
                (Some(a), _) if j.task_type == SendCampaign::NAME && !j.status.is_terminal() => {
                    let to_send = match &progress {
                        Some(Progress::Count { pending, .. }) => *pending,
                        _ => j.params["recipients"].as_array().map_or(0, |r| r.len() as i64),
                    };
                    crate::email::pace::quota_warning(to_send, a).into_iter().collect()
                }
                _ => Vec::new(),
            };
            // A job held for its dependencies shows the time it asked for, not its hold's.
            let run_at = dependent.map_or(j.run_at, |h| h.run_at);
            JobView {
                waiting_until: until,
                waiting_rate,
                warnings,
                run_at,
                ordered_behind,
                ..JobView::new(j, waiting, progress)
            }
        })
        .collect())
}

/// One job read for a client (see `annotate`).
pub async fn annotate_one(db: &impl GenericClient, job: Job, now: DateTime<Utc>) -> Result<JobView, StoreError> {
    let mut one = annotate(db, vec![job], now).await?;
    Ok(one.remove(0))
}
