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

/// Issue 51, 3: any number of processes may open a fresh store at once (`relay serve`,
/// `relay worker` and the sweep started together): every one opens, and all share one key, so
/// a secret one writes, every other reads.
#[test]
fn many_openers_of_a_fresh_store_at_once_all_open_and_share_one_key() {
    use taskdeck::destinations::Secret;
    use taskdeck::destinations::local::LocalSecrets;
    const OPENERS: usize = 12;
    let tenant = taskdeck::job::TenantId::new();
    for trial in 0..20 {
        let dir = std::env::temp_dir().join(format!("relay-secrets-race-{}", taskdeck::job::TenantId::new()));
        let start = std::sync::Arc::new(std::sync::Barrier::new(OPENERS));
        let openers: Vec<_> = (0..OPENERS)
            .map(|_| {
                let (dir, start) = (dir.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    LocalSecrets::open(&dir)
                })
            })
            .collect();
        let stores: Vec<LocalSecrets> = openers
            .into_iter()
            .map(|t| t.join().unwrap().unwrap_or_else(|e| panic!("trial {trial}: an opener failed: {e}")))
            .collect();
        stores[0].write(tenant, "crm", Secret::Auth, "Bearer shared").unwrap();
        for (i, s) in stores.iter().enumerate() {
            assert_eq!(
                s.read(tenant, "crm", Secret::Auth).unwrap_or_else(|e| panic!("trial {trial}, store {i}: {e}")),
                "Bearer shared"
            );
        }
        let names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.contains("tmp")), "trial {trial}: a temporary file was left: {names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Issue 51, 4: a deleted destination's secrets go with it, so a tenant's secrets are bounded by
/// its destinations (200 create, put, delete cycles left 401 files); a secret put for a
/// destination that is gone is not kept.
#[tokio::test]
async fn a_deleted_destinations_secrets_are_deleted_with_it() {
    let dir = std::env::temp_dir().join(format!("relay-local-secrets-{}", taskdeck::job::TenantId::new()));
    let w = local_world(&dir).await;
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let signing = format!("whsec_{}", base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 32]));
    let started = std::time::Instant::now();
    for i in 0..200 {
        let name = format!("d{}", i % 7);
        destination(&w, &w.key, &name, addr, json!({"auth_header": "Authorization"})).await;
        let value = json!({"value": format!("Bearer {}", "k".repeat(1024))});
        let (s, e) = w.call(Method::PUT, &format!("/v1/destinations/{name}/secret"), None, Some(value)).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
        let (s, e) = w
            .call(
                Method::PUT,
                &format!("/v1/destinations/{name}/signing-secret"),
                None,
                Some(json!({"value": signing})),
            )
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
        if i == 0 {
            assert_eq!(walk(&dir).len(), 3, "the key and two secrets");
        }
        let (s, e) = w.call(Method::DELETE, &format!("/v1/destinations/{name}"), None, None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    }
    let files = walk(&dir);
    println!("200 cycles in {:?}: {} files", started.elapsed(), files.len());
    assert_eq!(files, vec![dir.join(taskdeck::destinations::local::KEY_FILE)], "only the store's key is left");
    // A destination deleted and made again starts with no secret.
    destination(&w, &w.key, "d1", addr, json!({"auth_header": "Authorization"})).await;
    let (_, d) = w.call(Method::GET, "/v1/destinations/d1", None, None).await;
    assert!(d["secret_set_at"].is_null(), "{d}");
    assert_eq!(walk(&dir).len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same through Secrets Manager (moto): a deleted destination's two secrets are deleted
/// with it, and a destination made again under the name takes a new secret.
#[tokio::test]
async fn a_deleted_destinations_secrets_leave_secrets_manager_too() {
    let w = crate::http::world().await;
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let sm = aws_sdk_secretsmanager::Client::new(&crate::support::moto::sdk_config());
    let signing = format!("whsec_{}", base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [9u8; 32]));
    for round in 0..2 {
        destination(&w, &w.key, "crm", addr, json!({"auth_header": "Authorization"})).await;
        let value = json!({"value": format!("Bearer round-{round}")});
        let (s, e) = w.call(Method::PUT, "/v1/destinations/crm/secret", None, Some(value)).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
        let (s, e) =
            w.call(Method::PUT, "/v1/destinations/crm/signing-secret", None, Some(json!({"value": signing}))).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
        let auth = taskdeck::destinations::Secret::Auth.id(w.tenant.id, "crm");
        let got = sm.get_secret_value().secret_id(&auth).send().await.unwrap();
        assert_eq!(got.secret_string(), Some(format!("Bearer round-{round}").as_str()));
        let (s, e) = w.call(Method::DELETE, "/v1/destinations/crm", None, None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
        for which in [taskdeck::destinations::Secret::Auth, taskdeck::destinations::Secret::Signing] {
            let id = which.id(w.tenant.id, "crm");
            assert!(sm.get_secret_value().secret_id(&id).send().await.is_err(), "round {round}: {id} is still there");
        }
    }
}
