//! The executor: runs claimed jobs and records each outcome, fenced by the attempt.
//!
//! Both transports end here: the Postgres-native worker loop (`worker`) claims due rows
//! itself, a transport that delivers ids (SQS) calls `run_dispatched`. Both record outcomes
//! through the one completer (`completer`).

mod completer;
mod decide;
mod record;
pub mod worker;

pub use completer::FLUSH_WINDOW;
use decide::panic_message;
pub use decide::{Ran, decide};

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use deadpool_postgres::Pool;
use futures::FutureExt;
use tracing::Instrument;

use crate::catalogue::Catalogue;
use crate::credentials::{JobAws, TaskCredentials};
use crate::job::{ClaimedJob, ExceptionKind, JobId, Outcome};
use crate::retry::RetryPolicy;
use crate::store::StoreError;
use crate::store::jobs;
use crate::store::modes::Modes;
use crate::task::TaskContext;
use crate::transport::{self, Transport};

/// `ExecutorConfig::deadline_reserve` unless configured.
pub const DEFAULT_DEADLINE_RESERVE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Lease length; a heartbeat renews it every third of this while a job runs.
    pub lease: Duration,
    /// Jobs one worker runs at once.
    pub concurrency: usize,
    /// Most jobs taken by one claim statement.
    pub claim_batch: usize,
    /// How long an idle worker waits for a wake-up before it looks anyway.
    pub poll_interval: Duration,
    /// Under a deadline (a Lambda invocation), the time kept back to record outcomes: a job
    /// starts only if its timeout fits in the time left less this.
    pub deadline_reserve: Duration,
    /// Under a deadline: the longest `timeout_seconds` any executor invocation can give (the
    /// longest lane's). A job above it can never start: it fails for good, with the reason.
    pub longest_fit: Option<i32>,
    /// Under a deadline: a lane for longer jobs. A job whose timeout exceeds `Onward::above`
    /// (this executor's own invocation less the reserve) is sent there, not run here.
    pub onward: Option<Onward>,
    /// Share the worker's running slots among the tenants with due work (`store::jobs::Shares`).
    /// Off only to measure what it buys (`relay chaos noisy --no-slot-shares`).
    pub slot_shares: bool,
    /// The worker's long lane: a job whose `timeout_seconds` exceeds `long_after` is long, and
    /// long jobs hold at most `long_slots` of the worker's `concurrency` slots (default half,
    /// at least 1), shared among tenants like the slots (`store::jobs::LongLane`). `None`:
    /// no lane (only to measure what it buys: `RELAY_TEST_LONG_LANE=off` in the tests).
    pub long_lane: Option<LaneSplit>,
    /// Share a send rate many tenants keep (an SES account's, a configuration set's) among the
    /// tenants with sends waiting (`email::pace`). Off only to measure what it buys.
    pub send_shares: bool,
}

/// How a worker's slots split into lanes (`ExecutorConfig::long_lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneSplit {
    /// A job whose `timeout_seconds` exceeds this is long.
    pub long_after: i32,
    /// The slots long jobs may hold; `None`: half the worker's, at least 1.
    pub long_slots: Option<usize>,
}

/// `LaneSplit::long_after` unless configured: a job that asked for more than the default
/// timeout (`job::terms::DEFAULT_TIMEOUT_SECONDS`) is long.
pub const DEFAULT_LONG_AFTER: i32 = crate::job::terms::DEFAULT_TIMEOUT_SECONDS;

impl Default for LaneSplit {
    fn default() -> Self {
        Self { long_after: DEFAULT_LONG_AFTER, long_slots: None }
    }
}

impl ExecutorConfig {
    /// The worker's long lane, in its slots (`LaneSplit`, within 1 to `concurrency`).
    pub fn long_lane(&self) -> Option<jobs::LongLane> {
        let split = self.long_lane?;
        let all = self.concurrency.max(1);
        let slots = split.long_slots.unwrap_or(all / 2).clamp(1, all);
        Some(jobs::LongLane { above: split.long_after, slots: i64::try_from(slots).unwrap_or(i64::MAX) })
    }
}

