//! Operator routes under `/v1/admin` (operator key only): exceptions — list, show, act on one
//! or in bulk — tenants' own failures counted per cause, and the operating modes. Every action writes an audit row naming the operator.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::cursor;
use super::error::{ApiError, ErrorBody, page_limit};
use super::extract::{JsonBody, Operator};
use crate::exceptions::{self as actions, Action, ActionError, ActionOutcome, BulkReport};
use crate::job::TenantId;
use crate::store::StoreError;
pub use crate::store::exceptions::ExceptionStatus;
use crate::store::exceptions::{self, Exception, ExceptionAction, ExceptionFilter};
use crate::store::jobs::{JobEvent, operator};
use crate::store::tenant_faults::{self, TenantFault};
use crate::store::{modes, tenants};
use crate::view::JobView;

impl From<ActionError> for ApiError {
    fn from(e: ActionError) -> Self {
        let code = e.code();
        match e {
            ActionError::Store(s) => ApiError::from(s),
            ActionError::NotFound => ApiError::not_found(),
            ActionError::ReasonRequired => {
                ApiError::unprocessable(code, "this action needs a reason").with("field", "reason")
            }
            other => ApiError::new(StatusCode::CONFLICT, code, other.to_string()),
        }
    }
}

/// Query of `GET /v1/admin/exceptions`; all optional.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExceptionQuery {
    /// open, resolved or ignored.
    #[param(value_type = Option<ExceptionStatus>)]
    pub status: Option<String>,
    /// e.g. attempts_exhausted, fatal_error, ambiguous_outcome.
    pub kind: Option<String>,
    pub task_type: Option<String>,
    /// A tenant's name or id.
    pub tenant: Option<String>,
    /// A substring of the cause, case-insensitive.
    pub cause: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^A[A-Za-z0-9_-]{31}$")]
    pub cursor: Option<String>,
}

/// Filters shared by the list and bulk actions (a bulk action takes only open exceptions).
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterBody {
    pub kind: Option<String>,
    pub task_type: Option<String>,
    /// A tenant's name or id.
    pub tenant: Option<String>,
    /// A substring of the cause, case-insensitive.
    pub cause: Option<String>,
}

async fn tenant_id(db: &impl crate::store::GenericClient, t: Option<&str>) -> Result<Option<TenantId>, ApiError> {
    let Some(t) = t else { return Ok(None) };
    if let Ok(id) = t.parse() {
        return Ok(Some(id));
    }
    match tenants::by_name(db, t).await? {
        Some(found) => Ok(Some(found.id)),
        None => Err(ApiError::new(StatusCode::NOT_FOUND, "unknown_tenant", format!("no tenant named {t:?}"))
            .with("field", "tenant")),
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExceptionList {
    pub exceptions: Vec<Exception>,
    /// Pass back as `cursor` for the next (older) page; null on the last page.
    pub next_cursor: Option<String>,
}

/// List exceptions, newest first.
#[utoipa::path(get, path = "/v1/admin/exceptions", tag = "operations", params(ExceptionQuery),
    security(("operator_key" = [])),
    responses((status = 200, body = ExceptionList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "no tenant of that name (`unknown_tenant`)", body = ErrorBody)))]
pub async fn list_exceptions(
    State(state): State<AppState>,
    Operator(_): Operator,
    query: Result<Query<ExceptionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ExceptionList>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(ExceptionStatus::parse(s).ok_or_else(|| {
            let names: Vec<&str> = ExceptionStatus::ALL.into_iter().map(ExceptionStatus::as_str).collect();
            ApiError::invalid_query("status", format!("status must be one of {}", names.join(", ")))
        })?),
    };
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let before = match q.cursor.as_deref() {
        None => None,
        Some(c) => Some(
            cursor::decode(c).ok_or_else(|| ApiError::invalid_query("cursor", "cursor is not one this API issued"))?,
        ),
    };
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let filter = ExceptionFilter {
        status,
        kind: q.kind,
        task_type: q.task_type,
        tenant_id: tenant_id(&db, q.tenant.as_deref()).await?,
        cause: q.cause,
        before,
        limit,
    };
    let page = exceptions::list(&db, &filter).await?;
    let next_cursor =
        (page.len() as i64 == limit).then(|| page.last().map(|e| cursor::encode(e.opened_at, e.id))).flatten();
    Ok(Json(ExceptionList { exceptions: page, next_cursor }))
}

/// Query of `GET /v1/admin/tenant-faults`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantFaultQuery {
    /// A tenant's name or id.
    pub tenant: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantFaultList {
    pub tenant_faults: Vec<TenantFault>,
}

/// Tenants' own failures (a callback URL refused or never answering), one row per tenant,
/// task type and kind, most recent first. They open no exception; this is where they show.
#[utoipa::path(get, path = "/v1/admin/tenant-faults", tag = "operations", params(TenantFaultQuery),
    security(("operator_key" = [])),
    responses((status = 200, body = TenantFaultList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "no tenant of that name (`unknown_tenant`)", body = ErrorBody)))]
