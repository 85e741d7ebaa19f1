//! Per-tenant sending reputation (`tenant_reputation`): the guard's thresholds and state, the
//! rolling counts of sends, permanent bounces and complaints it judges, and releasing the sends
//! a pause held. The rules are `email::reputation`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// A tenant's guard: thresholds as fractions of the window's sends, the exemptions, its state.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Guard {
    pub warn_bounce: f64,
    pub warn_complaint: f64,
    pub pause_bounce: f64,
    pub pause_complaint: f64,
    /// The rolling window, in hours.
    pub window_hours: i32,
    /// Fewer sends than this in the window: not judged.
    pub min_sends: i64,
    /// `name=value` message tags whose sends a pause does not hold.
    pub exempt_tags: Vec<String>,
    /// `ok`, `warning` or `paused`.
    pub state: String,
    pub state_reason: Option<String>,
    pub state_since: Option<DateTime<Utc>>,
    /// false: no operator set this tenant's guard; the defaults hold.
    pub configured: bool,
}

/// Sends in the window and how many of them bounced for good or drew a complaint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, ToSchema)]
pub struct Counts {
    pub sends: i64,
    pub permanent_bounces: i64,
    pub complaints: i64,
    /// Sends SES refused (`rejected`), apart from `sends`.
    pub failures: i64,
}

/// The columns of a guard's thresholds and exemptions, in `guard_params`' order ($2–$8).
macro_rules! thresholds {
    () => {
        "warn_bounce, warn_complaint, pause_bounce, pause_complaint, window_hours, min_sends, exempt_tags"
    };
}

pub(super) const COLUMNS: &str = concat!(thresholds!(), ", state, state_reason, state_since");

fn guard(r: &Row) -> Guard {
    guard_at(r, 0)
}

/// A guard from `COLUMNS` read at `at` onwards.
pub(super) fn guard_at(r: &Row, at: usize) -> Guard {
    Guard {
        warn_bounce: r.get(at),
        warn_complaint: r.get(at + 1),
        pause_bounce: r.get(at + 2),
        pause_complaint: r.get(at + 3),
        window_hours: r.get(at + 4),
        min_sends: r.get(at + 5),
        exempt_tags: r.get(at + 6),
        state: r.get(at + 7),
        state_reason: r.get(at + 8),
        state_since: r.get(at + 9),
        configured: true,
    }
}

/// The tenant's guard as stored; None: the defaults hold, state `ok`.
pub async fn get(db: &impl GenericClient, tenant: TenantId) -> Result<Option<Guard>, StoreError> {
    let row =
        db.query_opt(&format!("SELECT {COLUMNS} FROM tenant_reputation WHERE tenant_id = $1"), &[&tenant]).await?;
    Ok(row.as_ref().map(guard))
}

/// The tenant ($1) and the guard's `thresholds!` ($2–$8): what `set` and `raise` both write.
fn guard_params<'a>(tenant: &'a TenantId, g: &'a Guard) -> Vec<&'a (dyn ToSql + Sync)> {
    vec![
        tenant,
        &g.warn_bounce,
        &g.warn_complaint,
        &g.pause_bounce,
        &g.pause_complaint,
        &g.window_hours,
        &g.min_sends,
        &g.exempt_tags,
    ]
}

/// Set a tenant's thresholds and exemptions (its state stays as it is).
pub async fn set(db: &impl GenericClient, tenant: TenantId, g: &Guard, by: &str) -> Result<(), StoreError> {
    let mut params = guard_params(&tenant, g);
    params.push(&by);
    db.execute(
        concat!(
            "INSERT INTO tenant_reputation (tenant_id, ",
            thresholds!(),
            ", updated_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (tenant_id) DO UPDATE SET (",
            thresholds!(),
            ", updated_by) = ($2, $3, $4, $5, $6, $7, $8, $9), updated_at = now()"
        ),
        &params,
    )
    .await?;
    Ok(())
}

/// Raise a tenant's state to `to` (`warning` or `paused`) unless it is there or higher already;
/// `g` is what to store when the tenant has no row yet. True when it rose.
pub async fn raise(
    db: &impl GenericClient,
    tenant: TenantId,
    g: &Guard,
    to: &str,
    reason: &str,
) -> Result<bool, StoreError> {
    let mut params = guard_params(&tenant, g);
    params.extend([&to as &(dyn ToSql + Sync), &reason]);
    let n = db
        .execute(
            concat!(
                "INSERT INTO tenant_reputation AS r (tenant_id, ",
                thresholds!(),
                ", updated_by, state, state_reason, state_since)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'system', $9, $10, now())
                 ON CONFLICT (tenant_id) DO UPDATE SET state = $9, state_reason = $10, state_since = now()
                 WHERE (CASE r.state WHEN 'ok' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END)
                     < (CASE $9::text WHEN 'ok' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END)"
            ),
            &params,
        )
        .await?;
    Ok(n == 1)
}

