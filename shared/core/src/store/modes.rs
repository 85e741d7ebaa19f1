//! Operating modes: one row per switch, changed by an operator with an audit row. The global
//! ones (shadow, the integrations' write switches, the pauses) are read on every claim; an
//! operator's switch for one tenant's destination only by that destination's calls. A tenant's
//! own switch for its destination is not here: it lives on the destination (`destinations`).

use std::collections::BTreeMap;

use super::{GenericClient, StoreError};

/// A snapshot of the modes table. A switch without a row takes its default in code:
/// shadow on, integration writes off, nothing paused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modes {
    pub switches: BTreeMap<String, bool>,
}

/// The integrations a `write:<integration>` switch may name: SES (email), callbacks,
/// `http.request`'s calls to tenants' destinations, and SES tenant management (`ses_tenants`:
/// each send names its Relay tenant's SES tenant, `email::ses::tenant_name`).
pub const INTEGRATIONS: &[&str] = &["ses", "callbacks", "http", "ses_tenants"];

/// Which rows the claim reads: those that apply to every job, never the per-destination ones
/// (matching the partial index `operating_modes_global`, so the claim reads them by it).
pub const GLOBAL: &str = "name NOT LIKE 'write:http:%'";

/// The operator's write switch for one tenant's destination, below `write:http`; no row means
/// on. The tenant's own switch is on the destination; a call goes out only when both allow it.
pub fn destination_switch(tenant: crate::job::TenantId, destination: &str) -> String {
    format!("write:http:{tenant}:{destination}")
}

impl Modes {
    /// Outbound effects are recorded, not sent. On unless a row turns it off.
    pub fn shadow(&self) -> bool {
        self.switches.get("shadow").copied().unwrap_or(true)
    }

    /// Whether writes to an integration (`ses`, `callbacks`) may leave the machine.
    pub fn writes_enabled(&self, integration: &str) -> bool {
        !self.shadow() && self.switches.get(&format!("write:{integration}")).copied().unwrap_or(false)
    }

    pub fn paused(&self, task_type: &str) -> bool {
        self.switches.get(&format!("pause:{task_type}")).copied().unwrap_or(false)
    }

    /// From a JSON object of switch names to booleans (as the claim statement returns them).
    pub fn from_json(v: &serde_json::Value) -> Modes {
        let switches = v
            .as_object()
            .map(|o| o.iter().filter_map(|(k, v)| Some((k.clone(), v.as_bool()?))).collect())
            .unwrap_or_default();
        Modes { switches }
    }
}

/// Every switch with a row (the operators' view).
pub async fn load(db: &impl GenericClient) -> Result<Modes, StoreError> {
    let stmt = db.prepare_cached("SELECT name, enabled FROM operating_modes").await?;
    let rows = db.query(&stmt, &[]).await?;
    Ok(Modes { switches: rows.iter().map(|r| (r.get(0), r.get(1))).collect() })
}

/// The switches that apply to every job (what a claim reads): no per-destination one.
pub async fn load_global(db: &impl GenericClient) -> Result<Modes, StoreError> {
    let stmt = db.prepare_cached(&format!("SELECT name, enabled FROM operating_modes WHERE {GLOBAL}")).await?;
    let rows = db.query(&stmt, &[]).await?;
    Ok(Modes { switches: rows.iter().map(|r| (r.get(0), r.get(1))).collect() })
}

/// Whether an operator holds writes to this tenant's destination (`destination_switch` off).
pub async fn operator_holds(
    db: &impl GenericClient,
    tenant: crate::job::TenantId,
    destination: &str,
) -> Result<bool, StoreError> {
    let stmt = db.prepare_cached("SELECT NOT enabled FROM operating_modes WHERE name = $1").await?;
    let row = db.query_opt(&stmt, &[&destination_switch(tenant, destination)]).await?;
    Ok(row.is_some_and(|r| r.get(0)))
}

/// Set one switch and write the audit row in the same transaction.
pub async fn set(
    db: &mut deadpool_postgres::Client,
    name: &str,
    enabled: bool,
    changed_by: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    let tx = db.transaction().await?;
    let old: Option<bool> = tx
        .query_opt("SELECT enabled FROM operating_modes WHERE name = $1 FOR UPDATE", &[&name])
        .await?
        .map(|r| r.get(0));
    tx.execute(
        "INSERT INTO operating_modes (name, enabled, updated_by) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET enabled = $2, updated_by = $3, updated_at = now()",
        &[&name, &enabled, &changed_by],
    )
    .await?;
    tx.execute(
        "INSERT INTO operating_mode_audit (name, old_enabled, new_enabled, changed_by, reason)
         VALUES ($1, $2, $3, $4, $5)",
        &[&name, &old, &enabled, &changed_by, &reason],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe_shadow_on_writes_off_nothing_paused() {
        let m = Modes::default();
        assert!(m.shadow());
        assert!(!m.writes_enabled("ses"));
        assert!(!m.paused("noop"));
    }

    #[test]
    fn writes_need_shadow_off_and_their_switch_on() {
        let mut m = Modes::default();
        m.switches.insert("write:ses".into(), true);
        assert!(!m.writes_enabled("ses"), "shadow still on");
        m.switches.insert("shadow".into(), false);
        assert!(m.writes_enabled("ses"));
        assert!(!m.writes_enabled("callbacks"));
    }
}
