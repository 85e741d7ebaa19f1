//! Signed callbacks end to end: a real HTTP receiver on 127.0.0.1 (allow-listed), the
//! delivery job's retries, rotation, 410, shadow mode, the address guard, the client module,
//! and correlation through children, callbacks and log lines.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::client::{Client, Projection, Verifier};
use taskdeck::job::JobId;
use taskdeck::job::terms::{CorrelationId, IdempotencyKey, Limits};
use taskdeck::outbound::AllowList;
use taskdeck::store::jobs::{self, NewJob};
use taskdeck::store::modes;
use tokio::sync::watch;

use crate::support::{World, test_settings};

/// What the receiver got: (headers, body) per request.
pub(crate) type Seen = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// A callback receiver answering from a script (then 200), recording every request.
pub(crate) async fn receiver(ip: &str, script: Vec<(u16, Option<&'static str>)>) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let (s2, sc2) = (seen.clone(), script.clone());
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
        let (seen, script) = (s2.clone(), sc2.clone());
        async move {
            seen.lock().unwrap().push((headers, body.to_vec()));
            let (status, retry_after) = script.lock().unwrap().pop_front().unwrap_or((200, None));
            let mut res = axum::response::Response::new(axum::body::Body::from("ok"));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            if let Some(r) = retry_after {
                let name = if status == 302 { "location" } else { "retry-after" };
                res.headers_mut().insert(name, r.parse().unwrap());
            }
            res
        }
    });
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

/// A world whose callbacks may reach 127.0.0.1 only, with callbacks switched on for real.
pub(crate) async fn world() -> World {
    let mut s = test_settings();
    s.callback_allow = AllowList::parse("127.0.0.1/32").unwrap();
    let w = World::with_settings(s).await;
    let mut db = w.db().await;
    modes::set(&mut db, "shadow", false, "test", None).await.unwrap();
    modes::set(&mut db, "write:callbacks", true, "test", None).await.unwrap();
    w
}

/// Run the due `callback.deliver` jobs once (time travel: backoffs are made due now).
pub(crate) async fn deliver_due(w: &World) -> usize {
    let db = w.db().await;
    let ids: Vec<JobId> = db
        .query(
            "UPDATE jobs SET run_at = now() WHERE task_type = 'callback.deliver' AND status = 'pending' RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    w.platform.executor().run_dispatched(&ids).await.unwrap().1
}

fn id_of(job: &Value) -> JobId {
    job["id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no id in {job}"))
}

async fn run_job(w: &World, key: &str, body: Value) -> JobId {
    let (s, job) = w.submit(key, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let id = id_of(&job);
    assert_eq!(w.platform.executor().run_dispatched(&[id]).await.unwrap().1, 1);
    id
}

#[tokio::test]
async fn a_callback_failing_three_times_then_succeeding_arrives_signed() {
    let w = world().await;
    let (addr, seen) = receiver("127.0.0.1", vec![(500, None), (503, Some("600")), (500, None)]).await;
    let (s, settings) =
        w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": format!("http://{addr}/hooks")}))).await;
    assert_eq!(s, StatusCode::OK, "{settings}");
    let secret = settings["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    let (_, again) = w.call(Method::GET, "/v1/callbacks", None, None).await;
    assert!(again.get("secret").is_none(), "the secret is shown once: {again}");

    let id = run_job(&w, "order-1", json!({"task_type": "noop", "correlation_id": "order-42"})).await;
    // The delivery job committed with the success, owned by the platform (not in the feed).
    let (_, feed) = w.call(Method::GET, "/v1/jobs", None, None).await;
    assert_eq!(feed["jobs"].as_array().unwrap().len(), 1, "{feed}");
    let next_run = "SELECT extract(epoch FROM run_at - now())::float8 FROM jobs WHERE task_type = 'callback.deliver'";
    for n in 1..=4 {
        assert_eq!(deliver_due(&w).await, 1, "delivery {n}");
        let wait: f64 = w.db().await.query_one(next_run, &[]).await.unwrap().get(0);
        match n {
            1 => assert!((44.0..=60.5).contains(&wait), "first retry after 45-60 s, got {wait}"),
            3 => assert!((179.0..=240.5).contains(&wait), "third retry after 180-240 s, got {wait}"),
            2 => assert!(wait > 590.0, "Retry-After 600 honoured, got {wait}"),
            _ => {}
        }
    }
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 4);
    let ids: Vec<&str> = got.iter().map(|(h, _)| h["webhook-id"].to_str().unwrap()).collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "one webhook-id across retries: {ids:?}");
    let (headers, body) = &got[3];
    let event = Verifier::new([secret.clone()]).verify(headers, body).expect("a valid signature");
    assert_eq!(event.kind, "job.succeeded");
    assert_eq!(
        (event.data["id"].as_str(), event.data["correlation_id"].as_str()),
        (Some(id.to_string().as_str()), Some("order-42"))
    );
    assert!(Verifier::new(["whsec_AAAA"]).verify(headers, body).is_err(), "another secret fails");
    let mut tampered = body.clone();
    tampered[0] = b' ';
    assert!(Verifier::new([secret.clone()]).verify(headers, &tampered).is_err(), "a changed body fails");

    let (_, attempts) = w.call(Method::GET, &format!("/v1/jobs/{id}/callbacks"), None, None).await;
    let outcomes: Vec<(&str, i64)> = attempts["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["outcome"].as_str().unwrap(), a["http_status"].as_i64().unwrap()))
        .collect();
    assert_eq!(outcomes, [("failed", 500), ("failed", 503), ("failed", 500), ("delivered", 200)]);
    assert_eq!(
        w.count("SELECT count(*) FROM jobs WHERE task_type = 'callback.deliver' AND status = 'succeeded'", &[]).await,
        1
    );

    // Rotation: two secrets sign until the overlap ends; a receiver with either accepts.
    let (_, rotated) = w.call(Method::POST, "/v1/callbacks/rotate", None, Some(json!({"overlap_seconds": 3600}))).await;
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, secret);
    assert!(rotated["previous_valid_until"].is_string());
    run_job(&w, "order-2", json!({"task_type": "noop"})).await;
    assert_eq!(deliver_due(&w).await, 1);
    let (headers, body) = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(headers["webhook-signature"].to_str().unwrap().split(' ').count(), 2);
    Verifier::new([secret.clone()]).verify(&headers, &body).expect("the old secret still verifies");
    Verifier::new([new_secret.clone()]).verify(&headers, &body).expect("the new secret verifies");
}

