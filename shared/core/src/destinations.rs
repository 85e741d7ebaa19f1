//! A tenant's HTTP destinations, the targets of `http.request` and `webhook.send`: the rules
//! their names, the paths and the headers of a call follow, and a destination's two secrets
//! (the auth header's value, and the Standard Webhooks signing secret: `Secret`).
//!
//! The secret lives in Secrets Manager under a name Relay derives, never one a tenant writes:
//! `<root>/tenants/<tenant id>/destinations/<name>`, the root `relay/<stack>` on AWS
//! (`RELAY_SECRET_ROOT`, so two stacks in one account keep apart), `relay` elsewhere. A tenant
//! therefore cannot make Relay read another tenant's secret, nor the platform's; IAM holds the
//! same line (the task roles may read their session's tenant's only, the intake function may
//! write under its own stack's root only). The value is
//! written through the API (`PUT /v1/destinations/{name}/secret`) and read at run time under
//! the `http.request` task's own role; no table holds it and no answer returns it. Where there
//! is no Secrets Manager (`relay dev`, or `RELAY_SECRETS_DIR`), the local store (`local`) keeps
//! it, encrypted at rest, behind the same API.

pub mod answer;
pub mod call;
pub mod local;
pub mod oauth;
pub mod patterns;
pub mod signature;
pub mod success;
pub mod task;
pub mod webhook;

use std::sync::Arc;

use aws_sdk_secretsmanager::error::{DisplayErrorContext, ProvideErrorMetadata};

use crate::job::TenantId;

/// A destination's name: lowercase letters, digits, `_` and `-`, 1 to 63, starting with a
/// letter or digit.
pub const NAME_PATTERN: &str = "^[a-z0-9][a-z0-9_-]{0,62}$";
/// The root of every tenant's destination secrets in Secrets Manager unless
/// `set_secret_root` named another.
pub const DEFAULT_SECRET_ROOT: &str = "relay";
/// What a root may be (`check_secret_root`).
pub const SECRET_ROOT_RULE: &str =
    "1 to 256 letters, digits and '/_+=.@-', neither starting nor ending with '/', no '//'";
/// The longest path (with its query) a call may name.
pub const MAX_PATH_LEN: usize = 2000;
/// The longest header value, and secret value, taken.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;
/// The most headers a call may add.
pub const MAX_HEADERS: usize = 50;

/// Headers a call may not set: hop-by-hop ones, those of the connection, and Relay's own.
pub const REFUSED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
    "idempotency-key",
    "x-relay-correlation-id",
];

pub fn check_name(name: &str) -> Result<(), &'static str> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok { Ok(()) } else { Err("1 to 63 lowercase letters, digits, '_' or '-', starting with a letter or digit") }
}

static SECRET_ROOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Set the process's secret root (`RELAY_SECRET_ROOT`; the first call wins).
pub fn set_secret_root(root: &str) {
    let _ = SECRET_ROOT.set(root.to_owned());
}

/// The process's secret root.
pub fn secret_root() -> &'static str {
    SECRET_ROOT.get().map_or(DEFAULT_SECRET_ROOT, String::as_str)
}

/// A root as Secrets Manager names take it (`SECRET_ROOT_RULE`).
pub fn check_secret_root(root: &str) -> Result<(), &'static str> {
    let ok = (1..=256).contains(&root.len())
        && !root.starts_with('/')
        && !root.ends_with('/')
        && !root.contains("//")
        && root.chars().all(|c| c.is_ascii_alphanumeric() || "/_+=.@-".contains(c));
    if ok { Ok(()) } else { Err(SECRET_ROOT_RULE) }
}

/// The Secrets Manager name of a destination's secret.
pub fn secret_id(tenant: TenantId, name: &str) -> String {
    secret_id_under(secret_root(), tenant, name)
}

/// The same under a given root.
pub fn secret_id_under(root: &str, tenant: TenantId, name: &str) -> String {
    format!("{root}/tenants/{tenant}/destinations/{name}")
}

/// Which of a destination's secrets (the store notes when each was written).
pub use crate::store::destinations::Secret;

impl Secret {
    /// Every kind, as a destination's deletion removes them.
    pub const ALL: [Secret; 4] = [Secret::Auth, Secret::Signing, Secret::ClientSecret, Secret::RefreshToken];

