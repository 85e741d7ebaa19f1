//! Message events as their tenant sees them (issue 35): the callback and feed type of each
//! stored event, the suppression an event caused kept as an event of its own, and the
//! tenant-scoped reads behind `callback.deliver` and `GET /v1/messages/events`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::messages::Message;
use super::{GenericClient, StoreError};
use crate::job::{JobId, TenantId};

/// Keep, as an event of its own (`suppressed`) on the message, the addresses an event put on
/// the tenant's suppression list, so the tenant hears of the change (callback and feed).
/// Keyed on the causing event's key; returns the row, None when kept before.
pub async fn record_suppressed(
    db: &impl GenericClient,
    event_key: &str,
    m: &Message,
    addresses: &[String],
    reason: &str,
    occurred_at: Option<DateTime<Utc>>,
) -> Result<Option<i64>, StoreError> {
    let detail = serde_json::json!({ "addresses": addresses, "reason": reason });
    let row = db
        .query_opt(
            "INSERT INTO message_events (event_key, message_id, tenant_id, event_type, occurred_at, note, detail)
             VALUES ($1 || ':suppressed', $2, $3, 'suppressed', $4, $5, $6)
             ON CONFLICT (event_key) DO NOTHING RETURNING id",
            &[&event_key, &m.id, &m.tenant_id, &occurred_at, &format!("suppressed after a {reason}"), &detail],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Keep a topic opt-out or resubscription (`unsubscribed`, `resubscribed`) of `address` as an
/// event on the message it came through, so the tenant hears of it (callback and feed).
pub async fn record_topic_change(
    db: &impl GenericClient,
    tenant: TenantId,
    message_id: Uuid,
    kind: &str,
    address: &str,
    topic: &str,
) -> Result<Option<i64>, StoreError> {
    let detail = serde_json::json!({ "addresses": [address], "topic": topic });
    let row = db
        .query_opt(
            "INSERT INTO message_events (event_key, message_id, tenant_id, event_type, occurred_at, note, detail)
             SELECT 'topic:' || $3 || ':' || m.tenant_id::text || ':' || $4 || ':' || $5 || ':' || gen_random_uuid(), m.id, m.tenant_id,
                    $3, now(), $3 || ' ' || $4 || ' (topic ' || $5 || ')', $6
             FROM messages m WHERE m.id = $2 AND m.tenant_id = $1
             RETURNING id",
            &[&tenant, &message_id, &kind, &address, &topic, &detail],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Keep, as an event of its own on the message whose bounce or complaint raised it, the
/// tenant's reputation guard rising to `level` (`warning` or `paused`, `email::reputation`),
/// so the tenant hears of it (callback and feed). Keyed on the causing event's key.
pub async fn record_reputation(
    db: &impl GenericClient,
    event_key: &str,
    m: &Message,
    level: &str,
    why: &str,
    detail: &Value,
) -> Result<Option<i64>, StoreError> {
    let row = db
        .query_opt(
            "INSERT INTO message_events (event_key, message_id, tenant_id, event_type, occurred_at, note, detail)
             VALUES ($1 || ':reputation', $2, $3, 'reputation_' || $4, now(), $5, $6)
             ON CONFLICT (event_key) DO NOTHING RETURNING id",
            &[&event_key, &m.id, &m.tenant_id, &level, &why, detail],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// The callback and feed type of a stored event type (`message.bounced`...); None for what is
/// no tenant's to hear (inbound mail).
pub fn webhook_type(event_type: &str) -> Option<&'static str> {
    Some(match event_type {
        "send" => "message.sent",
        "delivery" => "message.delivered",
        "delivery_delay" => "message.delayed",
        "bounce" => "message.bounced",
        "complaint" => "message.complained",
        "reject" | "rendering_failure" => "message.rejected",
        "open" => "message.opened",
        "click" => "message.clicked",
        "subscription" | "unsubscribed" => "message.unsubscribed",
        "resubscribed" => "message.resubscribed",
        "suppressed" => "message.suppressed",
        "reputation_warning" => "message.reputation_warning",
        "reputation_paused" => "message.reputation_paused",
        _ => return None,
    })
}

/// Every type `webhook_type` gives: what a tenant may subscribe to.
pub const WEBHOOK_TYPES: [&str; 13] = [
    "message.sent",
    "message.delivered",
    "message.delayed",
    "message.bounced",
    "message.complained",
    "message.rejected",
    "message.opened",
    "message.clicked",
    "message.unsubscribed",
    "message.resubscribed",
    "message.suppressed",
    "message.reputation_warning",
    "message.reputation_paused",
];

/// A message event as its tenant sees it (callback `data` and feed entry): what happened, to
/// which message, job and recipients, and the provider's classification; never the raw event.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TenantEvent {
    /// The event's position (increasing): a receiver may drop one it has seen.
    pub id: i64,
    /// `message.bounced`, `message.delivered`...
    #[serde(rename = "type")]
    pub event_type: String,
    pub message_id: Uuid,
    #[schema(value_type = Uuid)]
    pub job_id: JobId,
    pub correlation_id: String,
    /// The recipients it is about (bounced, complained, delivered, suppressed...).
    pub recipients: Vec<String>,
    /// When the provider says it happened.
    pub occurred_at: Option<DateTime<Utc>>,
    /// When Relay received it (the feed's order).
    pub received_at: DateTime<Utc>,
    /// `Permanent`, `Transient` or `Undetermined` (bounces).
    pub bounce_type: Option<String>,
    pub bounce_subtype: Option<String>,
    /// The feedback type of a complaint (`abuse`...).
    pub complaint_type: Option<String>,
    /// A short summary (reject reason, link clicked, suppression cause...).
    pub note: Option<String>,
}

const TENANT_EVENT: &str = "SELECT e.id, e.event_type, e.message_id, m.job_id, m.correlation_id, e.occurred_at,
        e.received_at, e.note, e.detail
     FROM message_events e JOIN messages m ON m.id = e.message_id AND m.tenant_id = e.tenant_id";

fn tenant_event(r: &Row) -> Option<TenantEvent> {
    let stored: String = r.get(1);
    let detail: Value = r.get(8);
    let text = |p: &str| detail.pointer(p).and_then(Value::as_str).map(str::to_owned);
    let listed = |p: &str, key: Option<&str>| -> Vec<String> {
        detail
            .pointer(p)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| key.map_or(Some(v), |k| v.get(k))?.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let recipients = match stored.as_str() {
        "bounce" => listed("/bounce/bouncedRecipients", Some("emailAddress")),
        "complaint" => listed("/complaint/complainedRecipients", Some("emailAddress")),
        "delivery" => listed("/delivery/recipients", None),
        "delivery_delay" => listed("/deliveryDelay/delayedRecipients", Some("emailAddress")),
        "suppressed" | "unsubscribed" | "resubscribed" => listed("/addresses", None),
        "reputation_warning" | "reputation_paused" => vec![],
        _ => listed("/mail/destination", None),
    };
    Some(TenantEvent {
        id: r.get(0),
        event_type: webhook_type(&stored)?.to_owned(),
        message_id: r.get(2),
        job_id: r.get(3),
        correlation_id: r.get(4),
        recipients,
        occurred_at: r.get(5),
        received_at: r.get(6),
        bounce_type: text("/bounce/bounceType"),
        bounce_subtype: text("/bounce/bounceSubType"),
        complaint_type: text("/complaint/complaintFeedbackType"),
        note: r.get(7),
    })
}

/// One of the tenant's message events, as it sees it.
pub async fn tenant_event_by_id(
    db: &impl GenericClient,
    tenant: TenantId,
    id: i64,
) -> Result<Option<TenantEvent>, StoreError> {
    let row = db.query_opt(&format!("{TENANT_EVENT} WHERE e.id = $1 AND e.tenant_id = $2"), &[&id, &tenant]).await?;
    Ok(row.as_ref().and_then(tenant_event))
}

/// A page of the tenant's message events in (received_at, id) order after `after`.
pub async fn tenant_events(
    db: &impl GenericClient,
    tenant: TenantId,
    after: (DateTime<Utc>, i64),
    limit: i64,
) -> Result<Vec<TenantEvent>, StoreError> {
    let rows = db
        .query(
            &format!(
                "{TENANT_EVENT} WHERE e.tenant_id = $1 AND (e.received_at, e.id) > ($2, $3)
                 ORDER BY e.received_at, e.id LIMIT $4"
            ),
            &[&tenant, &after.0, &after.1, &limit],
        )
        .await?;
    Ok(rows.iter().filter_map(tenant_event).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::messages::EventKind;

    #[test]
    fn every_tenant_event_type_is_one_a_tenant_can_subscribe_to_and_inbound_mail_is_none() {
        let kinds = [
            EventKind::Send,
            EventKind::Delivery,
            EventKind::Bounce { permanent: true },
            EventKind::Complaint,
            EventKind::Reject,
            EventKind::Open,
            EventKind::Click,
            EventKind::DeliveryDelay,
            EventKind::RenderingFailure,
            EventKind::Subscription,
        ];
        let mut reached: Vec<&str> = kinds.iter().map(|k| webhook_type(k.name()).expect("a type")).collect();
        reached.push(webhook_type("suppressed").unwrap());
        reached.push(webhook_type("resubscribed").unwrap());
        reached.push(webhook_type("reputation_warning").unwrap());
        reached.push(webhook_type("reputation_paused").unwrap());
        assert!(WEBHOOK_TYPES.iter().all(|t| reached.contains(t)), "each type is reachable: {reached:?}");
        assert!(reached.iter().all(|t| WEBHOOK_TYPES.contains(t)));
        assert_eq!(webhook_type(EventKind::Received.name()), None);
        let defaults = crate::store::callbacks::DEFAULT_MESSAGE_EVENTS;
        assert!(defaults.iter().all(|t| WEBHOOK_TYPES.contains(t)));
        let migration = include_str!("../../../../migrations/0027_message_event_callbacks.sql");
        assert!(migration.contains(&format!("'{{{}}}'", defaults.join(","))), "the column's default is the same");
    }
}
