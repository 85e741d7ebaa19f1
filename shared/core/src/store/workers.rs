//! The `workers` table: one row per process or function instance, upserted on a liveness
//! heartbeat (every few seconds, never per job) and read by the status contract.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{GenericClient, StoreError};

/// What a process says about itself on each beat.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerRow {
    pub kind: String,
    pub instance_id: String,
    pub host: String,
    pub pid: Option<i32>,
    pub started_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
}

/// Record that this instance is alive now (insert on its first beat).
pub async fn beat(
    db: &impl GenericClient,
    kind: &str,
    instance_id: &str,
    host: &str,
    pid: Option<i32>,
    started_at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let stmt = db
        .prepare_cached(
            "INSERT INTO workers (instance_id, kind, host, pid, started_at, last_seen_at)
             VALUES ($1, $2, $3, $4, $5, now())
             ON CONFLICT (instance_id) DO UPDATE SET last_seen_at = now()",
        )
        .await?;
    db.execute(&stmt, &[&instance_id, &kind, &host, &pid, &started_at]).await?;
    Ok(())
}

/// Instances seen since `since`, most recently seen first, at most `limit`.
pub async fn seen_since(
    db: &impl GenericClient,
    since: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<WorkerRow>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT kind, instance_id, host, pid, started_at, last_seen_at FROM workers
             WHERE last_seen_at >= $1 ORDER BY last_seen_at DESC LIMIT $2",
        )
        .await?;
    let rows = db.query(&stmt, &[&since, &limit]).await?;
    Ok(rows
        .iter()
        .map(|r| WorkerRow {
            kind: r.get(0),
            instance_id: r.get(1),
            host: r.get(2),
            pid: r.get(3),
            started_at: r.get(4),
            last_seen_at: r.get(5),
        })
        .collect())
}

/// Forget instances not seen since `before` (Lambda containers come and go). Returns how many.
pub async fn prune(db: &impl GenericClient, before: DateTime<Utc>) -> Result<u64, StoreError> {
    let stmt = db.prepare_cached("DELETE FROM workers WHERE last_seen_at < $1").await?;
    Ok(db.execute(&stmt, &[&before]).await?)
}
