//! A tenant's HTTP destinations (`http.request`'s and `webhook.send`'s targets): create, read,
//! list, delete; the secret behind the auth header and the webhook signing secret (both
//! write-only); the destination's own write switch; and each job's calls.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody};
use crate::destinations::oauth::OAuth;
use crate::destinations::signature::{self, SignatureScheme};
use crate::destinations::success::SuccessRule;
use crate::destinations::{self as rules, Secret, patterns};
use crate::job::TenantId;
use crate::limits::Kind;
use crate::store::destination_terms::object_or_null;
use crate::store::destinations::{self, Destination, NewDestination};
use crate::store::{StoreError, http_calls};

pub const DEFAULT_TIMEOUT_MS: i32 = 10_000;
pub const DEFAULT_RATE_PER_SECOND: f64 = 10.0;
/// Calls in flight to one destination at once, across every worker, unless the tenant says:
/// at the default rate (10/s) that keeps the full rate for answers of up to 1 s, while a
/// destination that stops answering holds at most 10 running slots anywhere (a worker has 64),
/// so it cannot fill anyone's slots, its own tenant's other work included.
pub const DEFAULT_MAX_IN_FLIGHT: i32 = 10;
/// The most a tenant may set.
pub const MAX_IN_FLIGHT: i32 = 1000;
/// The slowest rate a destination may have: one call every 1000 s (a slower one would put a
/// slot's time past what a timestamp holds).
pub const MIN_RATE_PER_SECOND: f64 = 0.001;
/// The fastest rate a destination may have.
pub const MAX_RATE_PER_SECOND: f64 = 1000.0;

/// `PUT /v1/destinations/{name}`
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationBody {
    /// `https://host[:port][/path]` with no query or fragment; calls append their path to it.
    /// `http` only for hosts on the operator's allow-list (local development).
    #[schema(min_length = 1, max_length = 2000, pattern = "^https?://[^?#]*$")]
    pub base_url: String,
    /// The header Relay sends the destination's secret in (e.g. `Authorization`); none when
    /// absent. The value is set with `PUT /v1/destinations/{name}/secret`.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9-]{1,64}$")]
    pub auth_header: Option<String>,
    /// Time limit of one call, connect to last byte (100 to 60000; default 10000).
    #[serde(default)]
    #[schema(minimum = 100, maximum = 60000)]
    pub timeout_ms: Option<i32>,
    /// Calls per second, across every worker (0.001 to 1000; default 10).
    #[serde(default)]
    #[schema(minimum = 0.001, maximum = 1000)]
    pub rate_per_second: Option<f64>,
    /// Calls in flight at once, across every worker (1 to 1000; default 10). Past it a job
    /// waits pending (`waiting_reason` `rate_limited`, `waiting_rate`
    /// `destination_in_flight:<name>`), holding no worker slot.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_in_flight: Option<i32>,
    /// The run-time URLs `webhook.send` may POST to: up to 20 patterns
    /// `https://HOST[:PORT]/PREFIX/`, HOST a name, an address, `*.domain` (any name under it) or
    /// `*` (any name); the URL's path starts with PREFIX, which ends in `/`. None: no webhook.
    #[serde(default)]
    #[schema(max_items = 20)]
    pub url_patterns: Vec<String>,
    /// An OAuth 2.0 grant that mints the token each call carries, as `Bearer <token>` in
    /// `auth_header` (`Authorization` unless named), in place of the auth secret. The client
    /// secret is `PUT /v1/destinations/{name}/client-secret`, a refresh token `PUT
    /// /v1/destinations/{name}/refresh-token` (both write-only). `token_url` is under the same
    /// address guard as `base_url`.
    #[serde(default, deserialize_with = "object_or_null")]
    pub oauth: Option<OAuth>,
    /// How `webhook.send` signs, when not the Standard Webhooks way (absent): HMAC-SHA256 over
    /// one of four layouts, hex or base64, with the named headers.
    #[serde(default, deserialize_with = "object_or_null")]
    pub signature: Option<SignatureScheme>,
    /// Which answers succeed (absent: any 2xx): statuses, and a JSON pointer that must hold a
    /// value (`{"json": {"pointer": "/ok", "equals": true}}`). A job's own `success` wins.
    #[serde(default, deserialize_with = "object_or_null")]
    pub success: Option<SuccessRule>,
}

