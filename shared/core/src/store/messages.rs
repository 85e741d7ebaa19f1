//! Messages: the at-most-once record of every email, and what a provider event (parsed by
//! `email::events`, applied by `message_events::apply_event`) does to its status.
//!
//! The intent is written (in its own committed statement, under the job's fence) before SES is
//! called. Whoever finds an existing row never sends: a `sending` row left by an earlier
//! attempt means a send may have happened, so it becomes `unknown`. Events apply once (by
//! their key) and in any order: a message's status only moves up `Status::rank`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_postgres::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{GenericClient, StoreError};
use crate::job::{JobId, TenantId};

/// What happened to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Send,
    Delivery,
    /// `permanent`: a hard bounce (the address goes on the suppression list).
    Bounce {
        permanent: bool,
    },
    Complaint,
    Reject,
    Open,
    Click,
    DeliveryDelay,
    RenderingFailure,
    /// A contact changed its preferences through SES's list management; `opt_out`: the new
    /// preferences opt out of something (an event that only opts back in is no unsubscription).
    Subscription {
        opt_out: bool,
    },
    /// Inbound mail (a receipt rule's SNS action).
    Received,
}

impl EventKind {
    /// The name stored on `message_events`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Send => "send",
            EventKind::Delivery => "delivery",
            EventKind::Bounce { .. } => "bounce",
            EventKind::Complaint => "complaint",
            EventKind::Reject => "reject",
            EventKind::Open => "open",
            EventKind::Click => "click",
            EventKind::DeliveryDelay => "delivery_delay",
            EventKind::RenderingFailure => "rendering_failure",
            EventKind::Subscription { opt_out: true } => "subscription",
            EventKind::Subscription { opt_out: false } => "subscription_opt_in",
            EventKind::Received => "inbound",
        }
    }

    /// Proof that SES accepted the message: settles an `unknown` send.
    pub fn proves_sent(self) -> bool {
        matches!(
            self,
            EventKind::Send
                | EventKind::Delivery
                | EventKind::Bounce { .. }
                | EventKind::Complaint
                | EventKind::Open
                | EventKind::Click
                | EventKind::DeliveryDelay
        )
    }
}

/// One parsed SES event.
#[derive(Debug, Clone, PartialEq)]
pub struct SesEvent {
    pub kind: EventKind,
    /// SES's message id (`mail.messageId`).
    pub ses_message_id: String,
    /// Relay's message id, from the `relay_message_id` tag Relay sends with every message.
    pub relay_message_id: Option<Uuid>,
    pub occurred_at: Option<DateTime<Utc>>,
    /// Addresses that bounced hard or complained: for the suppression list.
    pub suppress: Vec<String>,
    /// A short human summary (bounce type, reject reason, link clicked...).
    pub summary: Option<String>,
}

/// Where a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Recorded, not sent: shadow mode or SES writes switched off.
    Shadowed,
    /// Not sent: the sender is not the tenant's (the job fails).
    Refused,
    /// Not sent, on purpose: a recipient is suppressed (bounced, complained, unsubscribed). The
    /// recipient's choice, not a failure: the job succeeds with `skipped` in its result.
    Skipped,
    /// The intent is recorded and the call is (or was) in flight.
    Sending,
    /// SES refused for now; nothing was sent; a later attempt may send.
    Throttled,
    /// The call may or may not have reached SES: never retried automatically; an exception is
    /// open until an SES event settles it.
    Unknown,
    /// SES refused it for good.
    Rejected,
    Sent,
    Delayed,
    Delivered,
    Bounced,
    Complained,
}