pub async fn list_tenant_faults(
    State(state): State<AppState>,
    Operator(_): Operator,
    query: Result<Query<TenantFaultQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TenantFaultList>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let tenant = tenant_id(&db, q.tenant.as_deref()).await?;
    Ok(Json(TenantFaultList { tenant_faults: tenant_faults::list(&db, tenant, limit).await? }))
}

/// One exception with its job, the job's history and the audit of actions taken.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExceptionDetail {
    pub exception: Exception,
    /// Null when retention has deleted the job.
    pub job: Option<JobView>,
    pub events: Vec<JobEvent>,
    pub actions: Vec<ExceptionAction>,
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| ApiError::not_found())
}

/// Show one exception.
#[utoipa::path(get, path = "/v1/admin/exceptions/{id}", tag = "operations", params(("id" = String, Path)),
    security(("operator_key" = [])),
    responses((status = 200, body = ExceptionDetail), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn show_exception(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(id): Path<String>,
) -> Result<Json<ExceptionDetail>, ApiError> {
    let id = parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let exception = exceptions::get(&db, id).await?.ok_or_else(ApiError::not_found)?;
    Ok(Json(ExceptionDetail {
        job: operator::get_any(&db, exception.job_id).await?.map(JobView::bare),
        events: operator::events_any(&db, exception.job_id).await?,
        actions: exceptions::actions(&db, id).await?,
        exception,
    }))
}

/// Body of `retry`: when (absent: now; a past time means now) and why.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    pub run_at: Option<DateTime<Utc>>,
    pub reason: Option<String>,
}

/// Body of `cancel`: why (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    pub reason: Option<String>,
}

/// Body of `ignore`: why (required: not blank).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IgnoreBody {
    #[schema(
        pattern = "^[^\\x00]*[^\\x00\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x00]*$"
    )]
    pub reason: String,
}

/// Body of `finish`: why (required: not blank) and a result to record beside it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishBody {
    #[schema(
        pattern = "^[^\\x00]*[^\\x00\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x00]*$"
    )]
    pub reason: String,
    pub result: Option<Value>,
}

async fn act(
    state: &AppState,
    op: &str,
    id: &str,
    action: Action,
    reason: Option<String>,
) -> Result<Json<ActionOutcome>, ApiError> {
    let id = parse_id(id)?;
    Ok(Json(actions::act(&state.pool, &state.transport, id, &action, reason.as_deref(), op, Utc::now()).await?))
}

/// Retry the failed job now or at a time; the exception resolves when the job succeeds.
#[utoipa::path(post, path = "/v1/admin/exceptions/{id}/retry", tag = "operations", params(("id" = String, Path)),
    request_body = RetryBody, security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = ActionOutcome), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn retry(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RetryBody>,
) -> Result<Json<ActionOutcome>, ApiError> {
    act(&state, &op.name, &id, Action::Retry { at: b.run_at }, b.reason).await
}

/// Cancel the job, its pending or waiting children and its schedule's future runs.
#[utoipa::path(post, path = "/v1/admin/exceptions/{id}/cancel", tag = "operations", params(("id" = String, Path)),
    request_body = CancelBody, security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = ActionOutcome), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn cancel(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<CancelBody>,
) -> Result<Json<ActionOutcome>, ApiError> {
    act(&state, &op.name, &id, Action::Cancel, b.reason).await
}

/// Mark the failed job succeeded; the result records who and why. A reason is required.
#[utoipa::path(post, path = "/v1/admin/exceptions/{id}/finish", tag = "operations", params(("id" = String, Path)),
    request_body = FinishBody, security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = ActionOutcome), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn finish(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<FinishBody>,
) -> Result<Json<ActionOutcome>, ApiError> {
    act(&state, &op.name, &id, Action::Finish { result: b.result }, Some(b.reason)).await
}

/// Close the exception as ignored; the job stays as it is. A reason is required.
#[utoipa::path(post, path = "/v1/admin/exceptions/{id}/ignore", tag = "operations", params(("id" = String, Path)),
    request_body = IgnoreBody, security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = ActionOutcome), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn ignore(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<IgnoreBody>,
) -> Result<Json<ActionOutcome>, ApiError> {
    act(&state, &op.name, &id, Action::Ignore, Some(b.reason)).await
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    Retry,
    Cancel,
    Finish,
    Ignore,
}

/// Body of a bulk action: every open exception the filter matches (at most 1000 a call).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkBody {
    pub action: BulkAction,
    #[serde(default)]
    pub filter: FilterBody,
    pub reason: Option<String>,
    /// `retry` only.
    pub run_at: Option<DateTime<Utc>>,
}