/// `PUT /v1/destinations/{name}/secret`
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretBody {
    /// The auth header's value, e.g. `Bearer …`: stored in Secrets Manager, never returned.
    #[schema(min_length = 1, max_length = 4096, pattern = "^[\\t -~]+$")]
    pub value: String,
}

/// `PUT /v1/destinations/{name}/signing-secret`
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SigningSecretBody {
    /// The secret `webhook.send` signs with. For Standard Webhooks (no `signature`) and a
    /// scheme whose `key` is `whsec`: `whsec_` and the base64 of 24 to 64 random bytes
    /// (`^whsec_…$`, canonical base64); for a scheme whose `key` is `raw`: the receiver's
    /// shared secret as it is, 8 to 4096 visible ASCII characters (409 `secret_form_mismatch`
    /// for the other form). The tenant keeps it (its receivers verify with it); Relay never
    /// returns it.
    #[schema(min_length = 8, max_length = 4096)]
    pub value: String,
}

/// `PUT /v1/destinations/{name}/writes`
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WritesBody {
    pub enabled: bool,
    #[serde(default)]
    #[schema(max_length = 500)]
    pub reason: Option<String>,
}

/// The last call to a destination.
#[derive(Debug, Serialize, ToSchema)]
pub struct LastCall {
    pub outcome: String,
    pub http_status: Option<i32>,
    pub at: DateTime<Utc>,
}

