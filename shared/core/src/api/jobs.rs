//! The job resource: read, list as a change feed, cancel, history; and the catalogue. Every
//! query is scoped to the caller's tenant. Submitting is `submit`'s.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::cursor;
use super::error::{ApiError, ErrorBody, page_limit};
use super::extract::Caller;
use crate::job::{JobId, JobStatus, TenantId};
use crate::store::jobs::{self, Job, JobFilter};
use crate::store::{StoreError, attempt_sessions, dependencies, sending_identities};
use crate::view::{self, JobView};

/// A job's history, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    pub events: Vec<jobs::JobEvent>,
}

/// The answer of `GET /v1/jobs/{id}/sessions`.
#[derive(Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<attempt_sessions::Session>,
}

/// One page of the change feed.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// Pass back as `cursor`; null on the last page.
    pub next_cursor: Option<String>,
    /// Pass back later as `updated_since` to get every job changed after this page (always
    /// present). It stays `SETTLE_SECONDS` behind the clock, so a change whose transaction
    /// began earlier but committed later is not skipped: some jobs come again (same
    /// `updated_at`), none is missed.
    pub resume_cursor: String,
}

/// How far the resume cursor stays behind the present (longer than any write transaction).
pub const SETTLE_SECONDS: i64 = 15;

/// The catalogue.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    pub tasks: Vec<crate::catalogue::TaskInfo>,
}

/// A job id from a path. Shared by every route under `/v1/jobs/{id}`.
pub(super) fn parse_id(id: &str) -> Result<JobId, ApiError> {
    // A malformed id names no job: the same answer as any other missing job.
    id.parse().map_err(|_| ApiError::not_found())
}

/// `GET /v1/jobs/{id}`
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = JobView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let id = parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let job = owned(&db, tenant.id, id).await?;
    Ok(Json(view::annotate_one(&db, job, Utc::now()).await?))
}

/// The caller's job, or 404: another tenant's job answers exactly like a missing one.
/// The caller's job, or 404: another tenant's answers exactly like a missing one. Shared by
/// every route under `/v1/jobs/{id}`.
pub(super) async fn owned(db: &deadpool_postgres::Client, tenant_id: TenantId, id: JobId) -> Result<Job, ApiError> {
    let job = jobs::get(db, tenant_id, id).await?.ok_or_else(ApiError::not_found)?;
    crate::telemetry::record_job(&job.correlation_id, job.id);
    Ok(job)
}

/// `GET /v1/jobs/{id}/events`
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = EventList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn events(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    owned(&db, tenant.id, id).await?;
    Ok(Json(json!({ "events": jobs::events(&db, tenant.id, id).await? })))
}

/// `GET /v1/jobs/{id}/sessions`: the AWS role sessions its attempts assumed (what it could
/// touch), oldest first.
#[utoipa::path(get, path = "/v1/jobs/{id}/sessions", tag = "jobs", params(("id" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = SessionList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn sessions(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    owned(&db, tenant.id, id).await?;
    Ok(Json(json!({ "sessions": attempt_sessions::for_job(&db, tenant.id, id).await? })))
}

/// Most jobs that run after a cancelled one (`after`) a cancel cancels with it, in its own
/// transaction; a longer chain's rest is cancelled by the sweep (`dependencies::heal`).
pub const CANCEL_BUDGET: usize = dependencies::RELEASE_BUDGET;

/// `POST /v1/jobs/{id}/cancel`'s answer: the job, and what the cancel did down its chain.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelView {
    #[serde(flatten)]
    pub job: JobView,
    /// Jobs that run after this one (`after`), or after its children, cancelled by this call
    /// down the chain (0 on a cancel of a job already cancelled).
    pub dependents_cancelled: u64,
    /// True when the chain is longer than one cancel takes on (10,000 jobs): this call
    /// cancelled `dependents_cancelled` of them and the sweep cancels the rest, up to 10,000
    /// a pass (each pass taking on what the last one cancelled at least 10 s after it).
    pub dependents_remaining: bool,
}

