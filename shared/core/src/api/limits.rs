//! Per-tenant limits (`crate::limits`): a tenant reads its own (`GET /v1/limits`); an operator
//! reads and overrides any tenant's (`GET`/`PUT /v1/admin/tenants/{tenant_id}/limits`, audited
//! in `admin_actions`). And the answer a create gets at its limit.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody, Operator};
use crate::job::TenantId;
use crate::limits::{Kind, LimitError, MAX_LIMIT, RETRY_AFTER_SECONDS};
use crate::store::{StoreError, admin_actions, limits as store, tenants};

/// The longest reason kept.
const MAX_REASON: usize = 1000;

/// At its limit a create answers 409 `limit_reached`, naming the kind and the limit (jobs: 429
/// with `Retry-After`, since unfinished jobs drain by themselves).
impl From<LimitError> for ApiError {
    fn from(e: LimitError) -> Self {
        let raise = "or ask the operator to raise it";
        match e {
            LimitError::Store(s) => ApiError::from(s),
            LimitError::Reached { kind: Kind::PendingJobs, limit } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "limit_reached",
                format!(
                    "this tenant has {limit} unfinished jobs, its limit: retry after {RETRY_AFTER_SECONDS} s as they \
                     finish, {raise}"
                ),
            )
            .with("kind", Kind::PendingJobs.as_str())
            .with("limit", limit)
            .with("retry_after_seconds", RETRY_AFTER_SECONDS),
            LimitError::Reached { kind, limit } => ApiError::new(
                StatusCode::CONFLICT,
                "limit_reached",
                format!("this tenant has {limit} {}, its limit: delete one, {raise}", kind.as_str()),
            )
            .with("kind", kind.as_str())
            .with("limit", limit),
            LimitError::TooMany { asked, limit } => ApiError::new(
                StatusCode::CONFLICT,
                "limit_reached",
                format!(
                    "{asked} jobs in one request, more than this tenant's limit of {limit} unfinished jobs: {raise}"
                ),
            )
            .with("kind", Kind::PendingJobs.as_str())
            .with("limit", limit),
        }
    }
}

/// One kind's limit for a tenant and what it uses.
#[derive(Debug, Serialize, ToSchema)]
pub struct LimitView {
    /// `destinations`, `templates`, `suppressions`, `topic_opt_outs` or `pending_jobs`.
    pub kind: &'static str,
    /// What holds: the override, else the deployment's default.
    pub limit: i64,
    pub default: i64,
    /// Set by an operator; null: the default holds.
    #[serde(rename = "override")]
    pub override_: Option<i64>,
    /// Rows of this kind now (unfinished jobs for `pending_jobs`), counted up to `limit` + 1.
    pub used: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantLimits {
    pub tenant_id: String,
    pub limits: Vec<LimitView>,
}

async fn view(state: &AppState, tenant: TenantId) -> Result<TenantLimits, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let overrides = store::overrides(&db, tenant).await?;
    let defaults = state.quotas.defaults();
    let mut limits = Vec::new();
    for kind in Kind::ALL {
        let override_ = overrides.iter().find(|o| o.0 == kind).map(|o| o.1);
        let limit = override_.unwrap_or(defaults.of(kind));
        let used = store::used(&db, tenant, kind, limit.saturating_add(1)).await?;
        limits.push(LimitView { kind: kind.as_str(), limit, default: defaults.of(kind), override_, used });
    }
    Ok(TenantLimits { tenant_id: tenant.to_string(), limits })
}

/// `GET /v1/limits`: the caller's own limits and what it uses.
#[utoipa::path(get, path = "/v1/limits", tag = "limits", security(("tenant_key" = [])),
    responses((status = 200, body = TenantLimits), (status = 401, body = ErrorBody)))]
