//! The `schedules` table: platform-owned cron schedules. The slot arithmetic is pure
//! (`crate::schedules`); the sweep reads due rows here, enqueues each slot's job through
//! `Intake` (the slot is in the idempotency key), then advances the row with a compare-and-set
//! on `next_run_at`, so several sweepers fire each slot once and advance it once.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{GenericClient, StoreError};
use crate::job::{JobId, TenantId};

/// A schedule as stored, with the outcome of its last run.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Schedule {
    pub id: Uuid,
    pub name: String,
    #[schema(value_type = Uuid)]
    pub tenant_id: TenantId,
    pub task_type: String,
    pub params: Value,
    /// A cron expression (5 fields, or 6 with seconds first).
    pub cron: String,
    /// An IANA time zone, e.g. `Europe/Paris`.
    pub timezone: String,
    pub enabled: bool,
    /// Fire every missed slot after downtime, not only the latest.
    pub catch_up: bool,
    /// The slot last fired (its job's idempotency key holds it).
    pub last_fired_slot: Option<DateTime<Utc>>,
    #[schema(value_type = Option<Uuid>)]
    pub last_job_id: Option<JobId>,
    /// The status of the last job: its last outcome (`succeeded`, `failed`, ...) or where it is.
    pub last_outcome: Option<String>,
    pub next_run_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
}

const COLUMNS: &str = "s.id, s.name, s.tenant_id, s.task_type, s.params, s.cron, s.timezone, s.enabled, \
    s.catch_up, s.last_fired_slot, s.last_job_id, \
    (SELECT status FROM jobs j WHERE j.id = s.last_job_id) AS last_outcome, \
    s.next_run_at, s.created_at, s.updated_at, s.updated_by";

impl Schedule {
    fn from_row(r: &Row) -> Self {
        Schedule {
            id: r.get(0),
            name: r.get(1),
            tenant_id: r.get(2),
            task_type: r.get(3),
            params: r.get(4),
            cron: r.get(5),
            timezone: r.get(6),
            enabled: r.get(7),
            catch_up: r.get(8),
            last_fired_slot: r.get(9),
            last_job_id: r.get(10),
            last_outcome: r.get(11),
            next_run_at: r.get(12),
            created_at: r.get(13),
            updated_at: r.get(14),
            updated_by: r.get(15),
        }
    }
}

/// A schedule to create, already validated (cron, time zone, task type and params).
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub name: String,
    pub tenant_id: TenantId,
    pub task_type: String,
    pub params: Value,
    pub cron: String,
    pub timezone: String,
    pub enabled: bool,
    pub catch_up: bool,
    pub next_run_at: DateTime<Utc>,
    pub updated_by: String,
}

/// Create a schedule; `None` when the name is taken.
pub async fn create(db: &impl GenericClient, s: &NewSchedule) -> Result<Option<Schedule>, StoreError> {
    let id = Uuid::now_v7();
    let n = db
        .execute(
            "INSERT INTO schedules (id, name, tenant_id, task_type, params, cron, timezone, enabled,
                                    catch_up, next_run_at, updated_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (name) DO NOTHING",
            &[
                &id,
                &s.name,
                &s.tenant_id,
                &s.task_type,
                &s.params,
                &s.cron,
                &s.timezone,
                &s.enabled,
                &s.catch_up,
                &s.next_run_at,
                &s.updated_by,
            ],
        )
        .await?;
    if n == 0 {
        return Ok(None);
    }
    get(db, id).await
}

pub async fn get(db: &impl GenericClient, id: Uuid) -> Result<Option<Schedule>, StoreError> {
    let row = db.query_opt(&format!("SELECT {COLUMNS} FROM schedules s WHERE s.id = $1"), &[&id]).await?;
    Ok(row.as_ref().map(Schedule::from_row))
}

pub async fn by_name(db: &impl GenericClient, name: &str) -> Result<Option<Schedule>, StoreError> {
    let row = db.query_opt(&format!("SELECT {COLUMNS} FROM schedules s WHERE s.name = $1"), &[&name]).await?;
    Ok(row.as_ref().map(Schedule::from_row))
}

