//! A tenant's HTTP destinations (`http_destinations`), the targets of `http.request`, each with
//! the tenant's own write switch (removed with it). The rate slot every worker takes before a
//! call is the destination's key in `rate_slots`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::destination_terms::{OAuth, SignatureScheme, SuccessRule};
use super::{GenericClient, StoreError};
use crate::job::TenantId;

/// Which of a destination's secrets: the auth header's value, the signing secret `webhook.send`
/// signs with (`whsec_…` for Standard Webhooks), or an OAuth grant's client secret or refresh
/// token (`oauth`). All are write-only: the store keeps only when each was written; its Secrets
/// Manager name is `Secret::id` (`crate::destinations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secret {
    Auth,
    Signing,
    ClientSecret,
    RefreshToken,
}

/// A destination as stored (the secret's value is never here, only when it was last set).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Destination {
    pub name: String,
    pub base_url: String,
    /// The header the secret is sent in; null: none.
    pub auth_header: Option<String>,
    /// When the secret's value was last written (`PUT /v1/destinations/{name}/secret`).
    pub secret_set_at: Option<DateTime<Utc>>,
    /// The run-time URLs `webhook.send` may POST to (`destinations::patterns`); none: no
    /// webhook may use this destination.
    pub url_patterns: Vec<String>,
    /// When the Standard Webhooks signing secret was last written
    /// (`PUT /v1/destinations/{name}/signing-secret`); null: `webhook.send` cannot sign yet.
    pub signing_secret_set_at: Option<DateTime<Utc>>,
    pub timeout_ms: i32,
    pub rate_per_second: f64,
    /// Calls to it in flight at once, across every worker (1 to 1000; default 10): past it a
    /// job waits pending (`waiting_rate` `destination_in_flight:<name>`) instead of holding a
    /// running slot for its whole call.
    pub max_in_flight: i32,
    /// The tenant's own write switch (`PUT /v1/destinations/{name}/writes`): off, its calls
    /// are held. An operator's switch and `write:http` apply as well.
    pub writes_enabled: bool,
    /// Why the switch was last changed, as the tenant said.
    pub writes_reason: Option<String>,
    pub writes_changed_at: Option<DateTime<Utc>>,
    /// The OAuth 2.0 grant that mints the token sent in `auth_header` (`Bearer …`); null: the
    /// auth secret is sent as it is.
    pub oauth: Option<OAuth>,
    /// When the grant's client secret was last written (`PUT /v1/destinations/{name}/client-secret`).
    pub client_secret_set_at: Option<DateTime<Utc>>,
    /// When the grant's refresh token was last written (`PUT /v1/destinations/{name}/refresh-token`).
    pub refresh_token_set_at: Option<DateTime<Utc>>,
    /// How `webhook.send` signs; null: the Standard Webhooks way.
    pub signature: Option<SignatureScheme>,
    /// Which answers succeed; null: any 2xx. A job's own `success` wins.
    pub success: Option<SuccessRule>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What `put` stores.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDestination<'a> {
    pub name: &'a str,
    pub base_url: &'a str,
    pub auth_header: Option<&'a str>,
    pub timeout_ms: i32,
    pub rate_per_second: f64,
    pub max_in_flight: i32,
    pub url_patterns: &'a [String],
    pub oauth: Option<&'a OAuth>,
    pub signature: Option<&'a SignatureScheme>,
    pub success: Option<&'a SuccessRule>,
}

const COLUMNS: &str = "name, base_url, auth_header, secret_set_at, timeout_ms, rate_per_second, writes_enabled,
    writes_reason, writes_changed_at, created_at, updated_at, url_patterns, signing_secret_set_at, max_in_flight,
    oauth, signature, success, client_secret_set_at, refresh_token_set_at";

/// A JSON column as its type (the API checked it when it was written; what does not read as
/// its type reads as none).
fn json_of<T: serde::de::DeserializeOwned>(r: &Row, i: usize) -> Option<T> {
    r.get::<_, Option<serde_json::Value>>(i).and_then(|v| serde_json::from_value(v).ok())
}

fn json_value<T: Serialize>(v: Option<&T>) -> Option<serde_json::Value> {
    v.and_then(|v| serde_json::to_value(v).ok())
}

