//! Per-tenant limits on the rows a tenant's own calls create and that outlive the call: HTTP
//! destinations, email templates, suppressions it adds, and its unfinished jobs. The
//! deployment's configuration holds the defaults (`Defaults`); an operator overrides one kind
//! for one tenant (`store::limits`, `PUT /v1/admin/tenants/{tenant_id}/limits`).
//!
//! A named row (a destination, a template, a suppression) is admitted inside the transaction
//! that writes it, under a lock per tenant and kind, so concurrent creates cannot overshoot;
//! writing a name the tenant already has is an update and is always admitted. Jobs are
//! admitted against a count this process keeps per tenant, read again at most `FRESH` after
//! the last read (one index-only count), so intake pays no query per job; see `admit_jobs` for
//! what that lets through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use crate::job::TenantId;
use crate::store::{GenericClient, StoreError, limits as store};

/// The largest limit a default or an override may have.
pub const MAX_LIMIT: i64 = 1_000_000_000;
/// How old this process's count of a tenant's unfinished jobs may be.
pub const FRESH: Duration = Duration::from_secs(1);
/// What a refusal of jobs asks the client to wait (jobs drain as they run).
pub const RETRY_AFTER_SECONDS: u64 = 5;

/// A kind of row a tenant's call creates, under a limit of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Destinations,
    Templates,
    Suppressions,
    PendingJobs,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Destinations, Kind::Templates, Kind::Suppressions, Kind::PendingJobs];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Destinations => "destinations",
            Kind::Templates => "templates",
            Kind::Suppressions => "suppressions",
            Kind::PendingJobs => "pending_jobs",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The environment variable (and `relay` flag, lower-cased) of its default.
    pub fn variable(self) -> &'static str {
        match self {
            Kind::Destinations => "RELAY_LIMIT_DESTINATIONS",
            Kind::Templates => "RELAY_LIMIT_TEMPLATES",
            Kind::Suppressions => "RELAY_LIMIT_SUPPRESSIONS",
            Kind::PendingJobs => "RELAY_LIMIT_PENDING_JOBS",
        }
    }
}

/// The deployment's limits, one per kind, for every tenant without an override.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    pub destinations: i64,
    pub templates: i64,
    pub suppressions: i64,
    pub pending_jobs: i64,
}

/// Generous: far above what a well-behaved tenant uses, far below what would hurt the others.
/// 100 destinations and 1,000 templates are more integrations and messages than a service
/// has; 1,000,000 suppressions is a large sender's bounce list; 1,000,000 unfinished jobs is
/// two campaigns' worth of children, about 100 s of the intake's full rate.
impl Default for Defaults {
    fn default() -> Self {
        Defaults { destinations: 100, templates: 1_000, suppressions: 1_000_000, pending_jobs: 1_000_000 }
    }
}

impl Defaults {
    pub fn of(&self, kind: Kind) -> i64 {
        match kind {
            Kind::Destinations => self.destinations,
            Kind::Templates => self.templates,
            Kind::Suppressions => self.suppressions,
            Kind::PendingJobs => self.pending_jobs,
        }
    }

    pub fn set(&mut self, kind: Kind, n: i64) {
        match kind {
            Kind::Destinations => self.destinations = n,
            Kind::Templates => self.templates = n,
            Kind::Suppressions => self.suppressions = n,
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

/// This process's count of one tenant's unfinished jobs.
#[derive(Debug, Clone, Copy)]
struct Tally {
    limit: i64,
    /// Unfinished jobs when last read.
    counted: i64,
    /// Jobs admitted here since.
    added: i64,
    at: Instant,
    /// The limit changed since: read again.
    stale: bool,
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

    /// Admit `n` new jobs for the tenant against its count of unfinished jobs, read again
    /// when older than `FRESH`. A whole request passes or none of it. The count can run over
    /// the limit by what the tenant's other API processes admit while this one's count is
    /// not yet read again (at most `FRESH`), and by this process's jobs not yet committed
    /// when it is read; replays of an idempotency key are counted as new.
    pub async fn admit_jobs(&self, pool: &Pool, tenant: TenantId, n: usize) -> Result<(), LimitError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let stale = self.lock().get(&tenant).is_none_or(|t| t.stale || t.at.elapsed() >= FRESH);
        let read = if stale {
            let db = pool.get().await.map_err(StoreError::from)?;
            let (limit, counted) = store::open_jobs(&db, tenant, self.defaults.pending_jobs).await?;
            Some(Tally { limit, counted, added: 0, at: Instant::now(), stale: false })
        } else {
            None
        };
        let mut tallies = self.lock();
        // Entries are never removed, so one seen fresh is still there; a missing one (which
        // cannot be) admits nothing.
        let t =
            tallies.entry(tenant).or_insert(Tally { limit: 0, counted: 0, added: 0, at: Instant::now(), stale: true });
        if let Some(new) = read {
            *t = new;
        }
        if n > t.limit {
            return Err(LimitError::TooMany { asked: n, limit: t.limit });
        }
        if t.counted.saturating_add(t.added).saturating_add(n) > t.limit {
            return Err(LimitError::Reached { kind: Kind::PendingJobs, limit: t.limit });
        }
        t.added += n;
        Ok(())
    }

    /// Mark this process's tally of the tenant stale (its limit changed): the next jobs read it
    /// again.
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