/// A destination as the tenant sees it: never the secret's value.
#[derive(Debug, Serialize, ToSchema)]
pub struct DestinationView {
    #[serde(flatten)]
    pub destination: Destination,
    /// Where the secret lives in Secrets Manager (Relay derives it; the value is never shown).
    pub secret_id: String,
    /// Where the signing secret lives (likewise).
    pub signing_secret_id: String,
    pub last_call: Option<LastCall>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DestinationList {
    pub destinations: Vec<DestinationView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CallList {
    pub calls: Vec<http_calls::Call>,
}

fn invalid(field: &'static str, message: impl std::fmt::Display) -> ApiError {
    ApiError::unprocessable("invalid_field", format!("{field}: {message}")).with("field", field)
}

fn name_of(raw: &str) -> Result<(), ApiError> {
    rules::check_name(raw).map_err(|m| invalid("name", m))
}

async fn views(state: &AppState, tenant: TenantId, list: Vec<Destination>) -> Result<Vec<DestinationView>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let last = http_calls::last_per_destination(&db, tenant).await?;
    Ok(list
        .into_iter()
        .map(|d| DestinationView {
            secret_id: rules::secret_id(tenant, &d.name),
            signing_secret_id: rules::Secret::Signing.id(tenant, &d.name),
            last_call: last.iter().find(|l| l.0 == d.name).map(|l| LastCall {
                outcome: l.1.clone(),
                http_status: l.2,
                at: l.3,
            }),
            destination: d,
        })
        .collect())
}

/// A URL Relay calls (`base_url`, `oauth.token_url`) under the callbacks' rules (a literal
/// address the guard refuses is refused here), https unless allow-listed, no query or fragment.
fn check_target(state: &AppState, url: &str) -> Result<(), TargetError> {
    let allow = &state.admission.callback_allow;
    crate::outbound::check_url(url, allow)?;
    let target = crate::outbound::parse_url(url)?;
    if url.contains('?') || url.contains('#') {
        return Err(TargetError::QueryOrFragment);
    }
    let listed = allow.allows_host(&target.host) || target.host.parse().is_ok_and(|ip| allow.allows_ip(ip));
    if target.uri.scheme_str() == Some("http") && !listed {
        return Err(TargetError::HttpsOnly);
    }
    Ok(())
}

/// Why a URL Relay calls (`check_target`) is refused.
#[derive(Debug, thiserror::Error)]
enum TargetError {
    #[error(transparent)]
    Url(#[from] crate::outbound::UrlError),
    #[error("no query or fragment")]
    QueryOrFragment,
    #[error("https only (http only for hosts on the operator's allow-list)")]
    HttpsOnly,
}

/// The checks on a destination: its base URL and token URL (`check_target`), its headers,
/// bounds, patterns, grant, signature scheme and success rule.
fn check(state: &AppState, b: &DestinationBody) -> Result<(), ApiError> {
    let allow = &state.admission.callback_allow;
    check_target(state, &b.base_url).map_err(|why| invalid("base_url", why))?;
    if let Some(h) = &b.auth_header
        && (h.is_empty()
            || h.len() > 64
            || !h.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            || rules::REFUSED_HEADERS.contains(&h.to_ascii_lowercase().as_str()))
    {
        return Err(invalid("auth_header", "1 to 64 letters, digits or '-', not a header Relay sets itself"));
    }
    if b.timeout_ms.is_some_and(|t| !(100..=60_000).contains(&t)) {
        return Err(invalid("timeout_ms", "100 to 60000"));
    }
    if b.rate_per_second.is_some_and(|r| !(MIN_RATE_PER_SECOND..=MAX_RATE_PER_SECOND).contains(&r)) {
        return Err(invalid("rate_per_second", "0.001 (one call every 1000 s) to 1000 calls a second"));
    }
    if b.max_in_flight.is_some_and(|m| !(1..=MAX_IN_FLIGHT).contains(&m)) {
        return Err(invalid("max_in_flight", "1 to 1000 calls in flight at once"));
    }
    if b.url_patterns.len() > patterns::MAX_PATTERNS {
        return Err(invalid("url_patterns", format!("at most {} patterns", patterns::MAX_PATTERNS)));
    }
    for (i, p) in b.url_patterns.iter().enumerate() {
        patterns::Pattern::parse(p, allow).map_err(|m| {
            ApiError::unprocessable("invalid_field", format!("url_patterns.{i}: {m}")).with("field", "url_patterns")
        })?;
    }
    if let Some(o) = &b.oauth {
        check_target(state, &o.token_url).map_err(|why| invalid("oauth", format!("token_url: {why}")))?;
        o.check().map_err(|m| invalid("oauth", m))?;
    }
    if let Some(s) = &b.signature {
        s.check(auth_header(b).as_deref()).map_err(|m| invalid("signature", m))?;
    }
    if let Some(r) = &b.success {
        r.check().map_err(|m| invalid("success", m))?;
    }
    Ok(())
}

/// The header the destination's secret or minted token goes in: as named, else
/// `Authorization` for a destination with a grant.
fn auth_header(b: &DestinationBody) -> Option<String> {
    b.auth_header.clone().or_else(|| b.oauth.as_ref().map(|_| "Authorization".to_owned()))
}

/// `PUT /v1/destinations/{name}`: create or replace (its secret, switch and rate slot stay). A
/// new name past the tenant's limit is 409 `limit_reached`; replacing one never is.
#[utoipa::path(put, path = "/v1/destinations/{name}", tag = "destinations", params(("name" = String, Path)),
    request_body = DestinationBody, security(("tenant_key" = [])),
    responses((status = 200, body = DestinationView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, description = "a new destination past the tenant's limit (`limit_reached`)", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<DestinationBody>,
) -> Result<Json<DestinationView>, ApiError> {
    name_of(&name)?;
    check(&state, &b)?;
    let auth = auth_header(&b);
    let new = NewDestination {
        name: &name,
        base_url: &b.base_url,
        auth_header: auth.as_deref(),
        timeout_ms: b.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        rate_per_second: b.rate_per_second.unwrap_or(DEFAULT_RATE_PER_SECOND),
        max_in_flight: b.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT),
        url_patterns: &b.url_patterns,
        oauth: b.oauth.as_ref(),
        signature: b.signature.as_ref(),
        success: b.success.as_ref(),
    };
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    state.quotas.admit_row(&tx, tenant.id, Kind::Destinations, &name).await?;
    let d = destinations::put(&tx, tenant.id, &new).await?;
    tx.commit().await.map_err(StoreError::from)?;
    drop(db);
    Ok(Json(views(&state, tenant.id, vec![d]).await?.remove(0)))
}

/// `GET /v1/destinations`
#[utoipa::path(get, path = "/v1/destinations", tag = "destinations", security(("tenant_key" = [])),
    responses((status = 200, body = DestinationList), (status = 401, body = ErrorBody)))]
