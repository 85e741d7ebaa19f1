//! Process-wide counters. Each is also logged with a stable event name where it happens, so
//! a log-based metric (CloudWatch metric filter) counts it across Lambda containers. On Lambda
//! each invocation also prints its figures in Embedded Metric Format (`emf`).

pub mod emf;

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn add(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// The count so far, reset to zero.
    pub fn take(&self) -> u64 {
        self.0.swap(0, Ordering::Relaxed)
    }
}

/// Dispatches the transport refused (the sweep sends those jobs).
pub static DISPATCH_FAILURES: Counter = Counter::new();
/// Expired leases the sweep returned to pending or failed for good.
pub static LEASES_RECOVERED: Counter = Counter::new();
/// Due jobs the sweep dispatched again because their dispatch failed or was lost.
pub static REDISPATCHED: Counter = Counter::new();
/// Fenced writes refused because the job had moved on (a stale worker's late result).
pub static STALE_WRITES: Counter = Counter::new();
/// Jobs run to an outcome by this process's executors.
pub static JOBS_RUN: Counter = Counter::new();
/// Statements that wrote outcomes (each its own commit): with `JOBS_RUN`, commits per job.
pub static OUTCOME_WRITES: Counter = Counter::new();

/// Calls that could not reach the database (taken per invocation by `emf`; not in `snapshot`).
pub static DATABASE_ERRORS: Counter = Counter::new();

/// All counters by name, for the status contract and `relay` output.
pub fn snapshot() -> Vec<(&'static str, u64)> {
    vec![
        ("dispatch_failures", DISPATCH_FAILURES.get()),
        ("leases_recovered", LEASES_RECOVERED.get()),
        ("redispatched", REDISPATCHED.get()),
        ("stale_writes", STALE_WRITES.get()),
        ("jobs_run", JOBS_RUN.get()),
        ("outcome_writes", OUTCOME_WRITES.get()),
    ]
}