    /// The Secrets Manager name: the auth secret's is `secret_id`; the others have `/signing`,
    /// `/client-secret` or `/refresh-token` after it (still under the tenant's `destinations/`).
    pub fn id(self, tenant: TenantId, name: &str) -> String {
        let base = secret_id(tenant, name);
        match self {
            Secret::Auth => base,
            Secret::Signing => format!("{base}/signing"),
            Secret::ClientSecret => format!("{base}/client-secret"),
            Secret::RefreshToken => format!("{base}/refresh-token"),
        }
    }
}

/// Why a header a call adds, or a secret (sent as a header value), is refused. The message
/// says what to fix; an API answer shows it after the field's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("a header name is 1 to 64 token characters (letters, digits, !#$%&'*+-.^_`|~)")]
    Name,
    #[error("{0} may not be set (hop-by-hop, connection or Relay's own header)")]
    Refused(String),
    #[error("{0} is the destination's auth header: Relay sets it from the destination's secret")]
    AuthHeader(String),
    #[error("a header value is at most {MAX_HEADER_VALUE_LEN} visible ASCII characters, spaces or tabs")]
    Value,
    #[error("is empty")]
    Empty,
    #[error("a signing secret is whsec_ followed by base64 (as `openssl rand -base64 32` prints)")]
    NotWhsec,
    #[error("the key is 24 to 64 bytes (this one is {0})")]
    KeyLength(usize),
    #[error("a raw signing key is at least {} characters", signature::MIN_RAW_KEY_LEN)]
    RawKeyShort,
}

/// A signing secret as Standard Webhooks writes it: `whsec_` and the base64 of 24 to 64
/// random bytes.
pub fn check_signing_secret(value: &str) -> Result<(), HeaderError> {
    use base64::Engine;
    let key = value
        .strip_prefix("whsec_")
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .ok_or(HeaderError::NotWhsec)?;
    if !(24..=64).contains(&key.len()) {
        return Err(HeaderError::KeyLength(key.len()));
    }
    Ok(())
}

/// A `whsec_` signing secret as a pattern: `whsec_` and canonical base64 (the padding bits
/// zero) of 24 to 64 bytes, exactly what `check_signing_secret` takes.
pub const SIGNING_SECRET_PATTERN: &str = "^whsec_(([A-Za-z0-9+/]{4}){8,20}([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?|([A-Za-z0-9+/]{4}){21}([A-Za-z0-9+/][AQgw]==)?)$";

/// A call's path: `/` and URL characters (`%` only as an escape), an optional query, at most
/// `MAX_PATH_LEN`; no scheme or host (`//…`), no `.` or `..` segment (escaped or not), no
/// fragment or backslash. It is appended to the destination's base URL.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    if path.len() > MAX_PATH_LEN {
        return Err("at most 2000 characters");
    }
    if !path.starts_with('/') || path.starts_with("//") {
        return Err("must start with a single '/' (a path under the destination's base URL, no scheme or host)");
    }
    let bytes = path.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        let ok = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?".contains(b);
        let escape =
            *b == b'%' && bytes.len() > i + 2 && bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit();
        if !ok && !escape {
            return Err("URL characters only ('%' only as an escape; no space, '#', '\\' or control characters)");
        }
    }
    let route = path.split('?').next().unwrap_or_default();
    let dots = route.split('/').any(|seg| {
        let seg = seg.to_ascii_lowercase().replace("%2e", ".");
        seg == "." || seg == ".."
    });
    if dots || route.to_ascii_lowercase().contains("%2f") || route.to_ascii_lowercase().contains("%5c") {
        return Err("no '.' or '..' segments, and no escaped '/' or '\\'");
    }
    Ok(())
}

/// The URL a call goes to: the base URL (no trailing `/`) and the path.
pub fn join(base_url: &str, path: &str) -> String {
    format!("{}{path}", base_url.trim_end_matches('/'))
}

/// A header a call adds: a token name that is not refused (nor `auth_header`, the
/// destination's own), and a value of visible characters, spaces and tabs.
pub fn check_header(name: &str, value: &str, auth_header: Option<&str>) -> Result<(), HeaderError> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 64 || !name.bytes().all(token) {
        return Err(HeaderError::Name);
    }
    let lower = name.to_ascii_lowercase();
    if REFUSED_HEADERS.contains(&lower.as_str()) {
        return Err(HeaderError::Refused(name.to_owned()));
    }
    if auth_header.is_some_and(|a| a.eq_ignore_ascii_case(name)) {
        return Err(HeaderError::AuthHeader(name.to_owned()));
    }
    check_value(value)
}

