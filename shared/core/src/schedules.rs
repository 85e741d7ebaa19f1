//! Platform-owned cron schedules: the slot arithmetic (pure, `now` passed in) and the sweep's
//! firing of due slots.
//!
//! Exactly once per slot, with any number of sweepers: each slot's job is created through
//! `Intake::enqueue` under the idempotency key `schedule:<id>:<slot rfc3339>`, so a second fire
//! of the slot finds the first job; the schedule then advances with a compare-and-set on
//! `next_run_at`, so only one sweeper moves it. No connection is held while enqueueing (a
//! Lambda container has one). A slot missed during downtime fires once (the latest one),
//! unless the schedule asks for catch-up, which fires each missed slot, oldest first.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use deadpool_postgres::Pool;
use serde::Serialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::intake::Intake;
use crate::job::TenantId;
use crate::job::terms::{CorrelationId, IdempotencyKey, RequestHash};
use crate::store::StoreError;
use crate::store::jobs::{Inserted, NewJob};
use crate::store::schedules::{self, NewSchedule, Schedule};
use crate::store::tenants;

/// Most slots one schedule fires in one pass when catching up; the rest follow next pass.
pub const MAX_CATCH_UP: usize = 100;
/// Schedules handled per pass.
pub const MAX_DUE: i64 = 100;
/// The tenant that owns platform work (built-in schedules).
pub const PLATFORM_TENANT: &str = "platform";

/// A cron expression and its time zone, parsed.
#[derive(Debug, Clone)]
pub struct CronTz {
    cron: Cron,
    tz: Tz,
}

impl CronTz {
    /// Parse both; the error names which one is wrong, as (field, message).
    pub fn parse(cron: &str, timezone: &str) -> Result<CronTz, (&'static str, String)> {
        let tz = Tz::from_str(timezone).map_err(|_| ("timezone", format!("{timezone:?} is not an IANA time zone")))?;
        let cron = Cron::from_str(cron).map_err(|e| ("cron", format!("{cron:?} is not a cron expression: {e}")))?;
        Ok(CronTz { cron, tz })
    }

    /// The first slot strictly after `t`, if the expression has one.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&t.with_timezone(&self.tz), false).ok().map(|d| d.with_timezone(&Utc))
    }

    /// The slots to fire at `now` for a schedule due at `next_run_at`, and the next run after
    /// them. Without catch-up only the latest due slot fires; with it, every due slot (at most
    /// `MAX_CATCH_UP`, the rest next time).
    pub fn due_slots(
        &self,
        next_run_at: DateTime<Utc>,
        now: DateTime<Utc>,
        catch_up: bool,
    ) -> (Vec<DateTime<Utc>>, Option<DateTime<Utc>>) {
        if next_run_at > now {
            return (vec![], Some(next_run_at));
        }
        let mut slots = vec![next_run_at];
        let mut at = next_run_at;
        loop {
            match self.next_after(at) {
                Some(n) if n <= now => {
                    if catch_up {
                        if slots.len() == MAX_CATCH_UP {
                            return (slots, Some(n));
                        }
                        slots.push(n);
                    } else {
                        slots[0] = n;
                    }
                    at = n;
                }
                next => return (slots, next),
            }
        }
    }
}

fn slot_job(s: &Schedule, slot: DateTime<Utc>, now: DateTime<Utc>) -> NewJob {
    let key = IdempotencyKey::schedule_slot(s.id, slot);
    NewJob {
        correlation_id: CorrelationId::schedule_slot(&s.name, slot),
        request_hash: RequestHash::of(key.as_str().as_bytes()),
        run_at: now,
        ..NewJob::new(&s.task_type, s.params.clone(), key)
    }
}

/// What one firing pass did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct FireReport {
    /// Slot jobs created by this pass.
    pub fired: usize,
    /// Slots whose job existed already (another sweeper fired them).
    pub already_fired: usize,
}

