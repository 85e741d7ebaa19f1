//! What `http.request` sends and records: a destination echoing the request (its secret
//! included) leaves the secret nowhere Relay records an answer, `content-type` goes out once,
//! and a destination's rate is bounded where it is set.

use axum::http::{Method, StatusCode};
use serde_json::json;
use taskdeck::job::JobId;

use crate::http::{Reply, destination, receiver, world};
use crate::support::World;
use crate::support::leaks::rows_holding;

/// A fragment of the secret no other text holds.
const MARK: &str = "zq7-live";
/// Sent as a header value as is, JSON-escaped in a JSON answer (`\` becomes `\\`).
const SECRET: &str = "Bearer zq7-live\\9k";

async fn run(w: &World, key: &str, path: &str) -> JobId {
    let params = json!({"destination": "crm", "method": "POST", "path": path, "body": {"a": 1}});
    let (s, job) = w.submit(key, json!({"task_type": "http.request", "params": params})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let id: JobId = job["id"].as_str().unwrap().parse().unwrap();
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    id
}

#[tokio::test]
async fn a_destination_echoing_the_secret_leaves_it_in_no_record() {
    let w = world().await;
    let (addr, seen) = receiver(vec![Reply::Echo(400, false), Reply::Echo(200, true), Reply::Echo(409, true)]).await;
    destination(&w, &w.key, "crm", addr, json!({"auth_header": "Authorization"})).await;
    let (s, e) = w.call(Method::PUT, "/v1/destinations/crm/secret", None, Some(json!({"value": SECRET}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    let refused = run(&w, "echo-text", "/text").await;
    let ok = run(&w, "echo-json", "/json").await;
    let refused_json = run(&w, "echo-json-409", "/json").await;
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|r| r.head.contains(&format!("authorization: {SECRET}"))), "the secret was sent");

    for id in [refused, ok, refused_json] {
        for path in [format!("/v1/jobs/{id}"), format!("/v1/jobs/{id}/http-calls"), format!("/v1/jobs/{id}/events")] {
            let (s, body) = w.call(Method::GET, &path, None, None).await;
            assert_eq!(s, StatusCode::OK, "{body}");
            assert!(!body.to_string().contains(MARK), "{path}: {body}");
        }
    }
    let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{refused}"), None, None).await;
    assert_eq!(j["status"], "failed", "{j}");
    let error = j["last_error"].as_str().unwrap();
    assert!(error.contains("authorization: <redacted>"), "the echo is kept, the secret redacted: {error}");
    let (_, c) = w.call(Method::GET, &format!("/v1/jobs/{ok}/http-calls"), None, None).await;
    let answer = &c["calls"][0]["response"];
    assert!(answer["body"]["you_sent"].as_str().unwrap().contains("authorization: <redacted>"), "{answer}");
    assert_eq!(answer["headers"]["x-request-id"], "<redacted>", "{answer}");
    let (s, status) = w.call(Method::GET, "/v1/status", None, None).await;
    assert!(!status.to_string().contains(MARK), "{s}: {status}");
    assert_eq!(rows_holding(&w, MARK).await, Vec::<String>::new());
}

#[tokio::test]
async fn every_call_sends_one_content_type() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({})).await;
    run(&w, "ct-1", "/x").await;
    let got = seen.lock().unwrap().clone();
    let head = got[0].head.to_ascii_lowercase();
    assert_eq!(head.matches("\r\ncontent-type:").count(), 1, "{head}");
    assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
}

#[tokio::test]
async fn a_rate_outside_its_bounds_is_refused_where_it_is_set() {
    let w = world().await;
    for rate in
        [json!(1e-300), json!(0), json!(-1), json!(0.0009), json!(1000.5), json!(1e308), json!("1"), json!(null)]
    {
        let body = json!({"base_url": "https://api.example/", "rate_per_second": rate});
        let (s, e) = w.call(Method::PUT, "/v1/destinations/crm", None, Some(body)).await;
        if rate.is_null() {
            assert_eq!(s, StatusCode::OK, "null is the default: {e}");
            continue;
        }
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{rate}: {e}");
        assert!(e["error"]["code"].is_string(), "{e}");
    }
    // Past what a double holds: refused as JSON, not a 500.
    let raw = br#"{"base_url": "https://api.example/", "rate_per_second": 1e400}"#.to_vec();
    let (s, e) = w.call_as(&w.key, Method::PUT, "/v1/destinations/crm", None, Some(raw)).await;
    assert!(s.is_client_error() && e["error"]["code"].is_string(), "{s} {e}");
    for rate in [0.001, 1000.0] {
        let body = json!({"base_url": "https://api.example/", "rate_per_second": rate});
        let (s, d) = w.call(Method::PUT, "/v1/destinations/crm", None, Some(body)).await;
        assert_eq!((s, d["rate_per_second"].as_f64()), (StatusCode::OK, Some(rate)), "{d}");
    }
}
