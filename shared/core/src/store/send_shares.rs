//! Fair shares of a send rate many tenants' sends keep (`email::pace`): per shared rate (its
//! `rate_slots` key: an SES account's, a configuration set's) and tenant, when the tenant last
//! asked for a slot under it and the slots it booked there that are still ahead. A tenant is
//! waiting on a rate while it asked within the caller's window; its share is its weight
//! (`send_rates.weight` of its tenant row, 1 unless an operator set one) over the weights of
//! every tenant waiting there.

use chrono::{DateTime, Utc};

use super::{GenericClient, StoreError};

/// A tenant's standing under a shared rate, as it asks for a slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// Its slots booked under the rate that are still ahead, and the latest of them.
    pub ahead: i64,
    pub latest: Option<DateTime<Utc>>,
    /// Its weight.
    pub weight: f64,
    /// The weights of the other tenants waiting on the rate (0: none; it is alone).
    pub others: f64,
    /// The other tenants' slots booked under the rate that are still ahead.
    pub others_ahead: i64,
}

/// `tenant` asks for a slot under `key` now: its ask is recorded, its booked slots that have
/// passed are dropped, and its standing is read. Called in a transaction, its row stays locked
/// until the transaction ends, so one tenant's sends book under a key one at a time.
pub async fn ask(db: &impl GenericClient, key: &str, tenant: &str, window_secs: f64) -> Result<Standing, StoreError> {
    let sql = "WITH me AS (
                   INSERT INTO send_shares AS s (key, tenant, asked_at) VALUES ($1, $2, clock_timestamp())
                   ON CONFLICT (key, tenant) DO UPDATE SET asked_at = clock_timestamp(),
                       booked = ARRAY(SELECT b FROM unnest(s.booked) b WHERE b > clock_timestamp() ORDER BY b)
                   RETURNING booked
               )
               SELECT cardinality(me.booked)::int8, me.booked[cardinality(me.booked)],
                      coalesce((SELECT weight FROM send_rates WHERE scope = 'tenant' AND key = $2), 1),
                      (SELECT coalesce(sum(coalesce(r.weight, 1)), 0)
                       FROM send_shares o LEFT JOIN send_rates r ON r.scope = 'tenant' AND r.key = o.tenant
                       WHERE o.key = $1 AND o.tenant <> $2
                         AND o.asked_at > clock_timestamp() - make_interval(secs => $3)),
                      (SELECT coalesce(sum((SELECT count(*) FROM unnest(o.booked) b WHERE b > clock_timestamp())), 0)::int8
                       FROM send_shares o WHERE o.key = $1 AND o.tenant <> $2)
               FROM me";
    let stmt = db.prepare_cached(sql).await?;
    let row = db.query_one(&stmt, &[&key, &tenant, &window_secs]).await?;
    Ok(Standing {
        ahead: row.get(0),
        latest: row.get(1),
        weight: row.get(2),
        others: row.get(3),
        others_ahead: row.get(4),
    })
}

/// `tenant` booked a slot under `key`, at `at`.
pub async fn book(db: &impl GenericClient, key: &str, tenant: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
    let stmt = db
        .prepare_cached("UPDATE send_shares SET booked = booked || $3::timestamptz WHERE key = $1 AND tenant = $2")
        .await?;
    db.execute(&stmt, &[&key, &tenant, &at]).await?;
    Ok(())
}

/// An operator sets (or clears, `None`: 1) a tenant's weight in the shares; audited in the same
/// statement with the rates' changes.
pub async fn set_weight(
    db: &impl GenericClient,
    tenant: &str,
    weight: Option<f64>,
    by: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    db.execute(
        "WITH old AS (SELECT weight, rate_per_second FROM send_rates WHERE scope = 'tenant' AND key = $1 FOR UPDATE),
         new AS (
             INSERT INTO send_rates (scope, key, weight, updated_by) VALUES ('tenant', $1, $2, $3)
             ON CONFLICT (scope, key) DO UPDATE SET weight = $2, updated_by = $3, updated_at = now()
             RETURNING scope
         )
         INSERT INTO send_rate_audit (scope, key, old_rate, new_rate, old_weight, new_weight, changed_by, reason)
         SELECT 'tenant', $1, (SELECT rate_per_second FROM old), (SELECT rate_per_second FROM old),
                (SELECT weight FROM old), $2, $3, $4 FROM new",
        &[&tenant, &weight, &by, &reason],
    )
    .await?;
    Ok(())
}
