//! SES events as they reach ingress, parsed: the event-publishing form (`eventType`, from a
//! configuration set's SNS destination) and the notification form (`notificationType`, from an
//! identity's SNS topics, including inbound mail `Received`), each into the `SesEvent` its
//! message keeps (`store::messages`). Written from the formats AWS documents; pure, so every
//! shape is tested with fixtures.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::store::messages::{EventKind, SesEvent};

fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn addresses(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("emailAddress").and_then(Value::as_str))
                .filter_map(super::content::bare)
                .collect()
        })
        .unwrap_or_default()
}

/// The recipients an event's `mail.destination` names (bare, lower-case).
pub fn destination(event: &Value) -> Vec<String> {
    event
        .pointer("/mail/destination")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).filter_map(super::content::bare).collect())
        .unwrap_or_default()
}

/// The tag Relay sends the correlation id in (`ses::send`), as SES emits it back: under
/// `mail.tags`, named as sent, each value a one-element list. Its value is `tag_value` of the
/// id (SES tags take only letters, digits, `_` and `-`).
pub const CORRELATION_TAG: &str = "relay_correlation_id";

/// The correlation id of the message an SES event is about: verbatim from Relay's
/// `X-Relay-Correlation-Id` header when the event carries the original headers, else from
/// the `relay_correlation_id` tag (where characters outside the tag charset read `_`).
pub fn correlation_tag(message: &Value) -> Option<String> {
    let parsed;
    let v = match message {
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s).ok()?;
            &parsed
        }
        v => v,
    };
    let header = v.pointer("/mail/headers").and_then(Value::as_array).and_then(|hs| {
        hs.iter()
            .find(|h| h["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case(super::content::CORRELATION_HEADER)))
            .and_then(|h| h["value"].as_str())
    });
    let tag = || v.pointer(&format!("/mail/tags/{CORRELATION_TAG}/0")).and_then(Value::as_str);
    let id = header.or_else(tag)?;
    (!id.is_empty() && id.len() <= 200).then(|| id.to_owned())
}

/// Why a message is not an SES event (kept on the job as the reason).
#[derive(Debug, thiserror::Error)]
pub enum NotAnEvent {
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("neither eventType nor notificationType: not an SES event")]
    NoType,
    #[error("unknown SES event type {0:?}")]
    UnknownType(String),
    #[error("no mail.messageId")]
    NoMessageId,
}

