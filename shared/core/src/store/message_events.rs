//! Message events: a provider's event applied to its message once, by its key (`apply_event`),
//! and the events kept on a message; and as their tenant sees them (issue 35): the callback and
//! feed type of each stored event, the suppression an event caused kept as an event of its
//! own, and the tenant-scoped reads behind `callback.deliver` and `GET /v1/messages/events`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::messages::{COLUMNS, EventKind, Message, SesEvent, Status};
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
/// no tenant's to hear (inbound mail; an SES subscription event that only opts back in, heard
/// as each resubscription it made).
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

/// A provider event as kept on its message.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MessageEvent {
    pub event_type: String,
    pub occurred_at: Option<DateTime<Utc>>,
    pub note: Option<String>,
    pub received_at: DateTime<Utc>,
    /// The event as SES sent it.
    pub detail: Value,
}

pub async fn events(db: &impl GenericClient, message_id: Uuid) -> Result<Vec<MessageEvent>, StoreError> {
    let rows = db
        .query(
            "SELECT event_type, occurred_at, note, received_at, detail FROM message_events WHERE message_id = $1 ORDER BY id",
            &[&message_id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| MessageEvent {
            event_type: r.get(0),
            occurred_at: r.get(1),
            note: r.get(2),
            received_at: r.get(3),
            detail: r.get(4),
        })
        .collect())
}

/// What applying an event did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// This event (by its key) was applied before.
    Duplicate,
    /// No message matches; the event is kept with the reason.
    Unmatched,
    /// Applied to the message; `before` is its status before this event; `event_id` is the
    /// event's row (`message_events.id`).
    Applied { message: Box<Message>, before: Status, event_id: i64 },
}

/// Apply one event once, in the caller's transaction: keep it, move the message's status up,
/// count opens and clicks, and learn SES's message id if the send's own answer was lost.
pub async fn apply_event(
    db: &impl GenericClient,
    event_key: &str,
    e: &SesEvent,
    detail: &Value,
) -> Result<Applied, StoreError> {
    let by_relay_id = format!("SELECT {COLUMNS} FROM messages WHERE id = $1 FOR UPDATE");
    let by_provider_id = format!("SELECT {COLUMNS} FROM messages WHERE provider_message_id = $1 FOR UPDATE");
    let mut found = None;
    if e.kind == EventKind::Received {
        // Inbound mail answers no message of ours; it is kept as it came.
    } else if let Some(id) = e.relay_message_id {
        // The tag names Relay's message; SES's own id must agree once Relay knows it, so an
        // event about one message cannot be pinned on another by its tag.
        found = db
            .query_opt(&by_relay_id, &[&id])
            .await?
            .filter(|r| r.get::<_, Option<String>>(10).is_none_or(|known| known == e.ses_message_id));
    }
    if found.is_none() && e.kind != EventKind::Received {
        found = db.query_opt(&by_provider_id, &[&e.ses_message_id]).await?;
    }
    let message = found.as_ref().map(Message::from_row).transpose()?;
    let note = match &message {
        None if e.kind == EventKind::Received => e.summary.clone(),
        None => {
            Some(format!("no message matches SES message {} (relay id {:?})", e.ses_message_id, e.relay_message_id))
        }
        Some(_) => e.summary.clone(),
    };
    let inserted = db
        .query_opt(
            "INSERT INTO message_events (event_key, message_id, tenant_id, event_type, occurred_at, note, detail)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (event_key) DO NOTHING RETURNING id",
            &[
                &event_key,
                &message.as_ref().map(|m| m.id),
                &message.as_ref().map(|m| m.tenant_id),
                &e.kind.name(),
                &e.occurred_at,
                &note,
                detail,
            ],
        )
        .await?;
    let Some(event_id) = inserted.map(|r| r.get::<_, i64>(0)) else {
        return Ok(Applied::Duplicate);
    };
    let Some(m) = message else { return Ok(Applied::Unmatched) };
    let after = m.status.after(e.kind);
    let (opens, clicks) = (i32::from(e.kind == EventKind::Open), i32::from(e.kind == EventKind::Click));
    let sql = format!(
        "UPDATE messages SET status = $2, opens = opens + $3, clicks = clicks + $4,
                provider_message_id = coalesce(provider_message_id, $5),
                sent_at = CASE WHEN $6 THEN coalesce(sent_at, $7, now()) ELSE sent_at END,
                reason = CASE WHEN status <> $2 THEN $8 ELSE reason END, updated_at = now()
         WHERE id = $1 RETURNING {COLUMNS}"
    );
    let reason = e.summary.clone().or_else(|| Some(format!("SES {} event", e.kind.name())));
    // A shadowed or refused message was never sent: an event about it (fed by hand) does not
    // give it SES's id or a send time.
    let was_sent = m.status.rank() > 0;
    let row = db
        .query_one(
            &sql,
            &[
                &m.id,
                &after.as_str(),
                &opens,
                &clicks,
                &was_sent.then_some(&e.ses_message_id),
                &(was_sent && e.kind.proves_sent()),
                &e.occurred_at,
                &reason,
            ],
        )
        .await?;
    Ok(Applied::Applied { message: Box::new(Message::from_row(&row)?), before: m.status, event_id })
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
            EventKind::Subscription { opt_out: true },
        ];
        let mut reached: Vec<&str> = kinds.iter().map(|k| webhook_type(k.name()).expect("a type")).collect();
        reached.push(webhook_type("suppressed").unwrap());
        reached.push(webhook_type("resubscribed").unwrap());
        reached.push(webhook_type("reputation_warning").unwrap());
        reached.push(webhook_type("reputation_paused").unwrap());
        assert!(WEBHOOK_TYPES.iter().all(|t| reached.contains(t)), "each type is reachable: {reached:?}");
        assert!(reached.iter().all(|t| WEBHOOK_TYPES.contains(t)));
        assert_eq!(webhook_type(EventKind::Received.name()), None);
        assert_eq!(
            webhook_type(EventKind::Subscription { opt_out: false }.name()),
            None,
            "an opt-in is heard as resubscribed"
        );
        let defaults = crate::store::callbacks::DEFAULT_MESSAGE_EVENTS;
        assert!(defaults.iter().all(|t| WEBHOOK_TYPES.contains(t)));
        let migration = include_str!("../../../../migrations/0027_message_event_callbacks.sql");
        assert!(migration.contains(&format!("'{{{}}}'", defaults.join(","))), "the column's default is the same");
    }
}
