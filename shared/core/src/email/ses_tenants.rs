//! SES tenants set up by Relay (`write:ses_tenants`): before a live send of a tenant, its SES
//! tenant (`ses::tenant_name`) exists and its sending identities and the send's configuration
//! set are associated with it (`CreateTenant`, `CreateTenantResourceAssociation`), so SES's own
//! per-tenant reputation and pause apply to what the send names. Each part is set up once:
//! what is done is kept (`store::ses_tenants`), an answer that it exists already counts as done,
//! and a send whose parts are all kept makes no call. A part that cannot be set up holds the
//! send (pending, no attempt used, `waiting_reason` `ses_tenant_pending`), never fails it.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_sesv2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sesv2::operation::create_tenant::CreateTenantError;
use aws_sdk_sesv2::operation::create_tenant_resource_association::CreateTenantResourceAssociationError;
use aws_sdk_sts::operation::get_caller_identity::GetCallerIdentityError;

use super::ses;
use crate::job::{TaskError, TenantId};
use crate::store::ses_tenants::{CONFIGURATION_SET, IDENTITY, TENANT, record};

/// How long a send held by an SES tenant that could not be set up waits before it tries again.
pub const RETRY: Duration = Duration::from_secs(60);

/// The rate name such a send is held under (`waiting_rate`).
pub fn hold_rate(tenant: TenantId) -> String {
    format!("ses_tenant:{tenant}")
}

/// The ARN SES knows a part by (`identity:example.com`, `configuration_set:relay-events`) in
/// `account` and `region`; None for the SES tenant itself.
pub fn arn(resource: &str, region: &str, account: &str) -> Option<String> {
    let (kind, name) = if let Some(identity) = resource.strip_prefix(IDENTITY) {
        ("identity", identity)
    } else {
        ("configuration-set", resource.strip_prefix(CONFIGURATION_SET)?)
    };
    Some(format!("arn:aws:ses:{region}:{account}:{kind}/{name}"))
}

/// Whether an SES error says the thing exists already (success for a set-up made idempotent).
fn exists<E: ProvideErrorMetadata>(e: &SdkError<E>) -> bool {
    e.as_service_error().and_then(ProvideErrorMetadata::code) == Some("AlreadyExistsException")
}

/// Why a part of an SES tenant could not be set up (the held send's note says it).
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    #[error("CreateTenant {name}: {}", DisplayErrorContext(.error))]
    Tenant { name: String, error: Box<SdkError<CreateTenantError>> },
    #[error("GetCallerIdentity: {}", DisplayErrorContext(.0))]
    Caller(Box<SdkError<GetCallerIdentityError>>),
    #[error("{0}: not a part an SES tenant takes")]
    Part(String),
    #[error("CreateTenantResourceAssociation {name} {arn}: {}", DisplayErrorContext(.error))]
    Association { name: String, arn: String, error: Box<SdkError<CreateTenantResourceAssociationError>> },
}

/// Set up `missing` (`store::send_reads`' `ses_tenant_missing`, in its order) with this run's AWS access,
/// then keep what was done (a connection taken only then: none is held across a call). The
/// first part that fails holds the send, with why; the parts done before it are kept.
pub async fn set_up(
    pool: &deadpool_postgres::Pool,
    aws: &SdkConfig,
    tenant: TenantId,
    missing: &[String],
) -> Result<(), TaskError> {
    let name = ses::tenant_name(tenant);
    let client = ses::client(aws);
    let mut done = Vec::new();
    let mut account = None;
    let mut failed = None;
    for resource in missing {
        let called = if resource == TENANT {
            match client.create_tenant().tenant_name(&name).send().await {
                Ok(_) => Ok(None),
                Err(e) if exists(&e) => Ok(None),
                Err(e) => Err(SetUpError::Tenant { name: name.clone(), error: Box::new(e) }),
            }
        } else {
            associate(&client, aws, &name, resource, &mut account).await.map(Some)
        };
        match called {
            Ok(arn) => done.push((resource.clone(), arn)),
            Err(why) => {
                failed = Some(why);
                break;
            }
        }
    }
    if !done.is_empty() {
        let db = pool.get().await.map_err(TaskError::retryable)?;
        record(&db, tenant, &name, &done).await.map_err(TaskError::retryable)?;
        tracing::info!(event = "relay.email.ses_tenant", tenant_id = %tenant, ses_tenant = %name,
            parts = ?done.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(), "SES tenant set up");
    }
    match failed {
        None => Ok(()),
        Some(why) => {
            tracing::warn!(event = "relay.email.ses_tenant_failed", tenant_id = %tenant, ses_tenant = %name,
                error = %why, "the SES tenant could not be set up; the send is held");
            Err(TaskError::RateLimited {
                rate: hold_rate(tenant),
                note: format!("held: this tenant's SES tenant {name} is not set up yet ({why}); trying again"),
                wait: RETRY,
            })
        }
    }
}

/// Associate one part with the SES tenant; its ARN names the account the run's credentials
/// are in (read once per run, `GetCallerIdentity`).
async fn associate(
    client: &aws_sdk_sesv2::Client,
    aws: &SdkConfig,
    name: &str,
    resource: &str,
    account: &mut Option<String>,
) -> Result<String, SetUpError> {
    if account.is_none() {
        let me = aws_sdk_sts::Client::new(aws).get_caller_identity().send().await;
        let me = me.map_err(|e| SetUpError::Caller(Box::new(e)))?;
        *account = Some(me.account().unwrap_or_default().to_owned());
    }
    let region = aws.region().map_or("us-east-1", |r| r.as_ref());
    let arn = arn(resource, region, account.as_deref().unwrap_or_default())
        .ok_or_else(|| SetUpError::Part(resource.to_owned()))?;
    match client.create_tenant_resource_association().tenant_name(name).resource_arn(&arn).send().await {
        Ok(_) => Ok(arn),
        Err(e) if exists(&e) => Ok(arn),
        Err(e) => Err(SetUpError::Association { name: name.to_owned(), arn, error: Box::new(e) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_is_named_by_its_arn_and_the_tenant_by_none() {
        assert_eq!(
            arn("identity:example.com", "eu-west-1", "123456789012").as_deref(),
            Some("arn:aws:ses:eu-west-1:123456789012:identity/example.com")
        );
        assert_eq!(
            arn("configuration_set:relay-events", "eu-west-1", "1").as_deref(),
            Some("arn:aws:ses:eu-west-1:1:configuration-set/relay-events")
        );
        assert_eq!(arn(TENANT, "eu-west-1", "1"), None);
        assert!(hold_rate(TenantId::from_uuid(uuid::Uuid::nil())).starts_with("ses_tenant:"));
    }
}