/// A header value (and a secret, which is sent as one): visible ASCII, spaces and tabs.
pub fn check_value(value: &str) -> Result<(), HeaderError> {
    if value.len() > MAX_HEADER_VALUE_LEN || !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        return Err(HeaderError::Value);
    }
    Ok(())
}

/// Why a destination's secret could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// No value was ever written.
    #[error(
        "the secret {0} has no value: PUT /v1/destinations/<name>/secret (or /signing-secret, /client-secret, /refresh-token, as its name ends) first"
    )]
    Missing(String),
    #[error("the secret {0} is not a string")]
    NotAString(String),
    /// Secrets Manager failed or refused (the message has the whole cause chain).
    #[error("secrets manager: {0}")]
    Service(String),
}

/// Read a destination's secret with the given configuration (the task's own role).
pub async fn read_secret(
    sdk: &aws_config::SdkConfig,
    tenant: TenantId,
    name: &str,
    which: Secret,
) -> Result<String, SecretError> {
    let id = which.id(tenant, name);
    let client = aws_sdk_secretsmanager::Client::new(sdk);
    match client.get_secret_value().secret_id(&id).send().await {
        Ok(out) => out.secret_string().map(str::to_owned).ok_or(SecretError::NotAString(id)),
        Err(e) if e.code() == Some("ResourceNotFoundException") => Err(SecretError::Missing(id)),
        Err(e) => Err(SecretError::Service(DisplayErrorContext(&e).to_string())),
    }
}

/// Writes destination secrets: to Secrets Manager (the intake function's own identity, allowed
/// `<root>/tenants/*/destinations/*`), or to the local store.
#[derive(Clone, Debug)]
pub enum SecretWriter {
    Aws(aws_sdk_secretsmanager::Client),
    Local(Arc<local::LocalSecrets>),
}

impl SecretWriter {
    pub fn new(sdk: &aws_config::SdkConfig) -> Self {
        SecretWriter::Aws(aws_sdk_secretsmanager::Client::new(sdk))
    }

