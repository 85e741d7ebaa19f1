//! The admin function's audit: one row per invocation (`lambda::admin`).

use serde_json::Value;

use super::{GenericClient, StoreError};

/// Record one admin invocation.
pub async fn record(
    db: &impl GenericClient,
    action: &str,
    actor: &str,
    request_id: Option<&str>,
    ok: bool,
    detail: &Value,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO admin_actions (action, actor, request_id, ok, detail) VALUES ($1, $2, $3, $4, $5)",
        &[&action, &actor, &request_id, &ok, detail],
    )
    .await?;
    Ok(())
}
