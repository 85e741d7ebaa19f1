//! The one runner of the maintenance services: a pass runs each service (every one, or those
//! whose interval has come), each in its batches, and a service that fails does not stop the
//! others (unless no connection can be had at all: then the pass ends). The loop (`run`)
//! starts a pass every interval.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::watch;

use super::{Context, Service, SweepConfig, SweepReport, services};
use crate::intake::Intake;
use crate::liveness::Liveness;
use crate::store::StoreError;
use crate::transport::Transport;

/// The sweep: the maintenance services and what they work with. Clones share the services'
/// state (the re-sends' backoff, when each last ran): a loop's passes, or a Lambda container's
/// invocations.
#[derive(Clone)]
pub struct Sweeper {
    pub pool: Pool,
    pub transport: Arc<dyn Transport>,
    /// Creates the jobs of schedule slots and alert emails.
    pub intake: Intake,
    pub config: SweepConfig,
    services: Arc<[Box<dyn Service>]>,
    /// When each service (by its place in `services`) last ran.
    last_run: Arc<Mutex<Vec<Option<Instant>>>>,
}

/// A pass in which some services failed: each failed service and why, and what every
/// service did (the failed ones up to their failure).
#[derive(Debug)]
pub struct SweepError {
    pub report: SweepReport,
    pub failed: Vec<(&'static str, StoreError)>,
}

impl std::fmt::Display for SweepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all: Vec<String> = self.failed.iter().map(|(name, e)| format!("{name}: {e}")).collect();
        write!(f, "maintenance failed ({}); the other services ran", all.join("; "))
    }
}

impl std::error::Error for SweepError {}

impl Sweeper {
    pub fn new(pool: Pool, transport: Arc<dyn Transport>, intake: Intake, config: SweepConfig) -> Sweeper {
        Sweeper::with_services(pool, transport, intake, config, services())
    }

    fn with_services(
        pool: Pool,
        transport: Arc<dyn Transport>,
        intake: Intake,
        config: SweepConfig,
        services: Vec<Box<dyn Service>>,
    ) -> Sweeper {
        let last_run = Arc::new(Mutex::new(vec![None; services.len()]));
        Sweeper { pool, transport, intake, config, services: services.into(), last_run }
    }

    /// Run every service once, now.
    pub async fn pass(&self) -> Result<SweepReport, SweepError> {
        self.run_services(|_, _| true).await
    }

    /// Run the services whose interval has come (`Schedule::every`): those of every pass, and
    /// the others once their interval has passed since they last ran here.
    pub async fn pass_due(&self) -> Result<SweepReport, SweepError> {
        self.run_services(|every, last| last.is_none_or(|at| at.elapsed() >= every)).await
    }

    async fn run_services(&self, due: impl Fn(Duration, Option<Instant>) -> bool) -> Result<SweepReport, SweepError> {
        let cx = Context { pool: &self.pool, transport: &self.transport, intake: &self.intake, config: &self.config };
        let mut report = SweepReport::default();
        let mut failed = Vec::new();
        for (n, service) in self.services.iter().enumerate() {
            let schedule = service.schedule(&self.config);
            let last = self.last_run.lock().unwrap_or_else(|p| p.into_inner())[n];
            if !due(schedule.every, last) {
                continue;
            }
            self.last_run.lock().unwrap_or_else(|p| p.into_inner())[n] = Some(Instant::now());
            if !service.ready() {
                continue;
            }
            match run_batches(service.as_ref(), &cx, schedule.batch, schedule.batches, &mut report).await {
                Ok(()) => {}
                // No connection to be had (the database unreachable, the pool exhausted): every
                // later service would wait for one in turn, so the pass ends here.
                Err(e @ StoreError::Pool(_)) => {
                    tracing::warn!(event = "relay.sweep.service_failed", service = service.name(), error = %e,
                        "no database connection; the rest of this pass waits for the next");
                    failed.push((service.name(), e));
                    break;
                }
                Err(e) => {
                    tracing::warn!(event = "relay.sweep.service_failed", service = service.name(), error = %e,
                        "a maintenance service failed; the others run, and it runs again next pass");
                    failed.push((service.name(), e));
                }
            }
        }
        if report != SweepReport::default() {
            tracing::info!(
                event = "relay.sweep.recovered",
                leases_returned = report.leases_returned,
                leases_failed = report.leases_failed,
                redispatched = report.redispatched,
                completions_overdue = report.completions_overdue,
                "sweep recovered work"
            );
        }
        if failed.is_empty() { Ok(report) } else { Err(SweepError { report, failed }) }
    }

