//! Email cut-over stages (`email::cutover`): an operator reads a tenant's stages
//! (`GET /v1/admin/tenants/{tenant_id}/cutover`) and sets one per task type
//! (`PUT .../cutover/{task_type}`), each change audited in `admin_actions`; a tenant reads its
//! own (`GET /v1/cutover`).

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody, Operator};
use super::limits::tenant_of;
use crate::email::cutover as rules;
use crate::email::task::{SendCampaign, SendEmail};
use crate::store::cutover::{self as store, Stage};
use crate::store::{StoreError, admin_actions};
use crate::task::Task;

/// Most stages listed (two task types per tenant).
const MAX_STAGES: i64 = 100;

/// A tenant's stages.
#[derive(Debug, Serialize, ToSchema)]
pub struct StageList {
    pub stages: Vec<Stage>,
}

/// `GET /v1/cutover`: the caller's own cut-over stages (none: the global modes decide).
#[utoipa::path(get, path = "/v1/cutover", tag = "email", security(("tenant_key" = [])),
    responses((status = 200, body = StageList), (status = 401, body = ErrorBody)))]
pub async fn own(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<StageList>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    Ok(Json(StageList { stages: store::list(&db, Some(tenant.id), MAX_STAGES).await? }))
}

/// `GET /v1/admin/tenants/{tenant_id}/cutover`
#[utoipa::path(get, path = "/v1/admin/tenants/{tenant_id}/cutover", tag = "operations",
    params(("tenant_id" = String, Path)), security(("operator_key" = [])),
    responses((status = 200, body = StageList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(raw): Path<String>,
) -> Result<Json<StageList>, ApiError> {
    let tenant = tenant_of(&state, &raw).await?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    Ok(Json(StageList { stages: store::list(&db, Some(tenant), MAX_STAGES).await? }))
}

/// Body of `PUT /v1/admin/tenants/{tenant_id}/cutover/{task_type}`. A threshold left out takes
/// the default (bounces 2 %, complaints 0.05 %, refusals 5 %, judged from 20 sends).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageChange {
    /// `shadow`, `share` or `live`.
    pub stage: String,
    /// The fraction of recipients live in `share` (above 0, below 1; 0.1 is 10 %); only with `share`.
    pub share: Option<f64>,
    pub halt_bounce: Option<f64>,
    pub halt_complaint: Option<f64>,
    pub halt_failure: Option<f64>,
    /// 1 to 1,000,000.
    pub min_sends: Option<i64>,
    /// Why (kept in the audit), 1 to 1,000 characters.
    #[schema(max_length = 1000)]
    pub reason: String,
}

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::unprocessable("invalid_field", format!("{field}: {why}")).with("field", field)
}

/// The path of `PUT /v1/admin/tenants/{tenant_id}/cutover/{task_type}`: a tenant's name or id.
#[derive(Debug, Deserialize)]
pub struct TenantTask {
    pub tenant_id: String,
    pub task_type: String,
}

impl StageChange {
    fn stage(&self, tenant: crate::job::TenantId, task_type: &str) -> Result<Stage, ApiError> {
        if ![SendEmail::NAME, SendCampaign::NAME].contains(&task_type) {
            return Err(invalid("task_type", &format!("{} or {}", SendEmail::NAME, SendCampaign::NAME)));
        }
        let share = match (self.stage.as_str(), self.share) {
            ("share", Some(s)) if s > 0.0 && s < 1.0 => s,
            ("share", _) => return Err(invalid("share", "a fraction above 0 and below 1 (0.1 is 10 %)")),
            ("shadow" | "live", None) => 0.0,
            ("shadow" | "live", Some(_)) => return Err(invalid("share", "only with the share stage")),
            _ => return Err(invalid("stage", "shadow, share or live")),
        };
        let s = Stage {
            tenant_id: tenant,
            task_type: task_type.to_owned(),
            stage: self.stage.clone(),
            share,
            halt_bounce: self.halt_bounce.unwrap_or(rules::HALT_BOUNCE),
            halt_complaint: self.halt_complaint.unwrap_or(rules::HALT_COMPLAINT),
            halt_failure: self.halt_failure.unwrap_or(rules::HALT_FAILURE),
            min_sends: self.min_sends.unwrap_or(rules::MIN_SENDS),
            started_at: chrono::Utc::now(),
            halted_at: None,
            halted_reason: None,
            updated_by: String::new(),
        };
        for (field, v) in
            [("halt_bounce", s.halt_bounce), ("halt_complaint", s.halt_complaint), ("halt_failure", s.halt_failure)]
        {
            if !(v > 0.0 && v <= 1.0) {
                return Err(invalid(field, "a fraction above 0 and at most 1 (0.02 is 2 %)"));
            }
        }
        if !(1..=1_000_000).contains(&s.min_sends) {
            return Err(invalid("min_sends", "a whole number 1 to 1000000"));
        }
        if self.reason.trim().is_empty() || self.reason.chars().count() > 1000 {
            return Err(invalid("reason", "1 to 1000 characters"));
        }
        Ok(s)
    }
}

/// `PUT /v1/admin/tenants/{tenant_id}/cutover/{task_type}`: set a tenant's stage for
/// `email.send` or `email.campaign`; it starts now (an earlier halt is cleared); audited.
#[utoipa::path(put, path = "/v1/admin/tenants/{tenant_id}/cutover/{task_type}", tag = "operations",
    params(("tenant_id" = String, Path), ("task_type" = String, Path)), request_body = StageChange,
    security(("operator_key" = [])),
    responses((status = 200, body = Stage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(TenantTask { tenant_id: raw, task_type }): Path<TenantTask>,
    JsonBody(b): JsonBody<StageChange>,
) -> Result<Json<Stage>, ApiError> {
    let tenant = tenant_of(&state, &raw).await?;
    let wanted = b.stage(tenant, &task_type)?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let old = store::get(&tx, tenant, &task_type).await?;
    let new = store::set(&tx, tenant, &wanted, &op.name).await?;
    let detail = json!({"tenant_id": tenant.to_string(), "task_type": task_type, "old": old, "new": new,
        "reason": b.reason});
    admin_actions::record(&tx, "cutover.set", &op.name, None, true, &detail).await?;
    tx.commit().await.map_err(StoreError::from)?;
    tracing::info!(event = "relay.email.cutover_set", tenant_id = %tenant, task_type = %task_type,
        stage = %new.stage, share = new.share, operator = %op.name, "a cut-over stage was set");
    Ok(Json(new))
}
