//! Postgres, the only source of truth. All SQL lives in this folder, one module per table;
//! nothing outside `store` writes SQL (tests excepted). `tooling` holds what the `relay` tool's
//! benchmarks and chaos suite ask of the database.

pub mod admin_actions;
pub mod attempt_sessions;
pub mod callbacks;
pub mod campaign_pages;
pub mod completions;
mod connect;
pub mod cutover;
pub mod dead_letters;
pub mod dependencies;
pub mod destination_terms;
pub mod destinations;
#[cfg(feature = "testing")]
pub mod effects;
pub mod exceptions;
pub mod http_calls;
pub mod jobs;
pub mod limits;
pub mod message_events;
pub mod messages;
pub mod migrate;
pub mod modes;
pub mod operators;
pub mod ordering;
pub mod pipelined;
pub mod progress;
pub mod rate_slots;
pub mod reputation;
pub mod schedules;
pub mod secret;
pub mod send_rates;
pub mod send_reads;
pub mod send_shares;
pub mod sending_identities;
pub mod ses_tenants;
pub mod status;
pub mod status_keys;
pub mod suppressions;
pub mod templates;
pub mod tenant_faults;
pub mod tenants;
pub mod tls;
#[cfg(feature = "testing")]
pub mod tooling;
pub mod topics;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

pub use deadpool_postgres::GenericClient;

/// Errors from the store. A fenced write that touched no row is its own variant: a stale
/// worker's write is refused, never silently treated as done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("connection pool: {}", causes(.0))]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("stale write refused for job {job_id} attempt {attempt}: the job has moved on")]
    StaleWrite { job_id: crate::job::JobId, attempt: i32 },
    #[error("the intake writers have stopped")]
    IntakeClosed,
    /// An error the intake writers met, shared by every request of their batch.
    #[error("intake: {0}")]
    Intake(std::sync::Arc<StoreError>),
    #[error("{0} was deleted while this call ran; try again")]
    Vanished(String),
    #[error("migration {0} was edited after it was applied; migrations are additive only")]
    MigrationEdited(&'static str),
    #[error("migration {name}: {source}")]
    Migration { name: &'static str, source: tokio_postgres::Error },
    /// A stored exception kind this build does not know (a newer build wrote it).
    #[error(transparent)]
    UnknownExceptionKind(#[from] crate::job::UnknownExceptionKind),
    /// A stored value this build does not know (a newer build wrote it, or a hand): an error
    /// naming the column, never a guess.
    #[error("column {column} holds {value:?}, which this build does not know")]
    UnknownValue { column: &'static str, value: String },
}

/// Decode a stored name with `parse`; a name it does not know is `StoreError::UnknownValue`
/// naming `column`.
pub(crate) fn decode<T>(
    column: &'static str,
    value: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, StoreError> {
    parse(value).ok_or_else(|| StoreError::UnknownValue { column, value: value.to_owned() })
}

/// A database error with Postgres's own message (tokio-postgres's `Display` says only "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// An error and its causes, each said once: a refused connection names why ("error
/// performing TLS handshake: invalid peer certificate: UnknownIssuer", "password
/// authentication failed"), where the outer `Display`s stop at "error performing TLS handshake".
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

impl StoreError {
    /// True when the database could not be reached (as opposed to refusing a statement).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(_) | StoreError::IntakeClosed => true,
            // A closed connection or an I/O failure is an outage; an error Postgres answered
            // (it has a code) or one raised on this side (a bad parameter) is not.
            // So is the server going away: a connection exception (class 08), an operator
            // intervention such as a shutdown terminating the session (class 57: 57P01 on
            // `pg_ctl stop -m fast`), or no connection slot left (53300).
            StoreError::Db(e) => {
                e.is_closed()
                    || std::error::Error::source(e).is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
                    || e.code().is_some_and(|c| {
                        let c = c.code();
                        c.starts_with("08") || c.starts_with("57") || c == "53300"
                    })
            }
            StoreError::Intake(e) => e.is_unavailable(),
            _ => false,
        }
    }
}

/// Connection settings for a pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub max_size: usize,
    /// How long a caller waits for a connection before the pool gives up.
    pub wait_timeout: Duration,
    /// Extra `search_path` (used by tests to give each test its own schema).
    pub search_path: Option<String>,
    /// Check a pooled connection with a round trip before handing it out. For Lambda, where
    /// a container thaws with a connection the proxy may have closed while it was frozen.
    pub verify_on_checkout: bool,
    /// The login from a Secrets Manager secret instead of the URL's (the Lambda functions).
    pub secret: Option<Arc<secret::DbSecret>>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_size: 16,
            wait_timeout: Duration::from_secs(5),
            search_path: None,
            verify_on_checkout: false,
            secret: None,
        }
    }
}

/// Build a pool. No connection is opened here: an outage at start-up cannot leave the pool
/// broken, and connections that die are replaced on next use. TLS follows the URL's
/// `sslmode` and `sslrootcert` (`tls`); a bad CA file fails here.
pub fn pool(database_url: &str, opts: &PoolOptions) -> anyhow::Result<Pool> {
    let url = tls::DbUrl::parse(database_url)?;
    let tls = url.connector()?;
    let mut cfg = url.config;
    cfg.application_name("relay");
    cfg.connect_timeout(Duration::from_secs(5));
    // JIT never pays off for Relay's short statements, and a plan whose estimate crosses the
    // JIT thresholds (a claim planned on stale statistics) spent ~500 ms compiling on every
    // execution for a 0.1 ms run: the 200,000-job benchmark fell from ~30,000 to ~5,000 jobs/s.
    // Added to any options the URL carries (a child process's schema).
    let mut options = cfg.get_options().map(|o| format!("{o} ")).unwrap_or_default();
    options.push_str("-c jit=off");
    if let Some(path) = &opts.search_path {
        options.push_str(&format!(" -c search_path={path}"));
    }
    cfg.options(options);
    let recycling_method = if opts.verify_on_checkout { RecyclingMethod::Verified } else { RecyclingMethod::Fast };
    let connector = connect::Connector { tls, secret: opts.secret.clone() };
    let mgr = Manager::from_connect(cfg, connector, ManagerConfig { recycling_method });
    Ok(Pool::builder(mgr)
        .max_size(opts.max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(opts.wait_timeout))
        .create_timeout(Some(Duration::from_secs(5)))
        .build()?)
}