    /// Create the secret, or put a new value when it exists.
    pub async fn write(&self, tenant: TenantId, name: &str, which: Secret, value: &str) -> Result<(), SecretError> {
        let client = match self {
            SecretWriter::Aws(client) => client,
            SecretWriter::Local(store) => {
                let (store, name, value) = (store.clone(), name.to_owned(), value.to_owned());
                return tokio::task::spawn_blocking(move || store.write(tenant, &name, which, &value))
                    .await
                    .map_err(|e| SecretError::Service(e.to_string()))?;
            }
        };
        let id = which.id(tenant, name);
        let created = client.create_secret().name(&id).secret_string(value).send().await;
        match created {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ResourceExistsException") => {
                let put = client.put_secret_value().secret_id(&id).secret_string(value).send().await;
                put.map(|_| ()).map_err(|e| SecretError::Service(DisplayErrorContext(&e).to_string()))
            }
            Err(e) => Err(SecretError::Service(DisplayErrorContext(&e).to_string())),
        }
    }

    /// Put a new value in a secret that exists (a rotated refresh token: the task roles may
    /// put, not create).
    pub async fn replace(&self, tenant: TenantId, name: &str, which: Secret, value: &str) -> Result<(), SecretError> {
        let SecretWriter::Aws(client) = self else { return self.write(tenant, name, which, value).await };
        let id = which.id(tenant, name);
        let put = client.put_secret_value().secret_id(&id).secret_string(value).send().await;
        put.map(|_| ()).map_err(|e| SecretError::Service(DisplayErrorContext(&e).to_string()))
    }

    /// Delete every secret of a destination's, at once and for good (Secrets Manager's
    /// recovery window is skipped: the destination they belonged to is gone, and a new one of
    /// the same name starts without them). A secret that does not exist is no error.
    pub async fn delete(&self, tenant: TenantId, name: &str) -> Result<(), SecretError> {
        let client = match self {
            SecretWriter::Aws(client) => client,
            SecretWriter::Local(store) => {
                let (store, name) = (store.clone(), name.to_owned());
                return tokio::task::spawn_blocking(move || store.delete(tenant, &name))
                    .await
                    .map_err(|e| SecretError::Service(e.to_string()))?;
            }
        };
        for which in Secret::ALL {
            let id = which.id(tenant, name);
            match client.delete_secret().secret_id(&id).force_delete_without_recovery(true).send().await {
                Ok(_) => {}
                Err(e) if e.code() == Some("ResourceNotFoundException") => {}
                Err(e) => return Err(SecretError::Service(DisplayErrorContext(&e).to_string())),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern takes exactly what the check takes: every length of key, and the same key
    /// with padding bits set (which the decoder refuses).
    #[test]
    fn the_signing_secrets_pattern_is_the_check() {
        use base64::Engine;
        let re = regex::Regex::new(SIGNING_SECRET_PATTERN).unwrap();
        for n in 0..=70usize {
            for fill in [0u8, 0x5a, 0xff] {
                let b64 = base64::engine::general_purpose::STANDARD.encode(vec![fill; n]);
                let mut cases = vec![format!("whsec_{b64}")];
                // The last character before the padding with a low bit set: not canonical.
                if let Some(at) = b64.find('=').and_then(|i| i.checked_sub(1)) {
                    let mut odd = b64.clone().into_bytes();
                    odd[at] = if odd[at] == b'B' { b'C' } else { b'B' };
                    cases.push(format!("whsec_{}", String::from_utf8(odd).unwrap()));
                }
                for case in cases {
                    assert_eq!(re.is_match(&case), check_signing_secret(&case).is_ok(), "{n} bytes: {case}");
                }
            }
        }
    }

    #[test]
    fn names_follow_the_pattern() {
        let re = regex::Regex::new(NAME_PATTERN).unwrap();
        for n in ["crm", "crm-eu_2", "0x"] {
            assert!(check_name(n).is_ok() && re.is_match(n), "{n}");
        }
        for n in ["", "CRM", "-crm", "a/b", "a:b", "a.b", &"x".repeat(64), "crm\n", "é"] {
            assert!(check_name(n).is_err() && !re.is_match(n), "{n:?}");
        }
    }

    #[test]
    fn paths_stay_under_the_base_url() {
        for p in ["/", "/v1/contacts", "/v1/contacts?email=a%40b.example&x=1", "/a/b.c/..d"] {
            assert!(check_path(p).is_ok(), "{p}");
        }
        for p in [
            "",
            "v1",
            "//evil.example/x",
            "/../admin",
            "/a/./b",
            "/a/%2e%2E/b",
            "/a/%2fetc",
            "/a b",
            "/a#b",
            "/a\\b",
            "/a\r\nHost: x",
            "/%zz",
            "/%4",
            "http://x/",
        ] {
            assert!(check_path(p).is_err(), "{p:?}");
        }
        assert_eq!(join("https://api.example/base/", "/v1/x"), "https://api.example/base/v1/x");
    }

    #[test]
    fn headers_refuse_hop_by_hop_host_and_the_auth_header() {
        assert!(check_header("X-Tenant-Ref", "abc 123", Some("Authorization")).is_ok());
        for n in
            ["Host", "connection", "Transfer-Encoding", "Idempotency-Key", "X-Relay-Correlation-Id", "Content-Length"]
        {
            assert!(check_header(n, "x", None).is_err(), "{n}");
        }
        assert!(check_header("authorization", "x", Some("Authorization")).is_err());
        assert!(check_header("X-A", "a\r\nX-B: b", None).is_err());
        assert!(check_header("X-A", "\0", None).is_err());
        assert!(check_header("X A", "a", None).is_err());
        assert!(check_header("X:A", "a", None).is_err());
    }

    #[test]
    fn a_secret_name_is_derived_under_the_tenant() {
        let t = TenantId::new();
        assert_eq!(secret_id(t, "crm"), format!("relay/tenants/{t}/destinations/crm"));
        assert_eq!(secret_id_under("relay/prod", t, "crm"), format!("relay/prod/tenants/{t}/destinations/crm"));
        assert!(check_secret_root("relay/prod-2").is_ok() && check_secret_root("relay").is_ok());
        for bad in ["", "/relay", "relay/", "relay//x", "relay/a b", "relay/*"] {
            assert!(check_secret_root(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Secret::Signing.id(t, "crm"), format!("relay/tenants/{t}/destinations/crm/signing"));
    }

    #[test]
    fn signing_secrets_are_whsec_and_base64_of_24_to_64_bytes() {
        assert!(check_signing_secret(&crate::callbacks::new_secret()).is_ok());
        for bad in ["", "whsec_", "whsec_!!!", "secret", "whsec_c2hvcnQ=", &format!("whsec_{}", "A".repeat(100))] {
            assert!(check_signing_secret(bad).is_err(), "{bad}");
        }
    }
}
