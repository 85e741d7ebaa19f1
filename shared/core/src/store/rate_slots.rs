//! The next free slot per key (`rate_slots`): every worker and Lambda container takes a call's
//! slot here, so a rate holds across all of them. Each rate is a key: a tenant's HTTP
//! destination (`destination:<tenant>:<name>`), an SES account, a tenant's sends, a
//! configuration set (`email::pace`).

use std::time::Duration;

use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// One rate a call must keep.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub key: String,
    pub rate_per_second: f64,
    /// No slot once the key's count of slots taken (`taken`) reaches this (a quota).
    pub cap: Option<i64>,
}

/// The outcome of asking for a slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slot {
    /// Taken: the call may start this long from now (zero: at once).
    Taken(Duration),
    /// Every key's rate is used up further ahead than the caller would wait: the slot is
    /// this far away, and nothing was taken.
    Wait(Duration),
    /// A key's cap is reached; nothing was taken.
    Full,
}

/// The slot key of a tenant's destination.
pub fn destination_key(tenant: TenantId, name: &str) -> String {
    format!("destination:{tenant}:{name}")
}

/// Take one slot under every limit at once. The slot is the latest of the keys' next slots
/// (or now); when it is at most `horizon` away, each key's next slot moves on to it plus
/// 1/rate (and its count of slots taken by one, unless a key's `cap` is reached: `Full`),
/// and the caller starts its call when the slot comes. One row lock per key (taken in
/// key order) serialises every worker's take, so no key sees more than its rate of calls
/// start per second, whatever the number of workers.
pub async fn take(db: &impl GenericClient, limits: &[Limit], horizon: Duration) -> Result<Slot, StoreError> {
    if limits.is_empty() {
        return Ok(Slot::Taken(Duration::ZERO));
    }
    let keys: Vec<&str> = limits.iter().map(|l| l.key.as_str()).collect();
    let rates: Vec<f64> = limits.iter().map(|l| l.rate_per_second).collect();
    let caps: Vec<Option<i64>> = limits.iter().map(|l| l.cap).collect();
    let sql = "WITH want AS (
                   SELECT key, rate, cap FROM unnest($1::text[], $2::float8[], $4::int8[]) AS w(key, rate, cap)
               ), locked AS (
                   SELECT s.key, s.next_slot, s.taken FROM rate_slots s WHERE s.key = ANY ($1) ORDER BY s.key FOR UPDATE
               ), slot AS (
                   SELECT greatest(clock_timestamp(), max(l.next_slot)) AS at, clock_timestamp() AS clk,
                          count(*) AS found, coalesce(bool_and(w.cap IS NULL OR l.taken < w.cap), true) AS room
                   FROM locked l JOIN want w USING (key)
               ), taken AS (
                   UPDATE rate_slots s SET next_slot = slot.at + make_interval(secs => 1.0 / w.rate), taken = s.taken + 1
                   FROM slot, want w
                   WHERE s.key = w.key AND slot.found = cardinality($1::text[]) AND slot.room
                     AND slot.at <= slot.clk + make_interval(secs => $3)
                   RETURNING s.key
               )
               SELECT extract(epoch FROM slot.at - slot.clk)::float8, slot.found,
                      (SELECT count(*) FROM taken), slot.room, slot.at
               FROM slot";
    let stmt = db.prepare_cached(sql).await?;
    let horizon_s = horizon.as_secs_f64();
    for _ in 0..2 {
        let row = db.query_one(&stmt, &[&keys, &rates, &horizon_s, &caps]).await?;
        let (wait, found, taken, room): (Option<f64>, i64, i64, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if found < keys.len() as i64 {
            // A key's first take: its row is made, then taken as any other.
            db.execute(
                "INSERT INTO rate_slots (key) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT (key) DO NOTHING",
                &[&keys],
            )
            .await?;
            continue;
        }
        if !room {
            return Ok(Slot::Full);
        }
        let wait = Duration::from_secs_f64(wait.unwrap_or(0.0).max(0.0));
        // Until the slot as the clock says after the answer came (its commit took some of the
        // wait), so a slow commit does not push the call past its slot.
        let at: Option<chrono::DateTime<chrono::Utc>> = row.get(4);
        let left = at.map_or(wait, |at| (at - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO));
        return Ok(if taken > 0 { Slot::Taken(left) } else { Slot::Wait(wait.max(Duration::from_millis(1))) });
    }
    Err(StoreError::Vanished(format!("the rate slots {keys:?}")))
}

/// Take one back from each key's count of slots taken (a slot whose call was not made: it
/// counts against no quota). The keys' next slots stay where they are.
pub async fn give_back(db: &impl GenericClient, keys: &[String]) -> Result<(), StoreError> {
    db.execute("UPDATE rate_slots SET taken = taken - 1 WHERE key = ANY ($1) AND taken > 0", &[&keys]).await?;
    Ok(())
}
