//! Wiring: one place that turns settings into a pool, a transport, the API state, workers
//! and a sweeper. The `relay` binary and the Lambda mains build a `Platform` and hand over.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{AppState, TenantCache};
use crate::catalogue::Catalogue;
use crate::credentials::TaskCredentials;
use crate::executor::{Executor, ExecutorConfig, worker};
use crate::intake::Intake;
use crate::liveness::{Identity, Kind, Liveness};
use crate::maintenance::{SweepConfig, Sweeper};
use crate::retry::RetryPolicy;
use crate::store::{self, PoolOptions};
use crate::transport::Transport;
use crate::transport::postgres::{PgTransport, spawn_listener};

/// Tunables shared by every process shape.
#[derive(Debug, Clone)]
pub struct Settings {
    pub executor: ExecutorConfig,
    pub sweep: SweepConfig,
    pub sweep_interval: Duration,
    /// Register the `test.*` tasks (tests, chaos runs, `relay dev --test-tasks`).
    #[cfg(feature = "testing")]
    pub test_tasks: bool,
    /// Tasks that coalesce concurrent small submissions into multi-row inserts.
    pub intake_writers: usize,
    pub pool: PoolOptions,
    /// Connections the API and the intake keep to themselves (a pool of their own, with
    /// `pool`'s other options), so a burst of jobs that wait for connections does not queue
    /// ahead of the API's requests; `None`: they share `pool` with the tasks.
    pub api_pool_size: Option<usize>,
    /// The project name the status contract reports (`RELAY_PROJECT`, default `relay`).
    pub project: String,
    /// Addresses callbacks may reach although the guard refuses them (`RELAY_CALLBACK_ALLOW`).
    pub callback_allow: crate::outbound::AllowList,
    /// Per-tenant intake rate limit; `None`: unlimited.
    pub tenant_rate: Option<crate::api::ratelimit::TenantRate>,
    /// The longest `timeout_seconds` intake accepts: 86,400 by default; on Lambda what the
    /// executor function can give one attempt (`LambdaConfig::max_job_timeout`).
    pub max_timeout_seconds: i32,
    /// Each tenant's limits unless an operator overrides one (`RELAY_LIMIT_*`).
    pub tenant_limits: crate::limits::Defaults,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            executor: ExecutorConfig::default(),
            sweep: SweepConfig::default(),
            sweep_interval: Duration::from_secs(30),
            #[cfg(feature = "testing")]
            test_tasks: false,
            intake_writers: 1,
            pool: PoolOptions::default(),
            api_pool_size: None,
            project: "relay".into(),
            callback_allow: Default::default(),
            tenant_rate: None,
            max_timeout_seconds: crate::job::terms::MAX_TIMEOUT_SECONDS,
            tenant_limits: crate::limits::Defaults::default(),
        }
    }
}

#[derive(Clone)]
pub struct Platform {
    pub pool: Pool,
    /// The API's and the intake's connections (`Settings::api_pool_size`; else `pool` itself).
    pub api_pool: Pool,
    pub catalogue: Catalogue,
    pub transport: Arc<dyn Transport>,
    pub intake: Intake,
    pub settings: Settings,
    /// Per-task-type AWS roles; `None` denies every task's AWS access.
    pub credentials: Option<Arc<TaskCredentials>>,
    /// Claim statements this process runs at once, whatever its number of worker loops.
    claims: Arc<tokio::sync::Semaphore>,
    /// Writes destinations' secrets (the API's own identity); `None`: no secret store.
    pub secrets: Option<crate::destinations::SecretWriter>,
    /// The tokens destinations' OAuth grants minted, shared by `http.request` and `webhook.send`.
    tokens: crate::destinations::oauth::Tokens,
    database_url: String,
}

impl Platform {
    /// Build the pool, the Postgres-native transport and the intake writers (call inside a
    /// Tokio runtime). Opens no connection: nothing bound here can be left broken by an outage.
    pub fn new(database_url: &str, settings: Settings) -> anyhow::Result<Self> {
        let pool = store::pool(database_url, &settings.pool)?;
        let api_pool = match settings.api_pool_size {
            Some(n) => store::pool(database_url, &PoolOptions { max_size: n.max(1), ..settings.pool.clone() })?,
            None => pool.clone(),
        };
        let transport: Arc<dyn Transport> = Arc::new(PgTransport::new(pool.clone()));
        let catalogue = Catalogue::standard();
        #[cfg(feature = "testing")]
        let catalogue = if settings.test_tasks { catalogue.with_test_tasks() } else { catalogue };
        // One token cache for the process's destination calls (`destinations::oauth`).
        let tokens = crate::destinations::oauth::Tokens::default();
        let allow = settings.callback_allow.clone();
        Ok(Self {
            catalogue: catalogue
                .with(crate::callbacks::task::Deliver { allow: allow.clone() })
                .with(crate::destinations::task::HttpRequest {
                    allow: allow.clone(),
                    local: None,
                    tokens: tokens.clone(),
                })
                .with(crate::destinations::webhook::WebhookSend { allow, local: None, tokens: tokens.clone() }),
            tokens,
            intake: Intake::start(api_pool.clone(), transport.clone(), settings.intake_writers),
            pool,
            api_pool,
            transport,
            settings,
            credentials: None,
            claims: Arc::new(tokio::sync::Semaphore::new(crate::executor::CLAIMS_AT_ONCE)),
            secrets: None,
            database_url: database_url.to_owned(),
        })
    }

