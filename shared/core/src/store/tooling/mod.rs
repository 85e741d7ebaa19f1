//! What the `relay` tool asks of Postgres beyond the platform's own statements: `readouts` of
//! what a chaos run or a benchmark did, counted from the rows; `bench`'s bulk seeding and the
//! database's own counters; scratch schemas and databases. Behind the `testing` feature: the
//! Lambda functions never compile it.

pub mod bench;
pub mod readouts;

use super::StoreError;

/// Create a database unless it exists (a private cluster starts with only `postgres`).
pub async fn ensure_database(admin: &tokio_postgres::Client, name: &str) -> Result<(), StoreError> {
    let exists = admin.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?.is_some();
    if !exists {
        admin.batch_execute(&format!("CREATE DATABASE {}", quoted(name))).await?;
    }
    Ok(())
}

/// A schema of its own for one run (its tables made by the migrations, dropped after).
pub async fn create_schema(admin: &tokio_postgres::Client, name: &str) -> Result<(), StoreError> {
    Ok(admin.batch_execute(&format!("CREATE SCHEMA {}", quoted(name))).await?)
}

pub async fn drop_schema(admin: &tokio_postgres::Client, name: &str) -> Result<(), StoreError> {
    Ok(admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", quoted(name))).await?)
}

/// An identifier quoted for SQL.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The job a tenant's idempotency key names (what `relay ingress send` follows).
pub async fn job_by_key(
    db: &impl super::GenericClient,
    tenant: crate::job::TenantId,
    key: &str,
) -> Result<Option<crate::job::JobId>, StoreError> {
    let row = db
        .query_opt("SELECT job_id FROM job_keys WHERE tenant_id = $1 AND idempotency_key = $2", &[&tenant, &key])
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// A message of any tenant, by its id or its job's id (the job's first message): its id and
/// SES's id (`None` when it was never sent: shadowed, refused). For `relay ingress send --message`.
pub async fn message_for_event(
    db: &impl super::GenericClient,
    id: uuid::Uuid,
) -> Result<Option<(uuid::Uuid, Option<String>)>, StoreError> {
    let row = db
        .query_opt("SELECT id, provider_message_id FROM messages WHERE id = $1 OR job_id = $1 ORDER BY id = $1 DESC, created_at LIMIT 1", &[&id])
        .await?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}