impl Status {
    pub const ALL: [Status; 12] = [
        Status::Shadowed,
        Status::Refused,
        Status::Skipped,
        Status::Sending,
        Status::Throttled,
        Status::Unknown,
        Status::Rejected,
        Status::Sent,
        Status::Delayed,
        Status::Delivered,
        Status::Bounced,
        Status::Complained,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Shadowed => "shadowed",
            Status::Refused => "refused",
            Status::Skipped => "skipped",
            Status::Sending => "sending",
            Status::Throttled => "throttled",
            Status::Unknown => "unknown",
            Status::Rejected => "rejected",
            Status::Sent => "sent",
            Status::Delayed => "delayed",
            Status::Delivered => "delivered",
            Status::Bounced => "bounced",
            Status::Complained => "complained",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// How far along a message is; events only ever move it up, so they may arrive in any order.
    pub(super) fn rank(self) -> u8 {
        match self {
            Status::Shadowed | Status::Refused | Status::Skipped => 0,
            Status::Sending | Status::Throttled => 1,
            Status::Unknown => 2,
            Status::Sent => 3,
            Status::Delayed => 4,
            Status::Delivered => 5,
            Status::Rejected | Status::Bounced => 6,
            Status::Complained => 7,
        }
    }

    /// The status an event implies, if it implies one.
    fn implied_by(kind: EventKind) -> Option<Status> {
        Some(match kind {
            EventKind::Send => Status::Sent,
            EventKind::DeliveryDelay => Status::Delayed,
            EventKind::Delivery | EventKind::Open | EventKind::Click => Status::Delivered,
            EventKind::Bounce { permanent: true } => Status::Bounced,
            EventKind::Bounce { permanent: false } => Status::Delayed,
            EventKind::Complaint => Status::Complained,
            EventKind::Reject | EventKind::RenderingFailure => Status::Rejected,
            EventKind::Subscription { .. } | EventKind::Received => return None,
        })
    }

    /// The status after an event: the higher of the two, never out of shadowed, refused or skipped.
    pub fn after(self, kind: EventKind) -> Status {
        match Status::implied_by(kind) {
            Some(s) if self.rank() > 0 && s.rank() > self.rank() => s,
            _ => self,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Message {
    pub id: Uuid,
    pub message_key: String,
    #[schema(value_type = Uuid)]
    pub job_id: JobId,
    /// The job attempt that recorded the intent.
    pub attempt: i32,
    pub correlation_id: String,
    pub status: Status,
    /// Why it is refused, rejected, throttled or unknown.
    pub reason: Option<String>,
    pub from: String,
    /// `{"to": [...], "cc": [...], "bcc": [...]}`
    pub recipients: Value,
    pub subject: String,
    /// SES's message id, once known.
    pub provider_message_id: Option<String>,
    pub opens: i32,
    pub clicks: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub tenant_id: TenantId,
}

pub(super) const COLUMNS: &str = "id, message_key, job_id, attempt, correlation_id, status, reason, from_address, recipients, \
     subject, provider_message_id, opens, clicks, created_at, updated_at, sent_at, tenant_id";

impl Message {
    pub(super) fn from_row(r: &Row) -> Result<Message, StoreError> {
        Ok(Message {
            id: r.get(0),
            message_key: r.get(1),
            job_id: r.get(2),
            attempt: r.get(3),
            correlation_id: r.get(4),
            status: super::decode("messages.status", r.get(5), Status::parse)?,
            reason: r.get(6),
            from: r.get(7),
            recipients: r.get(8),
            subject: r.get(9),
            provider_message_id: r.get(10),
            opens: r.get(11),
            clicks: r.get(12),
            created_at: r.get(13),
            updated_at: r.get(14),
            sent_at: r.get(15),
            tenant_id: r.get(16),
        })
    }
}

/// Exactly what a shadowed message would have sent: the SES request's addressing, rendered
/// content, headers (Relay's own included) and tags (Relay's own included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Preview {
    pub from: String,
    pub to: Vec<String>,
    pub cc: Vec<String>,
    pub bcc: Vec<String>,
    pub reply_to: Vec<String>,
    pub subject: String,
    pub text: Option<String>,
    pub html: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub configuration_set: Option<String>,
    /// The extra inline parts, as sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartPreview>,
    /// The attachments: names, types and sizes (not their bytes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentPreview>,
}

/// An extra part of a shadowed message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PartPreview {
    /// As sent (`text/calendar; method=REQUEST`).
    pub content_type: String,
    /// Bytes of its text (UTF-8).
    pub size: usize,
    pub content: String,
}

/// An attachment of a shadowed message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AttachmentPreview {
    pub filename: String,
    pub content_type: String,
    /// `attachment` or `inline`.
    pub disposition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_id: Option<String>,
    /// Bytes, decoded.
    pub size: usize,
}

/// A message about to be recorded.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub id: Uuid,
    pub tenant_id: TenantId,
    pub message_key: String,
    pub job_id: JobId,
    pub attempt: i32,
    pub correlation_id: String,
    /// `Sending` (about to call SES), `Shadowed`, `Refused` or `Skipped`.
    pub status: Status,
    pub reason: Option<String>,
    pub from: String,
    pub recipients: Value,
    pub subject: String,
    /// What it would have sent, for a shadowed message.
    pub preview: Option<Preview>,
    /// The configuration set it names (its own, or the default), for reputation per set.
    pub configuration_set: Option<String>,
}

