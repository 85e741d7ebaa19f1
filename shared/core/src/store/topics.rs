//! Subscription topics (migration 0037): per-topic opt-outs of a tenant's addresses, beside the
//! suppression list (which blocks every send). A send naming a topic is skipped for an address
//! opted out of it; a send naming none is not affected. And (migration 0042) the SES contact
//! list and topic a tenant's topic maps onto (`email::list_management`), and (migration 0044)
//! the tenant's own changes to a mapped topic waiting to be written to the SES contact.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{GenericClient, StoreError};
use crate::job::TenantId;

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct OptOut {
    pub address: String,
    pub topic: String,
    /// `api` (the tenant) or `provider` (an SES subscription event on a message of the topic).
    pub source: String,
    /// The message it came through, when one did.
    pub message_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
}

/// Opt `addresses` (bare, lower-case) out of `topic`; an opt-out already there keeps its first
/// source. Returns the addresses newly opted out.
pub async fn opt_out(
    db: &impl GenericClient,
    tenant: TenantId,
    addresses: &[String],
    topic: &str,
    source: &str,
    message_id: Option<Uuid>,
) -> Result<Vec<String>, StoreError> {
    let rows = db
        .query(
            "INSERT INTO topic_opt_outs (tenant_id, address, topic, source, message_id)
             SELECT $1, a, $3, $4, $5 FROM unnest($2::text[]) a
             ON CONFLICT (tenant_id, address, topic) DO NOTHING RETURNING address",
            &[&tenant, &addresses, &topic, &source, &message_id],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Resubscribe: remove the opt-out. `None` when there was none.
pub async fn resubscribe(
    db: &impl GenericClient,
    tenant: TenantId,
    address: &str,
    topic: &str,
) -> Result<Option<OptOut>, StoreError> {
    let row = db
        .query_opt(
            "DELETE FROM topic_opt_outs WHERE tenant_id = $1 AND address = $2 AND topic = $3
             RETURNING address, topic, source, message_id, created_at",
            &[&tenant, &address, &topic],
        )
        .await?;
    Ok(row.as_ref().map(from_row))
}

/// A page of the tenant's opt-outs in (address, topic) order after `after`, of one address
/// when given.
pub async fn list(
    db: &impl GenericClient,
    tenant: TenantId,
    address: Option<&str>,
    after: (&str, &str),
    limit: i64,
) -> Result<Vec<OptOut>, StoreError> {
    let rows = db
        .query(
            "SELECT address, topic, source, message_id, created_at FROM topic_opt_outs
             WHERE tenant_id = $1 AND ($2::text IS NULL OR address = $2) AND (address, topic) > ($3, $4)
             ORDER BY address, topic LIMIT $5",
            &[&tenant, &address, &after.0, &after.1, &limit],
        )
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

fn from_row(r: &tokio_postgres::Row) -> OptOut {
    OptOut { address: r.get(0), topic: r.get(1), source: r.get(2), message_id: r.get(3), created_at: r.get(4) }
}

/// The most topics a tenant may map onto SES contact lists.
pub const MAX_SES_TOPICS: i64 = 100;

/// The SES contact list and topic a tenant's topic maps onto (migration 0042): a live send
/// naming the topic carries them (SES `ListManagementOptions`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SesTopic {
    pub topic: String,
    /// The SES contact list (`ContactListName`).
    pub contact_list: String,
    /// The topic in that list (`TopicName`).
    pub ses_topic: String,
    pub updated_at: DateTime<Utc>,
}

/// How setting a topic's SES list ended.
#[derive(Debug)]
pub enum SesTopicSet {
    Set(SesTopic),
    /// The tenant already maps `MAX_SES_TOPICS` others.
    Full,
}

/// Map `topic` onto an SES contact list and topic (or change where it maps).
pub async fn set_ses_topic(
    db: &impl GenericClient,
    tenant: TenantId,
    topic: &str,
    contact_list: &str,
    ses_topic: &str,
) -> Result<SesTopicSet, StoreError> {
    let row = db
        .query_opt(
            "INSERT INTO topic_ses_lists (tenant_id, topic, contact_list, ses_topic)
             SELECT $1, $2, $3, $4
             WHERE (SELECT count(*) FROM topic_ses_lists WHERE tenant_id = $1 AND topic <> $2) < $5
             ON CONFLICT (tenant_id, topic) DO UPDATE
                 SET contact_list = EXCLUDED.contact_list, ses_topic = EXCLUDED.ses_topic, updated_at = now()
             RETURNING topic, contact_list, ses_topic, updated_at",
            &[&tenant, &topic, &contact_list, &ses_topic, &MAX_SES_TOPICS],
        )
        .await?;
    Ok(row.as_ref().map_or(SesTopicSet::Full, |r| SesTopicSet::Set(ses_from_row(r))))
}

/// The SES contact list and topic `topic` maps onto, if it does.
pub async fn ses_topic(db: &impl GenericClient, tenant: TenantId, topic: &str) -> Result<Option<SesTopic>, StoreError> {
    let row = db
        .query_opt(
            "SELECT topic, contact_list, ses_topic, updated_at FROM topic_ses_lists WHERE tenant_id = $1 AND topic = $2",
            &[&tenant, &topic],
        )
        .await?;
    Ok(row.as_ref().map(ses_from_row))
}

/// Every topic of the tenant's that maps onto SES (at most `MAX_SES_TOPICS`), by name.
pub async fn ses_topics(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<SesTopic>, StoreError> {
    let rows = db
        .query(
            "SELECT topic, contact_list, ses_topic, updated_at FROM topic_ses_lists WHERE tenant_id = $1 ORDER BY topic",
            &[&tenant],
        )
        .await?;
    Ok(rows.iter().map(ses_from_row).collect())
}

/// Stop mapping `topic` onto SES. False when it did not.
pub async fn delete_ses_topic(db: &impl GenericClient, tenant: TenantId, topic: &str) -> Result<bool, StoreError> {
    let n = db.execute("DELETE FROM topic_ses_lists WHERE tenant_id = $1 AND topic = $2", &[&tenant, &topic]).await?;
    Ok(n == 1)
}

fn ses_from_row(r: &tokio_postgres::Row) -> SesTopic {
    SesTopic { topic: r.get(0), contact_list: r.get(1), ses_topic: r.get(2), updated_at: r.get(3) }
}

/// A change of the tenant's (API) to a mapped topic, to be written to the SES contact's topic
/// preference (`email::list_management::write_contact`).
#[derive(Debug, Clone, PartialEq)]
pub struct SesChange {
    pub id: i64,
    pub revision: i32,
    pub tenant_id: TenantId,
    pub address: String,
    pub contact_list: String,
    pub ses_topic: String,
    /// `OPT_OUT` when true, else `OPT_IN`.
    pub opt_out: bool,
    /// Tries so far, this one counted.
    pub tries: i32,
}

/// Keep, in the caller's transaction, that `address`'s preference for `topic` is to be written
/// to SES (opted out, or back in) when the topic maps onto an SES contact list; a change still
/// pending for the same address and topic is replaced. Returns whether the topic is mapped.
pub async fn queue_ses_change(
    db: &impl GenericClient,
    tenant: TenantId,
    address: &str,
    topic: &str,
    opt_out: bool,
) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "INSERT INTO topic_ses_changes (tenant_id, address, topic, contact_list, ses_topic, opt_out)
             SELECT $1, $2, $3, l.contact_list, l.ses_topic, $4 FROM topic_ses_lists l
             WHERE l.tenant_id = $1 AND l.topic = $3
             ON CONFLICT (tenant_id, address, topic) WHERE applied_at IS NULL DO UPDATE
                 SET contact_list = EXCLUDED.contact_list, ses_topic = EXCLUDED.ses_topic, opt_out = EXCLUDED.opt_out,
                     revision = topic_ses_changes.revision + 1, tries = 0, next_at = now(), last_error = NULL",
            &[&tenant, &address, &topic, &opt_out],
        )
        .await?;
    Ok(n == 1)
}

/// Take up to `limit` pending changes that are due (oldest first), each held for `hold_secs`
/// (its next try then, should this one never report) with its try counted. Two sweepers never
/// take the same change.
pub async fn take_ses_changes(
    db: &impl GenericClient,
    limit: i64,
    hold_secs: f64,
) -> Result<Vec<SesChange>, StoreError> {
    let rows = db
        .query(
            "UPDATE topic_ses_changes c SET tries = c.tries + 1, next_at = now() + make_interval(secs => $2)
             FROM (SELECT id FROM topic_ses_changes WHERE applied_at IS NULL AND next_at <= now()
                   ORDER BY next_at LIMIT $1 FOR UPDATE SKIP LOCKED) due
             WHERE c.id = due.id
             RETURNING c.id, c.revision, c.tenant_id, c.address, c.contact_list, c.ses_topic, c.opt_out, c.tries",
            &[&limit, &hold_secs],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| SesChange {
            id: r.get(0),
            revision: r.get(1),
            tenant_id: r.get(2),
            address: r.get(3),
            contact_list: r.get(4),
            ses_topic: r.get(5),
            opt_out: r.get(6),
            tries: r.get(7),
        })
        .collect())
}

