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
}

/// The outcome of asking for a slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slot {
    /// Taken: the call may start this long from now (zero: at once).
    Taken(Duration),
    /// Every key's rate is used up further ahead than the caller would wait: the slot is
    /// this far away, and nothing was taken.
    Wait(Duration),
}

/// The slot key of a tenant's destination.
pub fn destination_key(tenant: TenantId, name: &str) -> String {
    format!("destination:{tenant}:{name}")
}

/// Take one slot under every limit at once. The slot is the latest of the keys' next slots
/// (or now); when it is at most `horizon` away, each key's next slot moves on to it plus
/// 1/rate, and the caller starts its call when the slot comes. One row lock per key (taken in
/// key order) serialises every worker's take, so no key sees more than its rate of calls
/// start per second, whatever the number of workers.
pub async fn take(db: &impl GenericClient, limits: &[Limit], horizon: Duration) -> Result<Slot, StoreError> {
    if limits.is_empty() {
        return Ok(Slot::Taken(Duration::ZERO));
    }
    let keys: Vec<&str> = limits.iter().map(|l| l.key.as_str()).collect();
    let rates: Vec<f64> = limits.iter().map(|l| l.rate_per_second).collect();
    let sql = "WITH want AS (
                   SELECT key, rate FROM unnest($1::text[], $2::float8[]) AS w(key, rate)
               ), locked AS (
                   SELECT s.key, s.next_slot FROM rate_slots s WHERE s.key = ANY ($1) ORDER BY s.key FOR UPDATE
               ), slot AS (
                   SELECT greatest(clock_timestamp(), max(next_slot)) AS at, clock_timestamp() AS clk,
                          count(*) AS found
                   FROM locked
               ), taken AS (
                   UPDATE rate_slots s SET next_slot = slot.at + make_interval(secs => 1.0 / w.rate), taken = s.taken + 1
                   FROM slot, want w
                   WHERE s.key = w.key AND slot.found = cardinality($1::text[])
                     AND slot.at <= slot.clk + make_interval(secs => $3)
                   RETURNING s.key
               )
               SELECT extract(epoch FROM slot.at - slot.clk)::float8, slot.found,
                      (SELECT count(*) FROM taken)
               FROM slot";
    let stmt = db.prepare_cached(sql).await?;
    let horizon_s = horizon.as_secs_f64();
    for _ in 0..2 {
        let row = db.query_one(&stmt, &[&keys, &rates, &horizon_s]).await?;
        let (wait, found, taken): (Option<f64>, i64, i64) = (row.get(0), row.get(1), row.get(2));
        if found < keys.len() as i64 {
            // A key's first take: its row is made, then taken as any other.
            db.execute(
                "INSERT INTO rate_slots (key) SELECT unnest($1::text[]) ORDER BY 1 ON CONFLICT (key) DO NOTHING",
                &[&keys],
            )
            .await?;
            continue;
        }
        let wait = Duration::from_secs_f64(wait.unwrap_or(0.0).max(0.0));
        return Ok(if taken > 0 { Slot::Taken(wait) } else { Slot::Wait(wait.max(Duration::from_millis(1))) });
    }
    Err(StoreError::Vanished(format!("the rate slots {keys:?}")))
}