/// `POST /v1/jobs/{id}/cancel`: pending or waiting jobs (and their pending children), and the
/// jobs that run after them down the chain, in one transaction: all of it or none.
#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = CancelView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn cancel(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<CancelView>, ApiError> {
    let id = parse_id(&id)?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let cancelled = jobs::cancel(&tx, tenant.id, id, CANCEL_BUDGET).await?;
    tx.commit().await.map_err(StoreError::from)?;
    let job = view::annotate_one(&db, owned(&db, tenant.id, id).await?, Utc::now()).await?;
    if !cancelled.job && job.status != JobStatus::Cancelled {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_cancellable",
            format!("the job is {}; only pending or waiting jobs can be cancelled", job.status.as_str()),
        )
        .with("status", job.status.as_str()));
    }
    if cancelled.dependents_left {
        tracing::info!(event = "relay.jobs.cancel_continues", job_id = %id, cancelled = cancelled.dependents,
            "a cancel's chain is longer than one cancel takes on; the sweep cancels the rest");
    }
    Ok(Json(CancelView {
        job,
        dependents_cancelled: cancelled.dependents as u64,
        dependents_remaining: cancelled.dependents_left,
    }))
}

/// Query of `GET /v1/jobs`; all optional.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    #[param(value_type = Option<JobStatus>)]
    pub status: Option<String>,
    pub task_type: Option<String>,
    pub correlation_id: Option<String>,
    /// An RFC 3339 time, or a `resume_cursor`.
    pub updated_since: Option<String>,
    /// A `next_cursor`.
    #[param(pattern = "^A[A-Za-z0-9_-]{31}$")]
    pub cursor: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

/// `GET /v1/jobs`: the caller's jobs ordered by (updated_at, id): a change feed. Pass
/// `next_cursor` back as `cursor` for the next page; a job that changes again reappears later.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(ListQuery), security(("tenant_key" = [])),
    responses((status = 200, body = JobPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let bad = |field: &str, msg: String| ApiError::invalid_query(field, msg);
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(JobStatus::parse(s).ok_or_else(|| {
            bad("status", format!("status must be one of {}", JobStatus::ALL.map(JobStatus::as_str).join(", ")))
        })?),
    };
    // `updated_since`: an RFC 3339 time, or a cursor this API issued (`resume_cursor`).
    let (mut updated_since, mut since_cursor) = (None, None);
    if let Some(s) = q.updated_since.as_deref() {
        match DateTime::parse_from_rfc3339(s) {
            Ok(t) => updated_since = Some(t.with_timezone(&Utc)),
            Err(_) => {
                since_cursor = Some(job_cursor(s).ok_or_else(|| {
                    bad("updated_since", "updated_since must be an RFC 3339 time or a cursor this API issued".into())
                })?)
            }
        }
    }
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let after = match q.cursor.as_deref() {
        None => since_cursor,
        Some(c) => Some(job_cursor(c).ok_or_else(|| bad("cursor", "cursor is not one this API issued".into()))?),
    };
    if let Some(c) = &q.correlation_id {
        crate::telemetry::record_correlation(c);
    }
    let filter =
        JobFilter { status, task_type: q.task_type, correlation_id: q.correlation_id, updated_since, after, limit };
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let page = view::annotate(&db, jobs::list(&db, tenant.id, &filter).await?, Utc::now()).await?;
    let next_cursor = (page.len() as i64 == limit)
        .then(|| page.last().map(|j| cursor::encode(j.updated_at, j.id.as_uuid())))
        .flatten();
    let nil = JobId::from_uuid(Uuid::nil());
    let settled = (Utc::now() - chrono::Duration::seconds(SETTLE_SECONDS), nil);
    let reached = page.last().map(|j| (j.updated_at, j.id)).or(after).or(updated_since.map(|t| (t, nil)));
    let (at, id) = match reached {
        Some(r) if r < settled => r,
        _ => settled,
    };
    Ok(Json(json!({ "jobs": page, "next_cursor": next_cursor, "resume_cursor": cursor::encode(at, id.as_uuid()) })))
}

/// A change-feed position: a cursor's time and the job it names.
fn job_cursor(c: &str) -> Option<(DateTime<Utc>, JobId)> {
    cursor::decode(c).map(|(at, id)| (at, JobId::from_uuid(id)))
}

/// `GET /v1/tasks`: the catalogue, with each task's parameter schema: the rules its checks
/// apply at intake, and the caller's sending identities on an email's `from`.
#[utoipa::path(get, path = "/v1/tasks", tag = "jobs", security(("tenant_key" = [])),
    responses((status = 200, body = TaskList), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn tasks(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<Value>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let identities = sending_identities::list(&db, tenant.id).await?;
    let mut tasks = state.catalogue.describe();
    for t in &mut tasks {
        crate::email::rules::with_identities(t.name, &mut t.params_schema, &identities);
    }
    Ok(Json(json!({ "tasks": tasks })))
}