/// The long-job lane, seen from the short one (`ExecutorConfig::onward`).
#[derive(Clone)]
pub struct Onward {
    pub above: i32,
    pub transport: Arc<dyn Transport>,
}

impl std::fmt::Debug for Onward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Onward {{ above: {}, transport: {} }}", self.above, self.transport.name())
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            concurrency: 64,
            claim_batch: 64,
            poll_interval: Duration::from_secs(1),
            deadline_reserve: DEFAULT_DEADLINE_RESERVE,
            longest_fit: None,
            onward: None,
            slot_shares: true,
            long_lane: Some(LaneSplit::default()),
            send_shares: true,
        }
    }
}

/// Everything a worker needs; cheap to clone.
#[derive(Clone)]
pub struct Executor {
    pub pool: Pool,
    pub catalogue: Catalogue,
    pub transport: Arc<dyn Transport>,
    pub retry: RetryPolicy,
    pub config: ExecutorConfig,
    /// Where tasks get AWS credentials (per task type roles). `None`: every task's AWS access
    /// is denied.
    pub credentials: Option<Arc<TaskCredentials>>,
    /// How tasks create jobs (a fan-out parent's children): insert, commit, then dispatch.
    pub intake: crate::intake::Intake,
    /// Shared by the executors of one process: a worker loop holds a permit while it claims.
    pub claims: Arc<tokio::sync::Semaphore>,
}

/// Claim statements one process runs at once. Concurrent claims start at the same head of the
/// due index and step over each other's locked rows; past two at a time they add that
/// contention, not throughput, so more worker loops than this wait their turn to claim (their
/// jobs still run and record in parallel).
pub const CLAIMS_AT_ONCE: usize = 2;

/// What one delivery of ids came to (`run_dispatched_until`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Dispatched {
    pub report: RunReport,
    /// Jobs claimed and started.
    pub claimed: usize,
    /// What became of each id delivered, in the order delivered.
    pub fates: Vec<(JobId, Fate)>,
    /// Flushes that wrote outcomes (each one transaction).
    pub flushes: usize,
}

impl Dispatched {
    /// What became of `id` (`None`: it was not delivered).
    pub fn fate(&self, id: JobId) -> Option<Fate> {
        self.fates.iter().find(|f| f.0 == id).map(|f| f.1)
    }

    /// How many ids came to this.
    pub fn count(&self, fate: Fate) -> usize {
        self.fates.iter().filter(|f| f.1 == fate).count()
    }
}

/// What became of one delivered id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Claimed, run, and its outcome written in a committed flush (or refused as stale).
    Recorded(Recorded),
    /// Not started, because its timeout did not fit in the time left (no attempt charged, a
    /// `redispatched` event); already sent again for a later delivery.
    Deferred,
    /// Still running when the deadline came: nothing of it is recorded; it was stopped here,
    /// its lease expires and the sweep returns it.
    Unfinished,
    /// Run, but the flush of its outcome failed (nothing of it committed): its lease expires
    /// and the sweep returns it.
    Unrecorded,
    /// Not claimable: done, a duplicate or stale delivery, not yet due, paused. The row decides.
    NotClaimed,
    /// No job has this id: a message without a row.
    Missing,
}

/// What a flush did with one job's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Succeeded,
    Retried,
    Failed,
    /// Continues itself in a new run (or was deferred).
    Continued,
    /// Waits for its children, or for a completion.
    Waiting,
    /// Left `running` before its wait for a completion was written: the completion arrived
    /// first, or its lease expired.
    Overtaken,
    /// Refused: the job had moved on (a newer attempt owns it).
    Stale,
}

/// What one batch of jobs came to.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RunReport {
    pub succeeded: usize,
    pub retried: usize,
    pub failed: usize,
    /// Jobs that continue themselves in a new run, or now wait for their children.
    pub continued: usize,
    pub waiting: usize,
    /// Outcomes refused because the job had moved on (a newer attempt owns it).
    pub stale: usize,
}

