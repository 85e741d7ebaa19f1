//! The console function: a placeholder that deploys on its own, with no database and no
//! queue. The console issue gives it its content (polling each project's status contract).

use axum::Router;
use axum::routing::get;
use serde_json::json;

pub fn router() -> Router {
    Router::new().fallback(get(|| async {
        axum::Json(json!({ "console": "placeholder", "note": "the Relay console arrives with its own issue" }))
    }))
}
