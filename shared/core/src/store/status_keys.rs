//! Read-only status keys for `GET /v1/status`, distinct from tenant keys. A key is shown once,
//! at creation; only its sha256 is stored.

use uuid::Uuid;

use super::tenants::{hash_key, new_key};
use super::{GenericClient, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct StatusKey {
    pub id: Uuid,
    pub name: String,
}

/// Create a named status key and return it with the key (the only time it exists in clear).
pub async fn create(db: &impl GenericClient, name: &str) -> Result<(StatusKey, String), StoreError> {
    let key = new_key("rs");
    let id = Uuid::now_v7();
    db.execute("INSERT INTO status_keys (id, name, key_hash) VALUES ($1, $2, $3)", &[&id, &name, &hash_key(&key)])
        .await?;
    Ok((StatusKey { id, name: name.to_owned() }, key))
}

/// The enabled status key with this value, if any.
pub async fn by_key(db: &impl GenericClient, key: &str) -> Result<Option<StatusKey>, StoreError> {
    let stmt =
        db.prepare_cached("SELECT id, name FROM status_keys WHERE key_hash = $1 AND disabled_at IS NULL").await?;
    Ok(db.query_opt(&stmt, &[&hash_key(key)]).await?.map(|r| StatusKey { id: r.get(0), name: r.get(1) }))
}

pub async fn by_name(db: &impl GenericClient, name: &str) -> Result<Option<StatusKey>, StoreError> {
    let row = db.query_opt("SELECT id, name FROM status_keys WHERE name = $1", &[&name]).await?;
    Ok(row.map(|r| StatusKey { id: r.get(0), name: r.get(1) }))
}

/// Give the named key a new value (enabled again if it was disabled); returns the new key,
/// or None when no key has that name. The old value stops at once.
pub async fn rotate(db: &impl GenericClient, name: &str) -> Result<Option<String>, StoreError> {
    let key = new_key("rs");
    let n = db
        .execute("UPDATE status_keys SET key_hash = $2, disabled_at = NULL WHERE name = $1", &[&name, &hash_key(&key)])
        .await?;
    Ok((n == 1).then_some(key))
}

/// Disable a key by name; returns false when no enabled key has that name.
pub async fn disable(db: &impl GenericClient, name: &str) -> Result<bool, StoreError> {
    let n = db
        .execute("UPDATE status_keys SET disabled_at = now() WHERE name = $1 AND disabled_at IS NULL", &[&name])
        .await?;
    Ok(n == 1)
}
