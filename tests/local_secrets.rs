//! The local secret store (`relay dev`, `RELAY_SECRETS_DIR`): with no AWS at all, `PUT
//! /v1/destinations/{name}/secret` stores the value encrypted at rest, `http.request` sends it,
//! nothing returns it, and another tenant neither reads nor overwrites it.

use axum::http::{Method, StatusCode};
use serde_json::json;
use taskdeck::job::JobId;
use taskdeck::outbound::AllowList;
use taskdeck::store::modes;

use crate::http::{destination, receiver};
use crate::support::{World, test_settings};

/// A world with no AWS configuration: no task roles, the local store in a fresh folder.
async fn local_world(dir: &std::path::Path) -> World {
    let mut s = test_settings();
    s.callback_allow = AllowList::parse("127.0.0.1/32").unwrap();
    let w = World::with_settings(s).await;
    let mut db = w.db().await;
    modes::set(&mut db, "shadow", false, "test", None).await.unwrap();
    modes::set(&mut db, "write:http", true, "test", None).await.unwrap();
    let platform = w.platform.clone().with_local_secrets(dir).unwrap();
    World {
        router: taskdeck::api::router(platform.app_state()),
        platform,
        tenant: w.tenant,
        key: w.key,
        schema: w.schema,
    }
}

#[tokio::test]
async fn a_secret_put_without_aws_is_sealed_locally_and_sent_by_http_request() {
    let dir = std::env::temp_dir().join(format!("relay-local-secrets-{}", taskdeck::job::TenantId::new()));
    let w = local_world(&dir).await;
    assert!(w.platform.credentials.is_none(), "no AWS access at all");
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({"auth_header": "Authorization"})).await;
    let secret = "Bearer sk-dev-5150";
    let (s, e) = w.call(Method::PUT, "/v1/destinations/crm/secret", None, Some(json!({"value": secret}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    let (_, d) = w.call(Method::GET, "/v1/destinations/crm", None, None).await;
    assert!(d["secret_set_at"].is_string() && !d.to_string().contains("sk-dev"), "{d}");

    // At rest: a key file and a sealed value, the value nowhere in the clear.
    let mut files = vec![];
    for entry in walk(&dir) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(!bytes.windows(6).any(|w| w == b"sk-dev"), "{} holds the value in the clear", entry.display());
        files.push(entry);
    }
    assert_eq!(files.len(), 2, "{files:?}");

    // Another tenant: its own destination of the same name has no secret; it cannot write ours.
    let (_, other_key) = w.other_tenant("globex").await;
    destination(&w, &other_key, "crm", addr, json!({"auth_header": "Authorization"})).await;
    let params = json!({"destination": "crm", "method": "POST", "path": "/x"});
    let request = json!({"task_type": "http.request", "params": params}).to_string().into_bytes();
    let (s, job) = w.call_as(&other_key, Method::POST, "/v1/jobs", Some("theirs-1"), Some(request)).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let theirs: JobId = job["id"].as_str().unwrap().parse().unwrap();
    w.platform.executor().run_dispatched(&[theirs]).await.unwrap();
    let (_, j) = w.call_as(&other_key, Method::GET, &format!("/v1/jobs/{theirs}"), None, None).await;
    assert_eq!(j["status"], "failed", "{j}");
    assert!(j["last_error"].as_str().unwrap().contains("has no value"), "{j}");

    // Ours is sent.
    let (s, job) = w.submit("ours-1", json!({"task_type": "http.request", "params": params})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let ours: JobId = job["id"].as_str().unwrap().parse().unwrap();
    w.platform.executor().run_dispatched(&[ours]).await.unwrap();
    let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{ours}"), None, None).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "only our call went out");
    assert_eq!(got[0].headers["authorization"], secret);

    // Hostile values and names: JSON 4xx, nothing stored.
    for (path, body) in [
        ("/v1/destinations/crm/secret", json!({"value": "a\u{0}b"})),
        ("/v1/destinations/crm/secret", json!({"value": "é"})),
        ("/v1/destinations/crm/secret", json!({"value": "x".repeat(5000)})),
        ("/v1/destinations/crm/secret", json!({"value": ""})),
        ("/v1/destinations/..%2Fcrm/secret", json!({"value": "v"})),
        ("/v1/destinations/nope/secret", json!({"value": "v"})),
    ] {
        let (s, e) = w.call(Method::PUT, path, None, Some(body)).await;
        assert!(s.is_client_error() && e["error"]["code"].is_string(), "{path}: {s} {e}");
    }
    assert_eq!(walk(&dir).len(), 2, "nothing more stored");
    let _ = std::fs::remove_dir_all(&dir);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}