/// Fire every due slot of every due schedule (the sweep calls this each pass).
pub async fn fire_due(pool: &Pool, intake: &Intake, now: DateTime<Utc>) -> Result<FireReport, StoreError> {
    let due = schedules::due(&pool.get().await?, now, MAX_DUE).await?;
    let mut report = FireReport::default();
    for s in due {
        let Ok(ct) = CronTz::parse(&s.cron, &s.timezone) else {
            // Validated when written; a row edited by hand is skipped, loudly.
            tracing::error!(event = "relay.schedule.invalid", schedule = %s.name, "schedule has an invalid cron or time zone");
            continue;
        };
        let (slots, next) = ct.due_slots(s.next_run_at, now, s.catch_up);
        let Some(last) = slots.last().copied() else { continue };
        let jobs: Vec<NewJob> = slots.iter().map(|slot| slot_job(&s, *slot, now)).collect();
        let inserted = intake.enqueue(s.tenant_id, jobs).await.map_err(StoreError::Intake)?;
        let mut last_job = None;
        for i in &inserted {
            let j = match i {
                Inserted::Created(j) => {
                    report.fired += 1;
                    j
                }
                Inserted::Existing(j) => {
                    report.already_fired += 1;
                    j
                }
            };
            last_job = Some(j.id);
        }
        // A schedule whose expression has no next slot parks a century ahead (disable it).
        let next = next.unwrap_or_else(|| now + chrono::Duration::days(36_500));
        if let Some(job_id) = last_job {
            let advanced = schedules::advance(&pool.get().await?, s.id, s.next_run_at, last, job_id, next).await?;
            if advanced {
                tracing::info!(event = "relay.schedule.fired", schedule = %s.name, slots = slots.len(),
                    slot = %last, job_id = %job_id, next_run_at = %next, "schedule fired");
            }
        }
    }
    Ok(report)
}

/// Check what an operator gives for a schedule: the cron expression and time zone, the task
/// type and its params. Errors are (field, code, message).
pub fn validate(
    catalogue: &crate::catalogue::Catalogue,
    task_type: &str,
    params: &Value,
    cron: &str,
    timezone: &str,
) -> Result<CronTz, (String, &'static str, String)> {
    if !catalogue.contains(task_type) {
        return Err((
            "task_type".into(),
            "unknown_task_type",
            format!("task type {task_type:?} is not in the catalogue"),
        ));
    }
    catalogue.check(task_type, params).map_err(|e| (e.field.clone(), "invalid_params", e.to_string()))?;
    CronTz::parse(cron, timezone).map_err(|(field, msg)| {
        (field.to_owned(), if field == "cron" { "invalid_cron" } else { "invalid_timezone" }, msg)
    })
}

/// The built-in housekeeping schedule: `relay.retention` daily at 03:17 UTC, keeping terminal
/// jobs for `retention_days`. Created once; afterwards its params (the window) and cron are
/// the operator's to change over the API or the CLI.
pub async fn ensure_builtin(pool: &Pool, retention_days: u32, now: DateTime<Utc>) -> Result<Schedule, StoreError> {
    let db = pool.get().await?;
    let platform: TenantId = tenants::ensure(&db, PLATFORM_TENANT).await?.id;
    let (cron, tz) = ("17 3 * * *", "UTC");
    let next = CronTz::parse(cron, tz).ok().and_then(|c| c.next_after(now)).unwrap_or(now);
    schedules::ensure(
        &db,
        &NewSchedule {
            name: "relay.retention".into(),
            tenant_id: platform,
            task_type: crate::catalogue::housekeeping::RETENTION.into(),
            params: json!({ "older_than_days": retention_days }),
            cron: cron.into(),
            timezone: tz.into(),
            enabled: true,
            catch_up: false,
            next_run_at: next,
            updated_by: "system".into(),
        },
    )
    .await
}

/// A schedule as an operator describes it (API body and CLI flags).
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique; letters, digits and `_.:-`, at most 100.
    pub name: String,
    pub task_type: String,
    #[serde(default = "empty_object")]
    pub params: Value,
    /// 5 fields (minute first), or 6 with seconds first.
    pub cron: String,
    /// IANA time zone; default UTC.
    #[serde(default = "utc")]
    pub timezone: String,
    /// Owner of the jobs it fires: a tenant's name; default the platform tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Fire every slot missed during downtime, not only the latest.
    #[serde(default)]
    pub catch_up: bool,
}

fn empty_object() -> Value {
    json!({})
}
fn utc() -> String {
    "UTC".into()
}
fn yes() -> bool {
    true
}

/// A change to a schedule; absent fields stay as they are.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulePatch {
    pub enabled: Option<bool>,
    pub catch_up: Option<bool>,
    pub params: Option<Value>,
    pub cron: Option<String>,
    pub timezone: Option<String>,
}