#[tokio::test]
async fn gone_stops_retries_and_shadow_mode_sends_nothing() {
    let w = world().await;
    let (addr, seen) = receiver("127.0.0.1", vec![(410, None)]).await;
    w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": format!("http://{addr}/")}))).await;
    let id = run_job(&w, "gone", json!({"task_type": "noop"})).await;
    assert_eq!(deliver_due(&w).await, 1);
    assert_eq!(deliver_due(&w).await, 0, "no retry after 410");
    let (_, a) = w.call(Method::GET, &format!("/v1/jobs/{id}/callbacks"), None, None).await;
    assert_eq!(a["attempts"][0]["outcome"], "gone");

    // A job's own callback_url overrides the tenant's; in shadow mode nothing is sent.
    modes::set(&mut w.db().await, "shadow", true, "test", None).await.unwrap();
    let (other, other_seen) = receiver("127.0.0.1", vec![]).await;
    let id = run_job(&w, "own", json!({"task_type": "noop", "callback_url": format!("http://{other}/mine")})).await;
    assert_eq!(deliver_due(&w).await, 1);
    let (_, a) = w.call(Method::GET, &format!("/v1/jobs/{id}/callbacks"), None, None).await;
    assert_eq!(
        (a["attempts"][0]["outcome"].as_str(), a["attempts"][0]["url"].as_str()),
        (Some("shadowed"), Some(format!("http://{other}/mine").as_str()))
    );
    assert!(other_seen.lock().unwrap().is_empty() && seen.lock().unwrap().len() == 1);
    // A cancelled job calls back too (sent by the sweep).
    let (_, later) = w.submit("later", json!({"task_type": "noop", "delay_seconds": 60})).await;
    w.call(Method::POST, &format!("/v1/jobs/{}/cancel", id_of(&later)), None, None).await;
    let key = format!("callback:{}:cancelled:0", id_of(&later));
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE idempotency_key = $1", &[&key]).await, 1);
    // A callback_url without the tenant's secret, or not http(s), is refused at submit.
    let fresh = World::new().await;
    let (s, e) = fresh.submit("x", json!({"task_type": "noop", "callback_url": "https://example.com/"})).await;
    assert_eq!((s.as_u16(), e["error"]["code"].as_str()), (409, Some("callbacks_not_configured")));
    let (s, e) = w.submit("y", json!({"task_type": "noop", "callback_url": "ftp://example.com/"})).await;
    assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("callback_url")));
    for (i, url) in [
        "https://example.com:3874*",
        "https://example.com/a b",
        "https://example.com/%zz",
        "https://example.com/#frag",
        "https://a.1/",
    ]
    .iter()
    .enumerate()
    {
        let (s, e) = w.submit(&format!("shape-{i}"), json!({"task_type": "noop", "callback_url": url})).await;
        assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("callback_url")), "{url}");
    }
    let (s, e) = w
        .submit("z", json!({"task_type": "noop", "callback_url": "https://hooks.example.com:8443/in/%C3%A9?a=1&b=%2F"}))
        .await;
    assert_eq!(s.as_u16(), 202, "{e}");
}