pub async fn list(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<DestinationList>, ApiError> {
    let list = destinations::list(&state.pool.get().await.map_err(StoreError::from)?, tenant.id).await?;
    Ok(Json(DestinationList { destinations: views(&state, tenant.id, list).await? }))
}

/// `GET /v1/destinations/{name}`
#[utoipa::path(get, path = "/v1/destinations/{name}", tag = "destinations", params(("name" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = DestinationView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
) -> Result<Json<DestinationView>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let d = destinations::get(&db, tenant.id, &name).await?.ok_or_else(ApiError::not_found)?;
    drop(db);
    Ok(Json(views(&state, tenant.id, vec![d]).await?.remove(0)))
}

/// `DELETE /v1/destinations/{name}`: jobs still calling it fail; its two secrets are deleted
/// with it (503 when the secret store fails: the destination is gone, a DELETE again deletes them).
#[utoipa::path(delete, path = "/v1/destinations/{name}", tag = "destinations", params(("name" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 204, description = "deleted"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let existed = destinations::delete(&db, tenant.id, &name).await?;
    drop(db);
    // Its secrets go with it, so a tenant holds no more secrets than destinations. Also when
    // there was none: a DELETE again finishes what a failed one left.
    purge_secrets(&state, tenant.id, &name).await.map_err(|_| {
        ApiError::unavailable("the destination is deleted but its secrets are not yet; DELETE it again")
    })?;
    if existed { Ok(StatusCode::NO_CONTENT) } else { Err(ApiError::not_found()) }
}

/// Delete a destination's secrets from the secret store (none configured: none to delete).
async fn purge_secrets(state: &AppState, tenant: TenantId, name: &str) -> Result<(), rules::SecretError> {
    let Some(writer) = state.secrets.as_ref() else { return Ok(()) };
    if rules::check_name(name).is_err() {
        return Ok(());
    }
    writer.delete(tenant, name).await.inspect_err(|e| {
        tracing::warn!(event = "relay.destinations.secret_delete_failed", error = %e, "could not delete a destination's secrets");
    })
}

