//! The opaque page cursors the API issues and takes back: base64url of `<microseconds>|<id>`.
//! A cursor is refused (`None`) unless it decodes to a time of years 0 to 9999, the range of
//! the RFC 3339 times the API takes: beyond it Postgres refuses the time (SQLSTATE 22008).

use base64::Engine;
use chrono::{DateTime, NaiveDate, Utc};

/// The cursor of the row at (`at`, `id`); the id is a job's or an exception's.
pub fn encode(at: DateTime<Utc>, id: impl std::fmt::Display) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}|{id}", at.timestamp_micros()))
}

pub fn decode<Id: std::str::FromStr>(c: &str) -> Option<(DateTime<Utc>, Id)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).ok()?;
    let (micros, id) = std::str::from_utf8(&raw).ok()?.split_once('|')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    in_range(at).then_some(())?;
    Some((at, id.parse().ok()?))
}

/// Whether a time lies in years 0 to 9999 (UTC).
fn in_range(at: DateTime<Utc>) -> bool {
    let bound = |y, m, d| NaiveDate::from_ymd_opt(y, m, d).and_then(|d| d.and_hms_opt(0, 0, 0)).map(|t| t.and_utc());
    match (bound(0, 1, 1), bound(10_000, 1, 1)) {
        (Some(lo), Some(hi)) => lo <= at && at < hi,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let at = DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(decode(&encode(at, id)), Some((at, id)));
        assert_eq!(decode::<Uuid>("not-a-cursor"), None);
    }

    #[test]
    fn times_postgres_cannot_hold_are_refused() {
        let raw = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let nil = Uuid::nil();
        assert_eq!(decode::<Uuid>(&raw(&format!("-8000000000000000000|{nil}"))), None);
        assert_eq!(decode::<Uuid>(&raw(&format!("9000000000000000000|{nil}"))), None);
        let year1 = DateTime::parse_from_rfc3339("0001-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let year9999 = DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999Z").unwrap().with_timezone(&Utc);
        assert_eq!(decode(&encode(year1, nil)), Some((year1, nil)), "an RFC 3339 time the API took comes back");
        assert_eq!(decode(&encode(year9999, nil)), Some((year9999, nil)));
    }
}