/// What recording the intent found.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// Ours: newly written, or a throttled message of this job taken by this attempt.
    Recorded(Message),
    /// Someone recorded this message key before (this job's earlier attempt, or another job).
    Existing(Message),
    /// This attempt no longer holds the job: it may not send.
    Fenced,
}

/// Record the intent under the job's fence (attempt and `running` checked in the same
/// statement), committed on its own before any call to SES.
pub async fn record_intent(db: &impl GenericClient, m: &NewMessage) -> Result<Intent, StoreError> {
    record(db, m, "true").await
}

/// `record_intent` for a message that is not sent (shadowed, refused, skipped), committed without
/// waiting for the disk. Only a send needs its intent on disk before it happens; this record
/// only has to be durable with the job's outcome, and it is: that outcome commits later, and a
/// commit makes every earlier WAL record durable with it. A crash before the outcome reruns
/// the job, which finds this record or records it again. The setting is made inside the
/// statement, for its own implicit transaction, whose commit comes after it: one round trip.
pub async fn record_unsent(db: &impl GenericClient, m: &NewMessage) -> Result<Intent, StoreError> {
    record(db, m, "set_config('synchronous_commit', 'off', true) = 'off'").await
}

/// The intent's insert; `commit` is a condition evaluated with the fence (see `record_unsent`).
/// The message's tenant and job are read from the job row it is fenced on (and the caller's
/// tenant must be that job's): a message belongs to its job's tenant by construction, which
/// is why `messages` has no foreign key to `tenants` (migration 0019).
async fn record(db: &impl GenericClient, m: &NewMessage, commit: &str) -> Result<Intent, StoreError> {
    let stmt = db
        .prepare_cached(&format!(
            "INSERT INTO messages (id, tenant_id, message_key, job_id, attempt, correlation_id, status, reason,
                                   from_address, recipients, subject, preview, configuration_set)
             SELECT $1, j.tenant_id, $3, j.id, j.attempt, $6, $7, $8, $9, $10, $11, $12, $13 FROM jobs j
             WHERE j.id = $4 AND j.attempt = $5 AND j.status = 'running' AND j.tenant_id = $2 AND {commit}
             ON CONFLICT (tenant_id, message_key) DO UPDATE
             SET status = EXCLUDED.status, attempt = EXCLUDED.attempt, reason = EXCLUDED.reason,
                 recipients = EXCLUDED.recipients, subject = EXCLUDED.subject, preview = EXCLUDED.preview,
                 configuration_set = EXCLUDED.configuration_set, updated_at = now()
             WHERE messages.status = 'throttled' AND messages.job_id = EXCLUDED.job_id
             RETURNING {COLUMNS}"
        ))
        .await?;
    let status = m.status.as_str();
    // Strings and maps of strings: serialising cannot fail.
    let preview = m.preview.as_ref().map(|p| serde_json::to_value(p).unwrap_or_default());
    let row = db
        .query_opt(
            &stmt,
            &[
                &m.id,
                &m.tenant_id,
                &m.message_key,
                &m.job_id,
                &m.attempt,
                &m.correlation_id,
                &status,
                &m.reason,
                &m.from,
                &m.recipients,
                &m.subject,
                &preview,
                &m.configuration_set,
            ],
        )
        .await?;
    if let Some(r) = row {
        return Ok(Intent::Recorded(Message::from_row(&r)?));
    }
    Ok(match by_key(db, m.tenant_id, &m.message_key).await? {
        Some(existing) => Intent::Existing(existing),
        None => Intent::Fenced,
    })
}

pub async fn by_key(db: &impl GenericClient, tenant: TenantId, key: &str) -> Result<Option<Message>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM messages WHERE tenant_id = $1 AND message_key = $2");
    db.query_opt(&sql, &[&tenant, &key]).await?.as_ref().map(Message::from_row).transpose()
}

