//! Operator keys: distinct from tenant keys. A key is shown once, at creation; only its
//! sha256 is stored. The operator's name is the "who" of every audit row.

use uuid::Uuid;

use super::tenants::{hash_key, new_key};
use super::{GenericClient, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct Operator {
    pub id: Uuid,
    pub name: String,
}

/// Whether a name is acceptable (the table's CHECK, asked before a round trip).
pub fn valid_name(name: &str) -> bool {
    (1..=100).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.@:-".contains(&b))
}

/// Create an operator and return it with its key (the only time the key exists in clear).
pub async fn create(db: &impl GenericClient, name: &str) -> Result<(Operator, String), StoreError> {
    let key = new_key("ro");
    let id = Uuid::now_v7();
    db.execute("INSERT INTO operator_keys (id, name, key_hash) VALUES ($1, $2, $3)", &[&id, &name, &hash_key(&key)])
        .await?;
    Ok((Operator { id, name: name.to_owned() }, key))
}

/// The enabled operator holding this key, if any.
pub async fn by_key(db: &impl GenericClient, key: &str) -> Result<Option<Operator>, StoreError> {
    let stmt =
        db.prepare_cached("SELECT id, name FROM operator_keys WHERE key_hash = $1 AND disabled_at IS NULL").await?;
    let row = db.query_opt(&stmt, &[&hash_key(key)]).await?;
    Ok(row.map(|r| Operator { id: r.get(0), name: r.get(1) }))
}

/// Disable an operator's key; returns false when no enabled operator has that name.
pub async fn revoke(db: &impl GenericClient, name: &str) -> Result<bool, StoreError> {
    let n = db
        .execute("UPDATE operator_keys SET disabled_at = now() WHERE name = $1 AND disabled_at IS NULL", &[&name])
        .await?;
    Ok(n == 1)
}

/// Issue a new key for an enabled operator (the old one stops); `None` when there is none.
pub async fn rotate_key(db: &impl GenericClient, name: &str) -> Result<Option<String>, StoreError> {
    let key = new_key("ro");
    let n = db
        .execute(
            "UPDATE operator_keys SET key_hash = $2 WHERE name = $1 AND disabled_at IS NULL",
            &[&name, &hash_key(&key)],
        )
        .await?;
    Ok((n == 1).then_some(key))
}
