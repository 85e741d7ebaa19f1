//! The STS side of per-task credentials: `TaskCredentials` (held by the executor: the mapping
//! and an STS client under the executor's own identity), `JobAws` (one run's access, opened on
//! the task's first `ctx.aws()`), and the refreshing credentials provider behind it. Every
//! AssumeRole Relay makes lives in this file.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::SdkConfig;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, future};
use aws_sdk_sts::Client;
use aws_sdk_sts::config::{Credentials, IdentityCache, SharedCredentialsProvider};
use aws_sdk_sts::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sts::operation::assume_role::AssumeRoleError;
use aws_sdk_sts::types::Tag;
use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio::sync::{Mutex, OnceCell};

use super::session::{session_name, session_tags};
use super::{RoleSpec, TaskRoles};
use crate::job::{ClaimedJob, JobId, TaskError, TenantId};
use crate::store::attempt_sessions::{self, NewSession};

/// An STS call that takes longer fails (and the task decides whether to retry).
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Re-assume when less than this is left of a session (or a quarter of a short session).
pub const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// The executor's credential source: the mapping, the STS client (the executor's own
/// identity, which may do nothing but assume task roles) and the base configuration (region,
/// endpoint, HTTP client) that task clients inherit — never its credentials.
pub struct TaskCredentials {
    roles: TaskRoles,
    sts: Client,
    base: SdkConfig,
}

impl TaskCredentials {
    pub fn new(roles: TaskRoles, base: &SdkConfig) -> Self {
        let timeouts = aws_config::timeout::TimeoutConfig::builder().operation_timeout(OPERATION_TIMEOUT).build();
        let sts = Client::from_conf(aws_sdk_sts::config::Builder::from(base).timeout_config(timeouts).build());
        Self { roles, sts, base: base.clone() }
    }

    pub fn roles(&self) -> &TaskRoles {
        &self.roles
    }
}

/// Who a run is: what its session is named and tagged after.
#[derive(Debug, Clone)]
struct Run {
    job_id: JobId,
    attempt: i32,
    tenant_id: TenantId,
    task_type: String,
}

/// One run's access to AWS. Nothing is assumed until the task asks; the first `sdk_config`
/// assumes the mapped role (and records the session), later calls in the run reuse it.
#[derive(Clone)]
pub struct JobAws {
    inner: Arc<JobAwsInner>,
}

struct JobAwsInner {
    source: Option<Arc<TaskCredentials>>,
    run: Run,
    pool: Pool,
    config: OnceCell<SdkConfig>,
}

impl JobAws {
    pub fn new(source: Option<Arc<TaskCredentials>>, job: &ClaimedJob, pool: Pool) -> Self {
        let run =
            Run { job_id: job.id, attempt: job.attempt, tenant_id: job.tenant_id, task_type: job.task_type.clone() };
        Self { inner: Arc::new(JobAwsInner { source, run, pool, config: OnceCell::new() }) }
    }

    /// An SDK configuration whose credentials are this run's role session (refreshed before
    /// expiry), or a fatal error naming the missing mapping: default deny.
    pub async fn sdk_config(&self) -> Result<SdkConfig, TaskError> {
        self.inner.config.get_or_try_init(|| self.open()).await.cloned()
    }

    async fn open(&self) -> Result<SdkConfig, TaskError> {
        let run = &self.inner.run;
        let Some(source) = &self.inner.source else {
            return Err(TaskError::Fatal(format!(
                "no AWS credentials for task type {:?}: this executor has no task-role mapping \
                 (RELAY_TASK_ROLES is not configured); default deny",
                run.task_type
            )));
        };
        // A tenant's own sending role (named over the API) comes first for the sending task
        // types, with Relay's external id for that tenant.
        let own = if super::SENDS_AS_TENANT.contains(&run.task_type.as_str()) {
            let db = self.inner.pool.get().await.map_err(|e| TaskError::Retryable(e.to_string()))?;
            crate::store::sending_identities::role(&db, run.tenant_id)
                .await
                .map_err(|e| TaskError::Retryable(e.to_string()))?
                .map(|role_arn| RoleSpec { role_arn, external_id: Some(super::tenant_external_id(run.tenant_id)) })
        } else {
            None
        };
        let Some(role) = own.as_ref().or_else(|| source.roles.resolve(run.tenant_id, &run.task_type)) else {
            return Err(TaskError::Fatal(format!(
                "no AWS credentials for task type {:?}: no role is mapped for it in RELAY_TASK_ROLES \
                 (nor for tenant {} in RELAY_TENANT_TASK_ROLES); default deny",
                run.task_type, run.tenant_id
            )));
        };
        let provider = ScopedProvider {
            inner: Arc::new(ProviderInner {
                sts: source.sts.clone(),
                role: role.clone(),
                run: run.clone(),
                session: source.roles.session(),
                pool: self.inner.pool.clone(),
                current: Mutex::new(None),
            }),
        };
        // Assume now: a denial fails the task here, before it builds anything.
        provider.current().await?;
        Ok(source
            .base
            .to_builder()
            .credentials_provider(SharedCredentialsProvider::new(provider))
            // The provider caches and refreshes itself; a second cache would hold a session
            // past the provider's refresh point.
            .identity_cache(IdentityCache::no_cache())
            .build())
    }
}

#[async_trait::async_trait]
impl crate::task::AwsAccess for JobAws {
    async fn sdk_config(&self) -> Result<SdkConfig, TaskError> {
        JobAws::sdk_config(self).await
    }
}

