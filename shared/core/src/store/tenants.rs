//! Tenants and their API keys. A key is shown once, at creation; only its sha256 is stored.

use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{GenericClient, StoreError};
use crate::job::TenantId;

#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
}

/// A new key: `<prefix>_` and 32 random bytes, URL-safe base64. Tenants' API keys are `rk_`,
/// operators' `ro_`, status keys `rs_`; all are stored only as `hash_key`.
pub fn new_key(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

pub fn hash_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// Create a tenant and return it with its API key (the only time the key exists in clear).
pub async fn create(db: &impl GenericClient, name: &str) -> Result<(Tenant, String), StoreError> {
    let key = new_key("rk");
    let id = TenantId::new();
    db.execute("INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3)", &[&id, &name, &hash_key(&key)])
        .await?;
    Ok((Tenant { id, name: name.to_owned() }, key))
}

/// The enabled tenant that owns this API key, if any.
pub async fn by_api_key(db: &impl GenericClient, key: &str) -> Result<Option<Tenant>, StoreError> {
    let stmt =
        db.prepare_cached("SELECT id, name FROM tenants WHERE api_key_hash = $1 AND disabled_at IS NULL").await?;
    let row = db.query_opt(&stmt, &[&hash_key(key)]).await?;
    Ok(row.map(|r| Tenant { id: r.get(0), name: r.get(1) }))
}

pub async fn by_id(db: &impl GenericClient, id: TenantId) -> Result<Option<Tenant>, StoreError> {
    let row = db.query_opt("SELECT id, name FROM tenants WHERE id = $1", &[&id]).await?;
    Ok(row.map(|r| Tenant { id: r.get(0), name: r.get(1) }))
}

pub async fn by_name(db: &impl GenericClient, name: &str) -> Result<Option<Tenant>, StoreError> {
    let row = db.query_opt("SELECT id, name FROM tenants WHERE name = $1", &[&name]).await?;
    Ok(row.map(|r| Tenant { id: r.get(0), name: r.get(1) }))
}

/// Replace a tenant's key (used by `relay dev` to print a working key on every start).
pub async fn rotate_key(db: &impl GenericClient, id: TenantId) -> Result<String, StoreError> {
    let key = new_key("rk");
    db.execute("UPDATE tenants SET api_key_hash = $2 WHERE id = $1", &[&id, &hash_key(&key)]).await?;
    Ok(key)
}

/// The tenant with this name, created (with a key nobody is shown) when missing. Safe when
/// several processes ensure the same name at once. For platform-owned work such as ingress.
pub async fn ensure(db: &impl GenericClient, name: &str) -> Result<Tenant, StoreError> {
    let stmt = db
        .prepare_cached(
            "INSERT INTO tenants (id, name, api_key_hash) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO NOTHING",
        )
        .await?;
    db.execute(&stmt, &[&TenantId::new(), &name, &hash_key(&new_key("rk"))]).await?;
    by_name(db, name).await?.ok_or_else(|| StoreError::Vanished(format!("tenant {name:?}")))
}

/// Disable a tenant: its key stops working (within the API's key cache TTL) and no new key
/// is issued. Returns false when no enabled tenant has that name.
pub async fn revoke(db: &impl GenericClient, name: &str) -> Result<bool, StoreError> {
    let n =
        db.execute("UPDATE tenants SET disabled_at = now() WHERE name = $1 AND disabled_at IS NULL", &[&name]).await?;
    Ok(n == 1)
}
