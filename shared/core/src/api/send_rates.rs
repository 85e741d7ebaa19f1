//! Operators' send rates (`email::pace`): `GET /v1/admin/send-rates` lists every rate with
//! what holds now; `GET`/`PUT /v1/admin/send-rates/{scope}/{key}` reads one with its audited
//! changes, or sets (or clears, `null`) it.

use axum::Json;
use axum::extract::{Path, State};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Operator};
use crate::email::pace;
use crate::store::StoreError;
use crate::store::send_rates::{self, RateChange, Scope, SendRate};
use crate::store::send_shares;

/// The most an operator may set, per second.
pub const MAX_RATE: f64 = 10_000.0;
/// The lowest rate an operator may set: one send in about 17 minutes.
pub const MIN_RATE: f64 = 0.001;
/// The longest reason kept.
pub const MAX_REASON: usize = 1000;

/// A rate and what holds now.
#[derive(Debug, Serialize, ToSchema)]
pub struct RateView {
    #[serde(flatten)]
    pub rate: SendRate,
    /// The rate sends keep now (an account's base times its back-off); null: no limit.
    pub effective_rate: Option<f64>,
    /// The back-off now (1: none).
    pub factor_now: f64,
    /// What remains of an account's 24-hour quota; null: unknown or unlimited.
    pub quota_left: Option<f64>,
}

impl RateView {
    fn of(rate: SendRate) -> RateView {
        let now = Utc::now();
        RateView {
            effective_rate: pace::effective(&rate, now),
            factor_now: pace::factor_now(&rate, now),
            quota_left: pace::quota_left(&rate),
            rate,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RateList {
    pub rates: Vec<RateView>,
}

/// One rate and its changes, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct RateDetail {
    #[serde(flatten)]
    pub rate: RateView,
    pub changes: Vec<RateChange>,
}

/// Body of `PUT /v1/admin/send-rates/{scope}/{key}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateChangeBody {
    /// Sends per second, from 0.001 (one in about 17 minutes) to 10,000; null clears it (an
    /// account then keeps SES's own rate).
    #[schema(minimum = 0.001, maximum = 10000)]
    pub rate_per_second: Option<f64>,
    /// Why, for the audit (at most 1,000 characters).
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// The scope and key of a path: a scope of `account`, `tenant` or `configuration_set`; an
/// account's key `default` or a 12-digit account id; a tenant's, its id (which must exist); a
/// configuration set's, its name (1 to 64 letters, digits, `_` or `-`).
async fn target(state: &AppState, scope: &str, key: &str) -> Result<(Scope, String), ApiError> {
    let Some(scope) = Scope::parse(scope) else {
        return Err(ApiError::not_found());
    };
    let ok = match scope {
        Scope::Account => key == "default" || (key.len() == 12 && key.bytes().all(|b| b.is_ascii_digit())),
        Scope::Tenant => {
            let Ok(tenant) = key.parse::<crate::job::TenantId>() else { return Err(ApiError::not_found()) };
            let db = state.pool.get().await.map_err(StoreError::from)?;
            crate::store::tenants::by_id(&db, tenant).await?.ok_or_else(ApiError::not_found)?;
            return Ok((scope, tenant.to_string()));
        }
        Scope::ConfigurationSet => {
            (1..=64).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        }
    };
    if !ok {
        return Err(ApiError::not_found());
    }
    Ok((scope, key.to_owned()))
}

/// `GET /v1/admin/send-rates`: every rate, with what holds now.
#[utoipa::path(get, path = "/v1/admin/send-rates", tag = "operations", security(("operator_key" = [])),
    responses((status = 200, body = RateList), (status = 401, body = ErrorBody)))]
pub async fn list(State(state): State<AppState>, Operator(_): Operator) -> Result<Json<RateList>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    Ok(Json(RateList { rates: send_rates::list(&db).await?.into_iter().map(RateView::of).collect() }))
}

/// The path of `/v1/admin/send-rates/{scope}/{key}`.
#[derive(Debug, Deserialize)]
pub struct RatePath {
    pub scope: String,
    pub key: String,
}

