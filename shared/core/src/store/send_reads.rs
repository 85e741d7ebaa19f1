//! What an `email.send` reads before it records its message, in one statement: one round trip
//! and one prepared plan. As eight statements (even pipelined) each cost the database a bind,
//! an execution and a reply of its own: a campaign of 100,000 children made 800,000 of them.

use super::cutover::{self, Stage};
use super::reputation::{self, Guard};
use super::ses_tenants::{CONFIGURATION_SET, IDENTITY, TENANT};
use super::templates::{self, Template};
use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// Whose send it is and what it names.
pub struct SendQuery<'a> {
    pub tenant: TenantId,
    /// The stored template it renders, if any.
    pub template: Option<&'a str>,
    /// The sender, bare and lower-case.
    pub from: &'a str,
    /// Every recipient, bare and lower-case.
    pub recipients: &'a [String],
    pub topic: Option<&'a str>,
    /// The task type whose cut-over stage applies (`email::cutover::task_type_of`).
    pub stage_of: &'a str,
    pub configuration_set: Option<&'a str>,
    /// Whether Relay sets up the tenant's SES tenant (the `ses_tenants` write switch).
    pub ses_tenants: bool,
}

/// What the send found.
#[derive(Debug)]
pub struct SendReads {
    pub template: Option<Template>,
    /// The sender is one of the tenant's identities or at one of its domains.
    pub allowed: bool,
    /// Recipients on the tenant's suppression list, by address.
    pub suppressed: Vec<Suppressed>,
    /// Recipients opted out of the send's topic, by address.
    pub opted_out: Vec<String>,
    /// The tenant's own sending role, if it named one.
    pub role: Option<String>,
    /// The tenant's reputation guard as stored (None: the defaults hold, state `ok`).
    pub guard: Option<Guard>,
    /// The tenant's cut-over stage for this kind of send (None: the global modes alone decide).
    pub stage: Option<Stage>,
    /// What of the tenant's SES tenant a live send still needs set up, in order: the SES
    /// tenant first, then each sending identity and the configuration set not yet associated
    /// (empty without `ses_tenants`, or when everything is).
    pub ses_tenant_missing: Vec<String>,
}

/// A recipient on the suppression list and why it is there (`bounce`, `complaint`, `manual`).
#[derive(Debug)]
pub struct Suppressed {
    pub address: String,
    pub reason: String,
}

// Column positions: the template's 5, the guard's 10, the stage's 12, then one each.
const GUARD_AT: usize = 5;
const STAGE_AT: usize = 15;
const ROLE_AT: usize = 27;

pub async fn read(db: &impl GenericClient, q: &SendQuery<'_>) -> Result<SendReads, StoreError> {
    let sql = format!(
        "SELECT t.*, g.*, c.*,
            (SELECT role_arn FROM tenant_sending_roles WHERE tenant_id = $1),
            EXISTS (SELECT 1 FROM sending_identities WHERE tenant_id = $1 AND identity IN ($3, $4)),
            s.addresses, s.reasons,
            ARRAY(SELECT address FROM topic_opt_outs
                  WHERE tenant_id = $1 AND address = ANY ($5) AND topic = $6 ORDER BY address),
            ARRAY(SELECT w.resource FROM (
                      SELECT 0 AS ord, '{TENANT}' AS resource
                      UNION ALL SELECT 1, '{IDENTITY}' || identity FROM sending_identities WHERE tenant_id = $1
                      UNION ALL SELECT 2, '{CONFIGURATION_SET}' || $8::text WHERE $8::text IS NOT NULL
                  ) w
                  WHERE $9 AND NOT EXISTS
                      (SELECT 1 FROM ses_tenant_resources r WHERE r.tenant_id = $1 AND r.resource = w.resource)
                  ORDER BY w.ord, w.resource)
         FROM (SELECT 1) one
         LEFT JOIN LATERAL (SELECT {template} FROM email_templates WHERE tenant_id = $1 AND name = $2) t ON true
         LEFT JOIN LATERAL (SELECT {guard} FROM tenant_reputation WHERE tenant_id = $1) g ON true
         LEFT JOIN LATERAL (SELECT {stage} FROM cutover_stages WHERE tenant_id = $1 AND task_type = $7) c ON true
         LEFT JOIN LATERAL (SELECT array_agg(address ORDER BY address) AS addresses,
                                   array_agg(reason ORDER BY address) AS reasons
                            FROM suppressions WHERE tenant_id = $1 AND address = ANY ($5)) s ON true",
        template = templates::COLUMNS,
        guard = reputation::COLUMNS,
        stage = cutover::COLUMNS,
    );
    let stmt = db.prepare_cached(&sql).await?;
    let domain = q.from.rsplit_once('@').map_or("", |(_, d)| d);
    let r = db
        .query_one(
            &stmt,
            &[
                &q.tenant,
                &q.template,
                &q.from,
                &domain,
                &q.recipients,
                &q.topic,
                &q.stage_of,
                &q.configuration_set,
                &q.ses_tenants,
            ],
        )
        .await?;
    // A part's first column is NOT NULL in its table: NULL here means no row.
    let addresses: Option<Vec<String>> = r.get(ROLE_AT + 2);
    let reasons: Option<Vec<String>> = r.get(ROLE_AT + 3);
    Ok(SendReads {
        template: r.get::<_, Option<String>>(0).is_some().then(|| Template::from_row_at(&r, 0)),
        allowed: r.get(ROLE_AT + 1),
        suppressed: addresses
            .unwrap_or_default()
            .into_iter()
            .zip(reasons.unwrap_or_default())
            .map(|(address, reason)| Suppressed { address, reason })
            .collect(),
        opted_out: r.get(ROLE_AT + 4),
        role: r.get(ROLE_AT),
        guard: r.get::<_, Option<f64>>(GUARD_AT).is_some().then(|| reputation::guard_at(&r, GUARD_AT)),
        stage: r.get::<_, Option<TenantId>>(STAGE_AT).is_some().then(|| cutover::stage_at(&r, STAGE_AT)),
        ses_tenant_missing: r.get(ROLE_AT + 5),
    })
}