pub async fn own(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<TenantLimits>, ApiError> {
    Ok(Json(view(&state, tenant.id).await?))
}

/// The tenant of an operator path, which must exist (404 otherwise).
pub(super) async fn tenant_of(state: &AppState, raw: &str) -> Result<TenantId, ApiError> {
    let tenant: TenantId = raw.parse().map_err(|_| ApiError::not_found())?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    tenants::by_id(&db, tenant).await?.ok_or_else(ApiError::not_found)?;
    Ok(tenant)
}

/// `GET /v1/admin/tenants/{tenant_id}/limits`
#[utoipa::path(get, path = "/v1/admin/tenants/{tenant_id}/limits", tag = "operations",
    params(("tenant_id" = String, Path)), security(("operator_key" = [])),
    responses((status = 200, body = TenantLimits), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(raw): Path<String>,
) -> Result<Json<TenantLimits>, ApiError> {
    let tenant = tenant_of(&state, &raw).await?;
    Ok(Json(view(&state, tenant).await?))
}

/// Body of `PUT /v1/admin/tenants/{tenant_id}/limits`: the kinds to change, each a whole number
/// 0 to 1,000,000,000, or null to go back to the default; kinds left out stay as they are (a
/// body naming none changes nothing and is not audited).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsChange {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 1_000_000_000)]
    pub destinations: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 1_000_000_000)]
    pub templates: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 1_000_000_000)]
    pub suppressions: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 1_000_000_000)]
    pub topic_opt_outs: Option<Option<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 1_000_000_000)]
    pub pending_jobs: Option<Option<i64>>,
    /// Why (kept in the audit), at most 1,000 characters.
    #[serde(default)]
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// A field given (`Some`), as a number or null.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
    Option::<i64>::deserialize(d).map(Some)
}

impl LimitsChange {
    fn changes(&self) -> Vec<(Kind, Option<i64>)> {
        [
            (Kind::Destinations, self.destinations),
            (Kind::Templates, self.templates),
            (Kind::Suppressions, self.suppressions),
            (Kind::TopicOptOuts, self.topic_opt_outs),
            (Kind::PendingJobs, self.pending_jobs),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// `PUT /v1/admin/tenants/{tenant_id}/limits`: override (or clear) some of a tenant's limits;
/// audited with the operator and the reason. A lower limit refuses new rows only: nothing
/// already there is removed.
#[utoipa::path(put, path = "/v1/admin/tenants/{tenant_id}/limits", tag = "operations",
    params(("tenant_id" = String, Path)), request_body = LimitsChange, security(("operator_key" = [])),
    responses((status = 200, body = TenantLimits), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(raw): Path<String>,
    JsonBody(b): JsonBody<LimitsChange>,
) -> Result<Json<TenantLimits>, ApiError> {
    let changes = b.changes();
    for (kind, n) in &changes {
        if n.is_some_and(|n| !(0..=MAX_LIMIT).contains(&n)) {
            return Err(ApiError::unprocessable(
                "invalid_field",
                format!("{}: a whole number 0 to {MAX_LIMIT}, or null for the default", kind.as_str()),
            )
            .with("field", kind.as_str()));
        }
    }
    if b.reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON) {
        return Err(ApiError::unprocessable("invalid_field", "reason: at most 1000 characters").with("field", "reason"));
    }
    let tenant = tenant_of(&state, &raw).await?;
    if changes.is_empty() {
        return Ok(Json(view(&state, tenant).await?));
    }
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let before = store::overrides(&tx, tenant).await?;
    let mut detail = serde_json::Map::new();
    for (kind, n) in &changes {
        store::set(&tx, tenant, *kind, *n, &op.name).await?;
        let old = before.iter().find(|o| o.0 == *kind).map(|o| o.1);
        detail.insert(kind.as_str().into(), json!({"old": old, "new": n}));
    }
    let detail = json!({"tenant_id": tenant.to_string(), "changes": detail, "reason": b.reason});
    admin_actions::record(&tx, "tenant_limits.set", &op.name, None, true, &detail).await?;
    tx.commit().await.map_err(StoreError::from)?;
    drop(db);
    state.quotas.forget(tenant);
    tracing::info!(event = "relay.tenant.limits", tenant_id = %tenant, operator = %op.name, %detail, "tenant limits set");
    Ok(Json(view(&state, tenant).await?))
}
