//! A destination's own rules for its calls: a success rule judging a 2xx by its JSON answer
//! (Slack's `200 {"ok": false}`), on the destination or on one job; and a signature scheme
//! other than Standard Webhooks (AI Shipping Labs' `X-AISL-Signature`), checked by a receiver
//! written against ASL's verify rules.

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use taskdeck::job::JobId;

use crate::http::{Reply, calls, destination, job, receiver, world};
use crate::support::World;

async fn submit(w: &World, key: &str, params: Value) -> JobId {
    let (s, j) = w.submit(key, json!({"task_type": "http.request", "params": params})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    j["id"].as_str().unwrap().parse().unwrap()
}

async fn run(w: &World, id: JobId) -> Value {
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    job(w, id).await
}

#[tokio::test]
async fn a_slack_style_ok_false_fails_the_job_as_the_tenants_fault_with_the_answer_kept() {
    let w = world().await;
    let (addr, seen) = receiver(vec![Reply::Status(200, vec![], r#"{"ok":false,"error":"channel_not_found"}"#)]).await;
    let rule = json!({"json": {"pointer": "/ok", "equals": true}});
    let d = destination(&w, &w.key, "slack", addr, json!({"success": rule})).await;
    assert_eq!((&d["success"]["json"], &d["success"]["retry"]), (&rule["json"], &json!(false)), "{d}");
    let params = json!({"destination": "slack", "method": "POST", "path": "/chat.postMessage", "body": {"text": "hi"}});
    let failed = submit(&w, "slack-1", params.clone()).await;
    let j = run(&w, failed).await;
    assert_eq!((j["status"].as_str(), j["fault"].as_str()), (Some("failed"), Some("tenant")), "{j}");
    let error = j["last_error"].as_str().unwrap();
    assert!(error.contains("/ok is false, not true") && error.contains("channel_not_found"), "{error}");
    let c = calls(&w, failed).await;
    assert_eq!((c.len(), c[0]["outcome"].as_str(), c[0]["http_status"].as_i64()), (1, Some("fatal"), Some(200)));
    assert_eq!(c[0]["response"]["body"], json!({"ok": false, "error": "channel_not_found"}), "the answer is kept");
    let exceptions = "SELECT count(*) FROM exceptions WHERE job_id = $1";
    assert_eq!(w.count(exceptions, &[&failed]).await, 0, "the tenant's fault: no operator exception");
    // The same destination answering `{"ok": true}` (the receiver's default) succeeds.
    let ok = submit(&w, "slack-2", params).await;
    assert_eq!(run(&w, ok).await["status"], "succeeded");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_jobs_own_rule_wins_and_may_retry() {
    let w = world().await;
    let (addr, seen) = receiver(vec![
        Reply::Status(200, vec![], r#"{"ok":false,"error":"ratelimited"}"#),
        Reply::Status(202, vec![], r#"{"ok":true}"#),
    ])
    .await;
    // The destination's rule lists 202 as failing; the job's own (which retries) wins.
    destination(&w, &w.key, "api", addr, json!({"success": {"statuses": [200]}})).await;
    let rule = json!({"statuses": [200, 202], "json": {"pointer": "/ok", "equals": true}, "retry": true});
    let id = submit(&w, "own-1", json!({"destination": "api", "method": "POST", "path": "/x", "success": rule})).await;
    let j = run(&w, id).await;
    assert_eq!(j["status"], "pending", "a failed rule that retries waits for its next attempt: {j}");
    w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
    let j = run(&w, id).await;
    assert_eq!((j["status"].as_str(), j["result"]["status"].as_i64()), (Some("succeeded"), Some(202)), "{j}");
    let outcomes: Vec<Value> = calls(&w, id).await.iter().map(|c| c["outcome"].clone()).collect();
    assert_eq!(outcomes, [json!("retryable"), json!("succeeded")]);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// HMAC-SHA256 from its definition (RFC 2104), independent of the crate Relay signs with.
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::digest([pad(0x36), message.to_vec()].concat());
    Sha256::digest([pad(0x5c), inner.to_vec()].concat()).to_vec()
}

/// A test copy of AI Shipping Labs' verify rules (docs/event-hooks.md, `triggers/signing.py`):
/// `X-AISL-Signature` is `sha256=` and the hex HMAC-SHA256 of `"{X-AISL-Timestamp}.{raw body}"`
/// under the shared secret, compared in constant time; the timestamp is unix seconds within a
/// tolerance of now; `X-AISL-Event-Id` names the delivery.
fn aisl_verify(secret: &str, headers: &BTreeMap<String, String>, body: &[u8], now: i64) -> Result<String, String> {
    let signature = headers.get("x-aisl-signature").ok_or("no X-AISL-Signature")?;
    let timestamp = headers.get("x-aisl-timestamp").ok_or("no X-AISL-Timestamp")?;
    let event = headers.get("x-aisl-event-id").ok_or("no X-AISL-Event-Id")?;
    let ts: i64 = timestamp.parse().map_err(|_| "the timestamp is not unix seconds")?;
    if (now - ts).abs() > 300 {
        return Err("the timestamp is outside the tolerance".into());
    }
    let body = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8")?;
    let expected = format!("sha256={}", hex::encode(hmac_sha256(secret.as_bytes(), format!("{ts}.{body}").as_bytes())));
    let same = expected.len() == signature.len()
        && expected.bytes().zip(signature.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if same { Ok(event.clone()) } else { Err("the signature does not match".into()) }
}

#[tokio::test]
async fn a_receiver_checking_the_aisl_scheme_accepts_relays_delivery_and_refuses_a_changed_byte() {
    let w = crate::http::world_for("webhook.send", "arn:aws:iam::123456789012:role/relay-task-webhook-send").await;
    let (addr, seen) = receiver(vec![]).await;
    let scheme = json!({"signed": "timestamp.body", "encoding": "hex", "prefix": "sha256=", "key": "raw",
        "signature_header": "X-AISL-Signature", "timestamp_header": "X-AISL-Timestamp", "id_header": "X-AISL-Event-Id"});
    let body = json!({"base_url": "https://api.example.com", "rate_per_second": 100,
        "url_patterns": [format!("http://{addr}/hooks/")], "signature": scheme});
    let (s, d) = w.call(Method::PUT, "/v1/destinations/aisl", None, Some(body)).await;
    assert_eq!((s, &d["signature"]), (StatusCode::OK, &scheme), "{d}");
    let secret = "topsecret-aisl-7";
    let put = |v: &str| w.call(Method::PUT, "/v1/destinations/aisl/signing-secret", None, Some(json!({"value": v})));
    assert_eq!(put("short").await.0, StatusCode::UNPROCESSABLE_ENTITY, "a raw key of at least 8 characters");
    let (s, e) = put(secret).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    let params = json!({"destination": "aisl", "url": format!("http://{addr}/hooks/v0"), "event_type": "v0_workshop",
        "data": {"email": "m@example.com", "name": "Mé"}});
    let (s, j) = w.submit("aisl-1", json!({"task_type": "webhook.send", "params": params})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let id: JobId = j["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(run(&w, id).await["status"], "succeeded");

    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let (headers, sent) = (&got[0].headers, &got[0].body);
    let now = chrono::Utc::now().timestamp();
    assert_eq!(aisl_verify(secret, headers, sent, now), Ok(format!("wh_{id}")), "{headers:?}");
    assert!(headers["x-aisl-signature"].starts_with("sha256=") && headers["x-aisl-signature"].len() == 71);
    assert!(!headers.contains_key("webhook-signature"), "one scheme only: {headers:?}");
    // A changed byte anywhere is refused: in the body, the timestamp, the secret.
    for i in [0, sent.len() / 2, sent.len() - 1] {
        let mut changed = sent.clone();
        changed[i] ^= 0x01;
        assert!(aisl_verify(secret, headers, &changed, now).is_err(), "byte {i} changed");
    }
    let mut later = headers.clone();
    later.insert("x-aisl-timestamp".into(), (headers["x-aisl-timestamp"].parse::<i64>().unwrap() + 1).to_string());
    assert!(aisl_verify(secret, &later, sent, now).is_err(), "the timestamp is signed");
    assert!(aisl_verify("topsecret-aisl-8", headers, sent, now).is_err(), "another secret");
    // The record shows the delivery's id under the scheme's header, never the secret.
    let c = calls(&w, id).await;
    assert_eq!(c[0]["request"]["headers"]["X-AISL-Event-Id"], format!("wh_{id}"), "{}", c[0]["request"]);
    assert!(!c[0].to_string().contains(secret));
}

#[tokio::test]
async fn hostile_rules_and_schemes_get_json_4xx() {
    let w = world().await;
    let base = |extra: Value| {
        let mut b = json!({"base_url": "https://api.example/"});
        b.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap());
        b
    };
    let aisl = json!({"signed": "timestamp.body", "encoding": "hex", "key": "raw",
        "signature_header": "X-Sig", "timestamp_header": "X-Ts"});
    let with = |k: &str, v: Value| {
        let mut s = aisl.clone();
        s[k] = v;
        json!({"signature": s})
    };
    let bad = [
        json!({"success": {"json": {"pointer": "ok", "equals": true}}}),
        json!({"success": {"json": {"pointer": "/a~2", "equals": true}}}),
        json!({"success": {"json": {"pointer": format!("/{}", "x".repeat(100_000)), "equals": true}}}),
        json!({"success": {"json": {"pointer": "/ok", "equals": "x".repeat(5000)}}}),
        json!({"success": {"statuses": [200, 700]}}),
        json!({"success": {"statuses": []}}),
        json!({"success": {"json": {"pointer": "/ok"}}}),
        json!({"success": {"surprise": 1}}),
        // serde would read a struct from an array of its fields; the document says object.
        json!({"success": [null, null]}),
        json!({"success": {"json": ["/ok", true]}}),
        json!({"oauth": ["client_credentials", "https://auth.example.com/token", "id"]}),
        with("signed", json!("body.timestamp")),
        with("encoding", json!("base32")),
        with("key", json!("pem")),
        with("prefix", json!("x".repeat(100_000))),
        with("signature_header", json!("Content-Type")),
        with("signature_header", json!("X-Ts")),
        with("timestamp_header", Value::Null),
        with("signature_header", json!("X Sig\r\nEvil: 1")),
        json!({"signature": {"scheme": "my-own-code"}}),
    ];
    for extra in bad {
        let (s, e) = w.call(Method::PUT, "/v1/destinations/d", None, Some(base(extra.clone()))).await;
        assert!(s.is_client_error() && e["error"]["code"].is_string(), "{extra}: {s} {e}");
    }
    let ok = base(json!({"signature": aisl, "success": {"json": {"pointer": "/ok", "equals": true}}}));
    let (s, d) = w.call(Method::PUT, "/v1/destinations/d", None, Some(ok)).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    // Without a scheme the signing secret is Standard Webhooks': a raw one conflicts with it.
    w.call(Method::PUT, "/v1/destinations/sw", None, Some(base(json!({})))).await;
    let (s, e) =
        w.call(Method::PUT, "/v1/destinations/sw/signing-secret", None, Some(json!({"value": "topsecret"}))).await;
    assert_eq!((s, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("secret_form_mismatch")), "{e}");
    // A job's own rule is checked at submit.
    let params =
        json!({"destination": "d", "method": "GET", "path": "/x", "success": {"json": {"pointer": "x", "equals": 1}}});
    let (s, e) = w.submit("bad-rule", json!({"task_type": "http.request", "params": params})).await;
    let field = e["error"]["field"].as_str().unwrap_or_default();
    assert!(s == StatusCode::UNPROCESSABLE_ENTITY && field.starts_with("params.success"), "{e}");
}