/// Parse an SES event (the SNS `Message`, as JSON or as the JSON text SNS really sends).
pub fn parse(message: &Value) -> Result<SesEvent, NotAnEvent> {
    let owned;
    let v = match message {
        Value::String(s) => {
            owned = serde_json::from_str::<Value>(s).map_err(NotAnEvent::NotJson)?;
            &owned
        }
        v => v,
    };
    let type_name = text(v, &["eventType"]).or_else(|| text(v, &["notificationType"])).ok_or(NotAnEvent::NoType)?;
    // The detail object is named after the type, in camelCase (`deliveryDelay`), except
    // rendering failures (`failure`).
    let detail = |key: &str| v.get(key);
    let (kind, detail_key) = match type_name {
        "Send" => (EventKind::Send, "send"),
        "Delivery" => (EventKind::Delivery, "delivery"),
        "Bounce" => {
            let permanent = text(v, &["bounce", "bounceType"]) == Some("Permanent");
            (EventKind::Bounce { permanent }, "bounce")
        }
        "Complaint" => (EventKind::Complaint, "complaint"),
        "Reject" => (EventKind::Reject, "reject"),
        "Open" => (EventKind::Open, "open"),
        "Click" => (EventKind::Click, "click"),
        "DeliveryDelay" => (EventKind::DeliveryDelay, "deliveryDelay"),
        "Rendering Failure" | "RenderingFailure" => (EventKind::RenderingFailure, "failure"),
        // An event whose preferences cannot be read counts as an unsubscription (what SES
        // publishes it for).
        "Subscription" => {
            let opt_out = super::list_management::preferences(v).is_none_or(|p| p.opt_out());
            (EventKind::Subscription { opt_out }, "subscription")
        }
        "Received" => (EventKind::Received, "receipt"),
        other => return Err(NotAnEvent::UnknownType(other.to_owned())),
    };
    let ses_message_id = text(v, &["mail", "messageId"]).ok_or(NotAnEvent::NoMessageId)?.to_owned();
    let relay_message_id =
        v.pointer("/mail/tags/relay_message_id/0").and_then(Value::as_str).and_then(|s| s.parse().ok());
    let stamp = detail(detail_key)
        .and_then(|d| d.get("timestamp"))
        .or_else(|| v.pointer("/mail/timestamp"))
        .and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc));
    let suppress = match kind {
        EventKind::Bounce { permanent: true } => addresses(v.pointer("/bounce/bouncedRecipients")),
        EventKind::Complaint => addresses(v.pointer("/complaint/complainedRecipients")),
        _ => vec![],
    };
    let summary = match kind {
        EventKind::Bounce { .. } => Some(format!(
            "{} bounce ({})",
            text(v, &["bounce", "bounceType"]).unwrap_or("?"),
            text(v, &["bounce", "bounceSubType"]).unwrap_or("?")
        )),
        EventKind::Complaint => text(v, &["complaint", "complaintFeedbackType"]).map(|t| format!("complaint: {t}")),
        EventKind::Reject => text(v, &["reject", "reason"]).map(str::to_owned),
        EventKind::Click => text(v, &["click", "link"]).map(str::to_owned),
        EventKind::DeliveryDelay => text(v, &["deliveryDelay", "delayType"]).map(str::to_owned),
        EventKind::RenderingFailure => text(v, &["failure", "errorMessage"]).map(str::to_owned),
        EventKind::Received => v.pointer("/receipt/recipients").map(|r| format!("inbound mail to {r}")),
        _ => None,
    };
    Ok(SesEvent { kind, ses_message_id, relay_message_id, occurred_at: stamp, suppress, summary })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "0195a0a0-0000-7000-8000-000000000001";

    fn mail() -> Value {
        json!({"timestamp": "2026-11-30T10:00:00.000Z", "messageId": "ses-1", "source": "a@acme.example",
               "destination": ["b@example.com"], "tags": {"relay_message_id": [ID], "relay_job_id": ["j"]}})
    }

    #[test]
    fn event_publishing_shapes_parse() {
        let e = parse(&json!({"eventType": "Delivery", "mail": mail(),
            "delivery": {"timestamp": "2026-11-30T10:00:02.000Z", "recipients": ["b@example.com"]}}))
        .unwrap();
        assert_eq!(e.kind, EventKind::Delivery);
        assert_eq!(e.relay_message_id, Some(ID.parse().unwrap()));
        assert_eq!(e.occurred_at.unwrap().to_rfc3339(), "2026-11-30T10:00:02+00:00");
        let hard = parse(&json!({"eventType": "Bounce", "mail": mail(), "bounce": {"bounceType": "Permanent",
            "bounceSubType": "General", "bouncedRecipients": [{"emailAddress": "B@Example.com"}]}}))
        .unwrap();
        assert_eq!(hard.kind, EventKind::Bounce { permanent: true });
        assert_eq!(hard.suppress, ["b@example.com"]);
        let soft = parse(&json!({"eventType": "Bounce", "mail": mail(), "bounce": {"bounceType": "Transient",
            "bouncedRecipients": [{"emailAddress": "b@example.com"}]}}))
        .unwrap();
        assert!(soft.suppress.is_empty(), "a soft bounce suppresses nothing");
        let failure = parse(&json!({"eventType": "Rendering Failure", "mail": mail(),
            "failure": {"errorMessage": "Attribute 'name' is not present", "templateName": "t"}}))
        .unwrap();
        assert_eq!(failure.kind, EventKind::RenderingFailure);
        assert!(!failure.kind.proves_sent());
    }

    #[test]
    fn notifications_arrive_as_json_text_and_without_tags() {
        let mut m = mail();
        m.as_object_mut().unwrap().remove("tags");
        let text = json!({"notificationType": "Complaint", "mail": m,
            "complaint": {"complainedRecipients": [{"emailAddress": "b@example.com"}], "complaintFeedbackType": "abuse"}})
        .to_string();
        let e = parse(&Value::String(text)).unwrap();
        assert_eq!((e.kind, e.relay_message_id, e.ses_message_id.as_str()), (EventKind::Complaint, None, "ses-1"));
        assert_eq!(e.suppress, ["b@example.com"]);
        let inbound = parse(
            &json!({"notificationType": "Received", "mail": mail(), "receipt": {"recipients": ["in@acme.example"]}}),
        );
        assert_eq!(inbound.unwrap().kind, EventKind::Received);
    }

    #[test]
    fn the_correlation_id_comes_from_relays_header_or_else_its_tag_as_ses_emits_them() {
        let mut m = mail();
        m["tags"][CORRELATION_TAG] = json!([crate::email::content::tag_value("order 4711/ü")]);
        let event = json!({"eventType": "Delivery", "mail": m.clone()});
        assert_eq!(correlation_tag(&event).as_deref(), Some("order_4711__"), "the tag, as sent");
        m["headers"] = json!([{"name": "From", "value": "a@acme.example"},
                              {"name": "X-Relay-Correlation-Id", "value": "order 4711/ü"}]);
        let event = json!({"eventType": "Delivery", "mail": m});
        assert_eq!(correlation_tag(&event).as_deref(), Some("order 4711/ü"), "the header is verbatim");
        assert_eq!(
            correlation_tag(&Value::String(event.to_string())).as_deref(),
            Some("order 4711/ü"),
            "SNS sends text"
        );
        // Another spelling of the tag is not Relay's.
        let other = json!({"eventType": "Delivery", "mail": {"tags": {"relay-correlation-id": ["x"]}}});
        assert_eq!(correlation_tag(&other), None);
    }

    #[test]
    fn what_is_not_an_ses_event_says_why() {
        assert!(parse(&json!({"hello": 1})).unwrap_err().to_string().contains("not an SES event"));
        assert!(
            matches!(parse(&json!({"eventType": "Teleport", "mail": mail()})), Err(NotAnEvent::UnknownType(t)) if t == "Teleport")
        );
        assert!(matches!(parse(&json!({"eventType": "Send"})), Err(NotAnEvent::NoMessageId)));
        assert!(parse(&Value::String("{oops".into())).unwrap_err().to_string().starts_with("not JSON: "));
    }
}
