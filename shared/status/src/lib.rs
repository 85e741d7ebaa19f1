//! The status contract `relay.status/v1`: the document `GET /v1/status` serves and the console
//! reads, documented by `shared/schemas/status-v1.json`. No I/O here.
//!
//! One set of types for both sides. Reading is lenient on purpose: every field has a default
//! and unknown fields are ignored, so the console accepts any 1.x document (an older minor
//! lacks fields, a newer one adds them) from Relay or from any client project that serves it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub const CONTRACT: &str = "relay.status/v1";
/// The version this code writes: major 1 is the contract's name; minors only add fields.
/// 1.1 added the `count` progress (with `succeeded`, `cancelled`, `pending`) and the elapsed
/// progress's baseline (`baseline_p50_s`, `baseline_p95_s`, `runs_in_baseline`, `stuck`);
/// 1.2 the newest open exceptions (`exceptions`, optional); 1.3 `failures.dead_letters_24h`;
/// 1.4 the HTTP destinations (`destinations`) and waits for outside parties' completions
/// (`completions`), both optional; 1.5 the email send rates (`send_rates`, optional); 1.6 the
/// count progress's `shadowed` and `skipped` (apart from `succeeded`, which counts only
/// children that did their work), tenants' and configuration sets' sending reputation
/// (`reputation`) and email cut-over stages (`cutovers`), both optional.
pub const VERSION: &str = "1.6";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusDoc {
    pub contract: String,
    pub version: String,
    pub project: String,
    pub generated_at: Option<DateTime<Utc>>,
    pub workers: Vec<Worker>,
    pub queues: Vec<Queue>,
    pub schedules: Vec<Schedule>,
    pub recent_runs: Vec<Run>,
    pub failures: Failures,
    /// Runs and failures per bucket, oldest bucket first (optional).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    /// The newest open exceptions, at most 10 (optional; from 1.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exceptions: Option<Vec<OpenException>>,
    /// Tenants' HTTP destinations, at most 100 (optional; from 1.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destinations: Option<Vec<DestinationStatus>>,
    /// Jobs waiting for an outside party's completion (optional; from 1.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completions: Option<Completions>,
    /// The rates email is sent at: SES accounts', tenants', configuration sets' (optional;
    /// from 1.5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_rates: Option<Vec<SendRateStatus>>,
    /// Sending reputation: each tenant's guard and rolling rates, and each configuration set's
    /// rates (optional; from 1.6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reputation: Option<Vec<ReputationStatus>>,
    /// Email cut-over stages per tenant and task type, halted ones saying why (optional; from 1.6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cutovers: Option<Vec<CutoverStatus>>,
}

/// A tenant's (or a configuration set's) sending reputation over its rolling window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReputationStatus {
    /// `tenant` or `configuration_set`.
    pub scope: String,
    /// The tenant's name, or the configuration set's.
    pub key: String,
    /// A tenant's guard: `ok`, `warning` or `paused` (null for a configuration set).
    pub state: Option<String>,
    pub state_reason: Option<String>,
    pub state_since: Option<DateTime<Utc>>,
    pub window_hours: i32,
    pub sends: i64,
    pub permanent_bounces: i64,
    pub complaints: i64,
    pub bounce_rate: f64,
    pub complaint_rate: f64,
    /// Enough sends in the window for the rates to be judged.
    pub judged: bool,
}

/// A tenant's email cut-over stage for one task type.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CutoverStatus {
    pub tenant: String,
    pub task_type: String,
    /// `shadow`, `share` or `live`.
    pub stage: String,
    /// The fraction of recipients live in `share`.
    pub share: f64,
    pub started_at: Option<DateTime<Utc>>,
    /// Set when the stage halted itself back to `shadow`, with why.
    pub halted_at: Option<DateTime<Utc>>,
    pub halted_reason: Option<String>,
}

/// A rate email is sent at: what holds now, what it is made of, throttles, the quota.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SendRateStatus {
    /// `account`, `tenant` or `configuration_set`.
    pub scope: String,
    /// The account (`default`: Relay's own), the tenant's name, or the configuration set.
    pub key: String,
    /// The rate sends keep now (an account's base times its throttle back-off); null: none.
    pub effective_rate: Option<f64>,
    /// Set by an operator (for an account, it overrides SES's).
    pub configured_rate: Option<f64>,
    /// An account's `MaxSendRate` as SES last said.
    pub provider_rate: Option<f64>,
    /// The throttle back-off now (1: none).
    pub factor: f64,
    /// Throttle answers SES gave sends under this account.
    pub throttles: i64,
    pub last_throttle_at: Option<DateTime<Utc>>,
    /// An account's 24-hour quota, and what remains of it.
    pub max_24h: Option<f64>,
    pub quota_left: Option<f64>,
}

/// A tenant's HTTP destination (`http.request`): its write switch, rate, and last call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DestinationStatus {
    pub tenant: Option<String>,
    pub name: String,
    /// Its own write switch and `write:http`, shadow mode aside.
    pub writes_enabled: bool,
    pub rate_per_second: f64,
    /// succeeded, retryable, fatal, ambiguous, shadowed, refused, sending; none before a call.
    pub last_outcome: Option<String>,
    pub last_http_status: Option<i32>,
    pub last_call_at: Option<DateTime<Utc>>,
}

