//! Destinations that mint their token: an OAuth 2.0 grant at the destination's `token_url`
//! (RFC 6749 §4.4 client credentials, Zoom's server-to-server `account_credentials`, or §6 a
//! refresh token), the token sent as `Authorization: Bearer …` (the destination's
//! `auth_header`) in place of a stored auth secret.
//!
//! The client secret and the refresh token are the destination's secrets (`Secret::ClientSecret`,
//! `Secret::RefreshToken`: Secrets Manager or the local store, write-only). The token request
//! goes through the same address guard as every call (`outbound::resolve`, on every address
//! the host resolves to), with no pooled connection held across it. The token lives only in
//! the worker's memory (`Tokens`): never in a table, a log line, an error or a preview (shadow
//! mode mints none), and every answer recorded has it redacted.
//!
//! `Tokens` is one cache per process, owned by the tasks the executor runs (never a `static`),
//! keyed by tenant, destination and the version of its grant (its settings and when each of
//! its secrets was written: a new secret mints a new token). Jobs needing a token at once wait
//! for one request. A token is used until `margin` before it expires; a 401 drops it, once
//! for every job that used it, and the job calls once more with the next.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use hyper::body::Bytes;
use serde_json::Value;
use sha2::Digest;

use crate::job::{TaskError, TenantId};
use crate::outbound::{self, AllowList, Limits, Refusal};
pub use crate::store::destination_terms::{ClientAuth, Grant, OAuth};
use crate::store::destinations::Destination;

/// The most extra form fields a grant sends.
pub const MAX_PARAMS: usize = 10;
/// The longest client id, scope or extra field value taken.
pub const MAX_FIELD_LEN: usize = 1024;
/// The time limit of a token request.
pub const TOKEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a token endpoint's answer read.
const MAX_TOKEN_ANSWER: usize = 16 * 1024;
/// How long a token that says nothing of its lifetime (`expires_in`) is used.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// Form fields Relay sets itself.
pub const RESERVED: &[&str] = &["grant_type", "client_id", "client_secret", "refresh_token", "scope"];

fn visible(v: &str) -> bool {
    v.bytes().all(|b| (b' '..=b'~').contains(&b))
}

/// Why a grant's settings are refused, the field first (as the API answers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("client_id: 1 to {} visible ASCII characters", MAX_FIELD_LEN)]
    ClientId,
    #[error("scope: 1 to {} visible ASCII characters", MAX_FIELD_LEN)]
    Scope,
    #[error("params: at most {} fields", MAX_PARAMS)]
    TooManyParams,
    #[error("params.{0}: a name of 1 to 64 lowercase letters, digits or '_', not one Relay sets ({reserved:?})", reserved = RESERVED)]
    ParamName(String),
    #[error("params.{0}: at most {most} visible ASCII characters", most = MAX_FIELD_LEN)]
    ParamValue(String),
}

impl OAuth {
    /// The grant's own checks (the token URL's address is the caller's: `outbound::check_url`).
    pub fn check(&self) -> Result<(), GrantError> {
        if self.client_id.is_empty() || self.client_id.len() > MAX_FIELD_LEN || !visible(&self.client_id) {
            return Err(GrantError::ClientId);
        }
        if self.scope.as_ref().is_some_and(|s| s.is_empty() || s.len() > MAX_FIELD_LEN || !visible(s)) {
            return Err(GrantError::Scope);
        }
        if self.params.len() > MAX_PARAMS {
            return Err(GrantError::TooManyParams);
        }
        for (name, value) in &self.params {
            let named = (1..=64).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !named || RESERVED.contains(&name.as_str()) {
                return Err(GrantError::ParamName(name.clone()));
            }
            if value.len() > MAX_FIELD_LEN || !visible(value) {
                return Err(GrantError::ParamValue(name.clone()));
            }
        }
        Ok(())
    }

    /// Whether minting needs the client secret (a refresh token grant uses one when written).
    pub fn needs_client_secret(&self, dest: &Destination) -> bool {
        self.grant != Grant::RefreshToken || dest.client_secret_set_at.is_some()
    }
}

/// A token minted, as cached.
#[derive(Clone)]
struct Token {
    value: String,
    /// When it stops being used (`margin` before it expires).
    until: Instant,
}

/// The key of one destination's tokens: the tenant, the name and a digest of the grant's
/// version (its settings, when each secret was written).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    tenant: TenantId,
    name: String,
    version: String,
}

