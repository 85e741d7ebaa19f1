//! Maintenance: the duties the sweep runs, one service per file, each with its own schedule
//! (how often, how many rows a batch, how many batches a run) and its own failure: a service
//! that fails is logged by name and the others still run. `Sweeper` is their one runner, used
//! by `relay sweep`, `relay dev` and the sweeper function.
//!
//! In the order a pass runs them: `leases` (expired leases back to pending, or failed),
//! `dispatches` (lost dispatches re-sent), `parents` (fan-outs finished), `dependents`
//! (dependencies healed), `completions` (overdue waits for a completion), `progress`
//! (progress baselines), `schedules` (due schedule slots fired), `ses_account` (the SES
//! account's rate and quota read), `ses_contacts` (tenants' topic opt-outs and resubscribes
//! written to mapped SES contacts), `alerts` (alert emails queued), `tenant_faults` (tenants'
//! own failures signalled) and `instances` (workers unseen for a week forgotten). Every
//! recovery is a job event and a counter. Any number of sweepers may run at once: rows are
//! locked with `SKIP LOCKED`, so two sweepers never recover the same row.

mod alerts;
mod completions;
mod dependents;
mod dispatches;
mod instances;
mod leases;
mod parents;
mod progress;
mod runner;
mod schedules;
mod ses_account;
mod ses_contacts;
mod tenant_faults;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use serde::Serialize;

use crate::alerts::AlertConfig;
use crate::intake::Intake;
use crate::store::StoreError;
use crate::transport::Transport;

pub use dispatches::ResendBackoff;
pub use leases::decide_expired;
pub use runner::{SweepError, Sweeper};

#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// Rows a batch handles, for the services that work in batches; a run goes on while its
    /// batches come back full.
    pub batch: i64,
    /// A dispatched job not claimed this long after falling due counts as lost.
    pub redispatch_grace: Duration,
    /// Upper bound on batches per run of a service, so one pass always ends.
    pub max_batches: usize,
    /// Alert emails for new exceptions (`crate::alerts`); `None`: the log line only.
    pub alerts: Option<AlertConfig>,
    /// Relay's SES account: read its rate and quota (`GetAccount`) with this configuration, at
    /// most once per `ACCOUNT_READ_EVERY` across every sweeper, and write tenants' topic
    /// changes to mapped SES contacts (`ses_contacts`); `None`: neither.
    pub ses_account: Option<aws_config::SdkConfig>,
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            batch: 1000,
            redispatch_grace: Duration::from_secs(30),
            max_batches: 100,
            alerts: None,
            ses_account: None,
        }
    }
}

/// What one pass did: every service's figures.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    pub leases_returned: usize,
    pub leases_failed: usize,
    pub redispatched: usize,
    /// Schedule slots this pass created jobs for.
    pub schedules_fired: usize,
    /// Alert emails queued for new exceptions.
    pub alerts_queued: usize,
    /// Waiting fan-out parents finished because every child had.
    pub parents_finished: usize,
    /// Waits for a completion past their deadline whose overdue policy this pass applied.
    pub completions_overdue: usize,
    /// Open waits closed because their job had left their attempt (cancelled, retried).
    pub waits_superseded: usize,
    /// Tenant faults signalled to operators (`relay.tenant_fault`).
    pub tenant_faults_signalled: usize,
    /// Whether this pass read the SES account's rate and quota.
    pub ses_account_read: bool,
    /// Tenants' topic changes written to SES contacts.
    pub ses_contacts_written: usize,
    /// Tenants' topic changes SES refused or could not be reached for (tried again later).
    pub ses_contacts_failed: usize,
    /// Jobs released or cancelled (down a chain too) for dependencies whose end did not
    /// resolve them: a crash between the two, or a chain longer than one release takes on
    /// (`dependencies::RELEASE_BUDGET`). At most ten batches a pass; the rest the next.
    pub dependents_healed: usize,
}

/// How often a service runs, and how much it takes at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// The runner's loop runs it at most this often; `Duration::ZERO`: every pass.
    pub every: Duration,
    /// Rows per batch; a run goes on while a batch comes back with this many.
    pub batch: i64,
    /// Batches per run at most, so a run always ends.
    pub batches: usize,
}

impl Schedule {
    /// Every pass, in the configured batches.
    fn every_pass(config: &SweepConfig) -> Schedule {
        Schedule { every: Duration::ZERO, batch: config.batch, batches: config.max_batches }
    }

    /// One batch of `batch` rows, every `every`.
    fn once(every: Duration, batch: i64) -> Schedule {
        Schedule { every, batch, batches: 1 }
    }
}

/// What a service works with: the sweep's clients and settings.
pub struct Context<'a> {
    pub pool: &'a Pool,
    pub transport: &'a Arc<dyn Transport>,
    /// Creates the jobs of schedule slots and alert emails.
    pub intake: &'a Intake,
    pub config: &'a SweepConfig,
}

/// One maintenance duty. The runner calls `batch` until a batch comes back short of the
/// schedule's batch size, at most `Schedule::batches` times (the batch loop, written once).
#[async_trait::async_trait]
pub trait Service: Send + Sync {
    /// The service's name in logs and in a failed pass's error.
    fn name(&self) -> &'static str;

    fn schedule(&self, config: &SweepConfig) -> Schedule;

    /// Whether this run may go at all; asked once per run (the re-sends' backoff says no
    /// while the transport keeps failing).
    fn ready(&self) -> bool {
        true
    }

    /// One batch of at most `limit` rows, its figures added to `report`. Returns how many
    /// rows it took: fewer than `limit` ends the run.
    async fn batch(&self, cx: &Context<'_>, limit: i64, report: &mut SweepReport) -> Result<usize, StoreError>;
}

/// Every service, in the order a pass runs them.
fn services() -> Vec<Box<dyn Service>> {
    vec![
        Box::new(leases::Leases),
        Box::new(dispatches::Dispatches::default()),
        Box::new(parents::Parents),
        Box::new(dependents::Dependents),
        Box::new(completions::Overdue),
        Box::new(progress::Baselines),
        Box::new(schedules::Slots),
        Box::new(ses_account::Account),
        Box::new(ses_contacts::Contacts),
        Box::new(alerts::Alerts),
        Box::new(tenant_faults::Signals),
        Box::new(instances::Forget),
    ]
}

/// A batch's count as a row count for comparing with its limit.
fn rows(limit: i64) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX)
}
