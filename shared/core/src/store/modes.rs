//! Operating modes: one row per switch, read on every claim, changed with an audit row.

use std::collections::BTreeMap;

use super::{GenericClient, StoreError};

/// A snapshot of the modes table. A switch without a row takes its default in code:
/// shadow on, integration writes off, nothing paused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modes {
    pub switches: BTreeMap<String, bool>,
}

/// The integrations a `write:<integration>` switch may name: SES (email), callbacks, and
/// `http.request`'s calls to tenants' destinations.
pub const INTEGRATIONS: &[&str] = &["ses", "callbacks", "http"];

/// The write switch of one tenant's destination, below `write:http`; no row means on.
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

    /// Whether a tenant's destination takes writes: its own switch (on unless a row turns it
    /// off), below `writes_enabled("http")`.
    pub fn destination_writes(&self, tenant: crate::job::TenantId, destination: &str) -> bool {
        self.switches.get(&destination_switch(tenant, destination)).copied().unwrap_or(true)
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

pub async fn load(db: &impl GenericClient) -> Result<Modes, StoreError> {
    let stmt = db.prepare_cached("SELECT name, enabled FROM operating_modes").await?;
    let rows = db.query(&stmt, &[]).await?;
    Ok(Modes { switches: rows.iter().map(|r| (r.get(0), r.get(1))).collect() })
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

    #[test]
    fn a_destination_takes_writes_until_its_own_switch_is_off() {
        let t = crate::job::TenantId::new();
        let mut m = Modes::default();
        assert!(m.destination_writes(t, "crm"));
        m.switches.insert(destination_switch(t, "crm"), false);
        assert!(!m.destination_writes(t, "crm"));
        assert!(m.destination_writes(crate::job::TenantId::new(), "crm"), "another tenant's destination of that name");
    }
}
