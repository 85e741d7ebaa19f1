//! `webhook.send` end to end: a destination allowing run-time URLs by pattern, its signing
//! secret in moto's Secrets Manager (read under the task's own role), deliveries to a raw
//! receiver on 127.0.0.1 (allow-listed) verified by the Python `standardwebhooks` package, the
//! address guard at submit and at call time, a 1 MiB body, retries and the long-job lane.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::destinations::webhook::WebhookSend;
use taskdeck::executor::Onward;
use taskdeck::job::JobId;

use crate::http::{Reply, Seen, calls, job, receiver};
use crate::support::World;
use crate::support::transports::Recorded;

const ROLE: &str = "arn:aws:iam::123456789012:role/relay-task-webhook-send";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `http.request`'s test world, with `webhook.send`'s role mapped.
async fn world() -> World {
    crate::http::world_for("webhook.send", ROLE).await
}

/// Destination `hooks` allowing `patterns`, with the signing secret written.
async fn hooks(w: &World, patterns: Value) {
    let body = json!({"base_url": "https://api.example.com", "rate_per_second": 100, "url_patterns": patterns});
    let (s, d) = w.call(Method::PUT, "/v1/destinations/hooks", None, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["signing_secret_set_at"], Value::Null);
    let (s, e) =
        w.call(Method::PUT, "/v1/destinations/hooks/signing-secret", None, Some(json!({"value": SECRET}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
}

fn webhook(url: &str, data: Value) -> Value {
    json!({"task_type": "webhook.send", "correlation_id": "order-7",
        "params": {"destination": "hooks", "url": url, "event_type": "user.registered", "data": data}})
}

async fn submit(w: &World, key: &str, job: Value) -> JobId {
    let (s, j) = w.submit(key, job).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    j["id"].as_str().unwrap().parse().unwrap()
}

/// A venv with the Python `standardwebhooks` package, made once under the target dir (once
/// per process: the tests that use it run at once).
fn verifier_venv() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| {
        let python = std::env::var_os("RELAY_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("standardwebhooks-venv-1.1.0");
        relay::localaws::venv_with(&python, &dir, &["standardwebhooks==1.1.0"]).expect("the standardwebhooks venv")
    })
    .clone()
}

/// What `standardwebhooks.Webhook(secret).verify(body, headers)` says of each delivery:
/// `ok <the payload's type>` or `refused <why>`.
fn verify(secret: &str, deliveries: &[(BTreeMap<String, String>, Vec<u8>)]) -> Vec<String> {
    let venv = verifier_venv();
    let input: Vec<Value> =
        deliveries.iter().map(|(h, b)| json!({"headers": h, "body": String::from_utf8(b.clone()).unwrap()})).collect();
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("webhooks-{}.json", JobId::new()));
    std::fs::write(&file, serde_json::to_vec(&input).unwrap()).unwrap();
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
wh = Webhook(sys.argv[1])
for d in json.load(open(sys.argv[2])):
    try:
        print("ok", wh.verify(d["body"], d["headers"])["type"])
    except WebhookVerificationError as e:
        print("refused", e)
"#;
    let out = Command::new(venv.join("bin/python")).args(["-c", script, secret]).arg(&file).output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

fn delivery(r: &Seen) -> (BTreeMap<String, String>, Vec<u8>) {
    (r.headers.clone(), r.body.clone())
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("http://{addr}{path}")
}

#[tokio::test]
async fn a_signed_webhook_to_a_run_time_url_is_verified_by_standardwebhooks() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    hooks(&w, json!([format!("http://{addr}/hooks/")])).await;
    let id =
        submit(&w, "wh-1", webhook(&url(addr, "/hooks/user-7?src=relay"), json!({"user": 7, "plan": "pro"}))).await;
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    assert_eq!(j["result"]["status"], 200);

    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/hooks/user-7?src=relay"));
    assert_eq!(r.headers["webhook-id"], format!("wh_{id}"));
    assert_eq!(r.headers["idempotency-key"], "wh-1");
    assert_eq!(r.headers["x-relay-correlation-id"], "order-7");
    assert_eq!(r.headers["content-type"], "application/json");
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!((&body["type"], &body["data"]), (&json!("user.registered"), &json!({"user": 7, "plan": "pro"})));

    // One real verifier: the standardwebhooks package takes it; a changed body, another
    // secret or another id it refuses.
    let mut tampered = delivery(r);
    tampered.1 = tampered.1.iter().map(|b| if *b == b'7' { b'8' } else { *b }).collect();
    let mut other_id = delivery(r);
    other_id.0.insert("webhook-id".into(), "wh_other".into());
    let said = verify(SECRET, &[delivery(r), tampered, other_id]);
    assert_eq!(said[0], "ok user.registered", "{said:?}");
    assert!(said[1].starts_with("refused") && said[2].starts_with("refused"), "{said:?}");
    let said = verify("whsec_c29tZW9uZSBlbHNlJ3Mgc2VjcmV0IGtleSEh", &[delivery(r)]);
    assert!(said[0].starts_with("refused"), "{said:?}");

    // The call's record shows the body's size and digest; the secret is in no table or answer.
    let c = calls(&w, id).await;
    assert_eq!(c[0]["outcome"], "succeeded");
    assert_eq!(c[0]["request"]["body"]["bytes"], r.body.len());
    assert_eq!(c[0]["request"]["headers"]["webhook-id"], format!("wh_{id}"));
    let (_, d) = w.call(Method::GET, "/v1/destinations/hooks", None, None).await;
    assert!(d["signing_secret_set_at"].is_string(), "{d}");
    assert!(d["signing_secret_id"].as_str().unwrap().ends_with("/destinations/hooks/signing"), "{d}");
    let key = SECRET.trim_start_matches("whsec_");
    let leaked = "SELECT count(*) FROM http_calls WHERE request::text LIKE $1 OR response::text LIKE $1";
    assert_eq!(w.count(leaked, &[&format!("%{key}%")]).await, 0);
    assert!(!d.to_string().contains(key) && !j.to_string().contains(key));
}

#[tokio::test]
async fn retries_keep_the_webhook_id_and_each_attempt_is_signed_anew() {
    let w = world().await;
    let (addr, seen) = receiver(vec![Reply::Status(503, vec![], "{}"), Reply::Status(500, vec![], "{}")]).await;
    hooks(&w, json!([format!("http://{addr}/hooks/")])).await;
    let id = submit(&w, "wh-retry", webhook(&url(addr, "/hooks/a"), json!({"n": 1}))).await;
    for _ in 0..3 {
        w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
        w.platform.executor().run_dispatched(&[id]).await.unwrap();
    }
    let j = job(&w, id).await;
    assert_eq!((j["status"].as_str(), j["attempt"].as_i64()), (Some("succeeded"), Some(3)), "{j}");
    let got = seen.lock().unwrap().clone();
    let ids: Vec<&str> = got.iter().map(|r| r.headers["webhook-id"].as_str()).collect();
    let expected = format!("wh_{id}");
    assert_eq!(ids, [expected.as_str(); 3]);
    let said = verify(SECRET, &got.iter().map(delivery).collect::<Vec<_>>());
    assert_eq!(said, ["ok user.registered"; 3]);
    let outcomes: Vec<String> = calls(&w, id).await.iter().map(|c| c["outcome"].as_str().unwrap().to_owned()).collect();
    assert_eq!(outcomes, ["retryable", "retryable", "succeeded"]);
}

#[tokio::test]
async fn a_one_mebibyte_body_is_delivered_intact_and_held_once() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    hooks(&w, json!([format!("http://{addr}/hooks/")])).await;
    // 1 MiB of compact JSON exactly: the bound, through the API's own body limit.
    let filler = "é".repeat(400) + &"x".repeat(taskdeck::destinations::webhook::MAX_BODY - 2 - 800);
    let data = json!(filler);
    assert_eq!(serde_json::to_vec(&data).unwrap().len(), taskdeck::destinations::webhook::MAX_BODY);
    let id = submit(&w, "wh-big", webhook(&url(addr, "/hooks/list"), data.clone())).await;
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    assert_eq!(job(&w, id).await["status"], "succeeded");
    let got = seen.lock().unwrap().clone();
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["data"], data, "delivered intact");
    assert_eq!(verify(SECRET, &[delivery(&got[0])]), ["ok user.registered"]);
    // Held once, in the job's parameters: not in the call's record, the job's events or result.
    let held = "SELECT (SELECT count(*) FROM jobs WHERE params::text LIKE '%xxxxxxxxxxxx%')
        + (SELECT count(*) FROM http_calls WHERE request::text LIKE '%xxxxxxxxxxxx%')
        + (SELECT count(*) FROM http_calls WHERE response::text LIKE '%xxxxxxxxxxxx%')
        + (SELECT count(*) FROM job_events WHERE reason LIKE '%xxxxxxxxxxxx%')
        + (SELECT count(*) FROM jobs WHERE result::text LIKE '%xxxxxxxxxxxx%')";
    assert_eq!(w.count(held, &[]).await, 1);
    // One byte more is refused at submit, naming the field.
    let over = json!("x".repeat(taskdeck::destinations::webhook::MAX_BODY - 1));
    let (s, e) = w.submit("wh-over", webhook(&url(addr, "/hooks/list"), over)).await;
    assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("params.data")), "{e}");
}