#[tokio::test]
async fn the_ssrf_corpus_never_connects() {
    // No allow-list: the platform's own guard, writes switched on.
    let w = World::new().await;
    let mut db = w.db().await;
    modes::set(&mut db, "shadow", false, "test", None).await.unwrap();
    modes::set(&mut db, "write:callbacks", true, "test", None).await.unwrap();
    w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": null}))).await;
    let (addr, seen) = receiver("127.0.0.1", vec![]).await;
    let p = addr.port();
    // Hosts written as an address the guard refuses: refused when set, at submit and at
    // `PUT /v1/callbacks`, with a 422 naming the field.
    let literal = [
        format!("http://127.0.0.1:{p}/"),
        format!("http://[::1]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://[::ffff:7f00:1]:{p}/"),
        format!("http://[::ffff:0:7f00:1]:{p}/"),
        format!("http://0.0.0.0:{p}/"),
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://[::ffff:169.254.169.254]/latest/meta-data/".into(),
        "http://[fd00:ec2::254]/".into(),
        "http://[64:ff9b:1::a00:1]/".into(),
        "http://10.0.0.1/".into(),
        "http://192.168.1.1/".into(),
        "http://172.16.0.1/".into(),
        "http://100.100.100.200/".into(),
        // Numeric spellings other than dotted quads are not host names: refused when set.
        format!("http://2130706433:{p}/"),
        format!("http://0x7f.1:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        format!("http://0x7f000001:{p}/"),
        format!("http://127.1:{p}/"),
    ];
    for (i, url) in literal.iter().enumerate() {
        let (s, e) = w.submit(&format!("literal-{i}"), json!({"task_type": "noop", "callback_url": url})).await;
        assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("callback_url")), "{url}: {e}");
        let (s, e) = w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": url}))).await;
        assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("url")), "{url}: {e}");
    }
    // Names are judged where they resolve, at delivery.
    let corpus = [format!("http://localhost:{p}/"), format!("http://LocalHost:{p}/")];
    for (i, url) in corpus.iter().enumerate() {
        let id = run_job(&w, &format!("ssrf-{i}"), json!({"task_type": "noop", "callback_url": url})).await;
        deliver_due(&w).await;
        let (_, a) = w.call(Method::GET, &format!("/v1/jobs/{id}/callbacks"), None, None).await;
        let a = &a["attempts"][0];
        assert_eq!(a["outcome"], "refused", "{url}: {a}");
    }
    assert!(seen.lock().unwrap().is_empty(), "a refused callback connected");
    // Refused for good, and the tenant's own doing: each delivery failed, shown on the job's
    // callback attempts; no operator exception, one count per tenant and cause.
    let failed = "SELECT count(*) FROM jobs WHERE task_type = 'callback.deliver' AND status = 'failed'";
    assert_eq!(w.count(failed, &[]).await, corpus.len() as i64);
    assert_eq!(
        w.count("SELECT count(*) FROM exceptions", &[]).await,
        0,
        "a tenant's refused callbacks are not operator work"
    );
    let faults = "SELECT count FROM tenant_faults WHERE tenant_id = $1 AND task_type = 'callback.deliver' AND kind = 'fatal_error'";
    assert_eq!(w.count(faults, &[&w.tenant.id]).await, corpus.len() as i64);

    // A redirect (even from an allowed receiver) is not followed: a failed attempt.
    let (trap, trapped) = receiver("127.0.0.2", vec![]).await;
    let location: &'static str = Box::leak(format!("http://{trap}/").into_boxed_str());
    let mut s = test_settings();
    s.callback_allow = AllowList::parse("127.0.0.1/32").unwrap();
    let w2 = World::with_settings(s).await;
    let mut db = w2.db().await;
    modes::set(&mut db, "shadow", false, "test", None).await.unwrap();
    modes::set(&mut db, "write:callbacks", true, "test", None).await.unwrap();
    let (redirector, _) = receiver("127.0.0.1", vec![(302, Some(location))]).await;
    w2.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": format!("http://{redirector}/")}))).await;
    let id = run_job(&w2, "redirect", json!({"task_type": "noop"})).await;
    deliver_due(&w2).await;
    let (_, a) = w2.call(Method::GET, &format!("/v1/jobs/{id}/callbacks"), None, None).await;
    assert_eq!(
        (a["attempts"][0]["outcome"].as_str(), a["attempts"][0]["http_status"].as_i64()),
        (Some("failed"), Some(302))
    );
    assert!(trapped.lock().unwrap().is_empty(), "the redirect was followed");
}

