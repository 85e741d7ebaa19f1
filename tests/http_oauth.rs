//! Destinations that mint their token (an OAuth 2.0 client-credentials grant) against a local
//! token endpoint: 50 jobs at once cost one token request; a 401 costs one more and the job
//! calls again; the token (and the client secret) is in no row, no log line and no preview;
//! the token URL is under the address guard.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use taskdeck::store::modes;

use crate::http::{Reply, calls, destination, job, receiver, world};
use crate::support::World;
use crate::support::leaks::{self, rows_holding};

/// What every token minted starts with (no other text holds it).
const TOKEN: &str = "zq9tok";
const CLIENT_SECRET: &str = "cs-zq8-secret";

/// The token requests a token endpoint got: their headers and form.
type Requests = Arc<Mutex<Vec<(BTreeMap<String, String>, String)>>>;

/// A token endpoint on 127.0.0.1 minting `zq9tok-<n>` for an hour, each answer 300 ms late (so
/// jobs asking at once overlap).
async fn token_endpoint() -> (SocketAddr, Requests) {
    let requests: Requests = Arc::default();
    let app = axum::Router::new()
        .route(
            "/oauth/token",
            axum::routing::post(|State(r): State<Requests>, headers: HeaderMap, form: String| async move {
                let named = headers.iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
                let n = {
                    let mut r = r.lock().unwrap();
                    r.push((named, form));
                    r.len()
                };
                tokio::time::sleep(Duration::from_millis(300)).await;
                axum::Json(json!({"access_token": format!("{TOKEN}-{n}"), "token_type": "bearer", "expires_in": 3600}))
            }),
        )
        .with_state(requests.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, requests)
}

/// Destination `zoom` at the receiver, minting its token at the endpoint (Zoom's grant).
async fn zoom(w: &World, receiver: SocketAddr, issuer: SocketAddr) -> Value {
    let oauth = json!({"grant": "account_credentials", "token_url": format!("http://{issuer}/oauth/token"),
        "client_id": "zoom-client", "params": {"account_id": "acc-1"}});
    destination(w, &w.key, "zoom", receiver, json!({"oauth": oauth, "max_in_flight": 100, "rate_per_second": 1000}))
        .await
}

