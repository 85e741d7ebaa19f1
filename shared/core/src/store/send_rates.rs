//! The rates email is sent at (`send_rates`): an SES account's (read from SES by the sweep,
//! or an operator's, which wins), a tenant's and a configuration set's (operators'), each
//! change audited (`send_rate_audit`); the account's throttle back-off; and why a deferred
//! job waits (`job_rate_waits`). The slots themselves are taken in `rate_slots`.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::JobId;

/// What a rate applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// An SES account (`default`: Relay's own; else the account id of a tenant's sending role).
    Account,
    /// One tenant's sends (its id).
    Tenant,
    /// One SES configuration set's sends (its name).
    ConfigurationSet,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Account => "account",
            Scope::Tenant => "tenant",
            Scope::ConfigurationSet => "configuration_set",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        [Scope::Account, Scope::Tenant, Scope::ConfigurationSet].into_iter().find(|x| x.as_str() == s)
    }
}

/// A rate as stored, with its slot key's count of sends.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SendRate {
    pub scope: Scope,
    pub key: String,
    /// Set by an operator; for an account it overrides what SES said. Null: none.
    pub rate_per_second: Option<f64>,
    /// An account's `MaxSendRate`, `Max24HourSend` and `SentLast24Hours` as SES last said
    /// (`GetAccount`, read by the sweep), when, and why the last read failed.
    pub provider_rate: Option<f64>,
    pub max_24h: Option<f64>,
    pub sent_24h: Option<f64>,
    pub read_at: Option<DateTime<Utc>>,
    pub read_error: Option<String>,
    /// Sends taken under this key since the quota was read (an account's), or ever.
    pub sent_since_read: i64,
    /// The key's count of slots taken when the quota was read (0: never read).
    #[serde(skip)]
    pub taken_at_read: i64,
    /// The throttle back-off as last written (1: none) and when (`email::pace` grows it back).
    pub factor: f64,
    pub factor_at: DateTime<Utc>,
    /// Throttle answers SES gave sends under this account.
    pub throttles: i64,
    pub last_throttle_at: Option<DateTime<Utc>>,
    /// A tenant's weight in the shares of a rate many tenants keep (an account's, a
    /// configuration set's), set by an operator; null: 1 (`store::send_shares`).
    pub weight: Option<f64>,
    pub updated_by: Option<String>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str = "r.scope, r.key, r.rate_per_second, r.provider_rate, r.max_24h, r.sent_24h, r.read_at,
     r.read_error, coalesce(s.taken, 0) - coalesce(r.taken_at_read, 0), r.factor, r.factor_at, r.throttles,
     r.last_throttle_at, r.updated_by, r.updated_at, coalesce(r.taken_at_read, 0), r.weight";

/// The slot key of a rate (`rate_slots`).
pub fn slot_key(scope: Scope, key: &str) -> String {
    format!("ses:{}:{key}", scope.as_str())
}

const FROM: &str = "send_rates r LEFT JOIN rate_slots s ON s.key = 'ses:' || r.scope || ':' || r.key";

impl SendRate {
    fn from_row(r: &Row) -> Self {
        SendRate {
            scope: Scope::parse(r.get(0)).unwrap_or(Scope::Account),
            key: r.get(1),
            rate_per_second: r.get(2),
            provider_rate: r.get(3),
            max_24h: r.get(4),
            sent_24h: r.get(5),
            read_at: r.get(6),
            read_error: r.get(7),
            sent_since_read: r.get(8),
            factor: r.get(9),
            factor_at: r.get(10),
            throttles: r.get(11),
            last_throttle_at: r.get(12),
            updated_by: r.get(13),
            updated_at: r.get(14),
            taken_at_read: r.get(15),
            weight: r.get(16),
        }
    }
}

/// Every rate, accounts first.
pub async fn list(db: &impl GenericClient) -> Result<Vec<SendRate>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM {FROM} ORDER BY r.scope, r.key");
    Ok(db.query(&sql, &[]).await?.iter().map(SendRate::from_row).collect())
}

pub async fn get(db: &impl GenericClient, scope: Scope, key: &str) -> Result<Option<SendRate>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM {FROM} WHERE r.scope = $1 AND r.key = $2");
    Ok(db.query_opt(&sql, &[&scope.as_str(), &key]).await?.as_ref().map(SendRate::from_row))
}

/// The rates one send keeps: its account's, its tenant's and its configuration set's (those
/// that exist). One statement, cheap enough for every send.
pub async fn for_send(
    db: &impl GenericClient,
    account: &str,
    tenant: &str,
    configuration_set: Option<&str>,
) -> Result<Vec<SendRate>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM {FROM}
         WHERE (r.scope, r.key) IN (('account', $1), ('tenant', $2), ('configuration_set', coalesce($3, '')))"
    );
    let stmt = db.prepare_cached(&sql).await?;
    Ok(db.query(&stmt, &[&account, &tenant, &configuration_set]).await?.iter().map(SendRate::from_row).collect())
}

/// An operator sets (or clears, `None`) a rate; the change is audited in the same statement.
pub async fn set(
    db: &impl GenericClient,
    scope: Scope,
    key: &str,
    rate: Option<f64>,
    by: &str,
    reason: Option<&str>,
) -> Result<SendRate, StoreError> {
    db.execute(
        "WITH old AS (SELECT rate_per_second, weight FROM send_rates WHERE scope = $1 AND key = $2 FOR UPDATE),
         new AS (
             INSERT INTO send_rates (scope, key, rate_per_second, updated_by) VALUES ($1, $2, $3, $4)
             ON CONFLICT (scope, key) DO UPDATE SET rate_per_second = $3, updated_by = $4, updated_at = now()
             RETURNING scope
         )
         INSERT INTO send_rate_audit (scope, key, old_rate, new_rate, old_weight, new_weight, changed_by, reason)
         SELECT $1, $2, (SELECT rate_per_second FROM old), $3, (SELECT weight FROM old), (SELECT weight FROM old), $4, $5
         FROM new",
        &[&scope.as_str(), &key, &rate, &by, &reason],
    )
    .await?;
    get(db, scope, key).await?.ok_or_else(|| StoreError::Vanished(format!("the {} rate {key}", scope.as_str())))
}

