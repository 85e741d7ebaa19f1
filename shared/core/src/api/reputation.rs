//! Tenants' sending reputation (`email::reputation`): a tenant reads its own
//! (`GET /v1/reputation`); an operator reads any tenant's, sets its guard's thresholds and
//! exemptions (`PUT /v1/admin/tenants/{tenant_id}/reputation`) and resumes a paused tenant
//! (`POST .../reputation/resume`), each change audited in `admin_actions`.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody, Operator};
use super::limits::tenant_of;
use crate::email::reputation as guard;
use crate::job::TenantId;
use crate::store::{StoreError, admin_actions, reputation as store};

/// The longest reason kept.
const MAX_REASON: usize = 1000;

async fn view(state: &AppState, tenant: TenantId) -> Result<Value, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let g = store::get(&db, tenant).await?.unwrap_or_else(guard::defaults);
    let c = store::counts(&db, tenant, g.window_hours).await?;
    let mut v = guard::view(&g, &c);
    v["tenant_id"] = json!(tenant.to_string());
    Ok(v)
}

/// `GET /v1/reputation`: the caller's own rolling bounce and complaint rates, its guard's
/// thresholds and state (`ok`, `warning`, `paused`).
#[utoipa::path(get, path = "/v1/reputation", tag = "email", security(("tenant_key" = [])),
    responses((status = 200, body = Object), (status = 401, body = ErrorBody)))]
pub async fn own(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<Value>, ApiError> {
    Ok(Json(view(&state, tenant.id).await?))
}

/// `GET /v1/admin/tenants/{tenant_id}/reputation`
#[utoipa::path(get, path = "/v1/admin/tenants/{tenant_id}/reputation", tag = "operations",
    params(("tenant_id" = String, Path)), security(("operator_key" = [])),
    responses((status = 200, body = Object), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = tenant_of(&state, &raw).await?;
    Ok(Json(view(&state, tenant).await?))
}

/// Body of `PUT /v1/admin/tenants/{tenant_id}/reputation`: the whole guard; a field left out
/// takes the default. Rates are fractions (0.02 is 2 %), above 0 and at most 1. A pause level
/// below its warning level pauses without a warning first.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardChange {
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub warn_bounce: Option<f64>,
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub warn_complaint: Option<f64>,
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub pause_bounce: Option<f64>,
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub pause_complaint: Option<f64>,
    /// 1 to 720.
    #[schema(minimum = 1, maximum = 720)]
    pub window_hours: Option<i32>,
    /// 1 to 1,000,000.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub min_sends: Option<i64>,
    /// `name=value` message tags whose sends a pause does not hold (transactional mail): at
    /// most 50, each at most 300 bytes.
    #[serde(default)]
    #[schema(max_items = 50)]
    pub exempt_tags: Vec<String>,
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

fn invalid(field: &str, why: &str) -> ApiError {
    ApiError::unprocessable("invalid_field", format!("{field}: {why}")).with("field", field)
}

impl GuardChange {
    fn guard(&self) -> Result<store::Guard, ApiError> {
        let d = guard::defaults();
        let g = store::Guard {
            warn_bounce: self.warn_bounce.unwrap_or(d.warn_bounce),
            warn_complaint: self.warn_complaint.unwrap_or(d.warn_complaint),
            pause_bounce: self.pause_bounce.unwrap_or(d.pause_bounce),
            pause_complaint: self.pause_complaint.unwrap_or(d.pause_complaint),
            window_hours: self.window_hours.unwrap_or(d.window_hours),
            min_sends: self.min_sends.unwrap_or(d.min_sends),
            exempt_tags: self.exempt_tags.clone(),
            configured: true,
            ..d
        };
        for (field, v) in [
            ("warn_bounce", g.warn_bounce),
            ("warn_complaint", g.warn_complaint),
            ("pause_bounce", g.pause_bounce),
            ("pause_complaint", g.pause_complaint),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(invalid(field, "a fraction above 0 and at most 1 (0.02 is 2 %)"));
            }
        }
        if !(1..=720).contains(&g.window_hours) {
            return Err(invalid("window_hours", "a whole number 1 to 720"));
        }
        if !(1..=1_000_000).contains(&g.min_sends) {
            return Err(invalid("min_sends", "a whole number 1 to 1000000"));
        }
        if g.exempt_tags.len() > 50 || g.exempt_tags.iter().any(|t| t.len() > 300 || !t.contains('=')) {
            return Err(invalid("exempt_tags", "at most 50 tags, each `name=value`"));
        }
        if self.reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON) {
            return Err(invalid("reason", "at most 1000 characters"));
        }
        Ok(g)
    }
}

/// `PUT /v1/admin/tenants/{tenant_id}/reputation`: set a tenant's thresholds, window and
/// exemptions; audited. Its state stays (a resume is its own action).
#[utoipa::path(put, path = "/v1/admin/tenants/{tenant_id}/reputation", tag = "operations",
    params(("tenant_id" = String, Path)), request_body = GuardChange, security(("operator_key" = [])),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(raw): Path<String>,
    JsonBody(b): JsonBody<GuardChange>,
) -> Result<Json<Value>, ApiError> {
    let g = b.guard()?;
    let tenant = tenant_of(&state, &raw).await?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let old = store::get(&tx, tenant).await?;
    store::set(&tx, tenant, &g, &op.name).await?;
    let detail = json!({"tenant_id": tenant.to_string(), "old": old, "new": g, "reason": b.reason});
    admin_actions::record(&tx, "reputation.set", &op.name, None, true, &detail).await?;
    tx.commit().await.map_err(StoreError::from)?;
    drop(db);
    Ok(Json(view(&state, tenant).await?))
}

/// Body of `POST /v1/admin/tenants/{tenant_id}/reputation/resume`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// Why (kept in the audit and as the state's reason): 1 to 1,000 characters, not blank.
    #[schema(min_length = 1, max_length = 1000)]
    pub reason: String,
}

/// `POST /v1/admin/tenants/{tenant_id}/reputation/resume`: the tenant's guard back to `ok` and
/// every send its pause held due now; audited. `released` counts the sends made due.
#[utoipa::path(post, path = "/v1/admin/tenants/{tenant_id}/reputation/resume", tag = "operations",
    params(("tenant_id" = String, Path)), request_body = Resume, security(("operator_key" = [])),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn resume(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(raw): Path<String>,
    JsonBody(b): JsonBody<Resume>,
) -> Result<Json<Value>, ApiError> {
    if b.reason.trim().is_empty() || b.reason.chars().count() > MAX_REASON {
        return Err(invalid("reason", "1 to 1000 characters"));
    }
    let tenant = tenant_of(&state, &raw).await?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let why = format!("resumed by {}: {}", op.name, b.reason);
    let (before, released) = store::resume(&tx, tenant, &guard::hold_rate(tenant), &why).await?;
    let detail = json!({"tenant_id": tenant.to_string(), "state_before": before, "released": released,
        "reason": b.reason});
    admin_actions::record(&tx, "reputation.resume", &op.name, None, true, &detail).await?;
    tx.commit().await.map_err(StoreError::from)?;
    drop(db);
    tracing::info!(event = "relay.email.reputation_resumed", tenant_id = %tenant, operator = %op.name, released,
        "a tenant's sends resumed");
    let mut v = view(&state, tenant).await?;
    v["released"] = json!(released);
    Ok(Json(v))
}