async fn submit(w: &World, key: &str) -> JobId {
    let params =
        json!({"destination": "zoom", "method": "POST", "path": "/v2/users/me/meetings", "body": {"topic": "t"}});
    let (s, j) = w.submit(key, json!({"task_type": "http.request", "params": params})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    j["id"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn fifty_jobs_share_one_token_a_401_mints_one_more_and_the_token_is_nowhere() {
    let (lines, _logs) = leaks::capture_this_thread();

    // A pool as large as the jobs at once, so none waits long for a connection when the
    // token comes and they all go.
    let mut settings = crate::support::test_settings();
    settings.pool.max_size = 60;
    let w = crate::http::world_with(settings, "http.request", crate::http::ROLE).await;
    let (issuer, requests) = token_endpoint().await;
    let (addr, seen) = receiver(vec![]).await;
    let d = zoom(&w, addr, issuer).await;
    assert_eq!((d["auth_header"].as_str(), d["client_secret_set_at"].is_string()), (Some("Authorization"), false));
    let (s, e) =
        w.call(Method::PUT, "/v1/destinations/zoom/client-secret", None, Some(json!({"value": CLIENT_SECRET}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");

    // 50 jobs at once: one token request.
    let ids: Vec<JobId> = futures::future::join_all((0..50).map(|i| {
        let w = &w;
        async move { submit(w, &format!("meet-{i}")).await }
    }))
    .await;
    let started = std::time::Instant::now();
    w.platform.executor().run_dispatched(&ids).await.unwrap();
    let first = w.count("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'succeeded'", &[&ids]).await;
    // Those that found the destination's rate slot taken (all woke together when the token
    // came) were deferred, not failed: run them again until every job is done.
    let pending = "SELECT id FROM jobs WHERE id = ANY($1) AND status = 'pending'";
    for _ in 0..20 {
        let db = w.db().await;
        let left: Vec<JobId> = db.query(pending, &[&ids]).await.unwrap().iter().map(|r| r.get(0)).collect();
        if left.is_empty() {
            break;
        }
        db.execute("UPDATE jobs SET run_at = now() WHERE id = ANY($1)", &[&left]).await.unwrap();
        drop(db);
        w.platform.executor().run_dispatched(&left).await.unwrap();
    }
    println!("50 jobs, one token request: {:?} ({first} done in the first pass)", started.elapsed());
    let done = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'succeeded'";
    assert_eq!(w.count(done, &[&ids]).await, 50);
    assert_eq!(requests.lock().unwrap().len(), 1, "one token request for 50 jobs");
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 50);
    assert!(got.iter().all(|r| r.headers["authorization"] == format!("Bearer {TOKEN}-1")), "{:?}", got[0].headers);
    {
        let r = requests.lock().unwrap();
        let (headers, form) = &r[0];
        assert_eq!(form, "grant_type=account_credentials&account_id=acc-1");
        assert_eq!(headers["content-type"], "application/x-www-form-urlencoded");
        use base64::Engine;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("zoom-client:{CLIENT_SECRET}"));
        assert_eq!(headers["authorization"], format!("Basic {basic}"));
    }

    // A 401: the token is dropped, one new one minted, the job calls once more and succeeds.
    // (The destination moves to a receiver that refuses once; its grant and secret, and so its
    // cached token, stay.)
    let (addr401, seen401) =
        receiver(vec![Reply::Status(401, vec![], r#"{"code":124,"message":"Invalid access token"}"#)]).await;
    zoom(&w, addr401, issuer).await;
    let id = submit(&w, "meet-401").await;
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!((j["status"].as_str(), j["attempt"].as_i64()), (Some("succeeded"), Some(1)), "{j}");
    let auths: Vec<String> = seen401.lock().unwrap().iter().map(|r| r.headers["authorization"].clone()).collect();
    assert_eq!(requests.lock().unwrap().len(), 2, "exactly one more token request");
    assert_eq!(auths, [format!("Bearer {TOKEN}-1"), format!("Bearer {TOKEN}-2")]);
    let c = calls(&w, id).await;
    let outcomes: Vec<(Value, Value)> = c.iter().map(|c| (c["outcome"].clone(), c["http_status"].clone())).collect();
    assert_eq!(outcomes, [(json!("retryable"), json!(401)), (json!("succeeded"), json!(200))]);
    assert_eq!(c[0]["request"]["headers"]["Authorization"], "<redacted>");

    // Shadow mode shows the call with the header redacted, and mints nothing.
    modes::set(&mut w.db().await, "shadow", true, "test", None).await.unwrap();
    let shadowed = submit(&w, "meet-shadow").await;
    w.platform.executor().run_dispatched(&[shadowed]).await.unwrap();
    let j = job(&w, shadowed).await;
    assert_eq!(j["result"]["request"]["headers"]["Authorization"], "<redacted>", "{j}");
    assert_eq!(requests.lock().unwrap().len(), 2);

    // The token and the client secret: in no row, no answer, no log line.
    assert_eq!(rows_holding(&w, TOKEN).await, Vec::<String>::new());
    assert_eq!(rows_holding(&w, CLIENT_SECRET).await, Vec::<String>::new());
    for id in ids.iter().take(3).chain([&id, &shadowed]) {
        for path in [format!("/v1/jobs/{id}"), format!("/v1/jobs/{id}/http-calls"), format!("/v1/jobs/{id}/events")] {
            let (_, body) = w.call(Method::GET, &path, None, None).await;
            assert!(!body.to_string().contains(TOKEN), "{path}: {body}");
        }
    }
    let (_, d) = w.call(Method::GET, "/v1/destinations/zoom", None, None).await;
    assert!(!d.to_string().contains(CLIENT_SECRET) && d["client_secret_set_at"].is_string(), "{d}");
    // The capture works (a line of the test's own is in it). Run alone, every line of the run
    // is; beside other tests, tracing's per-callsite interest cache may hide some from a
    // subscriber scoped to this thread.
    tracing::debug!(event = "test.oauth.sentinel", "captured");
    let logged = lines.text();
    assert!(logged.contains("test.oauth.sentinel"), "the log was captured: {logged}");
    assert!(!logged.contains(TOKEN) && !logged.contains(CLIENT_SECRET), "{logged}");
}

#[tokio::test]
async fn a_refused_token_request_fails_the_job_as_the_tenants_and_a_private_token_url_is_refused() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    // No client secret written: the job fails as the tenant's, nothing is sent.
    let oauth = json!({"grant": "client_credentials", "token_url": "http://127.0.0.1:9/token", "client_id": "c"});
    destination(&w, &w.key, "crm", addr, json!({"oauth": oauth})).await;
    let params = json!({"destination": "crm", "method": "GET", "path": "/x"});
    let (_, j) = w.submit("no-secret", json!({"task_type": "http.request", "params": params})).await;
    let id: JobId = j["id"].as_str().unwrap().parse().unwrap();
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!((j["status"].as_str(), j["fault"].as_str()), (Some("failed"), Some("tenant")), "{j}");
    assert!(j["last_error"].as_str().unwrap().contains("client-secret"), "{j}");
    assert_eq!(seen.lock().unwrap().len(), 0);

    let base = |oauth: Value| json!({"base_url": "https://api.example/", "oauth": oauth});
    let bad = [
        json!({"grant": "client_credentials", "token_url": "http://169.254.169.254/token", "client_id": "c"}),
        json!({"grant": "client_credentials", "token_url": "https://10.0.0.7/token", "client_id": "c"}),
        json!({"grant": "client_credentials", "token_url": "https://[::1]/token", "client_id": "c"}),
        json!({"grant": "client_credentials", "token_url": "http://auth.example/token", "client_id": "c"}),
        json!({"grant": "client_credentials", "token_url": "https://auth.example/t?x=1", "client_id": "c"}),
        json!({"grant": "password", "token_url": "https://auth.example/token", "client_id": "c"}),
        json!({"grant": "client_credentials", "token_url": "https://auth.example/token", "client_id": "x".repeat(100_000)}),
        json!({"grant": "client_credentials", "token_url": "https://auth.example/token", "client_id": "c",
            "params": {"grant_type": "password"}}),
        json!({"grant": "client_credentials", "token_url": "https://auth.example/token", "client_id": "c", "secret": "s"}),
    ];
    for oauth in bad {
        let (s, e) = w.call(Method::PUT, "/v1/destinations/bad", None, Some(base(oauth.clone()))).await;
        assert!(s.is_client_error() && e["error"]["code"].is_string(), "{oauth}: {s} {e}");
    }
    for path in ["client-secret", "refresh-token"] {
        let url = format!("/v1/destinations/crm/{path}");
        let (s, e) = w.call(Method::PUT, &url, None, Some(json!({"value": "a\r\nX-Evil: 1"}))).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {e}");
        let (s, _) = w.call(Method::PUT, &url, None, Some(json!({"value": "x".repeat(5000)}))).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path}");
    }
}

/// What every refresh token starts with (no other text holds it).
const REFRESH: &str = "zq6rt";

/// A token endpoint of the refresh-token grant that rotates (as Calendly's does): it takes only
/// the refresh token it gave last (`zq6rt-0` first), answers a token and `zq6rt-<n+1>`, and
/// refuses the old one with `400 invalid_grant`.
async fn rotating_endpoint() -> (SocketAddr, Requests) {
    let requests: Requests = Arc::default();
    let app = axum::Router::new()
        .route(
            "/oauth/token",
            axum::routing::post(|State(r): State<Requests>, form: String| async move {
                let mut r = r.lock().unwrap();
                let current = format!("{REFRESH}-{}", r.iter().filter(|(h, _)| h.contains_key("accepted")).count());
                let accepted = form.contains(&format!("refresh_token={current}&"));
                let mark = if accepted { "accepted" } else { "refused" };
                r.push((BTreeMap::from([(mark.to_owned(), String::new())]), form));
                if !accepted {
                    let refusal = json!({"error": "invalid_grant"});
                    return (StatusCode::BAD_REQUEST, axum::Json(refusal));
                }
                let n = r.iter().filter(|(h, _)| h.contains_key("accepted")).count();
                let answer = json!({"access_token": format!("{TOKEN}-r{n}"), "token_type": "bearer",
                    "expires_in": 3600, "refresh_token": format!("{REFRESH}-{n}")});
                (StatusCode::OK, axum::Json(answer))
            }),
        )
        .with_state(requests.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, requests)
}

/// A refresh token the endpoint rotates is kept (write-only, in the destination's secret
/// store) and sent on the next refresh, which the endpoint refuses with the old one; keeping
/// it does not drop the token just minted; neither token is in a row, an answer or a log line.
#[tokio::test]
async fn a_rotated_refresh_token_is_kept_and_used_for_the_next_refresh() {
    let (lines, _logs) = leaks::capture_this_thread();
    let w = world().await;
    let (issuer, requests) = rotating_endpoint().await;
    let calendly = |at: SocketAddr| {
        let oauth = json!({"grant": "refresh_token", "token_url": format!("http://{issuer}/oauth/token"),
            "client_id": "cal-client", "client_auth": "body"});
        let w = &w;
        async move { destination(w, &w.key, "calendly", at, json!({"oauth": oauth})).await }
    };
    let (addr, seen) = receiver(vec![]).await;
    calendly(addr).await;
    let url = "/v1/destinations/calendly/refresh-token";
    let (s, e) = w.call(Method::PUT, url, None, Some(json!({"value": format!("{REFRESH}-0")}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    let run = |key: &'static str| {
        let w = &w;
        async move {
            let params = json!({"destination": "calendly", "method": "GET", "path": "/users/me"});
            let (_, j) = w.submit(key, json!({"task_type": "http.request", "params": params})).await;
            let id: JobId = j["id"].as_str().unwrap().parse().unwrap();
            w.platform.executor().run_dispatched(&[id]).await.unwrap();
            (id, job(w, id).await)
        }
    };
    let (first, j) = run("cal-1").await;
    assert_eq!(j["status"], "succeeded", "{j}");
    // The next job uses the cached token: keeping the rotated refresh token is not a new grant.
    let (second, j) = run("cal-2").await;
    assert_eq!(j["status"], "succeeded", "{j}");
    assert_eq!(requests.lock().unwrap().len(), 1, "one token request for two jobs");
    let auths: Vec<String> = seen.lock().unwrap().iter().map(|r| r.headers["authorization"].clone()).collect();
    assert_eq!(auths, [format!("Bearer {TOKEN}-r1"), format!("Bearer {TOKEN}-r1")]);

    // A 401 drops the token: the refresh that follows sends the rotated token, which alone works.
    let (addr401, seen401) = receiver(vec![Reply::Status(401, vec![], r#"{"message":"expired"}"#)]).await;
    calendly(addr401).await;
    let (third, j) = run("cal-3").await;
    assert_eq!((j["status"].as_str(), j["attempt"].as_i64()), (Some("succeeded"), Some(1)), "{j}");
    let forms: Vec<(bool, String)> =
        requests.lock().unwrap().iter().map(|(h, f)| (h.contains_key("accepted"), f.clone())).collect();
    assert_eq!(
        forms,
        [
            (true, format!("grant_type=refresh_token&refresh_token={REFRESH}-0&client_id=cal-client")),
            (true, format!("grant_type=refresh_token&refresh_token={REFRESH}-1&client_id=cal-client")),
        ]
    );
    let auths: Vec<String> = seen401.lock().unwrap().iter().map(|r| r.headers["authorization"].clone()).collect();
    assert_eq!(auths, [format!("Bearer {TOKEN}-r1"), format!("Bearer {TOKEN}-r2")]);

    // Neither token, nor any refresh token, in a row, an answer or a log line.
    for mark in [TOKEN, REFRESH] {
        assert_eq!(rows_holding(&w, mark).await, Vec::<String>::new(), "{mark}");
    }
    for id in [first, second, third] {
        for path in [format!("/v1/jobs/{id}"), format!("/v1/jobs/{id}/http-calls"), format!("/v1/jobs/{id}/events")] {
            let (_, body) = w.call(Method::GET, &path, None, None).await;
            assert!(!body.to_string().contains(TOKEN) && !body.to_string().contains(REFRESH), "{path}: {body}");
        }
    }
    let (_, d) = w.call(Method::GET, "/v1/destinations/calendly", None, None).await;
    assert!(!d.to_string().contains(REFRESH) && d["refresh_token_set_at"].is_string(), "{d}");
    tracing::debug!(event = "test.oauth.sentinel", "captured");
    let logged = lines.text();
    assert!(logged.contains("test.oauth.sentinel"), "the log was captured: {logged}");
    assert!(!logged.contains(TOKEN) && !logged.contains(REFRESH), "{logged}");
}
