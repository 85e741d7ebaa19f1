//! The queries behind the status contract (`GET /v1/status`). Each one reads only live rows or
//! a right-edge range of a partial index, so its cost does not grow with the number of
//! finished jobs: `jobs_due_free`, `jobs_keyed_pending` and `jobs_leases` (queues),
//! `jobs_failed_finished` (failure counts), `jobs_finished_top` and `jobs_waiting` (recent
//! runs); progress comes from `store::progress`.

use chrono::{DateTime, Utc};

use super::jobs::{JOB_COLUMNS, Job, PENDING_JOBS};
use super::{GenericClient, StoreError};

/// Live work of one task type.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRow {
    pub task_type: String,
    /// Pending and due now.
    pub due: i64,
    /// Pending, due later.
    pub scheduled: i64,
    pub running: i64,
    /// `run_at` of the oldest due job.
    pub oldest_due: Option<DateTime<Utc>>,
}

/// Pending and running jobs per task type (task types with no live job are absent).
pub async fn queues(db: &impl GenericClient) -> Result<Vec<QueueRow>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT task_type, sum(due)::bigint, sum(scheduled)::bigint, sum(running)::bigint, min(oldest)
             FROM (SELECT task_type, (run_at <= now())::int AS due, (run_at > now())::int AS scheduled,
                          0 AS running, CASE WHEN run_at <= now() THEN run_at END AS oldest
                   FROM {PENDING_JOBS} p
                   UNION ALL
                   SELECT task_type, 0, 0, 1, NULL FROM jobs WHERE status = 'running') live
             GROUP BY task_type ORDER BY task_type"
        ))
        .await?;
    Ok(db
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|r| QueueRow {
            task_type: r.get(0),
            due: r.get(1),
            scheduled: r.get(2),
            running: r.get(3),
            oldest_due: r.get(4),
        })
        .collect())
}

/// Top-level jobs that failed for good in the last hour and the last 24 hours: counted as runs
/// are (a campaign whose children failed is one failure, as it is one run).
pub async fn failure_counts(db: &impl GenericClient) -> Result<(i64, i64), StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT count(*) FILTER (WHERE finished_at >= now() - interval '1 hour'), count(*)
             FROM jobs WHERE status = 'failed' AND parent_id IS NULL AND finished_at >= now() - interval '24 hours'",
        )
        .await?;
    let row = db.query_one(&stmt, &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// Runs and failures per bucket over the last `buckets * bucket_secs` seconds, oldest bucket
/// first. Runs are finished top-level jobs (a campaign is one run); failures are the runs among
/// them that failed for good (a campaign whose children failed fails itself), so the two series
/// share a basis and a scale. Each count reads at most `cap` index entries, newest first;
/// `truncated` says the cap was reached (older buckets are then undercounted).
#[derive(Debug, Clone, PartialEq)]
pub struct Activity {
    pub bucket_secs: i64,
    pub runs: Vec<i64>,
    pub failures: Vec<i64>,
    pub truncated: bool,
}

pub async fn activity(
    db: &impl GenericClient,
    buckets: usize,
    bucket_secs: i64,
    cap: i64,
) -> Result<Activity, StoreError> {
    let window = bucket_secs * i64::try_from(buckets).unwrap_or(0);
    let mut out = Activity { bucket_secs, runs: vec![0; buckets], failures: vec![0; buckets], truncated: false };
    let sources = [
        "SELECT finished_at FROM jobs WHERE finished_at IS NOT NULL AND parent_id IS NULL
           AND finished_at >= now() - make_interval(secs => $1) ORDER BY finished_at DESC LIMIT $2",
        "SELECT finished_at FROM jobs WHERE status = 'failed' AND parent_id IS NULL
           AND finished_at >= now() - make_interval(secs => $1) ORDER BY finished_at DESC LIMIT $2",
    ];
    for (n, source) in sources.iter().enumerate() {
        let stmt = db
            .prepare_cached(&format!(
                "SELECT floor(extract(epoch FROM now() - finished_at)::float8 / $3::float8)::bigint AS ago, count(*), (sum(count(*)) OVER ())::bigint
                 FROM ({source}) f GROUP BY 1"
            ))
            .await?;
        let (window_f, bucket_f) = (window as f64, bucket_secs as f64);
        let rows = db.query(&stmt, &[&window_f, &cap, &bucket_f]).await?;
        let series = if n == 0 { &mut out.runs } else { &mut out.failures };
        for r in rows {
            let ago: i64 = r.get(0);
            if r.get::<_, i64>(2) >= cap {
                out.truncated = true;
            }
            if let Ok(ago) = usize::try_from(ago)
                && ago < buckets
            {
                series[buckets - 1 - ago] += r.get::<_, i64>(1);
            }
        }
    }
    Ok(out)
}

/// A job shown as a run, with its tenant's name.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub job: Job,
    pub tenant: String,
}

