//! Recording outcomes in two steps: `write` (fenced, a statement per kind of outcome, sent
//! together inside the caller's transaction) and, once that is committed, `settle`: alerts,
//! logs and metrics, parents whose last child ended, and the dispatch of retries and
//! callbacks. The completer (`completer`) runs both; the slots keyed jobs freed are filled in
//! the same transaction (a worker's lanes) or handed on after it.

use std::collections::HashSet;

use super::{Executor, Recorded, RunReport};
use crate::job::{ClaimedJob, Dispatch, Ending, Fence, JobId, Outcome};
use crate::metrics;
use crate::parents::finish_parents;
use crate::store::jobs::{self, Failure, Retry};
use crate::store::{GenericClient, StoreError};
use crate::transport;

/// Outcomes written, and what is left to do once the write is committed (`Executor::settle`).
#[derive(Debug)]
pub(crate) struct Written {
    /// Each job's result, in the order of the outcomes.
    pub(super) results: Vec<(JobId, Recorded)>,
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

/// A flush's outcomes sorted by kind, each with its fence.
#[derive(Default)]
struct Kinds {
    done: Vec<(Fence, serde_json::Value)>,
    retries: Vec<(Fence, Retry)>,
    failures: Vec<(Fence, Failure)>,
    continues: Vec<(Fence, jobs::Continued)>,
    waits: Vec<(Fence, i32)>,
    awaits: Vec<(Fence, chrono::DateTime<chrono::Utc>)>,
}

impl Kinds {
    /// Statements the write sends (one per kind present).
    fn statements(&self) -> usize {
        let k = [
            self.done.len(),
            self.retries.len(),
            self.failures.len(),
            self.continues.len(),
            self.waits.len(),
            self.awaits.len(),
        ];
        k.iter().filter(|n| **n > 0).count()
    }
}

impl Executor {
    fn kinds(&self, outcomes: &[(ClaimedJob, Outcome)]) -> Kinds {
        let mut k = Kinds::default();
        for (job, outcome) in outcomes {
            match outcome {
                Outcome::Succeeded { result } => k.done.push((job.fence(), result.clone())),
                Outcome::Retry { run_at, error } => {
                    k.retries.push((job.fence(), Retry { run_at: *run_at, error: error.clone() }))
                }
                Outcome::Failed { kind, error, tenants } => {
                    let fault = self.catalogue.fault(job, Ending { kind: *kind, error, tenants: *tenants });
                    k.failures.push((job.fence(), Failure { kind: *kind, error: error.clone(), fault, owners: false }))
                }
                Outcome::Continue { note, run_at, rate } => {
                    k.continues.push((job.fence(), (note.clone(), *run_at, rate.clone())))
                }
                Outcome::Wait { total } => k.waits.push((job.fence(), *total)),
                Outcome::AwaitCompletion { until } => k.awaits.push((job.fence(), *until)),
            }
        }
        k
    }

    /// Write outcomes, fenced by each job's attempt: a statement per kind of outcome, sent
    /// together (one flight) on `db`, inside the caller's transaction. When there is more than
    /// one, the rows are locked first, in id order (`jobs::lock_in_order`).
    pub(crate) async fn write(
        &self,
        db: &impl GenericClient,
        outcomes: &[(ClaimedJob, Outcome)],
    ) -> Result<Written, StoreError> {
        let kinds = self.kinds(outcomes);
        let writes = kinds.statements();
        let Kinds { done, retries, mut failures, continues, waits, awaits } = kinds;
        let lock = async {
            if writes > 1 {
                let mut ids: Vec<JobId> = outcomes.iter().map(|(j, _)| j.id).collect();
                ids.sort();
                jobs::lock_in_order(db, &ids).await?;
            }
            Ok::<_, StoreError>(())
        };
        // Polled in this order, so sent in it: the lock first.
        let (_, succeeded, stale_retries, failed, stale_continues, stale_waits, early) = tokio::try_join!(
            lock,
            async {
                if done.is_empty() { Ok(jobs::Succeeded::default()) } else { jobs::succeed_reporting(db, &done).await }
            },
            async { if retries.is_empty() { Ok(Vec::<Fence>::new()) } else { jobs::retry(db, &retries).await } },
            async {
                if failures.is_empty() {
                    Ok(jobs::Failed::default())
                } else {
                    jobs::fail_reporting(db, &failures).await
                }
            },
            async {
                if continues.is_empty() { Ok(Vec::<Fence>::new()) } else { jobs::continue_later(db, &continues).await }
            },
            async { if waits.is_empty() { Ok(Vec::<Fence>::new()) } else { jobs::wait_running(db, &waits).await } },
            async {
                if awaits.is_empty() { Ok(Vec::<Fence>::new()) } else { jobs::await_completion(db, &awaits).await }
            },
        )?;
        let stale_failures = &failed.refused;
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
        redo.extend(failed.callbacks.iter().copied());
        let mut parents = succeeded.parents;
        parents.extend(failed.parents.iter().copied());
        // A parent that starts waiting after its children all ended (they were quick) is done.
        parents.extend(waits.iter().filter(|w| !stale_waits.contains(&w.0)).map(|w| w.0.job));
        let stale: Vec<Fence> = [&succeeded.refused, &stale_retries, stale_failures, &stale_continues, &stale_waits]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        let results = results(outcomes, &stale, &early);
        failures.retain(|f| !stale_failures.contains(&f.0));
        Ok(Written {
            results,
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
    pub(crate) async fn settle(&self, w: Written) {
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
    }
}

/// Each job's result: stale when its fence was refused, overtaken when it left `running`
/// before its wait was written, else what its outcome asked for.
fn results(outcomes: &[(ClaimedJob, Outcome)], stale: &[Fence], early: &[Fence]) -> Vec<(JobId, Recorded)> {
    let stale: HashSet<JobId> = stale.iter().map(|f| f.job).collect();
    let early: HashSet<JobId> = early.iter().map(|f| f.job).collect();
    let of = |job: &ClaimedJob, outcome: &Outcome| match outcome {
        _ if stale.contains(&job.id) => Recorded::Stale,
        Outcome::AwaitCompletion { .. } if early.contains(&job.id) => Recorded::Overtaken,
        Outcome::Succeeded { .. } => Recorded::Succeeded,
        Outcome::Retry { .. } => Recorded::Retried,
        Outcome::Failed { .. } => Recorded::Failed,
        Outcome::Continue { .. } => Recorded::Continued,
        Outcome::Wait { .. } | Outcome::AwaitCompletion { .. } => Recorded::Waiting,
    };
    outcomes.iter().map(|(job, outcome)| (job.id, of(job, outcome))).collect()
}

impl RunReport {
    /// The counts of these results.
    pub(crate) fn of(results: &[(JobId, Recorded)]) -> RunReport {
        let mut r = RunReport::default();
        for (_, result) in results {
            match result {
                Recorded::Succeeded => r.succeeded += 1,
                Recorded::Retried => r.retried += 1,
                Recorded::Failed => r.failed += 1,
                Recorded::Continued => r.continued += 1,
                Recorded::Waiting => r.waiting += 1,
                Recorded::Stale => r.stale += 1,
                Recorded::Overtaken => {}
            }
        }
        r
    }
}