/// An operator's resume: the state back to `ok`, and every send the pause held due now (the
/// `job_rate_waits` of `rate`). Returns the previous state (None: no row) and the sends released.
pub async fn resume(
    db: &impl GenericClient,
    tenant: TenantId,
    rate: &str,
    reason: &str,
) -> Result<(Option<String>, u64), StoreError> {
    let before = db
        .query_opt(
            "UPDATE tenant_reputation r SET state = 'ok', state_reason = $2, state_since = now()
             FROM (SELECT state FROM tenant_reputation WHERE tenant_id = $1 FOR UPDATE) old
             WHERE r.tenant_id = $1 RETURNING old.state",
            &[&tenant, &reason],
        )
        .await?
        .map(|r| r.get::<_, String>(0));
    let released = db
        .execute(
            "WITH held AS (DELETE FROM job_rate_waits WHERE rate = $1 RETURNING job_id)
             UPDATE jobs SET run_at = now(), updated_at = now()
             WHERE id IN (SELECT job_id FROM held) AND status = 'pending' AND tenant_id = $2",
            &[&rate, &tenant],
        )
        .await?;
    Ok((before, released))
}

/// The tenant's sends in the last `window_hours` (messages that left or may have: sent and
/// later states, and `unknown`), and how many of them bounced for good or drew a complaint.
pub async fn counts(db: &impl GenericClient, tenant: TenantId, window_hours: i32) -> Result<Counts, StoreError> {
    counts_since(db, tenant, Utc::now() - chrono::Duration::hours(i64::from(window_hours))).await
}

/// The columns `Counts` reads, over `messages m`: sends (not refused), permanent bounces,
/// complaints, refusals.
macro_rules! counted {
    () => {
        "count(*) FILTER (WHERE m.status <> 'rejected'),
         count(*) FILTER (WHERE EXISTS (SELECT 1 FROM message_events e WHERE e.message_id = m.id
             AND e.event_type = 'bounce' AND e.detail #>> '{bounce,bounceType}' = 'Permanent')),
         count(*) FILTER (WHERE EXISTS (SELECT 1 FROM message_events e WHERE e.message_id = m.id
             AND e.event_type = 'complaint')),
         count(*) FILTER (WHERE m.status = 'rejected')"
    };
}

/// The messages `counted!` counts: those that reached SES (or that SES refused).
macro_rules! counted_statuses {
    () => {
        "m.status IN ('sent', 'delayed', 'delivered', 'bounced', 'complained', 'unknown', 'rejected')"
    };
}

/// `counts` over the tenant's messages created after `since`, and its sends SES refused
/// (`rejected`, in `failures`, not in `sends`).
pub async fn counts_since(
    db: &impl GenericClient,
    tenant: TenantId,
    since: DateTime<Utc>,
) -> Result<Counts, StoreError> {
    let stmt = db
        .prepare_cached(concat!(
            "SELECT ",
            counted!(),
            " FROM messages m WHERE m.tenant_id = $1 AND m.created_at > $2 AND ",
            counted_statuses!()
        ))
        .await?;
    let r = db.query_one(&stmt, &[&tenant, &since]).await?;
    Ok(Counts { sends: r.get(0), permanent_bounces: r.get(1), complaints: r.get(2), failures: r.get(3) })
}

/// Tenants whose reputation the status document shows: those with a guard row or a message in
/// the last day, by name, at most `limit`.
pub async fn watched(db: &impl GenericClient, limit: i64) -> Result<Vec<(TenantId, String)>, StoreError> {
    let rows = db
        .query(
            "SELECT t.id, t.name FROM tenants t
             WHERE EXISTS (SELECT 1 FROM tenant_reputation r WHERE r.tenant_id = t.id)
                OR EXISTS (SELECT 1 FROM messages m WHERE m.tenant_id = t.id AND m.created_at > now() - interval '24 hours')
             ORDER BY t.name LIMIT $1",
            &[&limit],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Each configuration set's sends, permanent bounces and complaints over the last
/// `window_hours` (messages that name a set), by set name, at most `limit` sets.
pub async fn by_configuration_set(
    db: &impl GenericClient,
    window_hours: i32,
    limit: i64,
) -> Result<Vec<(String, Counts)>, StoreError> {
    let rows = db
        .query(
            concat!(
                "SELECT m.configuration_set, ",
                counted!(),
                " FROM messages m
                 WHERE m.configuration_set IS NOT NULL AND m.created_at > now() - make_interval(hours => $1) AND ",
                counted_statuses!(),
                " GROUP BY m.configuration_set ORDER BY m.configuration_set LIMIT $2"
            ),
            &[&window_hours, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                Counts { sends: r.get(1), permanent_bounces: r.get(2), complaints: r.get(3), failures: r.get(4) },
            )
        })
        .collect())
}
