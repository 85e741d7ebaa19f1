//! Message events reach the tenant (issue 35): an SES bounce through ingress becomes a signed
//! callback (the same `callback.deliver` machinery as a job's) of the types the tenant
//! subscribes to, and an entry in its feed (`GET /v1/messages/events`); another tenant sees none.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::client::Verifier;

use crate::callbacks::{Seen, deliver_due, receiver, world};
use crate::email::{
    DOMAIN, executor, go_live, message_of, roles, sender, ses_event, sns_record, submit, through_ingress,
};
use crate::support::moto;

/// The verified `message.*` callbacks a receiver got: (type, data).
fn message_callbacks(seen: &Seen, secret: &str) -> Vec<(String, Value)> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(h, b)| Verifier::new([secret.to_owned()]).verify(h, b).expect("a valid signature"))
        .filter(|e| e.kind.starts_with("message."))
        .map(|e| (e.kind, e.data))
        .collect()
}

#[tokio::test]
async fn a_bounce_reaches_the_tenants_callback_signed_and_its_feed_and_no_one_elses() {
    let w = world().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let (addr, seen) = receiver("127.0.0.1", vec![]).await;
    let (s, settings) =
        w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": format!("http://{addr}/hooks")}))).await;
    assert_eq!(s, StatusCode::OK, "{settings}");
    let secret = settings["secret"].as_str().unwrap().to_owned();
    let defaults = json!(["message.bounced", "message.complained", "message.rejected", "message.suppressed"]);
    assert_eq!(settings["message_events"], defaults, "the terminal and negative types by default");
    // A second tenant subscribed to everything, at its own receiver.
    let (_, other_key) = w.other_tenant("globex").await;
    let (other_addr, other_seen) = receiver("127.0.0.1", vec![]).await;
    let all = json!(["message.sent", "message.delivered", "message.bounced", "message.suppressed"]);
    let (s, _) = w
        .call_as(
            &other_key,
            Method::PUT,
            "/v1/callbacks",
            None,
            Some(json!({"url": format!("http://{other_addr}/"), "message_events": all}).to_string().into_bytes()),
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    let id = submit(&w, "bounce-1", json!({"task_type": "email.send", "correlation_id": "order-9", "params": {
        "from": format!("noreply@{DOMAIN}"), "to": ["bo@example.com"], "subject": format!("mev {}", w.schema), "text": "x"}}))
    .await;
    exec.run_dispatched(&[id]).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "sent", "{m}");
    let delivery = ses_event(
        "Delivery",
        &m,
        json!({"delivery": {"timestamp": "2026-11-30T10:00:05.000Z", "recipients": ["bo@example.com"]}}),
    );
    through_ingress(&w, &exec, vec![sns_record("mev-d", &delivery)]).await;
    let bounce = ses_event(
        "Bounce",
        &m,
        json!({"bounce": {"bounceType": "Permanent", "bounceSubType": "General",
        "bouncedRecipients": [{"emailAddress": "Bo@Example.com"}], "timestamp": "2026-11-30T10:00:06.000Z"}}),
    );
    // Twice: applied once, delivered once.
    through_ingress(&w, &exec, vec![sns_record("mev-b", &bounce), sns_record("mev-b", &bounce)]).await;
    // The job's own callback, the bounce and the suppression it caused; not the delivery.
    assert_eq!(deliver_due(&w).await, 3);
    assert_eq!(deliver_due(&w).await, 0, "each delivered once");

    let got = message_callbacks(&seen, &secret);
    let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.len(), 2, "{got:?}");
    assert!(kinds.contains(&"message.bounced") && kinds.contains(&"message.suppressed"), "{kinds:?}");
    let (_, bounced) = got.iter().find(|(k, _)| k == "message.bounced").unwrap();
    assert_eq!(bounced["type"], "message.bounced");
    assert_eq!(bounced["message_id"], m["id"]);
    assert_eq!(bounced["job_id"], json!(id.to_string()));
    assert_eq!(bounced["correlation_id"], "order-9");
    assert_eq!(bounced["recipients"], json!(["Bo@Example.com"]));
    assert_eq!(
        (bounced["bounce_type"].as_str(), bounced["bounce_subtype"].as_str()),
        (Some("Permanent"), Some("General"))
    );
    assert_eq!(bounced["occurred_at"], "2026-11-30T10:00:06Z");
    assert!(bounced.get("detail").is_none(), "never the raw provider event: {bounced}");
    let (_, suppressed) = got.iter().find(|(k, _)| k == "message.suppressed").unwrap();
    assert_eq!(suppressed["recipients"], json!(["bo@example.com"]));
    assert_eq!(suppressed["job_id"], json!(id.to_string()));
    // The attempts are on the message's job, with the job's own callback.
    let (_, attempts) = w.call(Method::GET, &format!("/v1/jobs/{id}/callbacks"), None, None).await;
    let mut events: Vec<&str> =
        attempts["attempts"].as_array().unwrap().iter().map(|a| a["event"].as_str().unwrap()).collect();
    events.sort();
    assert_eq!(events, ["job.succeeded", "message.bounced", "message.suppressed"], "{attempts}");

    // The feed has every type, subscribed or not, in the order received.
    let (s, feed) = w.call(Method::GET, "/v1/messages/events", None, None).await;
    assert_eq!(s, StatusCode::OK, "{feed}");
    let types: Vec<&str> = feed["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["message.delivered", "message.bounced", "message.suppressed"], "{feed}");
    assert_eq!(feed["events"][0]["recipients"], json!(["bo@example.com"]));
    assert_eq!(feed["events"][1]["correlation_id"], "order-9");
    let (_, page) = w.call(Method::GET, "/v1/messages/events?limit=1", None, None).await;
    assert_eq!(page["events"][0]["type"], "message.delivered");
    let next = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, page) = w.call(Method::GET, &format!("/v1/messages/events?limit=2&cursor={next}"), None, None).await;
    let rest: Vec<&str> = page["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(rest, ["message.bounced", "message.suppressed"]);
    let (_, later) = w.call(Method::GET, "/v1/messages/events?updated_since=2999-01-01T00:00:00Z", None, None).await;
    assert_eq!(later["events"], json!([]));

    // The other tenant got nothing and sees nothing, even from this tenant's positions.
    assert!(other_seen.lock().unwrap().is_empty(), "another tenant's receiver got a delivery");
    for q in ["", "?updated_since=1970-01-01T00:00:00Z", &format!("?cursor={next}")] {
        let (s, theirs) = w.call_as(&other_key, Method::GET, &format!("/v1/messages/events{q}"), None, None).await;
        assert_eq!((s, &theirs["events"]), (StatusCode::OK, &json!([])), "{q}: {theirs}");
    }

    // Hostile positions: a clear 400.
    for q in ["cursor=not-a-cursor", "cursor=B0000000000000000000000000000000", "updated_since=yesterday", "limit=0"] {
        let (s, e) = w.call(Method::GET, &format!("/v1/messages/events?{q}"), None, None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {e}");
        assert_eq!(e["error"]["code"], "invalid_query", "{q}: {e}");
    }
    // Any cursor of the shape and any RFC 3339 time is a position (none is a 500).
    let edges = [
        format!("cursor={}", "A".repeat(32)),
        format!("cursor=A{}", "_".repeat(31)),
        "updated_since=0000-01-01T00:00:00Z".into(),
        "updated_since=9999-12-31T23:59:59.999999-23:59".into(),
    ];
    for q in edges {
        let (s, e) = w.call(Method::GET, &format!("/v1/messages/events?{q}"), None, None).await;
        assert_eq!(s, StatusCode::OK, "{q}: {e}");
    }

    // Subscribing: an unknown type is refused; a delivery then reaches the callback.
    let (s, e) = w
        .call(
            Method::PUT,
            "/v1/callbacks",
            None,
            Some(json!({"url": format!("http://{addr}/hooks"),
        "message_events": ["message.bounced", "message.teleported"]})),
        )
        .await;
    assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("message_events")), "{e}");
    let (s, set) = w
        .call(
            Method::PUT,
            "/v1/callbacks",
            None,
            Some(json!({"url": format!("http://{addr}/hooks"),
        "message_events": ["message.delivered"]})),
        )
        .await;
    assert_eq!((s, &set["message_events"]), (StatusCode::OK, &json!(["message.delivered"])), "{set}");
    let again = ses_event("Delivery", &m, json!({"delivery": {"recipients": ["bo@example.com"]}}));
    through_ingress(&w, &exec, vec![sns_record("mev-d2", &again)]).await;
    assert_eq!(deliver_due(&w).await, 1);
    let got = message_callbacks(&seen, &secret);
    assert_eq!(got.last().map(|(k, _)| k.as_str()), Some("message.delivered"), "{got:?}");
    assert!(other_seen.lock().unwrap().is_empty());
}