/// How long before expiry a session is replaced: five minutes, or a quarter of a shorter
/// session.
pub fn refresh_margin(session: Duration) -> Duration {
    REFRESH_BEFORE.min(session / 4)
}

/// Whether credentials expiring at `expiry` must be replaced at `now`. Pure.
pub fn needs_refresh(now: SystemTime, expiry: Option<SystemTime>, margin: Duration) -> bool {
    match expiry {
        None => false,
        Some(at) => now + margin >= at,
    }
}

/// The credentials provider of one run: assumes the role, records the session, and
/// re-assumes before expiry (one refresh at a time).
#[derive(Clone)]
struct ScopedProvider {
    inner: Arc<ProviderInner>,
}

struct ProviderInner {
    sts: Client,
    role: RoleSpec,
    run: Run,
    session: Duration,
    pool: Pool,
    current: Mutex<Option<Credentials>>,
}

impl fmt::Debug for ScopedProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedProvider")
            .field("role_arn", &self.inner.role.role_arn)
            .field("job_id", &self.inner.run.job_id)
            .field("attempt", &self.inner.run.attempt)
            .finish_non_exhaustive()
    }
}

impl ScopedProvider {
    async fn current(&self) -> Result<Credentials, TaskError> {
        let mut current = self.inner.current.lock().await;
        if let Some(c) = current.as_ref()
            && !needs_refresh(SystemTime::now(), c.expiry(), refresh_margin(self.inner.session))
        {
            return Ok(c.clone());
        }
        let fresh = self.assume().await?;
        *current = Some(fresh.clone());
        Ok(fresh)
    }

    async fn assume(&self) -> Result<Credentials, TaskError> {
        let (run, role) = (&self.inner.run, &self.inner.role);
        let secs = i32::try_from(self.inner.session.as_secs()).unwrap_or(3600);
        let mut req = self
            .inner
            .sts
            .assume_role()
            .role_arn(&role.role_arn)
            .role_session_name(session_name(run.job_id, run.attempt))
            .duration_seconds(secs);
        for (key, value) in session_tags(run.tenant_id, &run.task_type, run.job_id, run.attempt) {
            let tag = Tag::builder().key(key).value(value).build().map_err(|e| TaskError::Fatal(e.to_string()))?;
            req = req.tags(tag);
        }
        if let Some(external_id) = &role.external_id {
            req = req.external_id(external_id);
        }
        let out = req.send().await.map_err(|e| classify(&role.role_arn, &e))?;
        let creds = out.credentials().ok_or_else(|| {
            TaskError::Retryable(format!("AssumeRole {} answered without credentials", role.role_arn))
        })?;
        let session_arn = out.assumed_role_user().map(|u| u.arn().to_owned()).ok_or_else(|| {
            TaskError::Retryable(format!("AssumeRole {} answered without a session ARN", role.role_arn))
        })?;
        let expiry = SystemTime::try_from(*creds.expiration())
            .map_err(|e| TaskError::Retryable(format!("AssumeRole {}: expiration out of range: {e}", role.role_arn)))?;
        let expires_at = DateTime::<Utc>::from(expiry);
        // The session is on record before any call is made with it.
        let recorded = async {
            let db = self.inner.pool.get().await?;
            attempt_sessions::record(
                &db,
                &NewSession {
                    job_id: run.job_id,
                    attempt: run.attempt,
                    role_arn: role.role_arn.clone(),
                    session_arn: session_arn.clone(),
                    external_id: role.external_id.is_some(),
                    expires_at,
                },
            )
            .await
        };
        recorded.await.map_err(|e| TaskError::Retryable(format!("could not record the role session: {e}")))?;
        tracing::info!(event = "relay.credentials.assumed", job_id = %run.job_id, attempt = run.attempt,
            task_type = %run.task_type, role_arn = %role.role_arn, session_arn = %session_arn,
            expires_at = %expires_at, "task role assumed");
        Ok(Credentials::new(
            creds.access_key_id(),
            creds.secret_access_key(),
            Some(creds.session_token().to_owned()),
            Some(expiry),
            "relay-task-role",
        ))
    }
}

/// A refusal (access denied, a bad request) will not change on retry; anything else might.
fn classify(role_arn: &str, e: &SdkError<AssumeRoleError>) -> TaskError {
    let msg = format!("AssumeRole {role_arn}: {}", DisplayErrorContext(e));
    match e.code() {
        Some(
            "AccessDenied"
            | "AccessDeniedException"
            | "MalformedPolicyDocument"
            | "PackedPolicyTooLarge"
            | "RegionDisabledException"
            | "ValidationError"
            | "InvalidParameterValue",
        ) => TaskError::Fatal(msg),
        _ => TaskError::Retryable(msg),
    }
}

impl ProvideCredentials for ScopedProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(async move { self.current().await.map_err(CredentialsError::provider_error) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_replaced_before_they_expire() {
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        assert_eq!(refresh_margin(hour), REFRESH_BEFORE);
        assert_eq!(refresh_margin(Duration::from_secs(4)), Duration::from_secs(1));
        let m = refresh_margin(hour);
        assert!(!needs_refresh(now, Some(now + hour), m));
        assert!(needs_refresh(now, Some(now + Duration::from_secs(299)), m));
        assert!(needs_refresh(now, Some(now - Duration::from_secs(1)), m));
        assert!(!needs_refresh(now, None, m));
    }
}