/// `PUT /v1/destinations/{name}/secret`: write the auth header's value to Secrets Manager under
/// this tenant's namespace. Write-only: no route returns it.
#[utoipa::path(put, path = "/v1/destinations/{name}/secret", tag = "destinations", params(("name" = String, Path)),
    request_body = SecretBody, security(("tenant_key" = [])),
    responses((status = 204, description = "stored"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn put_secret(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<SecretBody>,
) -> Result<StatusCode, ApiError> {
    put_plain(&state, tenant.id, &name, Secret::Auth, &b.value).await
}

/// `PUT /v1/destinations/{name}/signing-secret`: write the Standard Webhooks signing secret
/// `webhook.send` signs with, under this tenant's namespace. Write-only: no route returns it.
#[utoipa::path(put, path = "/v1/destinations/{name}/signing-secret", tag = "destinations",
    params(("name" = String, Path)), request_body = SigningSecretBody, security(("tenant_key" = [])),
    responses((status = 204, description = "stored"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "a secret of the other form than the destination's scheme takes (`secret_form_mismatch`)", body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn put_signing_secret(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<SigningSecretBody>,
) -> Result<StatusCode, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let d = destinations::get(&db, tenant.id, &name).await?.ok_or_else(ApiError::not_found)?;
    drop(db);
    signature::check_secret(d.signature.as_ref(), &b.value).map_err(|m| {
        // A secret of the other form than the destination's scheme takes: well formed, but
        // refused by the destination's own state.
        if signature::is_some_form(&b.value) {
            ApiError::new(StatusCode::CONFLICT, "secret_form_mismatch", format!("value: {m}")).with("field", "value")
        } else {
            invalid("value", m)
        }
    })?;
    write_secret(&state, tenant.id, &name, Secret::Signing, &b.value).await
}

/// `PUT /v1/destinations/{name}/client-secret`: write the OAuth grant's client secret under
/// this tenant's namespace. Write-only: no route returns it.
#[utoipa::path(put, path = "/v1/destinations/{name}/client-secret", tag = "destinations",
    params(("name" = String, Path)), request_body = SecretBody, security(("tenant_key" = [])),
    responses((status = 204, description = "stored"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn put_client_secret(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<SecretBody>,
) -> Result<StatusCode, ApiError> {
    put_plain(&state, tenant.id, &name, Secret::ClientSecret, &b.value).await
}

/// `PUT /v1/destinations/{name}/refresh-token`: write the OAuth grant's refresh token under
/// this tenant's namespace. Write-only: no route returns it.
#[utoipa::path(put, path = "/v1/destinations/{name}/refresh-token", tag = "destinations",
    params(("name" = String, Path)), request_body = SecretBody, security(("tenant_key" = [])),
    responses((status = 204, description = "stored"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn put_refresh_token(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<SecretBody>,
) -> Result<StatusCode, ApiError> {
    put_plain(&state, tenant.id, &name, Secret::RefreshToken, &b.value).await
}

/// A secret sent as it is (the auth secret, a client secret, a refresh token): checked, written.
async fn put_plain(
    state: &AppState,
    tenant: TenantId,
    name: &str,
    which: Secret,
    value: &str,
) -> Result<StatusCode, ApiError> {
    if value.is_empty() {
        return Err(invalid("value", "must not be empty"));
    }
    rules::check_value(value).map_err(|m| invalid("value", m))?;
    write_secret(state, tenant, name, which, value).await
}

/// Write one of an existing destination's secrets to the secret store, then note when.
async fn write_secret(
    state: &AppState,
    tenant: TenantId,
    name: &str,
    which: Secret,
    value: &str,
) -> Result<StatusCode, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    destinations::get(&db, tenant, name).await?.ok_or_else(ApiError::not_found)?;
    drop(db);
    let writer = state
        .secrets
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("this deployment has no secret store configured"))?;
    writer.write(tenant, name, which, value).await.map_err(|e| {
        tracing::warn!(event = "relay.destinations.secret_write_failed", error = %e, "could not write a destination's secret");
        ApiError::unavailable("the secret store did not take the value; try again")
    })?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if destinations::secret_written(&db, tenant, name, which).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        // Deleted while the value was written: the value goes too, not kept for no destination.
        drop(db);
        let _ = purge_secrets(state, tenant, name).await;
        Err(ApiError::not_found())
    }
}

/// `PUT /v1/destinations/{name}/writes`: the tenant's own write switch, kept on the destination
/// (removed with it). Off: its jobs are held, not sent. An operator's switch for the destination
/// is another switch, which this neither reads nor changes: a call goes out only when both allow.
#[utoipa::path(put, path = "/v1/destinations/{name}/writes", tag = "destinations", params(("name" = String, Path)),
    request_body = WritesBody, security(("tenant_key" = [])),
    responses((status = 200, body = DestinationView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put_writes(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<WritesBody>,
) -> Result<Json<DestinationView>, ApiError> {
    if b.reason.as_ref().is_some_and(|r| r.len() > 500 || r.contains('\0')) {
        return Err(invalid("reason", "at most 500 characters, no NUL"));
    }
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let d = destinations::set_writes(&db, tenant.id, &name, b.enabled, b.reason.as_deref())
        .await?
        .ok_or_else(ApiError::not_found)?;
    drop(db);
    Ok(Json(views(&state, tenant.id, vec![d]).await?.remove(0)))
}

/// `GET /v1/jobs/{id}/http-calls`: every call of an `http.request` job, oldest first.
#[utoipa::path(get, path = "/v1/jobs/{id}/http-calls", tag = "destinations", params(("id" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 200, body = CallList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn calls(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<CallList>, ApiError> {
    let id = super::jobs::parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    super::jobs::owned(&db, tenant.id, id).await?;
    Ok(Json(CallList { calls: http_calls::for_job(&db, tenant.id, id).await? }))
}

/// What the OpenAPI document says of a destination's grant, success rule and signing secret:
/// what the checks in `destinations` take (the token URL under the base URL's rules;
/// `constraints::apply` calls it).
pub(super) fn schema_rules(schemas: &mut Value, base_url: &str) {
    use crate::destinations::oauth;
    use crate::store::destination_terms::Layout;
    let visible = format!("^[ -~]{{1,{}}}$", oauth::MAX_FIELD_LEN);
    let grant = &mut schemas["OAuth"]["properties"];
    grant["token_url"]["pattern"] = json!(base_url);
    grant["token_url"]["maxLength"] = json!(crate::outbound::MAX_URL_LEN);
    grant["client_id"]["pattern"] = json!(visible);
    grant["scope"]["pattern"] = json!(visible);
    grant["params"]["maxProperties"] = json!(oauth::MAX_PARAMS);
    grant["params"]["propertyNames"] = json!({"pattern": "^[a-z0-9_]{1,64}$", "not": {"enum": oauth::RESERVED}});
    grant["params"]["additionalProperties"] =
        json!({"type": "string", "pattern": format!("^[ -~]{{0,{}}}$", oauth::MAX_FIELD_LEN)});
    let rule = &mut schemas["SuccessRule"]["properties"];
    rule["statuses"]["minItems"] = json!(1);
    rule["statuses"]["items"] = json!({"type": "integer", "minimum": 100, "maximum": 599});
    // Printable ASCII, `~` only as `~0` or `~1` (the server counts the limit in bytes).
    schemas["JsonCheck"]["properties"]["pointer"]["pattern"] = json!("^(/([ -}]|~[01])*)+$");
    // A layout that signs the timestamp (the id) names the header that carries it.
    let without = |signs: fn(Layout) -> bool| -> Vec<Value> {
        Layout::ALL.into_iter().filter(|l| !signs(*l)).map(|l| json!(l)).collect()
    };
    let carried = |signs: fn(Layout) -> bool, header: &str| {
        json!({"anyOf": [{"properties": {"signed": {"enum": without(signs)}}},
                         {"required": [header], "properties": {header: {"type": "string"}}}]})
    };
    schemas["SignatureScheme"]["allOf"] =
        json!([carried(Layout::has_timestamp, "timestamp_header"), carried(Layout::has_id, "id_header")]);
    // Either form; which one a destination takes depends on its scheme (else 409).
    schemas["SigningSecretBody"]["properties"]["value"]["anyOf"] = json!([
        {"pattern": crate::destinations::SIGNING_SECRET_PATTERN},
        {"pattern": format!("^[ -~]{{{},4096}}$", crate::destinations::signature::MIN_RAW_KEY_LEN)},
    ]);
}
