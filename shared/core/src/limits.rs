//! Per-tenant limits on the rows a tenant's own calls create and that outlive the call: HTTP
//! destinations, email templates, suppressions and topic opt-outs it adds, and its unfinished jobs. The
//! deployment's configuration holds the defaults (`Defaults`); an operator overrides one kind
//! for one tenant (`store::limits`, `PUT /v1/admin/tenants/{tenant_id}/limits`).
//!
//! A named row (a destination, a template, a suppression) is admitted inside the transaction
//! that writes it, under a lock per tenant and kind, so concurrent creates cannot overshoot;
//! writing a name the tenant already has is an update and is always admitted. Jobs are
//! admitted against a count this process keeps per tenant, read again when over `FRESH` old
//! and then only for the jobs created since, so intake pays no query per job and no count of
//! a large backlog per second; see `admit_jobs` for what that lets through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use crate::job::{JobId, TenantId};
use crate::store::jobs::retention::first_id_at;
use crate::store::{GenericClient, StoreError, limits as store};

/// The largest limit a default or an override may have.
pub const MAX_LIMIT: i64 = 1_000_000_000;
/// How old this process's count of a tenant's unfinished jobs may be.
pub const FRESH: Duration = Duration::from_secs(1);
/// How often, at most, a tenant's unfinished jobs are all counted again while it is refused.
pub const FULL: Duration = Duration::from_secs(5);
/// How long after its id is made a job is taken to have committed (or failed): older ids are
/// counted once, with the jobs created before them (`Quotas::admit_jobs`).
pub const SETTLE: chrono::Duration = chrono::Duration::seconds(5);
/// What a refusal of jobs asks the client to wait (jobs drain as they run).
pub const RETRY_AFTER_SECONDS: u64 = 5;

pub use crate::store::limits::Kind;

/// The environment variable (and `relay` flag, lower-cased) of a kind's default.
pub fn variable(kind: Kind) -> &'static str {
    match kind {
        Kind::Destinations => "RELAY_LIMIT_DESTINATIONS",
        Kind::Templates => "RELAY_LIMIT_TEMPLATES",
        Kind::Suppressions => "RELAY_LIMIT_SUPPRESSIONS",
        Kind::TopicOptOuts => "RELAY_LIMIT_TOPIC_OPT_OUTS",
        Kind::PendingJobs => "RELAY_LIMIT_PENDING_JOBS",
    }
}

/// The deployment's limits, one per kind, for every tenant without an override.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    pub destinations: i64,
    pub templates: i64,
    pub suppressions: i64,
    pub topic_opt_outs: i64,
    pub pending_jobs: i64,
}

/// Generous: far above what a well-behaved tenant uses, far below what would hurt the others.
/// 100 destinations and 1,000 templates are more integrations and messages than a service
/// has; 1,000,000 suppressions is a large sender's bounce list, as many topic opt-outs a large
/// list's preferences; 1,000,000 unfinished jobs is
/// two campaigns' worth of children, about 100 s of the intake's full rate.
impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            destinations: 100,
            templates: 1_000,
            suppressions: 1_000_000,
            topic_opt_outs: 1_000_000,
            pending_jobs: 1_000_000,
        }
    }
}

impl Defaults {
    pub fn of(&self, kind: Kind) -> i64 {
        match kind {
            Kind::Destinations => self.destinations,
            Kind::Templates => self.templates,
            Kind::Suppressions => self.suppressions,
            Kind::TopicOptOuts => self.topic_opt_outs,
            Kind::PendingJobs => self.pending_jobs,
        }
    }

    pub fn set(&mut self, kind: Kind, n: i64) {
        match kind {
            Kind::Destinations => self.destinations = n,
            Kind::Templates => self.templates = n,
            Kind::Suppressions => self.suppressions = n,
            Kind::TopicOptOuts => self.topic_opt_outs = n,
            Kind::PendingJobs => self.pending_jobs = n,
        }
    }
}

