//! What a destination's JSON columns hold: its OAuth grant (`oauth`), its signature scheme
//! (`signature`) and its success rule (`success`), as the store reads and writes them. What
//! each does lives with it in `crate::destinations` (`oauth`, `signature`, `success`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// Which grant mints the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// RFC 6749 §4.4: the client's id and secret.
    ClientCredentials,
    /// Zoom's server-to-server OAuth: as client credentials, `grant_type=account_credentials`
    /// (its `account_id` goes in `params`).
    AccountCredentials,
    /// RFC 6749 §6: the destination's refresh token (`PUT …/refresh-token`), with the client
    /// secret when one is written.
    RefreshToken,
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// HTTP Basic with the client id and secret (RFC 6749 §2.3.1, what every server takes).
    #[default]
    Basic,
    /// `client_id` and `client_secret` as form fields.
    Body,
}

/// A destination's grant (`PUT /v1/destinations/{name}`'s `oauth`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuth {
    pub grant: Grant,
    /// The token endpoint: `https://…` (http only for an allow-listed host), under the same
    /// address guard as the destination.
    #[schema(min_length = 1, max_length = 2000)]
    pub token_url: String,
    /// The client's id (not a secret; the client secret is `PUT …/client-secret`).
    #[schema(min_length = 1, max_length = 1024)]
    pub client_id: String,
    /// The scope asked for, as the server spells it (space-separated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub scope: Option<String>,
    #[serde(default)]
    pub client_auth: ClientAuth,
    /// Extra form fields, not secret (Zoom's `account_id`, an `audience`): at most 10, names
    /// of lowercase letters, digits and `_`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

/// What the HMAC is computed over (`.` and `:` are literal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Layout {
    /// `{id}.{timestamp}.{body}` (Standard Webhooks, Svix).
    #[serde(rename = "id.timestamp.body")]
    IdTimestampBody,
    /// `{timestamp}.{body}` (AI Shipping Labs, Stripe's signed payload).
    #[serde(rename = "timestamp.body")]
    TimestampBody,
    /// `v0:{timestamp}:{body}` (Slack's request signing).
    #[serde(rename = "v0:timestamp:body")]
    V0TimestampBody,
    /// The body alone (GitHub's `X-Hub-Signature-256`, Shopify).
    #[serde(rename = "body")]
    Body,
}

impl Layout {
    pub const ALL: [Layout; 4] =
        [Layout::IdTimestampBody, Layout::TimestampBody, Layout::V0TimestampBody, Layout::Body];
}

/// How the digest is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Hex,
    Base64,
}

/// What the signing secret is to the HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyForm {
    /// The secret's own bytes (at least 8 visible ASCII characters).
    Raw,
    /// `whsec_` and base64: the decoded bytes (as Standard Webhooks).
    Whsec,
}

/// A signature scheme other than Standard Webhooks (always HMAC-SHA256).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignatureScheme {
    pub signed: Layout,
    pub encoding: Encoding,
    /// Written before the digest, e.g. `sha256=` or `v1,`: at most 16 letters, digits and `=,:_-`.
    #[serde(default)]
    #[schema(max_length = 16, pattern = "^[A-Za-z0-9=,:_-]{0,16}$")]
    pub prefix: String,
    pub key: KeyForm,
    /// The header the signature goes in.
    #[schema(pattern = "^[A-Za-z0-9-]{1,64}$")]
    pub signature_header: String,
    /// The header the timestamp (unix seconds) goes in; required when the layout signs it.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9-]{1,64}$")]
    pub timestamp_header: Option<String>,
    /// The header the delivery's id goes in; required when the layout signs it.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9-]{1,64}$")]
    pub id_header: Option<String>,
}

/// Which answers succeed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SuccessRule {
    /// The statuses that may succeed (100 to 599, at most 20); absent: any 2xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 20)]
    pub statuses: Option<Vec<u16>>,
    /// A check on a JSON answer: the value at `pointer` must equal `equals`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object_or_null")]
    pub json: Option<JsonCheck>,
    /// Whether a failed rule is retried like a 5xx (true) or fails the job (false, the default).
    #[serde(default)]
    pub retry: bool,
}

/// The value a JSON answer must hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonCheck {
    /// An RFC 6901 JSON pointer into the answer's body, e.g. `/ok` or `/data/0/status`.
    #[schema(min_length = 1, max_length = 256, pattern = "^(/([^~]|~[01])*)+$")]
    pub pointer: String,
    /// The value that must be there (compared as JSON: `true` is not `"true"`); at most 1 KiB.
    pub equals: Value,
}

/// An optional object as a request writes it: absent or `null` is `None`, anything but a JSON
/// object is refused (serde's derived structs would also read an array of their fields in order).
pub fn object_or_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => serde_json::from_value(v).map(Some).map_err(D::Error::custom),
        Some(_) => Err(D::Error::custom("an object or null")),
    }
}
