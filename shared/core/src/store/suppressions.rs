//! The suppression list: addresses a tenant will not send to. Hard bounces and complaints
//! (SES events) add to it; the tenant lists and removes entries over the API.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{GenericClient, StoreError};
use crate::job::TenantId;

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Suppression {
    pub address: String,
    /// `bounce`, `complaint` or `manual`.
    pub reason: String,
    pub detail: Option<String>,
    /// The message whose event added it.
    pub message_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
}

/// Add addresses (bare, lower-case); an address already listed keeps its first reason.
/// Returns the addresses newly listed.
pub async fn add(
    db: &impl GenericClient,
    tenant: TenantId,
    addresses: &[String],
    reason: &str,
    detail: Option<&str>,
    message_id: Option<Uuid>,
) -> Result<Vec<String>, StoreError> {
    let rows = db
        .query(
            "INSERT INTO suppressions (tenant_id, address, reason, detail, message_id)
             SELECT $1, a, $3, $4, $5 FROM unnest($2::text[]) a
             ON CONFLICT (tenant_id, address) DO NOTHING RETURNING address",
            &[&tenant, &addresses, &reason, &detail, &message_id],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// A page of the list, in address order after `after`.
pub async fn list(
    db: &impl GenericClient,
    tenant: TenantId,
    after: &str,
    limit: i64,
) -> Result<Vec<Suppression>, StoreError> {
    let rows = db
        .query(
            "SELECT address, reason, detail, message_id, created_at FROM suppressions
             WHERE tenant_id = $1 AND address > $2 ORDER BY address LIMIT $3",
            &[&tenant, &after, &limit],
        )
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// Returns false when the address was not listed.
pub async fn remove(db: &impl GenericClient, tenant: TenantId, address: &str) -> Result<bool, StoreError> {
    Ok(db.execute("DELETE FROM suppressions WHERE tenant_id = $1 AND address = $2", &[&tenant, &address]).await? == 1)
}

fn from_row(r: &tokio_postgres::Row) -> Suppression {
    Suppression { address: r.get(0), reason: r.get(1), detail: r.get(2), message_id: r.get(3), created_at: r.get(4) }
}