#[tokio::test]
async fn a_correlation_id_reaches_children_callbacks_and_log_lines() {
    // One process-wide subscriber (a scoped one misses lines when other tests run beside it),
    // recording only what happens inside spans carrying this test's correlation id.
    use crate::support::leaks::Lines;
    static LINES: std::sync::OnceLock<Lines> = std::sync::OnceLock::new();
    let lines = LINES.get_or_init(|| {
        let lines = Lines::default();
        let writer = lines.clone();
        let filter = "[job{correlation_id=order-77}]=debug,[request{correlation_id=order-77}]=debug";
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other test sets a global subscriber");
        lines
    });

    let w = world().await;
    let (addr, seen) = receiver("127.0.0.1", vec![]).await;
    w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": format!("http://{addr}/")}))).await;
    let (_, parent) =
        w.submit("top", json!({"task_type": "noop", "correlation_id": "order-77", "delay_seconds": 600})).await;
    let pid = id_of(&parent);
    assert!(jobs::wait_for_children(&w.db().await, w.tenant.id, pid, 2).await.unwrap());
    let parent = jobs::get(&w.db().await, w.tenant.id, pid).await.unwrap().unwrap();
    let kids: Vec<NewJob> = (0..2)
        .map(|i| {
            NewJob::child_of(
                parent.id,
                &CorrelationId::parse(&parent.correlation_id).unwrap(),
                NewJob {
                    limits: Limits::fixed(1, 10),
                    ..NewJob::new("noop", json!({}), IdempotencyKey::parse(&format!("top:{i}")).unwrap())
                },
            )
        })
        .collect();
    let kid_ids: Vec<JobId> = kids.iter().map(|k| k.id).collect();
    w.platform.intake.enqueue(w.tenant.id, kids).await.unwrap();
    w.platform.executor().run_dispatched(&kid_ids).await.unwrap();
    // Children finished: the sweep finishes the parent, which calls back.
    w.platform.sweeper().pass().await.unwrap();
    assert_eq!(deliver_due(&w).await, 1);

    let (_, chain) = w.call(Method::GET, "/v1/jobs?correlation_id=order-77", None, None).await;
    let chain: Vec<&Value> = chain["jobs"].as_array().unwrap().iter().collect();
    assert_eq!(chain.len(), 3, "parent and both children");
    assert!(chain.iter().all(|j| j["correlation_id"] == "order-77"));
    assert_eq!(chain.iter().filter(|j| j["parent_id"] == pid.to_string()).count(), 2);
    let (headers, body) = seen.lock().unwrap()[0].clone();
    let event: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (event["type"].as_str(), event["data"]["correlation_id"].as_str()),
        (Some("job.succeeded"), Some("order-77"))
    );
    assert_eq!(event["data"]["progress"]["succeeded"], 2);
    assert!(headers.contains_key("webhook-signature"));

    let text = lines.text();
    let with_id: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &Value| l["span"]["correlation_id"] == "order-77")
        .collect();
    for id in kid_ids.iter().chain([&pid]) {
        assert!(with_id.iter().any(|l| l["span"]["job_id"] == id.to_string()), "no log line for {id} in:\n{text}");
    }
    assert!(with_id.iter().any(|l| l["span"]["task_type"] == "callback.deliver"), "the delivery logs under the id");
    assert!(with_id.iter().any(|l| l["span"]["name"] == "request"), "API requests log under the id");
}

