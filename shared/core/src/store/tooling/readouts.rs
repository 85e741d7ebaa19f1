//! Read-outs of the platform's tables for the chaos suite and the benchmarks: which jobs
//! exist and how they ended, which events recorded a recovery, how long jobs waited to start.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::job::{JobId, TenantId};
use crate::store::dead_letters::DeadLetter;
use crate::store::jobs::{JOB_COLUMNS, Job, PENDING_JOBS};
use crate::store::{GenericClient, StoreError};

/// Every job, in id order.
pub async fn jobs(db: &impl GenericClient) -> Result<Vec<Job>, StoreError> {
    let rows = db.query(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY id"), &[]).await?;
    rows.iter().map(Job::from_row).collect::<Result<_, _>>()
}

/// The jobs among `ids` that exist, in id order.
pub async fn jobs_among(db: &impl GenericClient, ids: &[JobId]) -> Result<Vec<Job>, StoreError> {
    let rows = db.query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ANY($1) ORDER BY id"), &[&ids]).await?;
    rows.iter().map(Job::from_row).collect::<Result<_, _>>()
}

/// How many jobs are in each status.
pub async fn status_counts(db: &impl GenericClient) -> Result<BTreeMap<String, i64>, StoreError> {
    let rows = db.query("SELECT status, count(*) FROM jobs GROUP BY status", &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// True when no job is pending, running or waiting.
pub async fn all_terminal(db: &impl GenericClient) -> Result<bool, StoreError> {
    let sql = format!(
        "SELECT NOT EXISTS (SELECT 1 FROM {PENDING_JOBS} p) AND NOT EXISTS (SELECT 1 FROM jobs WHERE status IN ('running', 'waiting'))"
    );
    Ok(db.query_one(&sql, &[]).await?.get(0))
}

/// How many jobs are running their `attempt`th attempt.
pub async fn running_in_attempt(db: &impl GenericClient, attempt: i32) -> Result<i64, StoreError> {
    let sql = "SELECT count(*) FROM jobs WHERE status = 'running' AND attempt = $1";
    Ok(db.query_one(sql, &[&attempt]).await?.get(0))
}

/// How many job events of `kind` were recorded (in `attempt`, when given).
pub async fn count_events(db: &impl GenericClient, kind: &str, attempt: Option<i32>) -> Result<i64, StoreError> {
    let sql = "SELECT count(*) FROM job_events WHERE kind = $1 AND ($2::int IS NULL OR attempt = $2)";
    Ok(db.query_one(sql, &[&kind, &attempt]).await?.get(0))
}

/// The job and time of every event of `kind`, oldest first.
pub async fn events_of_kind(db: &impl GenericClient, kind: &str) -> Result<Vec<(JobId, DateTime<Utc>)>, StoreError> {
    let rows = db.query("SELECT job_id, at FROM job_events WHERE kind = $1 ORDER BY at", &[&kind]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Jobs whose attempts beyond the first are not each explained by a recorded recovery.
pub async fn reruns_without_recovery(db: &impl GenericClient) -> Result<i64, StoreError> {
    let sql = "SELECT count(*) FROM jobs j WHERE j.attempt - 1 <>
                   (SELECT count(*) FROM job_events e WHERE e.job_id = j.id AND e.kind = 'lease_expired')";
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// An attempt whose lease the sweep returned, and when the job was claimed again.
#[derive(Debug, Clone, Copy)]
pub struct Recovery {
    pub began: DateTime<Utc>,
    pub expired: DateTime<Utc>,
    pub claimed_again: DateTime<Utc>,
}

pub async fn recoveries(db: &impl GenericClient) -> Result<Vec<Recovery>, StoreError> {
    let rows = db
        .query(
            "SELECT e.started_at, e.at, coalesce(n.started_at, j.started_at)
             FROM job_events e JOIN jobs j ON j.id = e.job_id
             LEFT JOIN job_events n ON n.job_id = e.job_id AND n.attempt = e.attempt + 1 AND n.started_at IS NOT NULL
             WHERE e.kind = 'lease_expired'",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| Recovery { began: r.get(0), expired: r.get(1), claimed_again: r.get(2) }).collect())
}

/// Milliseconds from each job's acceptance to its first claim, for the jobs created since
/// `since` (of one tenant, when given) that have been claimed.
pub async fn start_latencies_ms(
    db: &impl GenericClient,
    tenant: Option<TenantId>,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<f64>, StoreError> {
    let rows = db
        .query(
            "SELECT EXTRACT(EPOCH FROM (coalesce(e.started_at, j.started_at) - j.created_at))::float8 * 1000
             FROM jobs j LEFT JOIN job_events e ON e.job_id = j.id AND e.attempt = 1
             WHERE ($1::uuid IS NULL OR j.tenant_id = $1) AND ($2::timestamptz IS NULL OR j.created_at >= $2)",
            &[&tenant, &since],
        )
        .await?;
    Ok(rows.iter().filter_map(|r| r.get::<_, Option<f64>>(0)).collect())
}

/// Each message's job and attempt (a message is the effect of an `email.send` attempt).
pub async fn message_attempts(db: &impl GenericClient) -> Result<Vec<(JobId, i32)>, StoreError> {
    Ok(db.query("SELECT job_id, attempt FROM messages", &[]).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// How many messages one tenant has.
pub async fn count_messages(db: &impl GenericClient, tenant: TenantId) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT count(*) FROM messages WHERE tenant_id = $1", &[&tenant]).await?.get(0))
}

/// Every row one tenant owns, table by table, as JSON text in sorted order: compare two
/// readings to see whether anything of the tenant's changed.
pub async fn tenant_rows(
    db: &impl GenericClient,
    tenant: TenantId,
) -> Result<BTreeMap<&'static str, Vec<String>>, StoreError> {
    const OWNED: &[(&str, &str)] = &[
        ("jobs", "SELECT row_to_json(t)::text FROM jobs t WHERE tenant_id = $1"),
        ("job_keys", "SELECT row_to_json(t)::text FROM job_keys t WHERE tenant_id = $1"),
        ("messages", "SELECT row_to_json(t)::text FROM messages t WHERE tenant_id = $1"),
        ("email_templates", "SELECT row_to_json(t)::text FROM email_templates t WHERE tenant_id = $1"),
        ("suppressions", "SELECT row_to_json(t)::text FROM suppressions t WHERE tenant_id = $1"),
        (
            "campaign_pages",
            "SELECT row_to_json(p)::text FROM campaign_pages p JOIN jobs j ON j.id = p.job_id WHERE j.tenant_id = $1",
        ),
    ];
    let mut out = BTreeMap::new();
    for (table, sql) in OWNED {
        let mut rows: Vec<String> = db.query(*sql, &[&tenant]).await?.iter().map(|r| r.get(0)).collect();
        rows.sort();
        out.insert(*table, rows);
    }
    Ok(out)
}

/// Idempotency keys recorded under a tenant other than their job's.
pub async fn keys_across_tenants(db: &impl GenericClient) -> Result<i64, StoreError> {
    let sql = "SELECT count(*) FROM job_keys k JOIN jobs j ON j.id = k.job_id WHERE k.tenant_id <> j.tenant_id";
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// Every dead letter kept.
pub async fn dead_letters(db: &impl GenericClient) -> Result<Vec<DeadLetter>, StoreError> {
    crate::store::dead_letters::recent(db, i64::MAX).await
}

/// The buffers (shared pages hit or read) one keyed claim of up to `limit` jobs of `key` touches,
/// from `EXPLAIN (ANALYZE, BUFFERS)` of the very statement `claim_keyed` runs, rolled back:
/// what a claim costs, in a unit the machine's speed does not move. The claim's plan is made
/// as a worker makes it (generic, under the claim's settings) at the first readout on `db`,
/// and kept for the later ones, as a worker's connection keeps it; the key is locked first, as
/// a claim's transaction locks it (the claim takes only keys locked).
pub async fn keyed_claim_buffers(db: &mut deadpool_postgres::Client, key: &str, limit: i64) -> Result<i64, StoreError> {
    use crate::store::jobs::{Keyed, Lane, lock_keys};
    let tx = db.transaction().await?;
    crate::store::jobs::plan_keyed_claim(&tx, false).await?;
    lock_keys(&tx, limit, Keyed::Lanes(&[Lane { key: key.to_owned(), after: None }])).await?;
    let prepared = "SELECT 1 FROM pg_prepared_statements WHERE name = 'keyed_claim_readout'";
    if tx.query_opt(prepared, &[]).await?.is_none() {
        let types = "int8, float8, text[], uuid[], int4, timestamptz[], uuid[]";
        let sql = crate::store::jobs::keyed_claim_sql(false);
        tx.batch_execute(&format!("PREPARE keyed_claim_readout ({types}) AS {sql}")).await?;
    }
    // EXECUTE takes no bound parameters: the key goes in as a quoted literal.
    let key = key.replace('\'', "''");
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
               EXECUTE keyed_claim_readout ({limit}, 30, ARRAY['{key}'], NULL, NULL, ARRAY[NULL::timestamptz], ARRAY[NULL::uuid])");
    let row = tx.query_one(&sql, &[]).await?;
    tx.rollback().await?;
    let plan: serde_json::Value = row.get(0);
    let top = &plan[0]["Plan"];
    let blocks = |k: &str| top[k].as_i64().unwrap_or(0);
    Ok(blocks("Shared Hit Blocks") + blocks("Shared Read Blocks"))
}

/// The buffers one fair claim (`claim_due`) of up to `limit` jobs touches, from `EXPLAIN
/// (ANALYZE, BUFFERS)` of the very statement it runs, rolled back (see `keyed_claim_buffers`),
/// without those its row locks touch themselves: a lock on a page that a vacuum marked
/// all-visible also reads the visibility map, a buffer a row, and whether the vacuum could
/// mark it depends on other sessions' snapshots, not on the claim.
pub async fn due_claim_buffers(db: &mut deadpool_postgres::Client, limit: i64) -> Result<i64, StoreError> {
    let tx = db.transaction().await?;
    let sql = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}", crate::store::jobs::fair_claim_sql());
    let none: Vec<crate::job::TenantId> = Vec::new();
    // With the long lane a worker has by default (`executor::LaneSplit`): half the slots, for
    // jobs above the default timeout.
    let (long_after, long_slots) = (Some(crate::job::terms::DEFAULT_TIMEOUT_SECONDS), (limit / 2).max(1));
    let nothing = Vec::<i64>::new();
    let row =
        tx.query_one(&sql, &[&limit, &30.0f64, &none, &nothing, &limit, &nothing, &long_after, &long_slots]).await?;
    tx.rollback().await?;
    let plan: serde_json::Value = row.get(0);
    let top = &plan[0]["Plan"];
    Ok(buffers(top) - locks_own_buffers(top))
}

/// A plan node's shared buffers (hit and read), its children's included.
fn buffers(node: &serde_json::Value) -> i64 {
    let blocks = |k: &str| node[k].as_i64().unwrap_or(0);
    blocks("Shared Hit Blocks") + blocks("Shared Read Blocks")
}

/// The buffers the `LockRows` nodes under `node` touched themselves (not their children).
fn locks_own_buffers(node: &serde_json::Value) -> i64 {
    let children = node["Plans"].as_array().map(Vec::as_slice).unwrap_or_default();
    let own =
        if node["Node Type"] == "LockRows" { buffers(node) - children.iter().map(buffers).sum::<i64>() } else { 0 };
    own + children.iter().map(locks_own_buffers).sum::<i64>()
}
