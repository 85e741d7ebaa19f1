//! Recording outcomes in two steps: `write` (fenced, a statement per kind of outcome, on a
//! connection or inside the caller's transaction) and, once that is committed, `settle`:
//! alerts, logs and metrics, parents whose last child ended, and the dispatch of retries and
//! callbacks. `record` is both on one connection. The slots keyed jobs freed are the caller's
//! to fill: `hand_on`, or a worker's own claim of those keys (`worker`).

use super::{Executor, RunReport};
use crate::job::{ClaimedJob, Dispatch, Ending, Fence, JobId, Outcome};
use crate::metrics;
use crate::parents::finish_parents;
use crate::store::jobs::{self, Failure, Retry};
use crate::store::{GenericClient, StoreError};
use crate::transport;

/// Outcomes written, and what is left to do once the write is committed (`Executor::settle`).
#[derive(Debug)]
pub(crate) struct Written {
    report: RunReport,
    /// Terminal failures written (not stale), and the exceptions they opened.
    failures: Vec<(Fence, Failure)>,
    opened: Vec<(uuid::Uuid, JobId)>,
    /// Jobs that left `running` before their wait for a completion was written.
    early: Vec<Fence>,
    stale: Vec<Fence>,
    redo: Vec<Dispatch>,
    parents: Vec<JobId>,
    /// Statements that wrote, and outcomes.
    writes: usize,
    jobs: usize,
}

impl Executor {
    /// Record outcomes (fenced) and settle them.
    pub async fn record(&self, outcomes: &[(ClaimedJob, Outcome)]) -> Result<RunReport, StoreError> {
        let written = self.write(&self.pool.get().await?, outcomes).await?;
        Ok(self.settle(written).await)
    }

    /// Write outcomes, fenced by each job's attempt: a statement per kind of outcome.
    pub(crate) async fn write(
        &self,
        db: &impl GenericClient,
        outcomes: &[(ClaimedJob, Outcome)],
    ) -> Result<Written, StoreError> {
        let mut done = Vec::new();
        let mut retries = Vec::new();
        let mut failures = Vec::new();
        let mut continues = Vec::new();
        let mut waits = Vec::new();
        let mut awaits = Vec::new();
        for (job, outcome) in outcomes {
            match outcome {
                Outcome::Succeeded { result } => done.push((job.fence(), result.clone())),
                Outcome::Retry { run_at, error } => {
                    retries.push((job.fence(), Retry { run_at: *run_at, error: error.clone() }))
                }
                Outcome::Failed { kind, error, tenants } => {
                    let fault = self.catalogue.fault(job, Ending { kind: *kind, error, tenants: *tenants });
                    failures.push((job.fence(), Failure { kind: *kind, error: error.clone(), fault, owners: false }))
                }
                Outcome::Continue { note, run_at, rate } => {
                    continues.push((job.fence(), (note.clone(), *run_at, rate.clone())))
                }
                Outcome::Wait { total } => waits.push((job.fence(), *total)),
                Outcome::AwaitCompletion { until } => awaits.push((job.fence(), *until)),
            }
        }
        let succeeded =
            if done.is_empty() { jobs::Succeeded::default() } else { jobs::succeed_reporting(db, &done).await? };
        let stale_done = succeeded.refused;
        let stale_retries = if retries.is_empty() { vec![] } else { jobs::retry(db, &retries).await? };
        let failed =
            if failures.is_empty() { jobs::Failed::default() } else { jobs::fail_reporting(db, &failures).await? };
        let stale_failures = failed.refused;
        let stale_continues = if continues.is_empty() { vec![] } else { jobs::continue_later(db, &continues).await? };
        let stale_waits = if waits.is_empty() { vec![] } else { jobs::wait_running(db, &waits).await? };
        let early = if awaits.is_empty() { vec![] } else { jobs::await_completion(db, &awaits).await? };

        let mut redo: Vec<Dispatch> = retries
            .iter()
            .filter(|r| !stale_retries.contains(&r.0))
            .map(|(fence, r)| Dispatch { id: fence.job, run_at: r.run_at, tenant: None })
            .collect();
        redo.extend(continues.iter().filter(|c| !stale_continues.contains(&c.0)).map(|c| Dispatch {
            id: c.0.job,
            run_at: c.1.1,
            tenant: None,
        }));
        redo.extend(succeeded.callbacks);
        redo.extend(failed.callbacks);
        let mut parents = succeeded.parents;
        parents.extend(failed.parents);
        // A parent that starts waiting after its children all ended (they were quick) is done.
        parents.extend(waits.iter().filter(|w| !stale_waits.contains(&w.0)).map(|w| w.0.job));
        let writes = [done.len(), retries.len(), failures.len(), continues.len(), waits.len(), awaits.len()]
            .iter()
            .filter(|n| **n > 0)
            .count();
        let stale: Vec<Fence> = [&stale_done, &stale_retries, &stale_failures, &stale_continues, &stale_waits]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        let report = RunReport {
            succeeded: done.len() - stale_done.len(),
            retried: retries.len() - stale_retries.len(),
            failed: failures.len() - stale_failures.len(),
            continued: continues.len() - stale_continues.len(),
            waiting: waits.len() - stale_waits.len() + awaits.len() - early.len(),
            stale: stale.len(),
        };
        failures.retain(|f| !stale_failures.contains(&f.0));
        Ok(Written {
            report,
            failures,
            opened: failed.opened,
            early,
            stale,
            redo,
            parents,
            writes,
            jobs: outcomes.len(),
        })
    }

    /// What follows a committed write: alerts and logs, the parents whose last child this was,
    /// and the dispatch of retries and callbacks.
    pub(crate) async fn settle(&self, w: Written) -> RunReport {
        metrics::OUTCOME_WRITES.add(w.writes);
        for fence in &w.early {
            tracing::info!(event = "relay.executor.completed_early", job_id = %fence.job, attempt = fence.attempt,
                "the job left running before its wait was recorded: its completion arrived first, or its lease expired");
        }
        for (exception_id, job_id) in &w.opened {
            if let Some((_, f)) = w.failures.iter().find(|f| f.0.job == *job_id) {
                crate::exceptions::alert_opened(*exception_id, *job_id, f.kind, &f.error);
            }
        }
        for (fence, f) in &w.failures {
            if w.opened.iter().any(|o| o.1 == fence.job) {
                tracing::warn!(event = "relay.job.failed", job_id = %fence.job, attempt = fence.attempt, kind = f.kind.as_str(),
                    error = %f.error, "job failed for good; exception opened");
            } else {
                // A child (its parent reports the failure), a tenant's own, or a job whose
                // exception is still open.
                tracing::info!(event = "relay.job.failed", job_id = %fence.job, attempt = fence.attempt, kind = f.kind.as_str(),
                    error = %f.error, "job failed for good");
            }
        }
        for fence in &w.stale {
            tracing::warn!(event = "relay.executor.stale_write", job_id = %fence.job, attempt = fence.attempt,
                "outcome refused: the job has moved on to a newer attempt");
        }
        metrics::STALE_WRITES.add(w.stale.len());
        metrics::JOBS_RUN.add(w.jobs);
        let mut redo = w.redo;
        redo.extend(finish_parents(&self.pool, w.parents).await);
        transport::send(&self.transport, &self.pool, &redo).await;
        w.report
    }
}
