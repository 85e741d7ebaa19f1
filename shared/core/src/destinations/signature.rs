//! How `webhook.send` signs a delivery. By default (a destination with no `signature`) the
//! Standard Webhooks way (`crate::callbacks`: `webhook-id`, `webhook-timestamp`,
//! `webhook-signature: v1,<base64>` over `{id}.{timestamp}.{body}`, a `whsec_` key). A
//! destination whose receivers already check another HMAC scheme names it instead, from a
//! closed set of choices (never code): always HMAC-SHA256; what is signed, one of four layouts;
//! hex or base64; a short literal prefix; the key as the secret's own bytes or `whsec_` base64;
//! and the header names. AI Shipping Labs' trigger webhooks, for one:
//!
//! ```json
//! {"signed": "timestamp.body", "encoding": "hex", "prefix": "sha256=", "key": "raw",
//!  "signature_header": "X-AISL-Signature", "timestamp_header": "X-AISL-Timestamp",
//!  "id_header": "X-AISL-Event-Id"}
//! ```
//!
//! The timestamp is the attempt's time in unix seconds; the id is the delivery's (`wh_<job
//! id>`, the same on every attempt).

use crate::plain::NameValue;
pub use crate::store::destination_terms::{Encoding, KeyForm, Layout, SignatureScheme};
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The longest prefix taken.
pub const MAX_PREFIX_LEN: usize = 16;
/// The shortest raw key taken.
pub const MIN_RAW_KEY_LEN: usize = 8;

impl Layout {
    pub fn has_timestamp(self) -> bool {
        !matches!(self, Layout::Body)
    }
    pub fn has_id(self) -> bool {
        matches!(self, Layout::IdTimestampBody)
    }
}

/// Headers a scheme may not name besides `REFUSED_HEADERS`: those Relay sets on every call.
pub const OWN_HEADERS: &[&str] = &["user-agent", "webhook-id", "webhook-timestamp", "webhook-signature"];

