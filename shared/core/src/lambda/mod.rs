//! The AWS runtime's handler logic: each function in `functions/` parses nothing and decides
//! nothing; it builds a `Platform` here once per container and passes each event to a handler
//! in this module. Handlers take parsed events and return responses, so tests call them with
//! real event payloads.
//!
//! Per container: one pool of at most one connection (through RDS Proxy in production),
//! verified before each use and re-opened after a failure; the SQS client; the STS client the
//! executor assumes task roles with (task code builds its own clients per run, from them). Nothing connects at
//! cold start, so an outage then cannot leave a container broken.

pub mod admin;
pub mod executor;
pub mod ingress;
pub mod pretraffic;
pub mod sweeper;

use std::sync::Arc;

/// Why a function could not take an event: it is not one the function handles, or its answer
/// did not serialise. The runtime reports it as the invocation's error (`Relay.BadEvent`).
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("not an SQS event: {0}")]
    NotSqs(serde_json::Error),
    #[error("{0}")]
    Answer(serde_json::Error),
}

use crate::config::LambdaConfig;
use crate::credentials::TaskCredentials;
use crate::platform::{Platform, Settings};
use crate::transport::Transport;
use crate::transport::sqs::SqsTransport;

/// The platform a function needs: a one-connection pool and the SQS transport. Opens no
/// connection: the database and SQS are reached on first use. (On Lambda `AWS_REGION` is set,
/// so the SDK does not look the region up either.)
pub async fn platform(cfg: &LambdaConfig) -> anyhow::Result<Platform> {
    // Name a missing variable before anything else runs.
    cfg.require_database_url()?;
    let queue_url = cfg.require_work_queue_url()?;
    let sdk = sdk_config(cfg).await;
    if let Some(set) = &cfg.ses_configuration_set {
        crate::email::set_default_configuration_set(set);
    }
    if let Some(root) = &cfg.secret_root {
        crate::destinations::set_secret_root(root);
    }
    let transport = Arc::new(SqsTransport::new(SqsTransport::client(&sdk), queue_url));
    let mut settings = settings(cfg);
    // The short lane's executor sends longer jobs to the long-job lane.
    if let Some((above, long_queue)) = cfg.onward() {
        let transport: Arc<dyn Transport> = Arc::new(SqsTransport::new(SqsTransport::client(&sdk), long_queue));
        settings.executor.onward = Some(crate::executor::Onward { above, transport });
    }
    // Tasks get AWS access only through the roles mapped to their types (default deny).
    let credentials = Arc::new(TaskCredentials::new(cfg.task_roles.clone(), &sdk));
    // The database login from Secrets Manager, read on first connect (none in the environment).
    settings.pool.secret =
        cfg.database_secret.as_deref().map(|id| Arc::new(crate::store::secret::DbSecret::new(&sdk, id)));
    Ok(Platform::new(cfg.require_database_url()?, settings)?
        .with_transport(transport)
        .with_credentials(credentials)
        .with_secrets(&sdk)
        .with_ses_account(&sdk))
}

/// The AWS SDK's shared configuration (credentials and region from the environment; the
/// local endpoint when `AWS_ENDPOINT_URL` names one). Resolves nothing over the network.
pub async fn sdk_config(cfg: &LambdaConfig) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(endpoint) = &cfg.aws_endpoint_url {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

/// The same, with the transport given (tests pass an SQS transport on a moto queue).
pub fn platform_with(cfg: &LambdaConfig, transport: Arc<dyn Transport>) -> anyhow::Result<Platform> {
    Ok(Platform::new(cfg.require_database_url()?, settings(cfg))?.with_transport(transport))
}

/// Settings for a Lambda container: one connection, checked before use; the lease longer
/// than the function may run, since an invocation does not heartbeat.
pub fn settings(cfg: &LambdaConfig) -> Settings {
    let mut s = Settings::default();
    s.pool.max_size = 1;
    s.pool.verify_on_checkout = true;
    s.pool.wait_timeout = cfg.db_wait;
    s.executor.lease = cfg.lease;
    s.executor.deadline_reserve = cfg.deadline_reserve;
    s.executor.longest_fit = Some(cfg.max_job_timeout());
    s.max_timeout_seconds = cfg.max_job_timeout();
    s.sweep.alerts = cfg.alerts.clone();
    s.callback_allow = cfg.callback_allow.clone();
    s.tenant_limits = cfg.limits;
    s
}
