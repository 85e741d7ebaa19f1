//! The opaque page cursors the API issues and takes back: 32 characters of base64url (no
//! padding) holding 24 bytes, a position in a list's `(time, id)` order: the time as
//! microseconds since 0000-01-01T00:00:00Z (big-endian, below 2^58, so the first character is
//! always `A`: years 0 to 9133), then the id's 16 bytes. Every string of that shape (`PATTERN`,
//! stated in the OpenAPI document) is a position the store can take; any other is refused.

use base64::Engine;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The shape of every cursor, and all the server checks.
pub const PATTERN: &str = "^A[A-Za-z0-9_-]{31}$";

/// Microseconds from the Unix epoch back to 0000-01-01T00:00:00Z.
const YEAR_ZERO_MICROS: i64 = -62_167_219_200_000_000;
/// Exclusive bound of the time field (2^58 µs, about 9133 years).
const LIMIT: u64 = 1 << 58;

/// The cursor of a position; a time outside years 0 to 9133 is clamped to that range's end
/// (no row lies beyond it, so the position is the same).
pub fn encode(at: DateTime<Utc>, id: Uuid) -> String {
    let micros = at.timestamp_micros().saturating_sub(YEAR_ZERO_MICROS).clamp(0, (LIMIT - 1) as i64) as u64;
    let mut raw = [0u8; 24];
    raw[..8].copy_from_slice(&micros.to_be_bytes());
    raw[8..].copy_from_slice(id.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

pub fn decode(c: &str) -> Option<(DateTime<Utc>, Uuid)> {
    if c.len() != 32 || !c.starts_with('A') {
        return None;
    }
    let raw: [u8; 24] = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).ok()?.try_into().ok()?;
    let micros = u64::from_be_bytes(raw[..8].try_into().ok()?);
    (micros < LIMIT).then_some(())?;
    let at = DateTime::from_timestamp_micros(micros as i64 + YEAR_ZERO_MICROS)?;
    Some((at, Uuid::from_bytes(raw[8..].try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let at = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        let c = encode(at, id);
        assert_eq!(c.len(), 32);
        assert!(c.starts_with('A'));
        assert_eq!(decode(&c), Some((at, id)));
        assert_eq!(decode("not-a-cursor"), None);
        assert_eq!(decode(&format!("B{}", &c[1..])), None, "a time field of 2^58 or more");
        assert_eq!(decode(&format!("{c}A")), None);
    }

    #[test]
    fn every_string_of_the_documented_shape_is_a_position() {
        let re_ok = |s: &str| {
            s.len() == 32
                && s.starts_with('A')
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        for s in [
            "A".repeat(32),
            format!("A{}", "_".repeat(31)),
            format!("A{}", "-".repeat(31)),
            format!("A{}", "z9".repeat(15)) + "Q",
        ] {
            assert!(re_ok(&s));
            let (at, _) = decode(&s).unwrap_or_else(|| panic!("{s} refused"));
            assert!(at.timestamp_micros() >= YEAR_ZERO_MICROS);
        }
    }

    #[test]
    fn times_beyond_the_range_are_clamped_to_its_ends() {
        let nil = Uuid::nil();
        let year0 = DateTime::parse_from_rfc3339("0000-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let year9999 = DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999Z").unwrap().with_timezone(&Utc);
        assert_eq!(decode(&encode(year0, nil)), Some((year0, nil)));
        let (late, _) = decode(&encode(year9999, nil)).unwrap();
        assert!(late.timestamp_micros() == (LIMIT - 1) as i64 + YEAR_ZERO_MICROS);
    }
}
