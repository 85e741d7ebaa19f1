//! Per-tenant email templates (`PUT /v1/templates/{name}`), rendered by `email::content`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::TenantId;

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Template {
    pub name: String,
    pub subject: String,
    pub text_body: Option<String>,
    pub html_body: Option<String>,
    pub updated_at: DateTime<Utc>,
}

impl Template {
    fn from_row(r: &Row) -> Self {
        Self::from_row_at(r, 0)
    }

    /// A template from `COLUMNS` read at `at` onwards.
    pub(super) fn from_row_at(r: &Row, at: usize) -> Self {
        Template {
            name: r.get(at),
            subject: r.get(at + 1),
            text_body: r.get(at + 2),
            html_body: r.get(at + 3),
            updated_at: r.get(at + 4),
        }
    }
}

/// A template name that breaks the rule below; the message states the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("1 to 100 letters, digits, '.', '_' or '-'")]
pub struct BadName;

/// A template name: 1 to 100 letters, digits, `.`, `_` or `-`.
/// What `check_name` takes, as a pattern.
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,100}$";

pub fn check_name(name: &str) -> Result<(), BadName> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(BadName) }
}

pub(super) const COLUMNS: &str = "name, subject, text_body, html_body, updated_at";

/// Create or replace; returns the stored template.
pub async fn put(
    db: &impl GenericClient,
    tenant: TenantId,
    name: &str,
    subject: &str,
    text: Option<&str>,
    html: Option<&str>,
) -> Result<Template, StoreError> {
    let row = db
        .query_one(
            &format!(
                "INSERT INTO email_templates (tenant_id, name, subject, text_body, html_body) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (tenant_id, name) DO UPDATE
                 SET subject = $3, text_body = $4, html_body = $5, updated_at = now()
                 RETURNING {COLUMNS}"
            ),
            &[&tenant, &name, &subject, &text, &html],
        )
        .await?;
    Ok(Template::from_row(&row))
}

/// Prepared once per connection: every `email.send` reads its template, and a statement given
/// as text is prepared anew on each call, a round trip of its own before the query's.
pub async fn get(db: &impl GenericClient, tenant: TenantId, name: &str) -> Result<Option<Template>, StoreError> {
    let stmt =
        db.prepare_cached(&format!("SELECT {COLUMNS} FROM email_templates WHERE tenant_id = $1 AND name = $2")).await?;
    Ok(db.query_opt(&stmt, &[&tenant, &name]).await?.as_ref().map(Template::from_row))
}

pub async fn list(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<Template>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM email_templates WHERE tenant_id = $1 ORDER BY name");
    Ok(db.query(&sql, &[&tenant]).await?.iter().map(Template::from_row).collect())
}

/// Returns false when there was no such template.
pub async fn delete(db: &impl GenericClient, tenant: TenantId, name: &str) -> Result<bool, StoreError> {
    Ok(db.execute("DELETE FROM email_templates WHERE tenant_id = $1 AND name = $2", &[&tenant, &name]).await? == 1)
}
