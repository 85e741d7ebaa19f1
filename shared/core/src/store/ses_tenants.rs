//! What of each tenant's SES tenant Relay set up (`ses_tenant_resources`): the SES tenant
//! itself (`tenant`) and the resources associated with it (`identity:<identity>`,
//! `configuration_set:<name>`). The rules and the SES calls are `email::ses_tenants`.

use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// The part for the SES tenant itself.
pub const TENANT: &str = "tenant";
/// The prefix of a sending identity's part.
pub const IDENTITY: &str = "identity:";
/// The prefix of a configuration set's part.
pub const CONFIGURATION_SET: &str = "configuration_set:";

/// Keep that these parts exist at SES (`(resource, ARN)`; no ARN for `tenant`), so no send
/// asks for them again.
pub async fn record(
    db: &impl GenericClient,
    tenant: TenantId,
    ses_tenant: &str,
    done: &[(String, Option<String>)],
) -> Result<(), StoreError> {
    let (resources, arns): (Vec<&str>, Vec<Option<&str>>) =
        done.iter().map(|(r, a)| (r.as_str(), a.as_deref())).unzip();
    db.execute(
        "INSERT INTO ses_tenant_resources (tenant_id, resource, ses_tenant, resource_arn)
         SELECT $1, r, $2, a FROM unnest($3::text[], $4::text[]) AS u (r, a)
         ON CONFLICT (tenant_id, resource) DO NOTHING",
        &[&tenant, &ses_tenant, &resources, &arns],
    )
    .await?;
    Ok(())
}