/// Every schedule, by name.
pub async fn list(db: &impl GenericClient) -> Result<Vec<Schedule>, StoreError> {
    let rows = db.query(&format!("SELECT {COLUMNS} FROM schedules s ORDER BY s.name"), &[]).await?;
    Ok(rows.iter().map(Schedule::from_row).collect())
}

/// Lock a schedule for an update in the caller's transaction.
pub async fn lock(db: &impl GenericClient, id: Uuid) -> Result<Option<Schedule>, StoreError> {
    let row = db.query_opt(&format!("SELECT {COLUMNS} FROM schedules s WHERE s.id = $1 FOR UPDATE"), &[&id]).await?;
    Ok(row.as_ref().map(Schedule::from_row))
}

/// Write back the settings an operator may change (params, cron, time zone, enabled,
/// catch-up) and the next run computed from them.
pub async fn save(db: &impl GenericClient, s: &Schedule) -> Result<(), StoreError> {
    db.execute(
        "UPDATE schedules SET params = $2, cron = $3, timezone = $4, enabled = $5, catch_up = $6,
             next_run_at = $7, updated_by = $8, updated_at = now()
         WHERE id = $1",
        &[&s.id, &s.params, &s.cron, &s.timezone, &s.enabled, &s.catch_up, &s.next_run_at, &s.updated_by],
    )
    .await?;
    Ok(())
}

pub async fn delete(db: &impl GenericClient, id: Uuid) -> Result<bool, StoreError> {
    Ok(db.execute("DELETE FROM schedules WHERE id = $1", &[&id]).await? == 1)
}

/// Enabled schedules whose next run is due at `now`, oldest first.
pub async fn due(db: &impl GenericClient, now: DateTime<Utc>, limit: i64) -> Result<Vec<Schedule>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM schedules s WHERE s.enabled AND s.next_run_at <= $1
             ORDER BY s.next_run_at LIMIT $2"
        ))
        .await?;
    Ok(db.query(&stmt, &[&now, &limit]).await?.iter().map(Schedule::from_row).collect())
}

/// Record a fire and move to the next run, only if no one else has since `read_next` was
/// read (a compare-and-set under the row lock). Returns false when someone had.
pub async fn advance(
    db: &impl GenericClient,
    id: Uuid,
    read_next: DateTime<Utc>,
    fired_slot: DateTime<Utc>,
    job_id: JobId,
    next_run_at: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let stmt = db
        .prepare_cached(
            "UPDATE schedules SET last_fired_slot = $3, last_job_id = $4, next_run_at = $5
             WHERE id = $1 AND next_run_at = $2",
        )
        .await?;
    Ok(db.execute(&stmt, &[&id, &read_next, &fired_slot, &job_id, &next_run_at]).await? == 1)
}

/// Disable the schedule that fired a job (its future runs are cancelled). Returns the
/// schedule's last job, which the caller cancels when it has not started.
pub async fn disable(
    db: &impl GenericClient,
    id: Uuid,
    tenant_id: TenantId,
    by: &str,
) -> Result<Option<Option<JobId>>, StoreError> {
    let row = db
        .query_opt(
            "UPDATE schedules SET enabled = false, updated_by = $3, updated_at = now()
             WHERE id = $1 AND tenant_id = $2 RETURNING last_job_id",
            &[&id, &tenant_id, &by],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Create a platform schedule when no schedule has its name (a built-in, ensured at start).
pub async fn ensure(db: &impl GenericClient, s: &NewSchedule) -> Result<Schedule, StoreError> {
    if let Some(found) = by_name(db, &s.name).await? {
        return Ok(found);
    }
    match create(db, s).await? {
        Some(created) => Ok(created),
        None => by_name(db, &s.name).await?.ok_or_else(|| StoreError::Vanished(format!("schedule {:?}", s.name))),
    }
}
