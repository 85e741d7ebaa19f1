//! The console: polls the status contract of each configured project (Relay itself and any
//! client project) and serves one server-rendered, auto-refreshing page. No database: it holds
//! only a cache, so it deploys on its own (`functions/console`, or `relay console` locally).

pub mod config;
pub mod lambda;
pub mod poll;
pub mod render;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

pub use config::{ConsoleConfig, Project};
pub use poll::{Console, ProjectState};

/// The console's routes: `/` the page, `/healthz`. Each page request polls the projects
/// when the cache is older than a third of the refresh interval (so it works the same in a
/// Lambda container, which runs nothing between requests).
pub fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/healthz", get(|| async { axum::Json(serde_json::json!({ "ok": true })) }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found") })
        .with_state(console)
}

async fn page(State(console): State<Console>) -> Response {
    console.refresh_if_older(console.config.refresh / 3).await;
    let view = render::view(&console.snapshot().await, console.config.refresh.as_secs(), chrono::Utc::now());
    match render::page(&view) {
        Ok(html) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], html)
            .into_response(),
        Err(e) => {
            tracing::error!(event = "relay.console.render_failed", error = %e, "could not render the console page");
            (StatusCode::INTERNAL_SERVER_ERROR, "the console page could not be rendered").into_response()
        }
    }
}