/// SES accepted the message: record its id. An event that arrived first may have moved the
/// status further already; it stays there.
pub async fn mark_sent(db: &impl GenericClient, id: Uuid, provider_message_id: &str) -> Result<(), StoreError> {
    db.execute(
        "UPDATE messages SET provider_message_id = coalesce(provider_message_id, $2), sent_at = coalesce(sent_at, now()),
                status = CASE WHEN status IN ('sending', 'unknown') THEN 'sent' ELSE status END,
                reason = CASE WHEN status IN ('sending', 'unknown') THEN NULL ELSE reason END, updated_at = now()
         WHERE id = $1",
        &[&id, &provider_message_id],
    )
    .await?;
    Ok(())
}

/// Move a message from `from` to `to` with a reason; false when it was no longer `from` (an
/// event got there first).
pub async fn transition(
    db: &impl GenericClient,
    id: Uuid,
    from: Status,
    to: Status,
    reason: &str,
) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE messages SET status = $3, reason = $4, updated_at = now() WHERE id = $1 AND status = $2",
            &[&id, &from.as_str(), &to.as_str(), &reason],
        )
        .await?;
    Ok(n == 1)
}

/// A `sending` message left by an earlier attempt (which may have sent it) becomes `unknown`.
/// Returns the message as it now is.
pub async fn abandon_earlier_attempt(
    db: &impl GenericClient,
    m: &Message,
    attempt: i32,
) -> Result<Option<Message>, StoreError> {
    let sql = format!(
        "UPDATE messages SET status = 'unknown', updated_at = now(),
                reason = 'attempt ' || attempt || ' recorded the intent and never reported the outcome; it may have been sent'
         WHERE id = $1 AND status = 'sending' AND attempt < $2 RETURNING {COLUMNS}"
    );
    if let Some(r) = db.query_opt(&sql, &[&m.id, &attempt]).await? {
        return Ok(Some(Message::from_row(&r)?));
    }
    get_any(db, m.id).await
}

async fn get_any(db: &impl GenericClient, id: Uuid) -> Result<Option<Message>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM messages WHERE id = $1");
    db.query_opt(&sql, &[&id]).await?.as_ref().map(Message::from_row).transpose()
}

/// One of the tenant's messages.
pub async fn get(db: &impl GenericClient, tenant: TenantId, id: Uuid) -> Result<Option<Message>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM messages WHERE id = $1 AND tenant_id = $2");
    db.query_opt(&sql, &[&id, &tenant]).await?.as_ref().map(Message::from_row).transpose()
}

/// What a shadowed message of the tenant's would have sent (none for a message really sent,
/// or recorded before previews were kept).
pub async fn preview(db: &impl GenericClient, tenant: TenantId, id: Uuid) -> Result<Option<Preview>, StoreError> {
    let row = db.query_opt("SELECT preview FROM messages WHERE id = $1 AND tenant_id = $2", &[&id, &tenant]).await?;
    Ok(row.and_then(|r| r.get::<_, Option<Value>>(0)).and_then(|v| serde_json::from_value(v).ok()))
}

/// The tenant's messages, newest first: all of one correlation id, or of one job.
pub async fn list(
    db: &impl GenericClient,
    tenant: TenantId,
    correlation_id: Option<&str>,
    job_id: Option<JobId>,
    limit: i64,
) -> Result<Vec<Message>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM messages WHERE tenant_id = $1
           AND ($2::text IS NULL OR correlation_id = $2) AND ($3::uuid IS NULL OR job_id = $3)
         ORDER BY created_at DESC, id DESC LIMIT $4"
    );
    db.query(&sql, &[&tenant, &correlation_id, &job_id, &limit]).await?.iter().map(Message::from_row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn events_only_move_a_message_up_whatever_their_order() {
        let order_a = [EventKind::Send, EventKind::Delivery, EventKind::Open];
        let order_b = [EventKind::Open, EventKind::Delivery, EventKind::Send];
        let run = |events: &[EventKind]| events.iter().fold(Status::Sending, |s, k| s.after(*k));
        assert_eq!(run(&order_a), Status::Delivered);
        assert_eq!(run(&order_b), Status::Delivered);
        assert_eq!(Status::Unknown.after(EventKind::Send), Status::Sent, "an event settles an unknown send");
        assert_eq!(Status::Delivered.after(EventKind::Complaint), Status::Complained);
        assert_eq!(Status::Complained.after(EventKind::Delivery), Status::Complained);
        assert_eq!(Status::Shadowed.after(EventKind::Delivery), Status::Shadowed);
    }
}