/// Why a schedule could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("{field}: {message}")]
    Invalid { field: String, code: &'static str, message: String },
    #[error("a schedule named {0:?} exists already")]
    Exists(String),
    #[error("no such schedule")]
    NotFound,
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn invalid((field, code, message): (String, &'static str, String)) -> ScheduleError {
    ScheduleError::Invalid { field, code, message }
}

/// Validate and create a schedule; its first run is the first slot after `now`.
pub async fn add(
    db: &impl crate::store::GenericClient,
    catalogue: &crate::catalogue::Catalogue,
    spec: ScheduleSpec,
    by: &str,
    now: DateTime<Utc>,
) -> Result<Schedule, ScheduleError> {
    if !crate::store::operators::valid_name(&spec.name) || spec.name.contains('@') {
        return Err(invalid(("name".into(), "invalid_field", "1 to 100 letters, digits or `_.:-`".into())));
    }
    let ct = validate(catalogue, &spec.task_type, &spec.params, &spec.cron, &spec.timezone).map_err(invalid)?;
    let next_run_at = ct
        .next_after(now)
        .ok_or_else(|| invalid(("cron".into(), "invalid_cron", "the expression has no future slot".into())))?;
    let tenant_id = match spec.tenant.as_deref() {
        None | Some(PLATFORM_TENANT) => tenants::ensure(db, PLATFORM_TENANT).await?.id,
        Some(name) => {
            tenants::by_name(db, name)
                .await?
                .ok_or_else(|| invalid(("tenant".into(), "unknown_tenant", format!("no tenant named {name:?}"))))?
                .id
        }
    };
    let new = NewSchedule {
        name: spec.name.clone(),
        tenant_id,
        task_type: spec.task_type,
        params: spec.params,
        cron: spec.cron,
        timezone: spec.timezone,
        enabled: spec.enabled,
        catch_up: spec.catch_up,
        next_run_at,
        updated_by: by.to_owned(),
    };
    schedules::create(db, &new).await?.ok_or(ScheduleError::Exists(spec.name))
}

/// Apply a change. A new expression or time zone, or a resume, starts from the first slot
/// after `now`: slots that passed while a schedule was paused do not fire.
pub async fn change(
    db: &mut deadpool_postgres::Client,
    catalogue: &crate::catalogue::Catalogue,
    id: Uuid,
    patch: SchedulePatch,
    by: &str,
    now: DateTime<Utc>,
) -> Result<Schedule, ScheduleError> {
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let mut s = schedules::lock(&tx, id).await?.ok_or(ScheduleError::NotFound)?;
    let restart = patch.cron.is_some() || patch.timezone.is_some() || (patch.enabled == Some(true) && !s.enabled);
    if let Some(v) = patch.params {
        s.params = v;
    }
    if let Some(v) = patch.cron {
        s.cron = v;
    }
    if let Some(v) = patch.timezone {
        s.timezone = v;
    }
    if let Some(v) = patch.enabled {
        s.enabled = v;
    }
    if let Some(v) = patch.catch_up {
        s.catch_up = v;
    }
    let ct = validate(catalogue, &s.task_type, &s.params, &s.cron, &s.timezone).map_err(invalid)?;
    if restart {
        s.next_run_at = ct
            .next_after(now)
            .ok_or_else(|| invalid(("cron".into(), "invalid_cron", "the expression has no future slot".into())))?;
    }
    s.updated_by = by.to_owned();
    schedules::save(&tx, &s).await?;
    let saved = schedules::get(&tx, id).await?.ok_or(ScheduleError::NotFound)?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn slots_follow_the_expression_in_its_time_zone() {
        let c = CronTz::parse("0 9 * * *", "Europe/Paris").unwrap();
        // 09:00 in Paris is 07:00 UTC in summer, 08:00 in winter.
        assert_eq!(c.next_after(t("2024-07-01T00:00:00Z")), Some(t("2024-07-01T07:00:00Z")));
        assert_eq!(c.next_after(t("2024-12-01T00:00:00Z")), Some(t("2024-12-01T08:00:00Z")));
        assert!(CronTz::parse("0 9 * * *", "Mars/Olympus").unwrap_err().0 == "timezone");
        assert!(CronTz::parse("every day", "UTC").unwrap_err().0 == "cron");
    }

    #[test]
    fn a_missed_run_fires_once_unless_catch_up() {
        let c = CronTz::parse("0 * * * *", "UTC").unwrap();
        let (next, now) = (t("2024-01-01T10:00:00Z"), t("2024-01-01T13:30:00Z"));
        let (slots, after) = c.due_slots(next, now, false);
        assert_eq!(slots, [t("2024-01-01T13:00:00Z")], "only the latest missed slot");
        assert_eq!(after, Some(t("2024-01-01T14:00:00Z")));
        let (slots, after) = c.due_slots(next, now, true);
        assert_eq!(slots.len(), 4, "10, 11, 12 and 13 o'clock");
        assert_eq!(after, Some(t("2024-01-01T14:00:00Z")));
        assert!(c.due_slots(t("2024-01-01T14:00:00Z"), now, false).0.is_empty(), "not due yet");
    }

    #[test]
    fn catch_up_is_bounded_per_pass() {
        let c = CronTz::parse("* * * * *", "UTC").unwrap();
        let (slots, after) = c.due_slots(t("2024-01-01T00:00:00Z"), t("2024-01-02T00:00:00Z"), true);
        assert_eq!(slots.len(), MAX_CATCH_UP);
        assert_eq!(after, Some(t("2024-01-01T01:40:00Z")), "the rest next pass");
    }
}