/// Why a signature scheme is refused; the message leads with the scheme's field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemeError {
    #[error("prefix: at most {MAX_PREFIX_LEN} letters, digits and '=,:_-'")]
    Prefix,
    #[error("{0}: 1 to 64 letters, digits or '-'")]
    HeaderName(&'static str),
    #[error("{0}: {1} is a header Relay sets itself")]
    OwnHeader(&'static str, String),
    #[error("{0}: {1} is already another header of the destination's")]
    Taken(&'static str, String),
    #[error("timestamp_header: required, the layout signs the timestamp")]
    NoTimestampHeader,
    #[error("id_header: required, the layout signs the id")]
    NoIdHeader,
}

impl SignatureScheme {
    /// The scheme's own checks; `auth_header` is the destination's.
    pub fn check(&self, auth_header: Option<&str>) -> Result<(), SchemeError> {
        if self.prefix.len() > MAX_PREFIX_LEN
            || !self.prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"=,:_-".contains(&b))
        {
            return Err(SchemeError::Prefix);
        }
        let names = [
            ("signature_header", Some(&self.signature_header)),
            ("timestamp_header", self.timestamp_header.as_ref()),
            ("id_header", self.id_header.as_ref()),
        ];
        let mut seen: Vec<String> = Vec::new();
        for (field, name) in names {
            let Some(name) = name else { continue };
            let lower = name.to_ascii_lowercase();
            if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(SchemeError::HeaderName(field));
            }
            if super::REFUSED_HEADERS.contains(&lower.as_str()) || OWN_HEADERS.contains(&lower.as_str()) {
                return Err(SchemeError::OwnHeader(field, name.clone()));
            }
            if auth_header.is_some_and(|a| a.eq_ignore_ascii_case(name)) || seen.contains(&lower) {
                return Err(SchemeError::Taken(field, name.clone()));
            }
            seen.push(lower);
        }
        if self.signed.has_timestamp() && self.timestamp_header.is_none() {
            return Err(SchemeError::NoTimestampHeader);
        }
        if self.signed.has_id() && self.id_header.is_none() {
            return Err(SchemeError::NoIdHeader);
        }
        Ok(())
    }

    /// The headers of one delivery signed under `secret`.
    fn headers(&self, secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<NameValue> {
        let key = match self.key {
            KeyForm::Raw => secret.as_bytes().to_vec(),
            KeyForm::Whsec => {
                let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
                base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default()
            }
        };
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("HMAC takes any key length");
        let head = match self.signed {
            Layout::IdTimestampBody => format!("{msg_id}.{timestamp}."),
            Layout::TimestampBody => format!("{timestamp}."),
            Layout::V0TimestampBody => format!("v0:{timestamp}:"),
            Layout::Body => String::new(),
        };
        mac.update(head.as_bytes());
        mac.update(body);
        let digest = mac.finalize().into_bytes();
        let written = match self.encoding {
            Encoding::Hex => hex::encode(digest),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(digest),
        };
        let mut out = vec![(self.signature_header.clone(), format!("{}{written}", self.prefix))];
        if let Some(h) = &self.timestamp_header {
            out.push((h.clone(), timestamp.to_string()));
        }
        if let Some(h) = &self.id_header {
            out.push((h.clone(), msg_id.to_owned()));
        }
        out
    }
}

/// Whether `value` is a signing secret the scheme (none: Standard Webhooks) can use.
pub fn check_secret(scheme: Option<&SignatureScheme>, value: &str) -> Result<(), super::HeaderError> {
    check_key(scheme.map_or(KeyForm::Whsec, |s| s.key), value)
}

/// Whether `value` is a signing secret some scheme could use (`whsec_` or raw).
pub fn is_some_form(value: &str) -> bool {
    [KeyForm::Whsec, KeyForm::Raw].into_iter().any(|key| check_key(key, value).is_ok())
}

fn check_key(key: KeyForm, value: &str) -> Result<(), super::HeaderError> {
    match key {
        KeyForm::Whsec => super::check_signing_secret(value),
        KeyForm::Raw => {
            if value.len() < MIN_RAW_KEY_LEN {
                return Err(super::HeaderError::RawKeyShort);
            }
            super::check_value(value)
        }
    }
}

/// The signature headers of one delivery: the scheme's, or Standard Webhooks' when none.
pub fn headers(
    scheme: Option<&SignatureScheme>,
    secret: &str,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Vec<NameValue> {
    match scheme {
        Some(s) => s.headers(secret, msg_id, timestamp, body),
        None => vec![
            ("webhook-id".into(), msg_id.to_owned()),
            ("webhook-timestamp".into(), timestamp.to_string()),
            ("webhook-signature".into(), crate::callbacks::signature_header(&[secret], msg_id, timestamp, body)),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standard() -> SignatureScheme {
        SignatureScheme {
            signed: Layout::IdTimestampBody,
            encoding: Encoding::Base64,
            prefix: "v1,".into(),
            key: KeyForm::Whsec,
            signature_header: "webhook-signature-x".into(),
            timestamp_header: Some("webhook-timestamp-x".into()),
            id_header: Some("webhook-id-x".into()),
        }
    }

    /// Standard Webhooks written as a scheme signs exactly as the default does.
    #[test]
    fn the_scheme_set_covers_standard_webhooks() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let ours = headers(Some(&standard()), secret, "msg_1", 1_700_000_000, b"{}");
        let default = headers(None, secret, "msg_1", 1_700_000_000, b"{}");
        assert_eq!(ours[0].1, default[2].1);
        assert_eq!((ours[1].1.as_str(), ours[2].1.as_str()), ("1700000000", "msg_1"));
    }

    #[test]
    fn schemes_are_checked() {
        assert!(standard().check(None).is_ok());
        let with = |f: &dyn Fn(&mut SignatureScheme)| {
            let mut s = standard();
            f(&mut s);
            s
        };
        let bad = [
            with(&|s| s.prefix = "x".repeat(17)),
            with(&|s| s.prefix = "a b".into()),
            with(&|s| s.signature_header = "Host".into()),
            with(&|s| s.signature_header = "Bad Header".into()),
            with(&|s| s.signature_header = String::new()),
            with(&|s| s.signature_header = "Webhook-Signature".into()),
            with(&|s| s.timestamp_header = Some("webhook-signature-X".into())),
            with(&|s| s.timestamp_header = None),
            with(&|s| s.id_header = None),
            with(&|s| s.signature_header = "Authorization".into()),
        ];
        for s in bad {
            assert!(s.check(Some("Authorization")).is_err(), "{s:?}");
        }
        let body_only = with(&|s| {
            s.signed = Layout::Body;
            s.timestamp_header = None;
            s.id_header = None;
        });
        assert!(body_only.check(None).is_ok());
        assert!(check_secret(Some(&with(&|s| s.key = KeyForm::Raw)), "short").is_err());
        assert!(check_secret(Some(&with(&|s| s.key = KeyForm::Raw)), "topsecret").is_ok());
        assert!(check_secret(None, "topsecret").is_err(), "the default takes whsec_ only");
    }
}