    /// A pass every `interval` until `stop` turns true, each running the services that are
    /// due, recording liveness before each pass.
    pub async fn run(&self, interval: Duration, live: Option<Liveness>, mut stop: watch::Receiver<bool>) {
        // A pass starts every `interval` (not `interval` after the last one ended), so a failed
        // dispatch waits at most one interval, or one pass when a pass takes longer.
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*stop.borrow() {
            tokio::select! { _ = ticks.tick() => {}, _ = stop.changed() => break }
            if let Some(live) = &live {
                live.touch().await;
            }
            // A failed service was logged by name; it runs again at the next pass.
            let _ = self.pass_due().await;
        }
    }
}

/// The batch loop, written once: `batch` until one comes back short of `size` rows, at most
/// `most` times.
async fn run_batches(
    service: &dyn Service,
    cx: &Context<'_>,
    size: i64,
    most: usize,
    report: &mut SweepReport,
) -> Result<(), StoreError> {
    for _ in 0..most {
        if service.batch(cx, size, report).await? < super::rows(size) {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Schedule;
    use super::*;

    /// A service that fails, or counts its batches into `parents_finished` and returns `rows`.
    struct Fake {
        fails: bool,
        rows: usize,
        every: Duration,
    }

    #[async_trait::async_trait]
    impl Service for Fake {
        fn name(&self) -> &'static str {
            if self.fails { "failing" } else { "counting" }
        }

        fn schedule(&self, _: &SweepConfig) -> Schedule {
            Schedule { every: self.every, batch: 10, batches: 3 }
        }

        async fn batch(&self, _: &Context<'_>, _: i64, report: &mut SweepReport) -> Result<usize, StoreError> {
            if self.fails {
                return Err(StoreError::Vanished("the fake's table".into()));
            }
            report.parents_finished += 1;
            Ok(self.rows)
        }
    }

    fn sweeper(services: Vec<Box<dyn Service>>) -> Sweeper {
        // No connection is opened: the fakes never use the pool.
        let pool = crate::store::pool("postgres://nobody@127.0.0.1:1/none", &Default::default()).unwrap();
        let transport: Arc<dyn Transport> = Arc::new(crate::transport::postgres::PgTransport::new(pool.clone()));
        let intake = Intake::start(pool.clone(), transport.clone(), 1);
        Sweeper::with_services(pool, transport, intake, SweepConfig::default(), services)
    }

    #[tokio::test]
    async fn a_failing_service_skips_none_of_the_others() {
        let s = sweeper(vec![
            Box::new(Fake { fails: false, rows: 0, every: Duration::ZERO }),
            Box::new(Fake { fails: true, rows: 0, every: Duration::ZERO }),
            Box::new(Fake { fails: false, rows: 0, every: Duration::ZERO }),
        ]);
        let e = s.pass().await.unwrap_err();
        assert_eq!(e.report.parents_finished, 2, "the service after the failing one ran too");
        assert_eq!(e.failed.iter().map(|f| f.0).collect::<Vec<_>>(), ["failing"]);
        assert!(e.to_string().contains("failing: "), "{e}");
    }

    #[tokio::test]
    async fn a_full_batch_goes_on_up_to_the_most_batches_and_a_short_one_ends_the_run() {
        let full = sweeper(vec![Box::new(Fake { fails: false, rows: 10, every: Duration::ZERO })]);
        assert_eq!(full.pass().await.unwrap().parents_finished, 3);
        let short = sweeper(vec![Box::new(Fake { fails: false, rows: 9, every: Duration::ZERO })]);
        assert_eq!(short.pass().await.unwrap().parents_finished, 1);
    }

    #[tokio::test]
    async fn a_due_pass_runs_a_service_once_per_its_interval_and_every_pass_service_each_time() {
        let s = sweeper(vec![
            Box::new(Fake { fails: false, rows: 0, every: Duration::ZERO }),
            Box::new(Fake { fails: false, rows: 0, every: Duration::from_secs(3600) }),
        ]);
        assert_eq!(s.pass_due().await.unwrap().parents_finished, 2, "the first pass runs both");
        assert_eq!(s.clone().pass_due().await.unwrap().parents_finished, 1, "the hourly one waits, in clones too");
        assert_eq!(s.pass().await.unwrap().parents_finished, 2, "a full pass runs every service");
    }
}
