//! The one API error: a status, a stable machine-readable code and a message, rendered as
//! `{"error": {"code", "message", ...details}}`. A 500 never echoes internals.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::job::terms::Invalid;
use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Extra machine-readable fields merged into the error object.
    pub details: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), details: Map::new() }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 422 `invalid_field` for a body of the wrong shape, naming the field at fault in JSON's
    /// terms, never Rust's (`plain`).
    pub fn wrong_shape(path: &serde_path_to_error::Path, inner: &dyn std::fmt::Display) -> Self {
        let crate::plain::ParamError { field, message } = crate::plain::field_error(path, inner);
        let message = match () {
            _ if field == "." => format!("the body {message}"),
            _ if message.starts_with("missing field ") => format!("missing field {field}"),
            _ => format!("{field}: {message}"),
        };
        Self::unprocessable("invalid_field", message).with("field", field)
    }

    /// 400 `invalid_query` for a query string axum could not read (a parameter given twice),
    /// naming the parameter.
    pub fn query(rejection: axum::extract::rejection::QueryRejection) -> Self {
        let text = rejection.body_text();
        let inner = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text);
        let field = inner.split('`').nth(1).unwrap_or("query").to_owned();
        Self::invalid_query(&field, format!("query parameter {}", crate::plain::plain(inner)))
    }

    /// 400 `invalid_query`, naming the query parameter at fault.
    pub fn invalid_query(field: &str, message: impl Into<String>) -> Self {
        Self::bad_request("invalid_query", message).with("field", field)
    }

    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such resource")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// The body as a JSON value (the batch endpoint nests it per item).
    pub fn body(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("code".into(), self.code.into());
        obj.insert("message".into(), self.message.clone().into());
        obj.extend(self.details.clone());
        json!({ "error": obj })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            res.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("5"));
        }
        if let Some(secs) = self.details.get("retry_after_seconds").and_then(Value::as_u64) {
            res.headers_mut().insert("retry-after", axum::http::HeaderValue::from(secs));
        }
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::from(&e)
    }
}

impl From<std::sync::Arc<StoreError>> for ApiError {
    fn from(e: std::sync::Arc<StoreError>) -> Self {
        ApiError::from(&*e)
    }
}

impl From<&StoreError> for ApiError {
    fn from(e: &StoreError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(event = "relay.api.db_unavailable", error = %e, "database unavailable");
            crate::metrics::DATABASE_ERRORS.add(1);
            return ApiError::unavailable("the database is unavailable; retry shortly");
        }
        if let StoreError::Vanished(what) = e {
            return ApiError::new(
                StatusCode::CONFLICT,
                "retry",
                format!("{what} changed while the request ran; retry"),
            );
        }
        tracing::error!(event = "relay.api.internal", error = %e, "internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
    }
}

/// A job's term out of bounds: 422 `invalid_field` naming it (and the deployment's `limit` for a
/// timeout); a malformed idempotency key is a 400 of its own.
impl From<Invalid> for ApiError {
    fn from(e: Invalid) -> Self {
        match e {
            Invalid::IdempotencyKey => ApiError::bad_request("invalid_idempotency_key", e.to_string()),
            Invalid::Timeout { longest } => {
                ApiError::unprocessable("invalid_field", e.to_string()).with("field", e.field()).with("limit", longest)
            }
            _ => ApiError::unprocessable("invalid_field", e.to_string()).with("field", e.field()),
        }
    }
}

/// The shape of every error answer, for the OpenAPI document.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

/// `code` is stable and machine-readable; `field` names the field at fault when there is one.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorObject {
    pub code: String,
    pub message: String,
    pub field: Option<String>,
}

/// A page size from the query: 1 to 500, `default` when absent.
pub fn page_limit(raw: Option<&str>, default: i64) -> Result<i64, ApiError> {
    match raw {
        None => Ok(default),
        Some(s) => s
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=500).contains(l))
            .ok_or_else(|| ApiError::invalid_query("limit", "limit must be 1 to 500")),
    }
}