impl Executor {
    fn lease_secs(&self) -> f64 {
        self.config.lease.as_secs_f64()
    }

    /// Claim these ids (if still claimable) and run them to an outcome. A duplicate or stale
    /// delivery claims nothing and runs nothing. Returns the report and how many ids ran.
    pub async fn run_dispatched(&self, ids: &[JobId]) -> Result<(RunReport, usize), StoreError> {
        let d = self.run_dispatched_until(ids, None).await?;
        Ok((d.report, d.claimed))
    }

    /// The same under a deadline (a Lambda invocation's): a job whose timeout does not fit in
    /// the time left (less `deadline_reserve`) is not claimed but sent again for a later
    /// delivery. Outcomes are written as jobs end, through the completer (its flush schedule),
    /// so a job that is still running cannot hold back the others'. Half the reserve before
    /// the deadline, whatever still runs is stopped. What became of each id comes back
    /// (`Dispatched::fates`); `Err` only when the claim itself failed.
    pub async fn run_dispatched_until(
        &self,
        ids: &[JobId],
        deadline: Option<Instant>,
    ) -> Result<Dispatched, StoreError> {
        let within = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now()).saturating_sub(self.config.deadline_reserve);
            i32::try_from(left.as_secs()).unwrap_or(i32::MAX)
        });
        let mut db = self.pool.get().await?;
        let mut claim = jobs::claim_ids(&db, ids, self.lease_secs(), within).await?;
        if claim.jobs.len() < ids.len() {
            // Some ids were not claimable without a key: keyed jobs take the keyed path (a
            // duplicate or stale delivery claims nothing there either).
            let n = i64::try_from(ids.len()).unwrap_or(i64::MAX);
            claim.merge(jobs::claim_keyed(&mut db, n, self.lease_secs(), jobs::Keyed::Ids(ids), within).await?);
        }
        let mut deferred = jobs::Deferred::default();
        let mut never = Vec::new();
        if let Some(within) = within
            && claim.jobs.len() < ids.len()
        {
            let rest: Vec<JobId> = ids.iter().filter(|id| !claim.jobs.iter().any(|j| j.id == **id)).copied().collect();
            let bounds = jobs::DeferBounds {
                onward_above: self.config.onward.as_ref().map(|o| o.above),
                longest: self.config.longest_fit,
            };
            deferred = jobs::defer_unfit(&db, &rest, within, bounds).await?;
            if !deferred.never.is_empty() {
                // Claimed only to fail for good through the one terminal path.
                never = jobs::claim_ids(&db, &deferred.never, self.lease_secs(), None).await?.jobs;
            }
        }
        drop(db);
        let missing = std::mem::take(&mut claim.missing);
        let mut out = self.run_claimed(claim, deferred, never, within, deadline).await;
        out.fates = ids
            .iter()
            .map(|id| {
                let fate = out.fate(*id).unwrap_or(if missing.contains(id) { Fate::Missing } else { Fate::NotClaimed });
                (*id, fate)
            })
            .collect();
        Ok(out)
    }

    /// The pre-traffic hook's check: claim the check job `id` of the tenant `tenant` (not yet
    /// due, so nothing else claims it: `jobs::claim_check`) and run it under the deadline as a
    /// dispatched job runs. `claimed` is 0 when it was not claimable or does not fit.
    pub async fn run_check(
        &self,
        id: JobId,
        tenant: &str,
        deadline: Option<Instant>,
    ) -> Result<Dispatched, StoreError> {
        let within = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now()).saturating_sub(self.config.deadline_reserve);
            i32::try_from(left.as_secs()).unwrap_or(i32::MAX)
        });
        let claim = jobs::claim_check(&self.pool.get().await?, id, tenant, self.lease_secs(), within).await?;
        let mut out = self.run_claimed(claim, jobs::Deferred::default(), Vec::new(), within, deadline).await;
        if out.fates.is_empty() {
            out.fates.push((id, Fate::NotClaimed));
        }
        Ok(out)
    }

    /// Run what a claim took (and fail for good the `never` ones) to outcomes under the
    /// deadline, recorded through the completer. The fates of the claimed and deferred ids.
    async fn run_claimed(
        &self,
        claim: jobs::Claim,
        deferred: jobs::Deferred,
        never: Vec<ClaimedJob>,
        within: Option<i32>,
        deadline: Option<Instant>,
    ) -> Dispatched {
        for d in deferred.again.iter().chain(&deferred.onward) {
            tracing::info!(event = "relay.executor.deferred", job_id = %d.id, within_seconds = within,
                onward = deferred.onward.contains(d),
                "job not started: its timeout does not fit in the invocation's time left; sent again");
        }
        transport::send(&self.transport, &self.pool, &deferred.again).await;
        match &self.config.onward {
            Some(o) => transport::send(&o.transport, &self.pool, &deferred.onward).await,
            None => transport::send(&self.transport, &self.pool, &deferred.onward).await,
        };
        let claimed = claim.jobs.len();
        let modes = Arc::new(claim.modes);
        let mut running = tokio::task::JoinSet::new();
        let mut started: Vec<JobId> = Vec::with_capacity(claimed);
        for job in claim.jobs {
            started.push(job.id);
            let (exec, modes) = (self.clone(), modes.clone());
            running.spawn(async move {
                let outcome = exec.execute(&job, modes).await;
                (job, outcome)
            });
        }
        let stop_at = deadline.map(|d| d.checked_sub(self.config.deadline_reserve / 2).unwrap_or(d));
        let mut out = Dispatched {
            claimed,
            fates: deferred.again.iter().chain(&deferred.onward).map(|d| (d.id, Fate::Deferred)).collect(),
            ..Dispatched::default()
        };
        let longest = self.config.longest_fit.unwrap_or(i32::MAX);
        let mut ended: Vec<(ClaimedJob, Outcome)> = never
            .into_iter()
            .map(|job| {
                let error = format!(
                    "never started: its timeout ({} s) exceeds the {longest} s the longest executor invocation can give; \
                     retry it with a timeout_seconds of at most {longest}",
                    job.timeout_seconds
                );
                (job, Outcome::Failed { kind: ExceptionKind::FatalError, error, tenants: false })
            })
            .collect();
        let schedule = completer::FlushSchedule::new(self.config.concurrency);
        let mut flush_at: Option<Instant> = (!ended.is_empty()).then(Instant::now);
        // Each turn has an arm enabled: a job running, or an outcome waiting for its flush.
        while !(running.is_empty() && ended.is_empty()) {
            tokio::select! {
                next = running.join_next(), if !running.is_empty() => match next {
                    Some(Ok(pair)) => {
                        started.retain(|id| *id != pair.0.id);
                        ended.push(pair);
                        let keyed = completer::any_keyed(ended.iter().map(|(j, _)| j));
                        let at = Instant::now() + schedule.wait(ended.len(), running.len(), keyed);
                        flush_at = Some(flush_at.map_or(at, |f| f.min(at)));
                    }
                    // `execute` catches a task's panic; this is only the executor's own.
                    Some(Err(e)) => tracing::error!(event = "relay.executor.job_task_failed", error = %e,
                        "a job's task ended without an outcome; its lease expires and the sweep returns it"),
                    None => {}
                },
                _ = sleep_until(flush_at), if flush_at.is_some() => {
                    self.complete(&std::mem::take(&mut ended), &mut out).await;
                    flush_at = None;
                }
                _ = sleep_until(stop_at), if stop_at.is_some() => break,
            }
        }
        if !ended.is_empty() {
            self.complete(&ended, &mut out).await;
        }
        if !running.is_empty() {
            running.abort_all();
            tracing::warn!(
                event = "relay.executor.deadline",
                jobs = started.len(),
                "jobs still running at the invocation's deadline were stopped; their leases expire and the sweep returns them"
            );
            out.fates.extend(started.into_iter().map(|id| (id, Fate::Unfinished)));
        }
        out
    }

    /// One flush of a delivery's ended jobs through the completer, and what follows its commit;
    /// each job's fate noted. A flush that fails leaves its jobs unrecorded (their leases
    /// expire and the sweep returns them); the delivery's other jobs go on.
    async fn complete(&self, ended: &[(ClaimedJob, Outcome)], out: &mut Dispatched) {
        out.flushes += 1;
        match self.flush(ended, None).await {
            Ok(f) => {
                out.report.add(&f.report);
                out.fates.extend(f.results.into_iter().map(|(id, r)| (id, Fate::Recorded(r))));
                self.after_commit(f.after).await;
            }
            Err(e) => {
                tracing::warn!(event = "relay.executor.record_failed", error = %e, jobs = ended.len(),
                    "could not record outcomes; their leases expire and the sweep returns the jobs");
                out.fates.extend(ended.iter().map(|(j, _)| (j.id, Fate::Unrecorded)));
            }
        }
    }

    /// Run one claimed job to its outcome: timeout, panic and unknown type included.
    pub async fn execute(&self, job: &ClaimedJob, modes: Arc<Modes>) -> Outcome {
        let policy = self.catalogue.retry_policy(&job.task_type).unwrap_or(self.retry);
        let ctx = TaskContext {
            job_id: job.id,
            tenant_id: job.tenant_id,
            task_type: job.task_type.clone(),
            attempt: job.attempt,
            correlation_id: job.correlation_id.clone(),
            modes,
            db: self.pool.clone(),
            jobs: Arc::new(self.intake.clone()),
            aws: Arc::new(JobAws::new(self.credentials.clone(), job, self.pool.clone())),
            retry: policy,
            send_shares: self.config.send_shares,
        };
        let timeout = Duration::from_secs(u64::try_from(job.timeout_seconds).unwrap_or(1));
        let span = crate::telemetry::job_span(job);
        let run = AssertUnwindSafe(self.catalogue.run(&job.task_type, &ctx, job.params.clone())).catch_unwind();
        let run = async {
            tracing::debug!(event = "relay.job.started", "attempt started");
            tokio::time::timeout(timeout, run).await
        };
        let ran = match run.instrument(span.clone()).await {
            Err(_) => Ran::TimedOut(timeout),
            Ok(Err(panic)) => Ran::Panicked(panic_message(&panic)),
            Ok(Ok(None)) => Ran::UnknownType,
            Ok(Ok(Some(r))) => Ran::Finished(r),
        };
        decide(job, ran, Utc::now(), &policy)
    }
}