impl Key {
    pub fn of(tenant: TenantId, dest: &Destination, oauth: &OAuth) -> Key {
        let mut h = sha2::Sha256::new();
        h.update(serde_json::to_vec(oauth).unwrap_or_default());
        for at in [dest.client_secret_set_at, dest.refresh_token_set_at] {
            h.update(at.map(|t| t.to_rfc3339()).unwrap_or_default());
            h.update(b"|");
        }
        Key { tenant, name: dest.name.clone(), version: hex::encode(h.finalize()) }
    }
}

type Cell = Arc<tokio::sync::Mutex<Option<Token>>>;

/// The tokens this process minted (see the module). Clones share one cache.
#[derive(Clone, Default)]
pub struct Tokens {
    cells: Arc<std::sync::Mutex<HashMap<Key, Cell>>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").finish_non_exhaustive()
    }
}

impl Tokens {
    fn cell(&self, key: &Key) -> Cell {
        let mut cells = self.cells.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !cells.contains_key(key) {
            // A new version: the same destination's older ones are of no more use.
            cells.retain(|k, _| !(k.tenant == key.tenant && k.name == key.name));
        }
        cells.entry(key.clone()).or_default().clone()
    }

    /// The token for `key`: the cached one while it is fresh, else one `mint` makes (callers
    /// asking at once wait for that one request). `stale` (a token the destination refused)
    /// is never returned: it is dropped, and the next one minted.
    pub async fn get<F, Fut>(&self, key: &Key, stale: Option<&str>, mint: F) -> Result<String, TaskError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Minted, TaskError>>,
    {
        let cell = self.cell(key);
        let mut held = cell.lock().await;
        if let Some(t) = held.as_ref()
            && t.until > Instant::now()
            && stale != Some(t.value.as_str())
        {
            return Ok(t.value.clone());
        }
        *held = None;
        let minted = mint().await?;
        let until = Instant::now() + minted.lifetime.saturating_sub(margin(minted.lifetime));
        *held = Some(Token { value: minted.token.clone(), until });
        Ok(minted.token)
    }
}

/// How long before its end a token is no longer used: a tenth of its life, at most a minute.
pub fn margin(lifetime: Duration) -> Duration {
    (lifetime / 10).min(Duration::from_secs(60))
}

/// A token the endpoint gave, for how long, and the refresh token it rotated to (RFC 6749
/// §6: an answer may carry a new `refresh_token`, and the old one may stop working), which
/// the caller stores in place of the one sent.
pub struct Minted {
    pub token: String,
    pub lifetime: Duration,
    pub rotated: Option<String>,
}

/// What minting needs: the grant, its secrets (read by the caller), the guard's allow-list.
pub struct Mint<'a> {
    pub oauth: &'a OAuth,
    pub client_secret: Option<String>,
    pub refresh_token: Option<String>,
    pub allow: &'a AllowList,
}