/// Why a create was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The tenant has `limit` rows of `kind` (or that many jobs unfinished).
    #[error("this tenant has reached its limit of {limit} {}", .kind.as_str())]
    Reached { kind: Kind, limit: i64 },
    /// More jobs in one request than the limit holds at all: no wait helps.
    #[error("{asked} jobs in one request; this tenant's limit of unfinished jobs is {limit}")]
    TooMany { asked: i64, limit: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// This process's count of one tenant's unfinished jobs, in two parts split at a job id: those
/// created before `upto` (which only finish, so an old count of them is an overcount) and
/// those after it, read again each time.
#[derive(Debug, Clone, Copy)]
struct Tally {
    limit: i64,
    /// Unfinished jobs with ids up to `upto`, summed over the reads since the last full count.
    settled: i64,
    upto: JobId,
    /// Unfinished jobs with later ids when last read.
    recent: i64,
    /// Jobs admitted here since.
    added: i64,
    read_at: Instant,
    /// When every unfinished job was last counted.
    full_at: Instant,
    /// The limit changed since: count everything again.
    stale: bool,
}

impl Tally {
    fn used(&self) -> i64 {
        self.settled.saturating_add(self.recent).saturating_add(self.added)
    }
}

/// The defaults and this process's tallies; cheap to clone.
#[derive(Clone, Default)]
pub struct Quotas {
    defaults: Defaults,
    tallies: Arc<Mutex<HashMap<TenantId, Tally>>>,
}

impl Quotas {
    pub fn new(defaults: Defaults) -> Quotas {
        Quotas { defaults, tallies: Arc::default() }
    }

    pub fn defaults(&self) -> Defaults {
        self.defaults
    }

    /// Admit one row of `kind` named `name` for the tenant, inside the transaction `tx` that
    /// then writes it: takes the tenant's lock for the kind (held to the end of `tx`) and
    /// counts. A name the tenant has already is an update: admitted at any count.
    pub async fn admit_row(
        &self,
        tx: &impl GenericClient,
        tenant: TenantId,
        kind: Kind,
        name: &str,
    ) -> Result<(), LimitError> {
        store::lock(tx, tenant, kind).await?;
        let s = store::standing(tx, tenant, kind, self.defaults.of(kind), name).await?;
        if s.exists || s.count < s.limit {
            return Ok(());
        }
        Err(LimitError::Reached { kind, limit: s.limit })
    }

    /// Admit `n` new jobs for the tenant (a whole request, or none of it) against its
    /// unfinished jobs. The count is read again when over `FRESH` old, and then only for jobs
    /// created since the last read (an index range at the right edge of the tenant's part):
    /// jobs created earlier only finish, so their old count can only be too high. Everything is
    /// counted again on a process's first submission for the tenant, after its limit changes,
    /// and, at most every `FULL`, when the count would refuse (jobs that finished make room).
    ///
    /// What it can let through beyond the limit: what the tenant's other API processes admit
    /// while this one's count is under `FRESH` old, and jobs committed more than `SETTLE` after
    /// their id was made (or minted by a host whose clock is behind by more), until the next
    /// full count. A replay of an idempotency key counts as new until the next read.
    pub async fn admit_jobs(&self, pool: &Pool, tenant: TenantId, n: usize) -> Result<(), LimitError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let known = self.lock().get(&tenant).copied();
        let mut read = match known {
            Some(t) if !t.stale && t.read_at.elapsed() < FRESH => None,
            Some(t) if !t.stale => Some(self.read(pool, tenant, Some(t)).await?),
            _ => Some(self.read(pool, tenant, None).await?),
        };
        let mut t = read.or(known).ok_or(LimitError::Reached { kind: Kind::PendingJobs, limit: 0 })?;
        if t.used().saturating_add(n) > t.limit && t.full_at.elapsed() >= FULL {
            t = self.read(pool, tenant, None).await?;
            read = Some(t);
        }
        let mut tallies = self.lock();
        let t = tallies.entry(tenant).or_insert(t);
        if let Some(new) = read {
            *t = new;
        }
        if n > t.limit {
            return Err(LimitError::TooMany { asked: n, limit: t.limit });
        }
        if t.used().saturating_add(n) > t.limit {
            return Err(LimitError::Reached { kind: Kind::PendingJobs, limit: t.limit });
        }
        t.added += n;
        Ok(())
    }

    /// Read the tenant's count again: from `prev` on, or (`None`) every unfinished job.
    async fn read(&self, pool: &Pool, tenant: TenantId, prev: Option<Tally>) -> Result<Tally, LimitError> {
        let now = Instant::now();
        let (after, settled, full_at) = match prev {
            Some(p) => (p.upto, p.settled, p.full_at),
            None => (JobId::from_uuid(uuid::Uuid::nil()), 0, now),
        };
        let upto = first_id_at(chrono::Utc::now() - SETTLE).max(after);
        let db = pool.get().await.map_err(StoreError::from)?;
        let (limit, older, recent) = store::open_jobs(&db, tenant, self.defaults.pending_jobs, after, upto).await?;
        Ok(Tally {
            limit,
            settled: settled.saturating_add(older),
            upto,
            recent,
            added: 0,
            read_at: Instant::now(),
            full_at,
            stale: false,
        })
    }

    /// Mark this process's tally of the tenant stale (its limit changed): the next jobs count
    /// everything again.
    pub fn forget(&self, tenant: TenantId) {
        if let Some(t) = self.lock().get_mut(&tenant) {
            t.stale = true;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, Tally>> {
        self.tallies.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_name_themselves_both_ways() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
        }
        assert_eq!(Kind::parse("schedules"), None);
    }
}
