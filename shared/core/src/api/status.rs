//! `GET /v1/status`: the status contract `relay.status/v1` (types in `crate::status`, schema in
//! `shared/schemas/status-v1.json`), for holders of a read-only status key.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};

use super::AppState;
use super::error::ApiError;
use super::extract::StatusReader;
use crate::store::status as queries;
use crate::store::{StoreError, exceptions, schedules, workers};
use crate::view::{self, JobView};
use relay_status::{self as status, Activity, Failures, Progress, Queue, Run, Schedule, StatusDoc, Worker};

/// Workers seen within this window are listed.
pub const WORKERS_WINDOW_HOURS: i64 = 24;
pub const MAX_WORKERS: i64 = 200;
/// Recent runs per part (running, waiting, finished).
pub const RUNS_PER_PART: i64 = 10;
/// The activity chart: 12 buckets of 5 minutes; each series reads at most this many rows.
pub const ACTIVITY_BUCKETS: usize = 12;
pub const ACTIVITY_BUCKET_SECS: i64 = 300;
pub const ACTIVITY_CAP: i64 = 50_000;

/// `GET /v1/status`: the status contract `relay.status/v1` (JSON Schema:
/// `shared/schemas/status-v1.json`).
#[utoipa::path(get, path = "/v1/status", tag = "meta", security(("status_key" = [])),
    responses((status = 200, description = "the status contract relay.status/v1, as described by shared/schemas/status-v1.json",
        content_type = "application/json"),
        (status = 401, body = super::error::ErrorBody), (status = 503, body = super::error::ErrorBody)))]
pub async fn status(State(state): State<AppState>, StatusReader(_): StatusReader) -> Result<Json<StatusDoc>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let now = Utc::now();
    let seen = workers::seen_since(&db, now - chrono::Duration::hours(WORKERS_WINDOW_HOURS), MAX_WORKERS).await?;
    let live = queries::queues(&db).await?;
    let (jobs, tenants): (Vec<_>, Vec<_>) =
        queries::recent_runs(&db, RUNS_PER_PART).await?.into_iter().map(|r| (r.job, r.tenant)).unzip();
    let runs = view::annotate(&db, jobs, now).await?.into_iter().zip(tenants);
    let (last_hour, last_24h) = queries::failure_counts(&db).await?;
    let open_exceptions = exceptions::count_open(&db).await?;
    let dead_letters_24h = crate::store::dead_letters::count_since(&db, now - chrono::Duration::hours(24)).await?;
    let newest_exceptions = queries::open_exceptions(&db, 10).await?;
    let modes = crate::store::modes::load_global(&db).await?;
    let destinations = queries::destinations(&db, 100)
        .await?
        .into_iter()
        .map(|mut d| {
            d.writes_enabled &= modes.writes_enabled("http");
            d
        })
        .collect();
    let (waits_open, waits_overdue) = crate::store::completions::count_open(&db).await?;
    let send_rates = crate::store::send_rates::list(&db).await?;
    let activity = queries::activity(&db, ACTIVITY_BUCKETS, ACTIVITY_BUCKET_SECS, ACTIVITY_CAP).await?;
    let reputation = reputation(&db).await?;
    let cutovers = cutovers(&db).await?;

    // Every task type in the catalogue has a queue (depth 0 when idle), plus any live type
    // the catalogue no longer knows.
    let mut queues: BTreeMap<String, Queue> = state
        .catalogue
        .names()
        .into_iter()
        .map(|n| {
            (n.to_owned(), Queue { name: n.to_owned(), transport: state.transport.name().into(), ..Queue::default() })
        })
        .collect();
    for q in live {
        queues.insert(
            q.task_type.clone(),
            Queue {
                name: q.task_type,
                transport: state.transport.name().into(),
                depth: q.due,
                oldest_pending_age_s: q.oldest_due.map_or(0.0, |at| age_secs(now, at)),
                scheduled: Some(q.scheduled),
                running: Some(q.running),
            },
        );
    }
    for q in queues.values_mut() {
        q.scheduled.get_or_insert(0);
        q.running.get_or_insert(0);
    }

    Ok(Json(StatusDoc {
        contract: status::CONTRACT.into(),
        version: status::VERSION.into(),
        project: state.project.clone(),
        generated_at: Some(now),
        workers: seen
            .into_iter()
            .map(|w| Worker {
                kind: w.kind,
                instance_id: w.instance_id,
                host: Some(w.host),
                pid: w.pid,
                started_at: Some(w.started_at),
                last_seen_at: Some(w.last_seen_at),
            })
            .collect(),
        queues: queues.into_values().collect(),
        schedules: schedules::list(&db)
            .await?
            .into_iter()
            .map(|s| Schedule {
                name: s.name,
                cron: Some(format!("{} ({})", s.cron, s.timezone)),
                last_run_at: s.last_fired_slot,
                last_outcome: s.last_outcome,
                next_run_at: s.enabled.then_some(s.next_run_at),
            })
            .collect(),
        recent_runs: runs.map(|(j, tenant)| run(j, tenant)).collect(),
        failures: Failures { last_hour, last_24h, open_exceptions, dead_letters_24h: Some(dead_letters_24h) },
        activity: Some(Activity {
            bucket_s: activity.bucket_secs,
            runs: activity.runs,
            failures: activity.failures,
            truncated: activity.truncated,
        }),
        exceptions: Some(newest_exceptions),
        destinations: Some(destinations),
        completions: Some(status::Completions { open: waits_open, overdue: waits_overdue }),
        send_rates: Some(send_rates.iter().map(|r| send_rate(r, now)).collect()),
        reputation: Some(reputation),
        cutovers: Some(cutovers),
    }))
}