/// `GET /v1/admin/send-rates/{scope}/{key}`: one rate and its audited changes.
#[utoipa::path(get, path = "/v1/admin/send-rates/{scope}/{key}", tag = "operations",
    params(("scope" = String, Path), ("key" = String, Path)), security(("operator_key" = [])),
    responses((status = 200, body = RateDetail), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(RatePath { scope, key }): Path<RatePath>,
) -> Result<Json<RateDetail>, ApiError> {
    let (scope, key) = target(&state, &scope, &key).await?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let rate = send_rates::get(&db, scope, &key).await?.ok_or_else(ApiError::not_found)?;
    let changes = send_rates::history(&db, scope, &key).await?;
    Ok(Json(RateDetail { rate: RateView::of(rate), changes }))
}

/// `PUT /v1/admin/send-rates/{scope}/{key}`: set (or clear) a rate; audited with the operator
/// and the reason. Takes effect on the next send.
#[utoipa::path(put, path = "/v1/admin/send-rates/{scope}/{key}", tag = "operations",
    params(("scope" = String, Path), ("key" = String, Path)), request_body = RateChangeBody,
    security(("operator_key" = [])),
    responses((status = 200, body = RateView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(RatePath { scope, key }): Path<RatePath>,
    JsonBody(b): JsonBody<RateChangeBody>,
) -> Result<Json<RateView>, ApiError> {
    if let Some(r) = b.rate_per_second
        && !(MIN_RATE..=MAX_RATE).contains(&r)
    {
        return Err(ApiError::unprocessable(
            "invalid_field",
            format!("rate_per_second: from {MIN_RATE} to {MAX_RATE}"),
        )
        .with("field", "rate_per_second"));
    }
    check_reason(b.reason.as_deref())?;
    let (scope, key) = target(&state, &scope, &key).await?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let rate = send_rates::set(&db, scope, &key, b.rate_per_second, &op.name, b.reason.as_deref()).await?;
    tracing::info!(event = "relay.email.send_rate", scope = scope.as_str(), key = %key, rate = ?b.rate_per_second,
        operator = %op.name, "send rate set");
    Ok(Json(RateView::of(rate)))
}

fn check_reason(reason: Option<&str>) -> Result<(), ApiError> {
    if let Some(reason) = reason
        && (reason.chars().count() > MAX_REASON || reason.contains('\0'))
    {
        return Err(
            ApiError::unprocessable("invalid_field", "reason: at most 1000 bytes, no NUL").with("field", "reason")
        );
    }
    Ok(())
}

/// The most weight an operator may give a tenant (and the least is `MIN_WEIGHT`).
pub const MAX_WEIGHT: f64 = 1000.0;
pub const MIN_WEIGHT: f64 = 0.01;

/// Body of `PUT /v1/admin/send-weights/{tenant}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WeightChangeBody {
    /// The tenant's weight in the shares of a rate many tenants' sends keep (an SES account's, a
    /// configuration set's), from 0.01 to 1,000; null clears it (1, as every tenant's).
    #[schema(minimum = 0.01, maximum = 1000)]
    pub weight: Option<f64>,
    /// Why, for the audit (at most 1,000 characters).
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// `PUT /v1/admin/send-weights/{tenant}`: set (or clear) a tenant's weight in the shares of the
/// send rates tenants share; audited with the rates (`GET /v1/admin/send-rates/tenant/{id}`).
/// Takes effect on the next send.
#[utoipa::path(put, path = "/v1/admin/send-weights/{tenant}", tag = "operations",
    params(("tenant" = String, Path)), request_body = WeightChangeBody, security(("operator_key" = [])),
    responses((status = 200, body = RateView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put_weight(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(tenant): Path<String>,
    JsonBody(b): JsonBody<WeightChangeBody>,
) -> Result<Json<RateView>, ApiError> {
    if let Some(w) = b.weight
        && !(MIN_WEIGHT..=MAX_WEIGHT).contains(&w)
    {
        return Err(ApiError::unprocessable("invalid_field", format!("weight: from {MIN_WEIGHT} to {MAX_WEIGHT}"))
            .with("field", "weight"));
    }
    check_reason(b.reason.as_deref())?;
    let (_, key) = target(&state, Scope::Tenant.as_str(), &tenant).await?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    send_shares::set_weight(&db, &key, b.weight, &op.name, b.reason.as_deref()).await?;
    let rate = send_rates::get(&db, Scope::Tenant, &key)
        .await?
        .ok_or_else(|| StoreError::Vanished(format!("the tenant rate {key}")))?;
    tracing::info!(event = "relay.email.send_weight", tenant = %key, weight = ?b.weight, operator = %op.name,
        "send weight set");
    Ok(Json(RateView::of(rate)))
}