#[tokio::test]
async fn the_client_module_verifies_reconciles_and_refreshes_against_a_running_router() {
    let w = World::new().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = w.router.clone();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let client = Client::new(&format!("http://{addr}"), &w.key).unwrap();

    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(id_of(&w.submit(&format!("c{i}"), json!({"task_type": "noop"})).await.1));
    }
    let mut projection = Projection::default();
    assert_eq!(projection.reconcile(&client).await.unwrap(), 7);
    assert!(ids.iter().all(|id| projection.jobs[id]["status"] == "pending"));
    // Work happens, callbacks are lost: reconciliation from the cursor catches up.
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(1, &stop);
    for id in &ids {
        w.wait_for(&id.to_string(), Duration::from_secs(10), |j| j["status"] == "succeeded").await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    let read = projection.reconcile(&client).await.unwrap();
    assert!(read >= 7, "every changed job comes again ({read})");
    assert!(ids.iter().all(|id| projection.jobs[id]["status"] == "succeeded"));
    // A stale page cannot move a job backwards.
    let mut stale = projection.jobs[&ids[0]].clone();
    stale["status"] = json!("pending");
    stale["updated_at"] = json!("2000-01-01T00:00:00Z");
    assert!(!projection.apply(stale));
    // Refresh one; an unknown id is None.
    assert_eq!(projection.refresh(&client, ids[1]).await.unwrap().unwrap()["status"], "succeeded");
    assert!(client.job(JobId::new()).await.unwrap().is_none());
    // Past the settle window with nothing new: an empty page, a cursor that still works.
    let (_, page) = w
        .call(Method::GET, &format!("/v1/jobs?updated_since={}", projection.cursor.as_ref().unwrap()), None, None)
        .await;
    assert!(page["resume_cursor"].is_string());
    let (s, e) = w.call(Method::GET, "/v1/jobs?updated_since=garbage", None, None).await;
    assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (400, Some("updated_since")));
}

#[tokio::test]
async fn a_tenants_failing_callbacks_are_its_own_and_reach_operators_once_per_cause() {
    // The reproduction: 27 jobs whose callback_url the guard refuses. Each is refused at submit,
    // so nothing is created and no operator exception can follow.
    let plain = World::new().await;
    plain.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": null}))).await;
    for i in 0..27 {
        let (s, e) = plain
            .submit(&format!("refused-{i}"), json!({"task_type": "noop", "callback_url": "http://127.0.0.1/"}))
            .await;
        assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("callback_url")), "{e}");
    }
    assert_eq!(plain.count("SELECT count(*) FROM jobs", &[]).await, 0);

    // An endpoint that never answers 2xx: every delivery attempt fails, then the attempts run out.
    let w = world().await;
    let attempts = taskdeck::store::callbacks::MAX_ATTEMPTS as usize;
    let (addr, seen) = receiver("127.0.0.1", vec![(500, None); 3 * attempts]).await;
    w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": format!("http://{addr}/hook")}))).await;
    let first = run_job(&w, "first", json!({"task_type": "noop"})).await;
    for _ in 0..attempts {
        deliver_due(&w).await;
    }
    assert_eq!(seen.lock().unwrap().len(), attempts, "every attempt reached the endpoint");
    let (_, a) = w.call(Method::GET, &format!("/v1/jobs/{first}/callbacks"), None, None).await;
    assert_eq!(a["attempts"].as_array().unwrap().len(), attempts, "the tenant sees every attempt: {a}");
    let failed = "SELECT count(*) FROM jobs WHERE task_type = 'callback.deliver' AND status = 'failed'";
    assert_eq!(w.count(failed, &[]).await, 1);
    assert_eq!(w.count("SELECT count(*) FROM exceptions", &[]).await, 0, "not an operator exception");

    // Operators get one signal for the tenant and cause, not one per job: a second failure
    // within the hour counts, and signals nothing new.
    let sweeper = w.platform.sweeper();
    assert_eq!(sweeper.pass().await.unwrap().tenant_faults_signalled, 1);
    assert_eq!(sweeper.pass().await.unwrap().tenant_faults_signalled, 0, "nothing new since");
    run_job(&w, "second", json!({"task_type": "noop"})).await;
    for _ in 0..attempts {
        deliver_due(&w).await;
    }
    assert_eq!(w.count(failed, &[]).await, 2);
    assert_eq!(sweeper.pass().await.unwrap().tenant_faults_signalled, 0, "at most one signal an hour");
    let op = taskdeck::store::operators::create(&w.db().await, "ops").await.unwrap().1;
    let (s, list) = w.call_as(&op, Method::GET, "/v1/admin/tenant-faults", None, None).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let row = &list["tenant_faults"][0];
    assert_eq!(
        (row["task_type"].as_str(), row["kind"].as_str(), row["count"].as_i64()),
        (Some("callback.deliver"), Some("attempts_exhausted"), Some(2)),
        "{list}"
    );
    assert_eq!(row["tenant_id"], json!(w.tenant.id));
    let (s, _) = w.call(Method::GET, "/v1/admin/tenant-faults", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "a tenant key cannot read operators' routes");
}