impl RunReport {
    /// Add another flush's counts to these.
    pub fn add(&mut self, other: &RunReport) {
        self.succeeded += other.succeeded;
        self.retried += other.retried;
        self.failed += other.failed;
        self.continued += other.continued;
        self.waiting += other.waiting;
        self.stale += other.stale;
    }
}

/// Sleep until `at`; never wakes when there is none (the `select!` arm is off then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

impl Executor {
    /// Keyed jobs that just stopped running freed slots of these keys (`freed_keys`): the next
    /// due jobs of those keys are dispatched at once. A failure here only delays them until the
    /// sweep.
    pub(crate) async fn hand_on(&self, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let ready = async { jobs::keyed_ready(&mut self.pool.get().await?, keys, HAND_ON_LIMIT).await };
        match ready.await {
            Ok(ready) => {
                transport::send(&self.transport, &self.pool, &ready).await;
            }
            Err(e) => {
                tracing::warn!(event = "relay.executor.hand_on_failed", error = %e, "could not hand freed slots on; the sweep will")
            }
        }
    }
}

/// The concurrency keys whose slots these ended jobs freed, once each.
pub(crate) fn freed_keys(outcomes: &[(ClaimedJob, Outcome)]) -> Vec<String> {
    let mut keys: Vec<String> = outcomes.iter().filter_map(|(j, _)| j.concurrency_key.clone()).collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Most jobs one hand-on dispatches.
const HAND_ON_LIMIT: i64 = 1000;