/// One audited change of a rate.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RateChange {
    pub old_rate: Option<f64>,
    pub new_rate: Option<f64>,
    /// A tenant's weight before and after the change (null: 1).
    pub old_weight: Option<f64>,
    pub new_weight: Option<f64>,
    pub changed_by: String,
    pub reason: Option<String>,
    pub at: DateTime<Utc>,
}

/// A rate's changes, newest first.
pub async fn history(db: &impl GenericClient, scope: Scope, key: &str) -> Result<Vec<RateChange>, StoreError> {
    let rows = db
        .query(
            "SELECT old_rate, new_rate, changed_by, reason, at, old_weight, new_weight FROM send_rate_audit
             WHERE scope = $1 AND key = $2 ORDER BY id DESC LIMIT 100",
            &[&scope.as_str(), &key],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| RateChange {
            old_rate: r.get(0),
            new_rate: r.get(1),
            changed_by: r.get(2),
            reason: r.get(3),
            at: r.get(4),
            old_weight: r.get(5),
            new_weight: r.get(6),
        })
        .collect())
}

/// What SES said of an account (`GetAccount`): kept with the account's send count now, so the
/// sends since are known.
pub async fn record_account(
    db: &impl GenericClient,
    key: &str,
    max_send_rate: f64,
    max_24h: f64,
    sent_24h: f64,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO send_rates (scope, key, provider_rate, max_24h, sent_24h, read_at, read_error, taken_at_read)
         VALUES ('account', $1, $2, $3, $4, now(), NULL, coalesce((SELECT taken FROM rate_slots WHERE key = $5), 0))
         ON CONFLICT (scope, key) DO UPDATE SET provider_rate = $2, max_24h = $3, sent_24h = $4, read_at = now(),
             read_error = NULL, taken_at_read = excluded.taken_at_read",
        &[&key, &max_send_rate, &max_24h, &sent_24h, &slot_key(Scope::Account, key)],
    )
    .await?;
    Ok(())
}

/// Forget what was read of an account (rate, quota, the throttle back-off), as if never read:
/// the next sweep reads it again. An operator's rate and the throttle count stay.
pub async fn forget_account_reading(db: &impl GenericClient, key: &str) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE send_rates SET provider_rate = NULL, max_24h = NULL, sent_24h = NULL, read_at = NULL,
                 taken_at_read = NULL, read_error = NULL, factor = 1, factor_at = now(), updated_at = now()
             WHERE scope = 'account' AND key = $1 AND provider_rate IS NOT NULL",
            &[&key],
        )
        .await?;
    Ok(n > 0)
}

/// Whether an account's quota is due to be read: never read, or last read (or last tried)
/// more than `every` seconds ago.
pub async fn account_read_due(db: &impl GenericClient, key: &str, every: f64) -> Result<bool, StoreError> {
    let row = db
        .query_opt(
            "SELECT coalesce(read_at, '-infinity') < now() - make_interval(secs => $2)
                    AND (read_error IS NULL OR updated_at < now() - make_interval(secs => $2))
             FROM send_rates WHERE scope = 'account' AND key = $1",
            &[&key, &every],
        )
        .await?;
    Ok(row.is_none_or(|r| r.get(0)))
}

/// A read of an account that failed: the last good figures stay, with why.
pub async fn record_account_error(db: &impl GenericClient, key: &str, error: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO send_rates (scope, key, read_error) VALUES ('account', $1, $2)
         ON CONFLICT (scope, key) DO UPDATE SET read_error = $2, updated_at = now()",
        &[&key, &error],
    )
    .await?;
    Ok(())
}

/// SES throttled a send under this account: count it, and set the back-off to `factor` (the
/// caller's decision, `email::pace::after_throttle`) unless another throttle did within `gap`
/// seconds (sends already under way answer together: one decrease for them all).
pub async fn throttled(db: &impl GenericClient, key: &str, factor: f64, gap: f64) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO send_rates (scope, key, factor, factor_at, throttles, last_throttle_at)
         VALUES ('account', $1, $2, now(), 1, now())
         ON CONFLICT (scope, key) DO UPDATE SET throttles = send_rates.throttles + 1, last_throttle_at = now(),
             factor = CASE WHEN send_rates.last_throttle_at > now() - make_interval(secs => $3)
                           THEN send_rates.factor ELSE $2 END,
             factor_at = CASE WHEN send_rates.last_throttle_at > now() - make_interval(secs => $3)
                              THEN send_rates.factor_at ELSE now() END",
        &[&key, &factor, &gap],
    )
    .await?;
    Ok(())
}

/// Why these jobs wait, for those a rate held: which rate, and the `run_at` it held them to.
pub async fn rate_waits(
    db: &impl GenericClient,
    jobs: &[JobId],
) -> Result<HashMap<JobId, (String, DateTime<Utc>)>, StoreError> {
    let rows = db.query("SELECT job_id, rate, until FROM job_rate_waits WHERE job_id = ANY ($1)", &[&jobs]).await?;
    Ok(rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect())
}