/// Waits for outside parties' completions: open now, and how many of those are past their
/// deadline (the sweep applies their overdue policy within one interval, so a number that
/// stays above zero means the sweep is not running).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Completions {
    pub open: i64,
    pub overdue: i64,
}

/// An open exception: a job that failed for good and waits for an operator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpenException {
    pub id: String,
    pub job_id: String,
    pub tenant: Option<String>,
    pub task_type: String,
    /// attempts_exhausted, fatal_error, ambiguous_outcome, ...
    pub kind: String,
    /// The error that opened it (at most 300 characters).
    pub cause: String,
    pub opened_at: Option<DateTime<Utc>>,
}

/// A process or function instance and when it was last seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Worker {
    /// api, worker, sweeper, executor, ingress (a client project may name its own kinds).
    pub kind: String,
    pub instance_id: String,
    pub host: Option<String>,
    pub pid: Option<i32>,
    pub started_at: Option<DateTime<Utc>>,
    pub last_seen_at: Option<DateTime<Utc>>,
}

/// Live work of one queue: for Relay, one task type on the platform's transport.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Queue {
    pub name: String,
    pub transport: String,
    /// Jobs due now and not yet running.
    pub depth: i64,
    /// Age of the oldest job due now (0 when none).
    pub oldest_pending_age_s: f64,
    /// Pending jobs due later (optional).
    pub scheduled: Option<i64>,
    /// Jobs running now (optional).
    pub running: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Schedule {
    pub name: String,
    pub cron: Option<String>,
    pub last_run_at: Option<DateTime<Utc>>,
    pub last_outcome: Option<String>,
    pub next_run_at: Option<DateTime<Utc>>,
}

/// A run: the job resource's fields (without `params` and `result`, which stay with the
/// client's own API), its tenant, and its progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Run {
    pub id: String,
    pub task_type: String,
    pub status: String,
    pub tenant: Option<String>,
    pub correlation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub parent_id: Option<String>,
    pub run_at: Option<DateTime<Utc>>,
    pub attempt: Option<i32>,
    pub max_attempts: Option<i32>,
    pub timeout_seconds: Option<i32>,
    pub lease_until: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub progress: Option<Progress>,
}

/// The job resource's progress (the core's `progress`), flattened for lenient readers:
/// `count` (1.1; a fan-out: `total`, `succeeded`, `failed`, `cancelled`, `pending`, and for 1.0
/// readers `done` = terminal children and `fraction`); `children` (1.0 documents: `done`/`total`,
/// `fraction`); `elapsed`: an opaque single unit running for `elapsed_s` (no fraction is
/// claimed), with its task type's baseline and `stuck` (1.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    pub kind: String,
    /// `count`: children that did their work (an email sent); from 1.6 without the shadowed
    /// ones, which 1.1 to 1.5 counted in it (a shadowed campaign read as sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<i64>,
    /// `count` (1.6): children that ran in shadow mode (an email recorded, not sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadowed: Option<i64>,
    /// `count` (1.6): children that ended on purpose without their work (an email to a
    /// suppressed recipient).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_p50_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_p95_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs_in_baseline: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stuck: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_s: Option<f64>,
}
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Failures {
    pub last_hour: i64,
    pub last_24h: i64,
    pub open_exceptions: i64,
    /// Messages that could not become work, kept in the last 24 hours (optional, from 1.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letters_24h: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Activity {
    pub bucket_s: i64,
    pub runs: Vec<i64>,
    pub failures: Vec<i64>,
    /// The counts hit their cap; older buckets are undercounted.
    pub truncated: bool,
}

/// Why a document cannot be read as `relay.status/v1`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContractError {
    #[error("not JSON of the expected shape: {0}")]
    Shape(String),
    #[error("contract {0:?} is not {CONTRACT}")]
    Contract(String),
    #[error("version {0:?} is not 1.x")]
    Version(String),
}

impl StatusDoc {
    /// Parse and check a document: the contract's name and a 1.x version; any minor, any
    /// missing optional field, any unknown field.
    pub fn parse(bytes: &[u8]) -> Result<StatusDoc, ContractError> {
        let doc: StatusDoc = serde_json::from_slice(bytes).map_err(|e| ContractError::Shape(e.to_string()))?;
        if doc.contract != CONTRACT {
            return Err(ContractError::Contract(doc.contract));
        }
        let mut parts = doc.version.split('.');
        let major_ok = parts.next() == Some("1");
        let minor_ok = parts.next().is_none_or(|m| m.parse::<u32>().is_ok());
        if !major_ok || !minor_ok {
            return Err(ContractError::Version(doc.version));
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_minor_of_major_one_is_accepted_and_others_are_not() {
        let doc = |v: &str| format!(r#"{{"contract": "relay.status/v1", "version": "{v}"}}"#);
        assert!(StatusDoc::parse(doc("1.0").as_bytes()).is_ok());
        assert!(StatusDoc::parse(doc("1.7").as_bytes()).is_ok());
        assert_eq!(StatusDoc::parse(doc("2.0").as_bytes()), Err(ContractError::Version("2.0".into())));
        let other = br#"{"contract": "acme.health/v3", "version": "1.0"}"#;
        assert!(matches!(StatusDoc::parse(other), Err(ContractError::Contract(_))));
        assert!(matches!(StatusDoc::parse(b"<html>"), Err(ContractError::Shape(_))));
    }
}