#[tokio::test]
async fn urls_outside_the_patterns_loopback_and_hostile_inputs_are_refused_at_submit() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    // Patterns that are ambiguous, or name an address the guard refuses, are refused.
    for bad in ["https://*.com/", "https://a*.example.com/", "https://*.example.com/hooks", "https://127.0.0.2/"] {
        let body = json!({"base_url": "https://api.example.com", "url_patterns": [bad]});
        let (s, e) = w.call(Method::PUT, "/v1/destinations/hooks", None, Some(body)).await;
        assert_eq!(
            (s, e["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("url_patterns")),
            "{bad}: {e}"
        );
    }
    // No signing secret yet: refused (409) naming the destination.
    let patterns = json!([format!("http://{addr}/hooks/"), "https://*.hooks.example.com/in/"]);
    let body = json!({"base_url": "https://api.example.com", "url_patterns": patterns});
    assert_eq!(w.call(Method::PUT, "/v1/destinations/hooks", None, Some(body)).await.0, StatusCode::OK);
    let (s, e) = w.submit("no-secret", webhook(&url(addr, "/hooks/a"), json!({}))).await;
    assert_eq!((s, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("signing_secret_missing")), "{e}");
    // Too short for any form: 422; a raw key's form (a 6-byte whsec, not base64) where the
    // destination signs the Standard Webhooks way: 409.
    for (bad, status) in [
        ("secret", StatusCode::UNPROCESSABLE_ENTITY),
        ("whsec_c2hvcnQ=", StatusCode::CONFLICT),
        ("whsec_not base64", StatusCode::CONFLICT),
    ] {
        let (s, _) =
            w.call(Method::PUT, "/v1/destinations/hooks/signing-secret", None, Some(json!({"value": bad}))).await;
        assert_eq!(s, status, "{bad}");
    }
    let (s, _) =
        w.call(Method::PUT, "/v1/destinations/hooks/signing-secret", None, Some(json!({"value": SECRET}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT);

    let refused: Vec<(Value, StatusCode, &str)> = vec![
        // Outside the patterns: another path, host, port, scheme; a prefix is not a word start.
        (webhook(&url(addr, "/admin"), json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook(&url(addr, "/hooksx/a"), json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook("https://hooks.example.com/in/a", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook("https://a.hooks.example.com:444/in/a", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook("http://a.hooks.example.com/in/a", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        // Loopback and private addresses, however written: the guard at submit.
        (
            webhook(&format!("http://127.0.0.2:{}/hooks/a", addr.port()), json!({})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "params.url",
        ),
        (webhook("http://[::1]/hooks/a", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook("http://2130706433/hooks/a", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook("https://169.254.169.254/in/a", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        // Hostile shapes.
        (webhook(&url(addr, "/hooks/../admin"), json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook(&url(addr, "/hooks/%2e%2e/admin"), json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook(&format!("http://u:p@{addr}/hooks/a"), json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook("javascript:alert(1)", json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (webhook(&url(addr, "/hooks/a\r\nHost: evil"), json!({})), StatusCode::UNPROCESSABLE_ENTITY, "params.url"),
        (
            webhook(&url(addr, &format!("/hooks/{}", "a".repeat(2100))), json!({})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "params.url",
        ),
    ];
    for (job, status, field) in refused {
        let (s, e) = w.submit("bad", job.clone()).await;
        assert_eq!((s, e["error"]["field"].as_str()), (status, Some(field)), "{job}: {e}");
    }
    let loopback = webhook(&format!("http://127.0.0.2:{}/hooks/a", addr.port()), json!({}));
    let (_, e) = w.submit("loop", loopback).await;
    assert!(e["error"]["message"].as_str().unwrap().contains("127.0.0.2"), "{e}");

    let mut bad_params: Vec<(Value, &str)> = Vec::new();
    for (k, v, field) in [
        ("event_type", json!("user registered"), "params.event_type"),
        ("event_type", json!(""), "params.event_type"),
        ("timeout_ms", json!(900_001), "params.timeout_ms"),
        ("timeout_ms", json!(99), "params.timeout_ms"),
        ("destination", json!("../x"), "params.destination"),
        ("surprise", json!(1), "params"),
    ] {
        let mut j = webhook(&url(addr, "/hooks/a"), json!({}));
        j["params"][k] = v;
        bad_params.push((j, field));
    }
    for (job, field) in bad_params {
        let (s, e) = w.submit("bad", job.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{job}: {e}");
        assert!(e["error"]["field"].as_str().unwrap().starts_with(field), "{job}: {e}");
    }
    // A call longer than the attempt the job asked for.
    let mut long = webhook(&url(addr, "/hooks/a"), json!({}));
    long["params"]["timeout_ms"] = json!(120_000);
    long["timeout_seconds"] = json!(60);
    let (s, e) = w.submit("short", long).await;
    assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("timeout_seconds")), "{e}");
    // An unknown destination is a 409 naming it.
    let mut unknown = webhook(&url(addr, "/hooks/a"), json!({}));
    unknown["params"]["destination"] = json!("nope");
    assert_eq!(w.submit("unknown", unknown).await.0, StatusCode::CONFLICT);
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 0, "nothing was admitted");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_at_call_time() {
    let w = world().await;
    hooks(&w, json!(["https://localhost/hooks/"])).await;
    // A name passes at submit (what it resolves to is not known until the call) ...
    let id = submit(&w, "wh-local", webhook("https://localhost/hooks/a", json!({}))).await;
    // ... and the guard refuses it at the call, on what the name resolves to. This worker's
    // allow-list is production's (empty): the test's 127.0.0.1 allowance is not its.
    let mut platform = w.platform.clone();
    platform.catalogue = platform.catalogue.clone().with(WebhookSend::default());
    platform.executor().run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!((j["status"].as_str(), j["fault"].as_str()), (Some("failed"), Some("tenant")), "{j}");
    let error = j["last_error"].as_str().unwrap();
    // (127.0.0.1 or ::1, whichever the machine's resolver answers: loopback either way.)
    assert!(error.contains("refused: localhost resolves to") && error.contains("loopback"), "{j}");
    let c = calls(&w, id).await;
    assert_eq!((c.len(), c[0]["outcome"].as_str()), (1, Some("refused")), "{c:?}");
    let faults = "SELECT count(*) FROM exceptions WHERE job_id = $1";
    assert_eq!(w.count(faults, &[&id]).await, 0, "the URL is the tenant's: no operator exception");
}

#[tokio::test]
async fn a_long_call_gets_a_long_attempt_on_the_long_job_lane() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    hooks(&w, json!([format!("http://{addr}/hooks/")])).await;
    let mut long = webhook(&url(addr, "/hooks/slow"), json!({}));
    long["params"]["timeout_ms"] = json!(600_000);
    let id = submit(&w, "wh-long", long).await;
    // The job was given attempts as long as its call and the margin to record it.
    assert_eq!(job(&w, id).await["timeout_seconds"], 605);
    // The short lane (a 120 s invocation) hands it on to the long lane's queue, unrun ...
    let lane = Arc::new(Recorded::default());
    let mut short = w.platform.clone();
    short.settings.executor.onward = Some(Onward { above: 115, transport: lane.clone() });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    short.executor().run_dispatched_until(&[id], Some(deadline)).await.unwrap();
    assert_eq!(lane.take().iter().map(|d| d.id).collect::<Vec<_>>(), [id]);
    assert!(seen.lock().unwrap().is_empty());
    // ... where a 900 s invocation runs it.
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    w.platform.executor().run_dispatched_until(&[id], Some(deadline)).await.unwrap();
    assert_eq!(job(&w, id).await["status"], "succeeded");
    assert_eq!(seen.lock().unwrap().len(), 1);
    // A call longer than this deployment's longest attempt is refused at submit.
    let mut too_long = webhook(&url(addr, "/hooks/slow"), json!({}));
    too_long["params"]["timeout_ms"] = json!(900_000);
    let mut capped = w.platform.clone();
    capped.settings.max_timeout_seconds = 895;
    let router = taskdeck::api::router(capped.app_state());
    let req = axum::http::Request::post("/v1/jobs")
        .header("authorization", format!("Bearer {}", w.key))
        .header("idempotency-key", "too-long")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(too_long.to_string()))
        .unwrap();
    let (s, e) = crate::support::send(&router, req).await;
    assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("params")), "{e}");
}
