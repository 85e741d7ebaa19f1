//! The reads behind a job's progress and waiting reason (decided in `crate::progress`), and the
//! rolling run-time baselines the sweep refreshes.

use std::collections::HashMap;

use super::{GenericClient, StoreError};
use crate::job::JobId;

/// Children of one parent, counted from their rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChildCounts {
    pub total: i64,
    /// Succeeded and did their work (an email sent), not counting the skipped or shadowed.
    pub succeeded: i64,
    /// Succeeded in shadow mode: recorded what they would have done, did nothing (an email
    /// shadowed, not sent).
    pub shadowed: i64,
    /// Succeeded with `skipped` in their result: ended on purpose without doing their work
    /// (an email to a suppressed recipient), never a failure.
    pub skipped: i64,
    pub failed: i64,
    pub cancelled: i64,
}

impl ChildCounts {
    pub fn terminal(&self) -> i64 {
        self.succeeded + self.shadowed + self.skipped + self.failed + self.cancelled
    }
}

/// A succeeded child whose result says it was skipped (`crate::email::SKIPPED_SUPPRESSED`);
/// SQL over a `jobs` row aliased `c`.
pub const SKIPPED_CHILD: &str = "c.status = 'succeeded' AND c.result ? 'skipped'";

/// A succeeded child that ran in shadow mode: its result says `"shadowed": true` (an email,
/// an HTTP call, a callback recorded and not sent) or, for an email, `"status": "shadowed"`;
/// SQL over a `jobs` row aliased `c`.
pub const SHADOWED_CHILD: &str = "c.status = 'succeeded' AND NOT (c.result ? 'skipped') \
     AND (c.result @> '{\"shadowed\": true}' OR c.result @> '{\"status\": \"shadowed\"}')";

/// A task type's run-time baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    pub p50_s: f64,
    pub p95_s: f64,
    pub runs: i32,
}

/// Earlier runs a baseline is computed from, per task type (the latest successful ones).
pub const BASELINE_RUNS: i64 = 100;
/// How many of the latest finished top-level jobs one refresh reads (bounded work per pass).
pub const BASELINE_SCAN: i64 = 20_000;

/// Child counts of each parent that has children (parents without children are absent); the
/// numerator counts only children in a terminal state, so a child that dies cannot move it.
pub async fn child_counts(
    db: &impl GenericClient,
    parents: &[JobId],
) -> Result<HashMap<JobId, ChildCounts>, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "SELECT c.parent_id, count(*),
                        count(*) FILTER (WHERE c.status = 'succeeded' AND NOT ({SKIPPED_CHILD}) AND NOT ({SHADOWED_CHILD})),
                        count(*) FILTER (WHERE {SHADOWED_CHILD}),
                        count(*) FILTER (WHERE {SKIPPED_CHILD}),
                        count(*) FILTER (WHERE c.status = 'failed'),
                        count(*) FILTER (WHERE c.status = 'cancelled')
                 FROM jobs c WHERE c.parent_id = ANY($1) GROUP BY c.parent_id"
        ))
        .await?;
    Ok(db
        .query(&stmt, &[&parents])
        .await?
        .iter()
        .map(|r| {
            (
                r.get(0),
                ChildCounts {
                    total: r.get(1),
                    succeeded: r.get(2),
                    shadowed: r.get(3),
                    skipped: r.get(4),
                    failed: r.get(5),
                    cancelled: r.get(6),
                },
            )
        })
        .collect())
}

/// Baselines of these task types (types with no finished runs yet are absent).
pub async fn baselines(db: &impl GenericClient, task_types: &[&str]) -> Result<HashMap<String, Baseline>, StoreError> {
    let stmt =
        db.prepare_cached("SELECT task_type, p50_s, p95_s, runs FROM task_baselines WHERE task_type = ANY($1)").await?;
    Ok(db
        .query(&stmt, &[&task_types])
        .await?
        .iter()
        .map(|r| (r.get(0), Baseline { p50_s: r.get(1), p95_s: r.get(2), runs: r.get(3) }))
        .collect())
}

/// Recompute each task type's median and p95 run time (claim to success of the attempt that
/// succeeded) over its latest `BASELINE_RUNS` successful top-level runs among the latest
/// `BASELINE_SCAN` finished ones (`jobs_finished_top`, newest first). Types with no run in
/// that window keep their last baseline. Returns how many baselines were written.
pub async fn refresh_baselines(db: &impl GenericClient) -> Result<u64, StoreError> {
    let stmt = db
        .prepare_cached(
            "INSERT INTO task_baselines (task_type, p50_s, p95_s, runs, updated_at)
             SELECT task_type,
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY secs),
                    percentile_cont(0.95) WITHIN GROUP (ORDER BY secs),
                    count(*), now()
             FROM (SELECT task_type, extract(epoch FROM finished_at - started_at)::float8 AS secs,
                          row_number() OVER (PARTITION BY task_type ORDER BY finished_at DESC) AS n
                   FROM (SELECT task_type, status, started_at, finished_at FROM jobs
                         WHERE finished_at IS NOT NULL AND parent_id IS NULL
                         ORDER BY finished_at DESC LIMIT $2) latest
                   WHERE status = 'succeeded' AND started_at IS NOT NULL) runs
             WHERE n <= $1
             GROUP BY task_type
             ON CONFLICT (task_type) DO UPDATE
                 SET p50_s = excluded.p50_s, p95_s = excluded.p95_s, runs = excluded.runs, updated_at = now()",
        )
        .await?;
    Ok(db.execute(&stmt, &[&BASELINE_RUNS, &BASELINE_SCAN]).await?)
}

/// Jobs of each of these concurrency keys running now.
pub async fn running_per_key(db: &impl GenericClient, keys: &[&str]) -> Result<HashMap<String, i64>, StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT concurrency_key, count(*) FROM jobs
             WHERE status = 'running' AND concurrency_key = ANY($1) GROUP BY concurrency_key",
        )
        .await?;
    Ok(db.query(&stmt, &[&keys]).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
}