/// Keep that `change` was written to SES (unless a later change replaced it meanwhile: that one
/// stays pending), and forget changes applied more than `keep_secs` ago.
pub async fn ses_change_applied(db: &impl GenericClient, change: &SesChange, keep_secs: f64) -> Result<(), StoreError> {
    db.execute(
        "UPDATE topic_ses_changes SET applied_at = now(), last_error = NULL WHERE id = $1 AND revision = $2",
        &[&change.id, &change.revision],
    )
    .await?;
    db.execute("DELETE FROM topic_ses_changes WHERE applied_at < now() - make_interval(secs => $1)", &[&keep_secs])
        .await?;
    Ok(())
}

/// Keep why `change` could not be written; it is tried again `retry_secs` from now (a later
/// change that replaced it meanwhile keeps its own schedule).
pub async fn ses_change_failed(
    db: &impl GenericClient,
    change: &SesChange,
    why: &str,
    retry_secs: f64,
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE topic_ses_changes SET last_error = $3, next_at = now() + make_interval(secs => $4)
         WHERE id = $1 AND revision = $2 AND applied_at IS NULL",
        &[&change.id, &change.revision, &why, &retry_secs],
    )
    .await?;
    Ok(())
}

/// A topic's name, as `check_name` takes it (the OpenAPI document states it).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9_.-]{1,64}$";

/// A topic's name: 1 to 64 letters, digits, `_`, `-` or `.`.
pub fn check_name(topic: &str) -> Result<(), &'static str> {
    let ok = (1..=64).contains(&topic.len())
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok { Ok(()) } else { Err("1 to 64 letters, digits, '_', '-' or '.'") }
}