/// Apply one action to every open exception matching a filter; answers with a count.
#[utoipa::path(post, path = "/v1/admin/exceptions:bulk", tag = "operations", request_body = BulkBody,
    security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = BulkReport),
        (status = 404, description = "no tenant of that name (`unknown_tenant`)", body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn bulk(
    State(state): State<AppState>,
    Operator(op): Operator,
    JsonBody(b): JsonBody<BulkBody>,
) -> Result<Json<BulkReport>, ApiError> {
    let f = b.filter;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let filter = ExceptionFilter {
        tenant_id: tenant_id(&db, f.tenant.as_deref()).await?,
        kind: f.kind,
        task_type: f.task_type,
        cause: f.cause,
        ..ExceptionFilter::default()
    };
    drop(db);
    let action = match b.action {
        BulkAction::Retry => Action::Retry { at: b.run_at },
        BulkAction::Cancel => Action::Cancel,
        BulkAction::Finish => Action::Finish { result: None },
        BulkAction::Ignore => Action::Ignore,
    };
    let report =
        actions::bulk(&state.pool, &state.transport, &filter, &action, b.reason.as_deref(), &op.name, Utc::now())
            .await?;
    Ok(Json(report))
}

/// The operating modes: every switch with a row, and the effective shadow mode.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModesView {
    /// Switches set in the table; a missing one takes its default (shadow on, writes off,
    /// nothing paused).
    pub switches: BTreeMap<String, bool>,
    /// Whether outbound effects are recorded instead of sent.
    pub shadow: bool,
}

/// Read the operating modes.
#[utoipa::path(get, path = "/v1/admin/modes", tag = "operations", security(("operator_key" = [])),
    responses((status = 200, body = ModesView), (status = 401, body = ErrorBody)))]
pub async fn get_modes(State(state): State<AppState>, Operator(_): Operator) -> Result<Json<ModesView>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let m = modes::load(&db).await?;
    Ok(Json(ModesView { shadow: m.shadow(), switches: m.switches }))
}

/// Body of `PUT /v1/admin/modes`: one switch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModeChange {
    /// `shadow`, `write:<integration>`, `write:http:<tenant id>:<destination>` or `pause:<task type>`.
    pub name: String,
    pub enabled: bool,
    pub reason: Option<String>,
}

/// Whether a switch name is one the modes table holds, and for a pause, a known task type.
pub fn check_mode_name(name: &str, catalogue: &crate::catalogue::Catalogue) -> Result<(), ApiError> {
    let invalid = || {
        ApiError::unprocessable("invalid_mode", "name must be `shadow`, `write:<integration>` or `pause:<task type>`")
            .with("field", "name")
    };
    if name == "shadow" {
        return Ok(());
    }
    if let Some(rest) = name.strip_prefix("write:http:") {
        // One tenant's destination: `write:http:<tenant id>:<destination>`.
        let ok = rest.split_once(':').is_some_and(|(t, d)| {
            t.parse::<crate::job::TenantId>().is_ok_and(|id| id.to_string() == t)
                && crate::destinations::check_name(d).is_ok()
        });
        if !ok {
            return Err(ApiError::unprocessable(
                "invalid_mode",
                "a destination's switch is `write:http:<tenant id>:<destination name>`",
            )
            .with("field", "name"));
        }
        return Ok(());
    }
    if let Some(i) = name.strip_prefix("write:") {
        if !modes::INTEGRATIONS.contains(&i) {
            let known = modes::INTEGRATIONS.iter().map(|i| format!("write:{i}")).collect::<Vec<_>>().join(", ");
            return Err(ApiError::unprocessable(
                "invalid_mode",
                format!("unknown integration {i:?}: the write switches are {known}"),
            )
            .with("field", "name"));
        }
        return Ok(());
    }
    if let Some(t) = name.strip_prefix("pause:") {
        if !catalogue.contains(t) {
            return Err(ApiError::unprocessable(
                "unknown_task_type",
                format!("task type {t:?} is not in the catalogue"),
            )
            .with("field", "name")
            .with("available", catalogue.names()));
        }
        return Ok(());
    }
    Err(invalid())
}

/// Set one switch; an audit row names the operator. Takes effect on the next claim.
#[utoipa::path(put, path = "/v1/admin/modes", tag = "operations", request_body = ModeChange,
    security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = ModesView), (status = 422, body = ErrorBody)))]
pub async fn set_mode(
    State(state): State<AppState>,
    Operator(op): Operator,
    JsonBody(b): JsonBody<ModeChange>,
) -> Result<Json<ModesView>, ApiError> {
    check_mode_name(&b.name, &state.catalogue)?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    modes::set(&mut db, &b.name, b.enabled, &op.name, b.reason.as_deref()).await?;
    let m = modes::load(&db).await?;
    Ok(Json(ModesView { shadow: m.shadow(), switches: m.switches }))
}