/// Tenants and configuration sets listed in `reputation`, at most this many of each.
pub const MAX_REPUTATIONS: i64 = 100;

/// Each watched tenant's guard and rolling rates, then each configuration set's rates over
/// the default window (`email::reputation`).
async fn reputation(db: &impl crate::store::GenericClient) -> Result<Vec<status::ReputationStatus>, StoreError> {
    use crate::email::reputation as guard;
    use crate::store::reputation as store;
    let mut out = Vec::new();
    for (tenant, name) in store::watched(db, MAX_REPUTATIONS).await? {
        let g = store::get(db, tenant).await?.unwrap_or_else(guard::defaults);
        let c = store::counts(db, tenant, g.window_hours).await?;
        out.push(guard::tenant_status(&name, &g, &c));
    }
    for (set, c) in store::by_configuration_set(db, guard::WINDOW_HOURS, MAX_REPUTATIONS).await? {
        out.push(guard::set_status(&set, guard::WINDOW_HOURS, &c));
    }
    Ok(out)
}

/// Every tenant's cut-over stages, named by tenant.
async fn cutovers(db: &impl crate::store::GenericClient) -> Result<Vec<status::CutoverStatus>, StoreError> {
    let mut out = Vec::new();
    for s in crate::store::cutover::list(db, None, MAX_REPUTATIONS).await? {
        let name = crate::store::tenants::by_id(db, s.tenant_id).await?.map(|t| t.name);
        out.push(status::CutoverStatus {
            tenant: name.unwrap_or_else(|| s.tenant_id.to_string()),
            task_type: s.task_type,
            stage: s.stage,
            share: s.share,
            started_at: Some(s.started_at),
            halted_at: s.halted_at,
            halted_reason: s.halted_reason,
        });
    }
    Ok(out)
}

/// A send rate as the contract shows it (`email::pace` decides what holds).
pub fn send_rate(r: &crate::store::send_rates::SendRate, now: DateTime<Utc>) -> status::SendRateStatus {
    use crate::email::pace;
    status::SendRateStatus {
        scope: r.scope.as_str().into(),
        key: r.key.clone(),
        effective_rate: pace::effective(r, now),
        configured_rate: r.rate_per_second,
        provider_rate: r.provider_rate,
        factor: pace::factor_now(r, now),
        throttles: r.throttles,
        last_throttle_at: r.last_throttle_at,
        max_24h: r.max_24h,
        quota_left: pace::quota_left(r),
    }
}

fn age_secs(now: DateTime<Utc>, at: DateTime<Utc>) -> f64 {
    ((now - at).num_milliseconds().max(0) as f64) / 1000.0
}

/// A job as a run, with the progress of the job resource, and its tenant's name.
pub fn run(j: JobView, tenant: String) -> Run {
    let progress = j.progress.as_ref().map(Progress::from);
    Run {
        id: j.id.to_string(),
        task_type: j.task_type,
        status: j.status.as_str().into(),
        tenant: Some(tenant),
        correlation_id: Some(j.correlation_id),
        idempotency_key: Some(j.idempotency_key),
        parent_id: j.parent_id.map(|p| p.to_string()),
        run_at: Some(j.run_at),
        attempt: Some(j.attempt),
        max_attempts: Some(j.max_attempts),
        timeout_seconds: Some(j.timeout_seconds),
        lease_until: j.lease_until,
        started_at: j.started_at,
        last_error: j.last_error,
        created_at: Some(j.created_at),
        updated_at: Some(j.updated_at),
        finished_at: j.finished_at,
        progress,
    }
}
