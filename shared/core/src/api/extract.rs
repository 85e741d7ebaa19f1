//! Request extractors whose every rejection is an `ApiError`: the caller's tenant (bearer key),
//! the operator (bearer operator key), a status reader (read-only status key), the idempotency
//! key, and a JSON body checked for size, syntax, NUL characters and shape. And the check every
//! request's path and query pass before any handler (`check_uri`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use crate::job::terms::IdempotencyKey;
use crate::plain::NameValue;
use crate::store::operators;
use crate::store::status_keys::{self, StatusKey};
use crate::store::tenants::{self, Tenant};

/// The tenant whose API key is in `Authorization: Bearer <key>`.
pub struct Caller(pub Tenant);

impl<S: Send + Sync> FromRequestParts<S> for Caller
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let state = AppState::from_ref(state);
        let unauthorized = |msg: &str| ApiError::new(axum::http::StatusCode::UNAUTHORIZED, "unauthorized", msg);
        let key = bearer(parts, "api key")?;
        let key = key.as_str();
        if let Some(t) = state.tenants.get(key) {
            return Ok(Caller(t));
        }
        let db = state.pool.get().await.map_err(crate::store::StoreError::from)?;
        match tenants::by_api_key(&db, key).await? {
            Some(t) => {
                state.tenants.put(key, t.clone());
                Ok(Caller(t))
            }
            None => Err(unauthorized("unknown or disabled API key")),
        }
    }
}

/// The bearer key of a request, or a 401.
fn bearer(parts: &Parts, what: &str) -> Result<String, ApiError> {
    let unauthorized = |msg: String| ApiError::new(axum::http::StatusCode::UNAUTHORIZED, "unauthorized", msg);
    let header = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| unauthorized(format!("missing Authorization: Bearer <{what}>")))?;
    header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| unauthorized(format!("Authorization must be `Bearer <{what}>`")))
}

/// The operator whose key is in `Authorization: Bearer <operator key>`. Tenant keys are
/// refused (401), as operator keys are on tenant routes: the two never mix. Operator calls
/// are rare, so every request looks its key up: a revoked key stops at once.
pub struct Operator(pub operators::Operator);

impl<S: Send + Sync> FromRequestParts<S> for Operator
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let state = AppState::from_ref(state);
        let key = bearer(parts, "operator key")?;
        let db = state.pool.get().await.map_err(crate::store::StoreError::from)?;
        match operators::by_key(&db, &key).await? {
            Some(op) => Ok(Operator(op)),
            None => Err(ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "unauthorized",
                "unknown or disabled operator key",
            )),
        }
    }
}

/// A holder of a read-only status key (`status_keys`), for `GET /v1/status`. Tenant and
/// operator keys are not status keys: either answers 401 here like any unknown key.
pub struct StatusReader(pub StatusKey);

impl<S: Send + Sync> FromRequestParts<S> for StatusReader
where
    AppState: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let state = AppState::from_ref(state);
        let key = bearer(parts, "status key")?;
        let db = state.pool.get().await.map_err(crate::store::StoreError::from)?;
        status_keys::by_key(&db, &key).await?.map(StatusReader).ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "unauthorized",
                "unknown or disabled status key (tenant API keys cannot read the status)",
            )
        })
    }
}

/// Recently seen API keys (by hash) and their tenants, so a busy client costs no key lookup
/// per request. An entry lives `TTL`: a disabled or rotated key stops working within that.
#[derive(Clone, Default)]
pub struct TenantCache(Arc<Mutex<KeyCache>>);

/// Key hash to tenant, with when it was looked up.
type KeyCache = HashMap<Vec<u8>, (Tenant, Instant)>;

impl TenantCache {
    pub const TTL: Duration = Duration::from_secs(10);
    const MAX_ENTRIES: usize = 10_000;

    fn get(&self, key: &str) -> Option<Tenant> {
        let map = self.0.lock().ok()?;
        let (tenant, at) = map.get(&tenants::hash_key(key))?;
        (at.elapsed() < Self::TTL).then(|| tenant.clone())
    }

    fn put(&self, key: &str, tenant: Tenant) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= Self::MAX_ENTRIES {
                map.retain(|_, (_, at)| at.elapsed() < Self::TTL);
            }
            map.insert(tenants::hash_key(key), (tenant, Instant::now()));
        }
    }
}

/// The `Idempotency-Key` header, required on submissions.
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let v = parts.headers.get("idempotency-key").ok_or_else(|| {
            ApiError::bad_request("missing_idempotency_key", "the Idempotency-Key header is required")
        })?;
        let key = v.to_str().ok().map(str::trim).unwrap_or_default();
        Ok(IdempotencyKey::parse(key)?)
    }
}

/// The largest body a route reads, as the request's extension (set by `body_limit`).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// The layers that bound a route's body (or, on the router, every route's): axum's limit on
/// what is read, and the same limit for `JsonBody` to check a declared `Content-Length`
/// against before reading any of it. A route's own replaces the router's.
pub fn body_limit(max: usize) -> (axum::extract::DefaultBodyLimit, axum::Extension<BodyLimit>) {
    (axum::extract::DefaultBodyLimit::max(max), axum::Extension(BodyLimit(max)))
}