    /// Use another transport (SQS, or a test double that fails on purpose).
    pub fn with_transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.intake = Intake::start(self.api_pool.clone(), transport.clone(), self.settings.intake_writers);
        self.transport = transport;
        self
    }

    /// Give tasks AWS access through their own roles (see `credentials`).
    pub fn with_credentials(mut self, credentials: Arc<TaskCredentials>) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Let the API write destinations' secrets to Secrets Manager with this configuration.
    pub fn with_secrets(mut self, sdk: &aws_config::SdkConfig) -> Self {
        self.secrets = Some(crate::destinations::SecretWriter::new(sdk));
        self
    }

    /// Let the sweep read the SES account's send rate and quota (`GetAccount`) with this
    /// configuration, for the pacing of sends (`email::pace`).
    pub fn with_ses_account(mut self, sdk: &aws_config::SdkConfig) -> Self {
        self.settings.sweep.ses_account = Some(sdk.clone());
        self
    }

    /// Keep destinations' secrets in the local store in `dir` (created with its key the first
    /// time): the API writes them there and `http.request` reads them from there.
    pub fn with_local_secrets(mut self, dir: &std::path::Path) -> anyhow::Result<Self> {
        let store = Arc::new(crate::destinations::local::LocalSecrets::open(dir)?);
        self.secrets = Some(crate::destinations::SecretWriter::Local(store.clone()));
        let allow = self.settings.callback_allow.clone();
        let tokens = self.tokens.clone();
        let task = crate::destinations::task::HttpRequest {
            allow: allow.clone(),
            local: Some(store.clone()),
            tokens: tokens.clone(),
        };
        let webhook = crate::destinations::webhook::WebhookSend { allow, local: Some(store), tokens };
        self.catalogue = self.catalogue.with(task).with(webhook);
        Ok(self)
    }

    pub async fn migrate(&self) -> anyhow::Result<Vec<&'static str>> {
        let mut db = self.pool.get().await?;
        Ok(store::migrate::run(&mut db).await?)
    }

    pub fn app_state(&self) -> AppState {
        AppState {
            pool: self.api_pool.clone(),
            catalogue: self.catalogue.clone(),
            intake: self.intake.clone(),
            tenants: TenantCache::default(),
            transport: self.transport.clone(),
            project: self.settings.project.clone(),
            limits: crate::api::ratelimit::RateLimits::new(self.settings.tenant_rate),
            quotas: crate::limits::Quotas::new(self.settings.tenant_limits),
            admission: crate::api::submit::Admission {
                callback_allow: self.settings.callback_allow.clone(),
                max_timeout_seconds: self.settings.max_timeout_seconds,
            },
            secrets: self.secrets.clone(),
        }
    }

    pub fn executor(&self) -> Executor {
        Executor {
            pool: self.pool.clone(),
            catalogue: self.catalogue.clone(),
            transport: self.transport.clone(),
            retry: RetryPolicy::default(),
            config: self.settings.executor.clone(),
            credentials: self.credentials.clone(),
            intake: self.intake.clone(),
            claims: self.claims.clone(),
        }
    }

    pub fn sweeper(&self) -> Sweeper {
        Sweeper::new(self.pool.clone(), self.transport.clone(), self.intake.clone(), self.settings.sweep.clone())
    }

    /// This process's liveness handle for `kind` (a row in `workers`).
    pub fn liveness(&self, kind: Kind) -> Liveness {
        Liveness::new(self.pool.clone(), Identity::of_this_process(kind))
    }

    /// Start `n` Postgres-native worker loops sharing one LISTEN connection, and the
    /// process's liveness beat (one row per process, whatever `n`).
    pub fn spawn_workers(&self, n: usize, stop: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let wake = spawn_listener(self.database_url.clone(), self.settings.pool.search_path.clone(), stop.clone());
        let mut handles: Vec<JoinHandle<()>> =
            (0..n).map(|_| tokio::spawn(worker::run(self.executor(), wake.clone(), stop.clone()))).collect();
        handles.push(self.liveness(Kind::Worker).spawn(stop.clone()));
        handles
    }

    /// Start the sweep loop (the maintenance services' runner); the sweeper records its
    /// liveness on every pass.
    pub fn spawn_sweeper(&self, stop: &watch::Receiver<bool>) -> JoinHandle<()> {
        let (sweeper, every, stop) = (self.sweeper(), self.settings.sweep_interval, stop.clone());
        let live = self.liveness(Kind::Sweeper);
        tokio::spawn(async move { sweeper.run(every, Some(live), stop).await })
    }
}