impl Destination {
    fn from_row(r: &Row) -> Self {
        Destination {
            name: r.get(0),
            base_url: r.get(1),
            auth_header: r.get(2),
            secret_set_at: r.get(3),
            timeout_ms: r.get(4),
            rate_per_second: r.get(5),
            writes_enabled: r.get(6),
            writes_reason: r.get(7),
            writes_changed_at: r.get(8),
            created_at: r.get(9),
            updated_at: r.get(10),
            url_patterns: r.get(11),
            signing_secret_set_at: r.get(12),
            max_in_flight: r.get(13),
            oauth: json_of(r, 14),
            signature: json_of(r, 15),
            success: json_of(r, 16),
            client_secret_set_at: r.get(17),
            refresh_token_set_at: r.get(18),
        }
    }
}

/// Create or replace (the secret, the write switch and the rate slot stay).
pub async fn put(db: &impl GenericClient, tenant: TenantId, d: &NewDestination<'_>) -> Result<Destination, StoreError> {
    let sql = format!(
        "INSERT INTO http_destinations (tenant_id, name, base_url, auth_header, timeout_ms, rate_per_second, url_patterns,
                                        max_in_flight, oauth, signature, success)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (tenant_id, name) DO UPDATE
         SET base_url = $3, auth_header = $4, timeout_ms = $5, rate_per_second = $6, url_patterns = $7,
             max_in_flight = $8, oauth = $9, signature = $10, success = $11, updated_at = now()
         RETURNING {COLUMNS}"
    );
    let row = db
        .query_one(
            &sql,
            &[
                &tenant,
                &d.name,
                &d.base_url,
                &d.auth_header,
                &d.timeout_ms,
                &d.rate_per_second,
                &d.url_patterns,
                &d.max_in_flight,
                &json_value(d.oauth),
                &json_value(d.signature),
                &json_value(d.success),
            ],
        )
        .await?;
    Ok(Destination::from_row(&row))
}

pub async fn get(db: &impl GenericClient, tenant: TenantId, name: &str) -> Result<Option<Destination>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM http_destinations WHERE tenant_id = $1 AND name = $2");
    Ok(db.query_opt(&sql, &[&tenant, &name]).await?.as_ref().map(Destination::from_row))
}

pub async fn list(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<Destination>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM http_destinations WHERE tenant_id = $1 ORDER BY name");
    Ok(db.query(&sql, &[&tenant]).await?.iter().map(Destination::from_row).collect())
}

/// Returns false when there was no such destination.
pub async fn delete(db: &impl GenericClient, tenant: TenantId, name: &str) -> Result<bool, StoreError> {
    Ok(db.execute("DELETE FROM http_destinations WHERE tenant_id = $1 AND name = $2", &[&tenant, &name]).await? == 1)
}

/// Set the tenant's own write switch. None when there is no such destination.
pub async fn set_writes(
    db: &impl GenericClient,
    tenant: TenantId,
    name: &str,
    enabled: bool,
    reason: Option<&str>,
) -> Result<Option<Destination>, StoreError> {
    let sql = format!(
        "UPDATE http_destinations SET writes_enabled = $3, writes_reason = $4, writes_changed_at = now()
         WHERE tenant_id = $1 AND name = $2 RETURNING {COLUMNS}"
    );
    Ok(db.query_opt(&sql, &[&tenant, &name, &enabled, &reason]).await?.as_ref().map(Destination::from_row))
}

/// Note that a secret's value was written. Returns false when there is no such destination.
pub async fn secret_written(
    db: &impl GenericClient,
    tenant: TenantId,
    name: &str,
    which: Secret,
) -> Result<bool, StoreError> {
    let column = match which {
        Secret::Auth => "secret_set_at",
        Secret::Signing => "signing_secret_set_at",
        Secret::ClientSecret => "client_secret_set_at",
        Secret::RefreshToken => "refresh_token_set_at",
    };
    let sql =
        format!("UPDATE http_destinations SET {column} = now(), updated_at = now() WHERE tenant_id = $1 AND name = $2");
    Ok(db.execute(&sql, &[&tenant, &name]).await? == 1)
}