/// `application/x-www-form-urlencoded` of one value.
fn form_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => (b as char).to_string(),
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Mint<'_> {
    /// The form the token request carries, and its Basic credentials when `client_auth` is basic.
    fn form(&self) -> (String, Option<String>) {
        let o = self.oauth;
        let grant = match o.grant {
            Grant::ClientCredentials => "client_credentials",
            Grant::AccountCredentials => "account_credentials",
            Grant::RefreshToken => "refresh_token",
        };
        let mut fields: Vec<(&str, &str)> = vec![("grant_type", grant)];
        if let Some(r) = &self.refresh_token {
            fields.push(("refresh_token", r));
        }
        if let Some(s) = &o.scope {
            fields.push(("scope", s));
        }
        fields.extend(o.params.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let basic = match (o.client_auth, &self.client_secret) {
            (ClientAuth::Basic, Some(secret)) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{}:{secret}", o.client_id))
            )),
            (ClientAuth::Basic, None) => {
                fields.push(("client_id", &o.client_id));
                None
            }
            (ClientAuth::Body, secret) => {
                fields.push(("client_id", &o.client_id));
                if let Some(s) = secret {
                    fields.push(("client_secret", s));
                }
                None
            }
        };
        let body = fields.iter().map(|(n, v)| format!("{n}={}", form_encode(v))).collect::<Vec<_>>().join("&");
        (body, basic)
    }

    /// Ask the token endpoint for a token. Its failures are the tenant's (its endpoint, its
    /// secrets): a refusal fails the job, a 408/429/5xx or no connection is retried. What the
    /// endpoint answered is in the error with the client secret and refresh token taken out;
    /// a successful answer (which holds the token) is never kept.
    pub async fn mint(&self) -> Result<Minted, TaskError> {
        let url = &self.oauth.token_url;
        let target = outbound::parse_url(url)
            .map_err(|e| TaskError::Fatal(format!("oauth.token_url {url:?}: {e}")).tenants())?;
        let addr = match outbound::resolve(&target, self.allow).await {
            Ok(a) => a,
            Err(r @ Refusal::Address { .. }) => return Err(TaskError::Fatal(format!("oauth.token_url: {r}")).tenants()),
            Err(r @ Refusal::Resolve { .. }) => {
                return Err(TaskError::retryable(format!("oauth.token_url: {r}")).tenants());
            }
        };
        let (form, basic) = self.form();
        let mut headers: Vec<(&str, String)> = vec![("accept", "application/json".into())];
        if let Some(b) = basic {
            headers.push(("authorization", b));
        }
        let limits = Limits {
            timeout: TOKEN_TIMEOUT,
            body: MAX_TOKEN_ANSWER,
            read_body: |_| true,
            content_type: "application/x-www-form-urlencoded",
        };
        let what = format!("the token request to {url}");
        let answer = outbound::request(&target, addr, hyper::Method::POST, &headers, Bytes::from(form), limits)
            .await
            .map_err(|e| TaskError::Retryable(format!("{what}: {e}")).tenants())?;
        if !(200..300).contains(&answer.status) {
            let secrets: Vec<&str> =
                [&self.client_secret, &self.refresh_token].into_iter().flatten().map(String::as_str).collect();
            let a = super::answer::redact(answer, &secrets);
            let body: String = String::from_utf8_lossy(&a.body).chars().take(500).collect();
            let error = format!("{what}: answered {}: {body}", a.status);
            return Err(if super::answer::retryable_status(a.status) {
                TaskError::Retryable(error)
            } else {
                TaskError::Fatal(error)
            }
            .tenants());
        }
        let parsed: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let token = parsed["access_token"].as_str().filter(|t| !t.is_empty() && super::check_value(t).is_ok());
        let Some(token) = token else {
            let why = "its answer has no access_token of visible ASCII (at most 4096 characters)";
            return Err(TaskError::Fatal(format!("{what}: {why}")).tenants());
        };
        let lifetime = parsed["expires_in"]
            .as_u64()
            .or_else(|| parsed["expires_in"].as_str().and_then(|s| s.parse().ok()))
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        let rotated = parsed["refresh_token"]
            .as_str()
            .filter(|r| self.refresh_token.is_some() && Some(*r) != self.refresh_token.as_deref())
            .filter(|r| !r.is_empty() && super::check_value(r).is_ok())
            .map(str::to_owned);
        Ok(Minted { token: token.to_owned(), lifetime, rotated })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn grant() -> OAuth {
        OAuth {
            grant: Grant::AccountCredentials,
            token_url: "https://zoom.us/oauth/token".into(),
            client_id: "id".into(),
            scope: Some("meeting:write user:read".into()),
            client_auth: ClientAuth::Basic,
            params: BTreeMap::from([("account_id".into(), "acc 1&x".into())]),
        }
    }

    #[test]
    fn the_form_and_the_basic_credentials() {
        let o = grant();
        let m = Mint { oauth: &o, client_secret: Some("s3".into()), refresh_token: None, allow: &AllowList::default() };
        let (form, basic) = m.form();
        assert_eq!(form, "grant_type=account_credentials&scope=meeting%3Awrite+user%3Aread&account_id=acc+1%26x");
        assert_eq!(basic.as_deref(), Some("Basic aWQ6czM="));
        let body = OAuth { client_auth: ClientAuth::Body, grant: Grant::RefreshToken, ..grant() };
        let m =
            Mint { oauth: &body, client_secret: None, refresh_token: Some("r/1".into()), allow: &AllowList::default() };
        let (form, basic) = m.form();
        assert_eq!(basic, None);
        assert!(
            form.starts_with("grant_type=refresh_token&refresh_token=r%2F1&") && form.ends_with("&client_id=id"),
            "{form}"
        );
    }

    #[test]
    fn grants_are_checked_and_margins_are_short() {
        assert!(grant().check().is_ok());
        let bad = [
            OAuth { client_id: String::new(), ..grant() },
            OAuth { client_id: "x".repeat(1025), ..grant() },
            OAuth { scope: Some("a\nb".into()), ..grant() },
            OAuth { params: BTreeMap::from([("grant_type".into(), "password".into())]), ..grant() },
            OAuth { params: BTreeMap::from([("Bad-Name".into(), "v".into())]), ..grant() },
            OAuth { params: (0..11).map(|i| (format!("p{i}"), "v".into())).collect(), ..grant() },
        ];
        for o in bad {
            assert!(o.check().is_err(), "{o:?}");
        }
        assert_eq!(margin(Duration::from_secs(3600)), Duration::from_secs(60));
        assert_eq!(margin(Duration::from_secs(30)), Duration::from_secs(3));
    }
}
