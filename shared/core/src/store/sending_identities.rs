//! Who a tenant sends as: the addresses and domains it may send from (operators manage them;
//! `email.send` refuses any other sender), and the sending role in its own AWS account that
//! `email.send` runs under when it names one (see `credentials`).

use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// Replace a tenant's identities with `identities` (lower-cased, deduplicated).
pub async fn set(
    db: &mut deadpool_postgres::Client,
    tenant: TenantId,
    identities: &[String],
) -> Result<Vec<String>, StoreError> {
    let mut wanted: Vec<String> = identities.iter().map(|i| i.trim().to_lowercase()).collect();
    wanted.sort();
    wanted.dedup();
    let tx = db.transaction().await?;
    tx.execute("DELETE FROM sending_identities WHERE tenant_id = $1", &[&tenant]).await?;
    tx.execute(
        "INSERT INTO sending_identities (tenant_id, identity) SELECT $1, unnest($2::text[])",
        &[&tenant, &wanted],
    )
    .await?;
    tx.commit().await?;
    Ok(wanted)
}

pub async fn list(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<String>, StoreError> {
    let rows =
        db.query("SELECT identity FROM sending_identities WHERE tenant_id = $1 ORDER BY identity", &[&tenant]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Add one identity (lower-cased) if it is not there.
pub async fn add(db: &impl GenericClient, tenant: TenantId, identity: &str) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO sending_identities (tenant_id, identity) VALUES ($1, lower($2)) ON CONFLICT DO NOTHING",
        &[&tenant, &identity],
    )
    .await?;
    Ok(())
}

/// The tenant's own sending role, if it named one.
pub async fn role(db: &impl GenericClient, tenant: TenantId) -> Result<Option<String>, StoreError> {
    let stmt = db.prepare_cached("SELECT role_arn FROM tenant_sending_roles WHERE tenant_id = $1").await?;
    Ok(db.query_opt(&stmt, &[&tenant]).await?.map(|r| r.get(0)))
}

/// Name (or, with `None`, forget) the tenant's own sending role.
pub async fn set_role(db: &impl GenericClient, tenant: TenantId, role_arn: Option<&str>) -> Result<(), StoreError> {
    match role_arn {
        Some(arn) => {
            db.execute(
                "INSERT INTO tenant_sending_roles (tenant_id, role_arn) VALUES ($1, $2)
                 ON CONFLICT (tenant_id) DO UPDATE SET role_arn = $2, updated_at = now()",
                &[&tenant, &arn],
            )
            .await?
        }
        None => db.execute("DELETE FROM tenant_sending_roles WHERE tenant_id = $1", &[&tenant]).await?,
    };
    Ok(())
}
