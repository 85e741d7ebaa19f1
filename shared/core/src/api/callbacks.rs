//! A tenant's callback settings: the URL every terminal state of its jobs (and each message
//! event of the types it subscribes to) is POSTed to, and the signing secret (shown once, when created or rotated; two valid during a rotation). And
//! each job's delivery attempts.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody};
use crate::store::StoreError;
use crate::store::callbacks::{self, Attempt, Settings};
use crate::store::message_events;

/// The default and the longest overlap of a rotation: the old secret keeps signing this long.
pub const DEFAULT_OVERLAP_SECONDS: u32 = 24 * 3600;
pub const MAX_OVERLAP_SECONDS: u32 = 30 * 24 * 3600;

/// `PUT /v1/callbacks`
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackSettingsRequest {
    /// http(s) URL for every terminal state of this tenant's top-level jobs; null: only jobs
    /// that name their own `callback_url` get callbacks.
    #[schema(min_length = 1, max_length = 2000, pattern = "^https?://")]
    pub url: Option<String>,
    /// The message event types the tenant's URL receives (`message.bounced`, `message.complained`,
    /// `message.rejected`, `message.suppressed`, `message.delivered`, `message.delayed`,
    /// `message.sent`, `message.opened`, `message.clicked`, `message.unsubscribed`); [] for none.
    /// Absent: unchanged (at first: bounced, complained, rejected, suppressed).
    #[schema(max_items = 10)]
    pub message_events: Option<Vec<String>>,
}

/// `POST /v1/callbacks/rotate`
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateRequest {
    /// How long the previous secret keeps signing (1 to 2592000 s; default 86400).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub overlap_seconds: Option<u32>,
}

/// A tenant's callback settings.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallbackSettings {
    pub url: Option<String>,
    /// The signing secret (`whsec_...`): only in the answer that created or rotated it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub secret_created_at: DateTime<Utc>,
    /// While a rotation lasts: until when the previous secret also signs.
    pub previous_valid_until: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// The message event types the tenant's URL receives.
    pub message_events: Vec<String>,
}

impl CallbackSettings {
    fn of(s: Settings, show_secret: bool) -> Self {
        let now = Utc::now();
        CallbackSettings {
            url: s.url,
            secret: show_secret.then_some(s.secret),
            secret_created_at: s.secret_created_at,
            previous_valid_until: s.previous_until.filter(|u| *u > now),
            updated_at: s.updated_at,
            message_events: s.message_events,
        }
    }
}

/// A job's callback delivery attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptList {
    pub attempts: Vec<Attempt>,
}

fn not_configured() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "callbacks_not_configured",
        "no callback settings: PUT /v1/callbacks first",
    )
}

/// `GET /v1/callbacks`
#[utoipa::path(get, path = "/v1/callbacks", tag = "callbacks", security(("tenant_key" = [])),
    responses((status = 200, body = CallbackSettings), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<CallbackSettings>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let s = callbacks::get(&db, tenant.id).await?.ok_or_else(not_configured)?;
    Ok(Json(CallbackSettings::of(s, false)))
}

/// `PUT /v1/callbacks`: set the URL; the first call creates the signing secret and shows it.
#[utoipa::path(put, path = "/v1/callbacks", tag = "callbacks", request_body = CallbackSettingsRequest,
    security(("tenant_key" = [])),
    responses((status = 200, body = CallbackSettings), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    JsonBody(req): JsonBody<CallbackSettingsRequest>,
) -> Result<Json<CallbackSettings>, ApiError> {
    if let Some(url) = &req.url {
        crate::outbound::check_url(url, &state.admission.callback_allow)
            .map_err(|why| ApiError::unprocessable("invalid_field", format!("url: {why}")).with("field", "url"))?;
    }
    let mut events = req.message_events;
    if let Some(list) = &mut events {
        if list.len() > message_events::WEBHOOK_TYPES.len() {
            return Err(ApiError::unprocessable(
                "invalid_field",
                format!("message_events: at most {} types", message_events::WEBHOOK_TYPES.len()),
            )
            .with("field", "message_events"));
        }
        if let Some(bad) = list.iter().find(|t| !message_events::WEBHOOK_TYPES.contains(&t.as_str())) {
            let bad: String = bad.chars().take(100).collect();
            return Err(ApiError::unprocessable(
                "invalid_field",
                format!("message_events: {bad:?} is not one of {}", message_events::WEBHOOK_TYPES.join(", ")),
            )
            .with("field", "message_events"));
        }
        list.sort();
        list.dedup();
    }
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let new_secret = crate::callbacks::new_secret();
    let (s, created) = callbacks::set_url(&db, tenant.id, req.url.as_deref(), events.as_deref(), &new_secret).await?;
    Ok(Json(CallbackSettings::of(s, created)))
}

/// `POST /v1/callbacks/rotate`: a new secret (shown once); the previous one keeps signing
/// for `overlap_seconds`, so receivers can switch without losing a callback.
#[utoipa::path(post, path = "/v1/callbacks/rotate", tag = "callbacks", request_body = RotateRequest,
    security(("tenant_key" = [])),
    responses((status = 200, body = CallbackSettings), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn rotate(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    JsonBody(req): JsonBody<RotateRequest>,
) -> Result<Json<CallbackSettings>, ApiError> {
    let overlap = req.overlap_seconds.unwrap_or(DEFAULT_OVERLAP_SECONDS);
    if !(1..=MAX_OVERLAP_SECONDS).contains(&overlap) {
        return Err(ApiError::unprocessable("invalid_field", format!("overlap_seconds: 1 to {MAX_OVERLAP_SECONDS}"))
            .with("field", "overlap_seconds"));
    }
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let s = callbacks::rotate(&db, tenant.id, &crate::callbacks::new_secret(), f64::from(overlap))
        .await?
        .ok_or_else(not_configured)?;
    Ok(Json(CallbackSettings::of(s, true)))
}

/// `DELETE /v1/callbacks`: no more callbacks (those queued find no settings and stop).
#[utoipa::path(delete, path = "/v1/callbacks", tag = "callbacks", security(("tenant_key" = [])),
    responses((status = 200, description = "`{\"deleted\": true}`"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if !callbacks::delete(&db, tenant.id).await? {
        return Err(not_configured());
    }
    Ok(Json(serde_json::json!({"deleted": true})))
}

/// `GET /v1/jobs/{id}/callbacks`: every delivery attempt of the job's callbacks, oldest first.
#[utoipa::path(get, path = "/v1/jobs/{id}/callbacks", tag = "callbacks", params(("id" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = AttemptList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn attempts(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<AttemptList>, ApiError> {
    let id = super::jobs::parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    super::jobs::owned(&db, tenant.id, id).await?;
    Ok(Json(AttemptList { attempts: callbacks::attempts(&db, tenant.id, id).await? }))
}