/// Recent top-level runs: up to `limit` running, up to `limit` waiting (fan-out parents) and up
/// to `limit` most recently finished, in that order (each part newest first).
pub async fn recent_runs(db: &impl GenericClient, limit: i64) -> Result<Vec<RunRow>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT r.*, (SELECT name FROM tenants t WHERE t.id = r.tenant_id) AS tenant_name FROM (
                 (SELECT 0 AS part, {JOB_COLUMNS} FROM jobs WHERE status = 'running' AND parent_id IS NULL
                  ORDER BY lease_until DESC LIMIT $1)
                 UNION ALL
                 (SELECT 1, {JOB_COLUMNS} FROM jobs WHERE status = 'waiting' ORDER BY updated_at DESC LIMIT $1)
                 UNION ALL
                 (SELECT 2, {JOB_COLUMNS} FROM jobs WHERE finished_at IS NOT NULL AND parent_id IS NULL
                  ORDER BY finished_at DESC LIMIT $1)
             ) r ORDER BY part, coalesce(finished_at, updated_at) DESC"
        ))
        .await?;
    db.query(&stmt, &[&limit])
        .await?
        .iter()
        .map(|r| {
            Ok(RunRow { job: Job::from_row(r)?, tenant: r.get::<_, Option<String>>("tenant_name").unwrap_or_default() })
        })
        .collect()
}

/// The newest open exceptions with their tenant's name; the cause cut to 300 characters.
pub async fn open_exceptions(
    db: &impl GenericClient,
    limit: i64,
) -> Result<Vec<relay_status::OpenException>, StoreError> {
    let rows = db
        .query(
            "SELECT e.id, e.job_id, t.name, e.task_type, e.kind, left(e.cause, 300), e.opened_at
             FROM exceptions e JOIN tenants t ON t.id = e.tenant_id
             WHERE e.status = 'open' ORDER BY e.opened_at DESC LIMIT $1",
            &[&limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| relay_status::OpenException {
            id: r.get::<_, uuid::Uuid>(0).to_string(),
            job_id: r.get::<_, crate::job::JobId>(1).to_string(),
            tenant: Some(r.get(2)),
            task_type: r.get(3),
            kind: r.get(4),
            cause: r.get(5),
            opened_at: Some(r.get(6)),
        })
        .collect())
}

/// Tenants' HTTP destinations (at most `limit`, by tenant and name) with their tenant's name,
/// rate and last call; writes enabled when both the tenant's switch and the operator's for the
/// destination allow them (`write:http` is the caller's to apply).
pub async fn destinations(
    db: &impl GenericClient,
    limit: i64,
) -> Result<Vec<relay_status::DestinationStatus>, StoreError> {
    let rows = db
        .query(
            "SELECT d.writes_enabled AND coalesce((SELECT enabled FROM operating_modes
                                                   WHERE name = 'write:http:' || d.tenant_id || ':' || d.name), true),
                    t.name, d.name, d.rate_per_second, c.outcome, c.http_status, c.at
             FROM http_destinations d JOIN tenants t ON t.id = d.tenant_id
             LEFT JOIN LATERAL (SELECT outcome, http_status, at FROM http_calls
                                WHERE tenant_id = d.tenant_id AND destination = d.name ORDER BY id DESC LIMIT 1) c ON true
             ORDER BY t.name, d.name LIMIT $1",
            &[&limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| relay_status::DestinationStatus {
            tenant: Some(r.get(1)),
            name: r.get(2),
            writes_enabled: r.get(0),
            rate_per_second: r.get(3),
            last_outcome: r.get(4),
            last_http_status: r.get(5),
            last_call_at: r.get(6),
        })
        .collect())
}
