//! Signed callbacks: the Standard Webhooks signature (HMAC-SHA256 over `{id}.{timestamp}.{body}`)
//! that every delivery carries and a receiver checks (`client::Verifier`). The delivery job is
//! `task`; it calls out through `crate::outbound`.

pub mod task;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A new signing secret in the Standard Webhooks form: `whsec_` and 32 random bytes, base64.
pub fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("whsec_{}", STANDARD.encode(bytes))
}

/// The key a secret stands for: the base64 after `whsec_` (the raw text otherwise).
fn secret_key(secret: &str) -> Vec<u8> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    STANDARD.decode(b64).unwrap_or_else(|_| secret.as_bytes().to_vec())
}

/// HMAC-SHA256 of `{id}.{timestamp}.{body}` under one secret.
fn mac(secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret_key(secret)).expect("HMAC takes any key length");
    mac.update(format!("{msg_id}.{timestamp}.").as_bytes());
    mac.update(body);
    mac
}

/// One signature, `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
pub fn sign(secret: &str, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    format!("v1,{}", STANDARD.encode(mac(secret, msg_id, timestamp, body).finalize().into_bytes()))
}

/// The `webhook-signature` header: one signature per valid secret, space-separated.
pub fn signature_header(secrets: &[&str], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets.iter().map(|s| sign(s, msg_id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

/// Why a callback's signature does not check out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("webhook-timestamp is not a number")]
    Timestamp,
    #[error("the timestamp is outside the tolerance")]
    Stale,
    #[error("no signature matches")]
    NoMatch,
}

/// Check a `webhook-signature` header against any of `secrets` (each comparison in constant
/// time), and the timestamp against `now` within `tolerance` seconds.
pub fn verify(
    secrets: &[&str],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
    header: &str,
    now: i64,
    tolerance: i64,
) -> Result<(), SignatureError> {
    if (now - timestamp).abs() > tolerance {
        return Err(SignatureError::Stale);
    }
    let given: Vec<Vec<u8>> = header
        .split_whitespace()
        .filter_map(|g| g.strip_prefix("v1,"))
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .collect();
    let ok = secrets.iter().any(|s| {
        let expected = mac(s, msg_id, timestamp, body);
        given.iter().any(|g| expected.clone().verify_slice(g).is_ok())
    });
    if ok { Ok(()) } else { Err(SignatureError::NoMatch) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_an_independent_hmac() {
        // Computed apart from this code (Python's hmac module): key "Jefe" (RFC 4231 test
        // case 2), and a key longer than SHA-256's block.
        assert_eq!(
            sign("whsec_SmVmZQ==", "msg_1", 1_700_000_000, b"{}"),
            "v1,/znRf2NDj89CWInaD6lrZNuat1XrfqqxwHGR//lzzVM="
        );
        let long = format!("whsec_{}", STANDARD.encode([0xaa; 131]));
        assert_eq!(sign(&long, "msg_1", 1_700_000_000, b"{}"), "v1,0u4VVv/rzdCt6hVXTgD+BSvuGUnEvYaYlUIYypAk254=");
    }

    #[test]
    fn signatures_verify_with_either_secret_and_fail_otherwise() {
        let (a, b) = (new_secret(), new_secret());
        let header = signature_header(&[&a, &b], "msg_1", 1_700_000_000, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        assert!(verify(&[&a], "msg_1", 1_700_000_000, b"{}", &header, 1_700_000_010, 300).is_ok());
        assert!(verify(&[&b], "msg_1", 1_700_000_000, b"{}", &header, 1_700_000_010, 300).is_ok());
        assert!(verify(&[&new_secret()], "msg_1", 1_700_000_000, b"{}", &header, 1_700_000_010, 300).is_err());
        assert!(verify(&[&a], "msg_1", 1_700_000_000, b"{ }", &header, 1_700_000_010, 300).is_err(), "body changed");
        assert_eq!(
            verify(&[&a], "msg_1", 1_700_000_000, b"{}", &header, 1_700_001_000, 300),
            Err(SignatureError::Stale),
            "too old"
        );
        assert_eq!(
            verify(&[&a], "msg_1", 1_700_000_000, b"{}", "v1,not base64 v2,AAAA", 1_700_000_010, 300),
            Err(SignatureError::NoMatch)
        );
    }
}