fn too_large() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        "the request body is over the size limit",
    )
}

/// A JSON object body: 413 over the size limit (at once when the declared `Content-Length` is
/// over it: nothing is read), 400 when not JSON or when any string holds a NUL character, 422
/// naming the field when the shape is wrong (in JSON's terms: `plain`).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let limit = req.extensions().get::<BodyLimit>().map_or(super::MAX_BODY_BYTES, |l| l.0);
        let declared =
            req.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
        if declared.is_some_and(|n: u64| n > limit as u64) {
            return Err(too_large());
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                ApiError::new(status, "unreadable_body", "the request body could not be read")
            }
        })?;
        let mut value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request("malformed_json", format!("the body is not valid JSON: {e}")))?;
        integral_numbers(&mut value);
        if let Some(path) = nul_path(&value, "") {
            return Err(
                ApiError::bad_request("nul_character", format!("{path} contains a NUL character")).with("field", path)
            );
        }
        // Every body is an object; serde would read a struct from an array too, field by field.
        if !value.is_object() {
            let kind = match &value {
                Value::Array(_) => "a list",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "true or false",
                _ => "null",
            };
            return Err(ApiError::unprocessable("invalid_field", format!("the body must be an object, not {kind}"))
                .with("field", "."));
        }
        let parsed =
            serde_path_to_error::deserialize(&value).map_err(|e| ApiError::wrong_shape(e.path(), e.inner()))?;
        Ok(JsonBody(parsed))
    }
}

/// Refuse a path that is not UTF-8 once percent-decoded (400 `invalid_path`) or that holds a NUL
/// character (400 `nul_character`), and a query whose decoded names or values hold a NUL
/// (400 `invalid_query` naming it): Postgres text cannot take a NUL (SQLSTATE 22021), and this
/// way no handler's path or query parameter can carry one.
pub fn check_uri(uri: &axum::http::Uri) -> Result<(), ApiError> {
    let path = percent_encoding::percent_decode_str(uri.path())
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("invalid_path", "the path is not UTF-8 once percent-decoded"))?;
    if path.contains('\0') {
        return Err(ApiError::bad_request("nul_character", "the path contains a NUL character"));
    }
    let pairs = axum::extract::Query::<Vec<NameValue>>::try_from_uri(uri).map(|q| q.0).unwrap_or_default();
    match pairs.iter().find(|(k, v)| k.contains('\0') || v.contains('\0')) {
        Some((k, _)) => Err(ApiError::invalid_query(k, format!("query parameter {k:?} contains a NUL character"))),
        None => Ok(()),
    }
}

/// Write every number without a fractional part as an integer (`1.0` as `1`): JSON Schema, and
/// so the OpenAPI document, counts it as one, and integer fields then take it.
fn integral_numbers(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
                && (i64::MIN as f64..-(i64::MIN as f64)).contains(&f)
            {
                *v = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// The path of the first string (or object key) that contains a NUL character.
fn nul_path(v: &Value, at: &str) -> Option<String> {
    let here = || if at.is_empty() { ".".to_owned() } else { at.to_owned() };
    match v {
        Value::String(s) if s.contains('\0') => Some(here()),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, x)| nul_path(x, &format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, x)| {
            let p = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
            if k.contains('\0') { Some(p) } else { nul_path(x, &p) }
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_without_a_fraction_are_integers() {
        let mut v = json!({"a": [1.0, 2.5, -0.0], "b": {"c": 3e300}, "d": 7});
        integral_numbers(&mut v);
        assert_eq!(v, json!({"a": [1, 2.5, 0], "b": {"c": 3e300}, "d": 7}));
        assert!(v["a"][0].is_i64());
    }

    #[test]
    fn nul_characters_are_found_anywhere() {
        assert_eq!(nul_path(&json!({"a": [1, {"b": "x\u{0}"}]}), ""), Some("a[1].b".into()));
        assert_eq!(nul_path(&json!({"k\u{0}": 1}), ""), Some("k\u{0}".into()));
        assert_eq!(nul_path(&json!({"a": "fine"}), ""), None);
    }

    #[test]
    fn paths_and_queries_with_nul_or_bad_utf8_are_refused() {
        let code = |uri: &str| check_uri(&uri.parse().unwrap()).err().map(|e| (e.status.as_u16(), e.code));
        assert_eq!(code("/v1/templates/a%00b"), Some((400, "nul_character")));
        assert_eq!(code("/v1/jobs/%FF"), Some((400, "invalid_path")));
        assert_eq!(code("/v1/jobs?task_type=a%00"), Some((400, "invalid_query")));
        assert_eq!(code("/v1/jobs?a%00=1"), Some((400, "invalid_query")));
        assert_eq!(code("/v1/suppressions/caf%C3%A9%40example.com?limit=5"), None);
    }
}
