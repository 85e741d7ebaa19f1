//! The HTTP API as one router, served by `relay serve`/`relay dev`, by the intake Lambda
//! (through lambda_http) and by tests (through `tower::ServiceExt::oneshot`).

pub mod admin;
pub mod callbacks;
pub mod completions;
pub mod constraints;
pub mod cursor;
pub mod cutover;
pub mod destinations;
pub mod email;
pub mod error;
pub mod extract;
pub mod jobs;
pub mod limits;
pub mod openapi;
pub mod ratelimit;
pub mod reputation;
pub mod schedules;
pub mod send_rates;
pub mod server;
pub mod status;
pub mod submit;
pub mod topics;

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use deadpool_postgres::Pool;

use crate::catalogue::Catalogue;
use crate::intake::Intake;
use error::ApiError;
pub use extract::TenantCache;
use extract::body_limit;

/// Largest request body accepted (a full batch of 500 modest jobs fits).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Largest body of a job submission (`POST /v1/jobs`, `POST /v1/jobs:batch`): room for a
/// `webhook.send` body of `destinations::webhook::MAX_BODY` and the request around it.
pub const MAX_JOB_BODY_BYTES: usize = 2 * 1024 * 1024;
/// A request that takes longer than this answers 503 instead of hanging.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// What every handler shares; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: Pool,
    pub catalogue: Catalogue,
    pub intake: Intake,
    pub tenants: TenantCache,
    /// Operator retries are dispatched after their commit.
    pub transport: std::sync::Arc<dyn crate::transport::Transport>,
    /// The project name the status contract reports.
    pub project: String,
    /// Per-tenant intake rate limits (none by default).
    pub limits: ratelimit::RateLimits,
    /// Per-tenant limits on the rows its calls create (`crate::limits`).
    pub quotas: crate::limits::Quotas,
    /// What this deployment admits beyond each task's own parameters.
    pub admission: submit::Admission,
    /// Writes destinations' secrets; `None`: `PUT /v1/destinations/{name}/secret` answers 503.
    pub secrets: Option<crate::destinations::SecretWriter>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/jobs", post(submit::submit).layer(body_limit(MAX_JOB_BODY_BYTES)).get(jobs::list))
        .route("/v1/jobs:batch", post(submit::submit_batch).layer(body_limit(MAX_JOB_BODY_BYTES)))
        .route("/v1/jobs/{id}", get(jobs::get))
        .route("/v1/jobs/{id}/events", get(jobs::events))
        .route("/v1/jobs/{id}/sessions", get(jobs::sessions))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/complete", post(completions::complete))
        .route("/v1/jobs/{id}/callbacks", get(callbacks::attempts))
        .route("/v1/callbacks", get(callbacks::get).put(callbacks::put).delete(callbacks::delete))
        .route("/v1/callbacks/rotate", post(callbacks::rotate))
        .route("/v1/tasks", get(jobs::tasks))
        .route("/v1/destinations", get(destinations::list))
        .route("/v1/destinations/{name}", get(destinations::get).put(destinations::put).delete(destinations::delete))
        .route("/v1/destinations/{name}/secret", put(destinations::put_secret))
        .route("/v1/destinations/{name}/signing-secret", put(destinations::put_signing_secret))
        .route("/v1/destinations/{name}/client-secret", put(destinations::put_client_secret))
        .route("/v1/destinations/{name}/refresh-token", put(destinations::put_refresh_token))
        .route("/v1/destinations/{name}/writes", put(destinations::put_writes))
        .route("/v1/jobs/{id}/http-calls", get(destinations::calls))
        .route("/v1/jobs/{id}/recipients/{page}", put(email::put_recipients))
        .route("/v1/messages", get(email::list_messages))
        .route("/v1/sending-role", get(email::get_sending_role).put(email::put_sending_role))
        .route("/v1/messages/events", get(email::message_events))
        .route("/v1/messages/{id}", get(email::get_message))
        .route("/v1/suppressions", get(email::list_suppressions))
        .route("/v1/suppressions/{address}", put(email::add_suppression).delete(email::remove_suppression))
        .route("/v1/topic-opt-outs", get(topics::list))
        .route("/v1/topic-opt-outs/{address}/{topic}", put(topics::put).delete(topics::delete))
        .route("/v1/topics/ses", get(topics::list_ses))
        .route("/v1/topics/{topic}/ses", put(topics::put_ses).delete(topics::delete_ses))
        .route("/v1/templates", get(email::list_templates))
        .route("/v1/templates/{name}", get(email::get_template).put(email::put_template).delete(email::delete_template))
        .route("/v1/limits", get(limits::own))
        .route("/v1/cutover", get(cutover::own))
        .route("/v1/admin/tenants/{tenant_id}/cutover", get(cutover::list))
        .route("/v1/admin/tenants/{tenant_id}/cutover/{task_type}", put(cutover::put))
        .route("/v1/reputation", get(reputation::own))
        .route("/v1/admin/tenants/{tenant_id}/reputation", get(reputation::get).put(reputation::put))
        .route("/v1/admin/tenants/{tenant_id}/reputation/resume", post(reputation::resume))
        .route("/v1/admin/tenants/{tenant_id}/limits", get(limits::get).put(limits::put))
        .route(
            "/v1/admin/tenants/{tenant_id}/sending-identities",
            get(email::get_identities).put(email::put_identities),
        )
        .route("/v1/admin/exceptions", get(admin::list_exceptions))
        .route("/v1/admin/exceptions:bulk", post(admin::bulk))
        .route("/v1/admin/exceptions/{id}", get(admin::show_exception))
        .route("/v1/admin/exceptions/{id}/retry", post(admin::retry))
        .route("/v1/admin/exceptions/{id}/cancel", post(admin::cancel))
        .route("/v1/admin/exceptions/{id}/finish", post(admin::finish))
        .route("/v1/admin/exceptions/{id}/ignore", post(admin::ignore))
        .route("/v1/admin/tenant-faults", get(admin::list_tenant_faults))
        .route("/v1/admin/modes", get(admin::get_modes).put(admin::set_mode))
        .route("/v1/admin/send-rates", get(send_rates::list))
        .route("/v1/admin/send-rates/{scope}/{key}", get(send_rates::get).put(send_rates::put))
        .route("/v1/admin/send-weights/{tenant}", put(send_rates::put_weight))
        .route("/v1/admin/schedules", get(schedules::list).post(schedules::create))
        .route("/v1/admin/schedules/{id}", get(schedules::get).patch(schedules::update).delete(schedules::delete))
        .route("/v1/status", get(status::status))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route("/healthz", get(openapi::healthz))
        .fallback(|| async { ApiError::not_found() })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
        })
        .layer(body_limit(MAX_BODY_BYTES))
        .layer(middleware::from_fn(checked_uri))
        .layer(middleware::from_fn(time_limit))
        .layer(middleware::from_fn(in_span))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_| {
            tracing::error!(event = "relay.api.panic", "handler panicked");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error").into_response()
        }))
        .with_state(state)
}

/// Run each request inside its span (`telemetry::request_span`).
async fn in_span(req: Request, next: Next) -> Response {
    use tracing::Instrument;
    let span = crate::telemetry::request_span(req.method().as_str(), req.uri().path());
    async move {
        let res = next.run(req).await;
        tracing::debug!(event = "relay.api.answered", status = res.status().as_u16(), "request answered");
        res
    }
    .instrument(span)
    .await
}

/// Refuse a path or query no handler may see (`extract::check_uri`), before any handler runs.
async fn checked_uri(req: Request, next: Next) -> Response {
    match extract::check_uri(req.uri()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Answer 503 with a JSON error rather than hang when a request cannot finish in time.
async fn time_limit(req: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(res) => res,
        Err(_) => ApiError::unavailable("the request timed out; retry with the same idempotency key").into_response(),
    }
}
