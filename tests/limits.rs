//! Per-tenant limits on the rows a tenant's calls create: each kind refused at its limit with a
//! clear answer, updates never refused, an operator's override for one tenant only, creates
//! racing at the limit, batches refused whole, and the operator route's hostile input.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use taskdeck::limits::Defaults;
use taskdeck::store::operators;
use tower::ServiceExt;

use crate::support::{World, test_settings};

/// A world whose tenants get these limits by default.
async fn world(limits: Defaults) -> World {
    let mut s = test_settings();
    s.tenant_limits = limits;
    World::with_settings(s).await
}

fn small() -> Defaults {
    Defaults { destinations: 2, templates: 2, suppressions: 2, topic_opt_outs: 2, pending_jobs: 3 }
}

async fn put(w: &World, key: &str, path: &str, body: Value) -> (StatusCode, Value) {
    w.call_as(key, Method::PUT, path, None, Some(body.to_string().into_bytes())).await
}

fn destination() -> Value {
    json!({"base_url": "https://crm.example/api"})
}

fn template() -> Value {
    json!({"subject": "Hello", "text": "Hi {{ name }}"})
}

/// The answer at a limit: its status, and a body naming the kind, the limit and the way out.
fn assert_refused(status: StatusCode, body: &Value, want: StatusCode, kind: &str, limit: i64) {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert_eq!(e["code"], "limit_reached", "{body}");
    assert_eq!(e["kind"], kind, "{body}");
    assert_eq!(e["limit"], limit, "{body}");
    assert!(e["message"].as_str().unwrap().contains("ask the operator to raise it"), "{body}");
}

#[tokio::test]
async fn each_kind_is_refused_at_its_limit_and_updates_still_pass() {
    let w = world(small()).await;
    let k = w.key.clone();

    // Destinations: two, then a third refused; replacing one at the limit works; a deleted one
    // makes room.
    for name in ["crm", "billing"] {
        assert_eq!(put(&w, &k, &format!("/v1/destinations/{name}"), destination()).await.0, StatusCode::OK);
    }
    let (s, e) = put(&w, &k, "/v1/destinations/erp", destination()).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "destinations", 2);
    let (s, d) = put(&w, &k, "/v1/destinations/crm", json!({"base_url": "https://crm2.example/api"})).await;
    assert_eq!((s, d["base_url"].as_str()), (StatusCode::OK, Some("https://crm2.example/api")), "{d}");
    assert_eq!(w.call(Method::DELETE, "/v1/destinations/billing", None, None).await.0, StatusCode::NO_CONTENT);
    assert_eq!(put(&w, &k, "/v1/destinations/erp", destination()).await.0, StatusCode::OK);
    let names = w.count("SELECT count(*) FROM http_destinations", &[]).await;
    assert_eq!(names, 2);

    // Templates.
    for name in ["welcome", "receipt"] {
        assert_eq!(put(&w, &k, &format!("/v1/templates/{name}"), template()).await.0, StatusCode::OK);
    }
    let (s, e) = put(&w, &k, "/v1/templates/reminder", template()).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "templates", 2);
    let (s, t) = put(&w, &k, "/v1/templates/welcome", json!({"subject": "Welcome back", "text": "x"})).await;
    assert_eq!((s, t["subject"].as_str()), (StatusCode::OK, Some("Welcome back")), "{t}");

    // Suppressions added by hand; one listed already is no new row.
    for a in ["a@x.example", "b@x.example"] {
        assert_eq!(put(&w, &k, &format!("/v1/suppressions/{a}"), json!({})).await.0, StatusCode::NO_CONTENT);
    }
    let (s, e) = put(&w, &k, "/v1/suppressions/c@x.example", json!({})).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "suppressions", 2);
    assert_eq!(put(&w, &k, "/v1/suppressions/a@x.example", json!({})).await.0, StatusCode::NO_CONTENT);
    assert_eq!(w.count("SELECT count(*) FROM suppressions", &[]).await, 2);

    // Topic opt-outs, one row per address and topic; one held already is no new row.
    for t in ["a@x.example/news", "a@x.example/offers"] {
        assert_eq!(put(&w, &k, &format!("/v1/topic-opt-outs/{t}"), json!({})).await.0, StatusCode::NO_CONTENT);
    }
    let (s, e) = put(&w, &k, "/v1/topic-opt-outs/a@x.example/digest", json!({})).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "topic_opt_outs", 2);
    assert_eq!(put(&w, &k, "/v1/topic-opt-outs/a@x.example/news", json!({})).await.0, StatusCode::NO_CONTENT);
    assert_eq!(w.count("SELECT count(*) FROM topic_opt_outs", &[]).await, 2);

    // Unfinished jobs (nothing runs them here): the fourth answers 429 with Retry-After.
    for i in 0..3 {
        let (s, job) = w.submit(&format!("j{i}"), json!({"task_type": "test.effect"})).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    }
    let req = Request::post("/v1/jobs")
        .header("authorization", format!("Bearer {k}"))
        .header("idempotency-key", "j3")
        .header("content-type", "application/json")
        .body(Body::from(json!({"task_type": "test.effect"}).to_string()))
        .unwrap();
    let res = w.router.clone().oneshot(req).await.unwrap();
    assert_eq!(res.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
    let (s, e) = crate::support::send(&w.router, {
        Request::post("/v1/jobs")
            .header("authorization", format!("Bearer {k}"))
            .header("idempotency-key", "j3")
            .header("content-type", "application/json")
            .body(Body::from(json!({"task_type": "test.effect"}).to_string()))
            .unwrap()
    })
    .await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 3);
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 3);

    // The tenant reads its own limits and what it uses.
    let (s, mine) = w.call(Method::GET, "/v1/limits", None, None).await;
    assert_eq!(s, StatusCode::OK, "{mine}");
    let used: Vec<(String, i64, i64)> = mine["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["kind"].as_str().unwrap().to_owned(), l["limit"].as_i64().unwrap(), l["used"].as_i64().unwrap()))
        .collect();
    let want = [
        ("destinations", 2, 2),
        ("templates", 2, 2),
        ("suppressions", 2, 2),
        ("topic_opt_outs", 2, 2),
        ("pending_jobs", 3, 3),
    ];
    assert_eq!(used, want.map(|(k, l, u)| (k.to_owned(), l, u)).to_vec());
}

#[tokio::test]
async fn an_override_raises_one_tenants_limit_and_not_anothers() {
    let w = world(Defaults { destinations: 1, ..small() }).await;
    let op = operators::create(&w.db().await, "ops").await.unwrap().1;
    let (other, other_key) = w.other_tenant("globex").await;
    let path = format!("/v1/admin/tenants/{}/limits", w.tenant.id);

    let (s, set) = put(&w, &op, &path, json!({"destinations": 3, "reason": "three CRMs"})).await;
    assert_eq!(s, StatusCode::OK, "{set}");
    let d = set["limits"].as_array().unwrap().iter().find(|l| l["kind"] == "destinations").unwrap().clone();
    assert_eq!(d, json!({"kind": "destinations", "limit": 3, "default": 1, "override": 3, "used": 0}));

    for name in ["a", "b", "c"] {
        let (s, e) = put(&w, &w.key, &format!("/v1/destinations/{name}"), destination()).await;
        assert_eq!(s, StatusCode::OK, "{e}");
    }
    let (s, e) = put(&w, &w.key, "/v1/destinations/d", destination()).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "destinations", 3);
    // The other tenant keeps the default.
    assert_eq!(put(&w, &other_key, "/v1/destinations/a", destination()).await.0, StatusCode::OK);
    let (s, e) = put(&w, &other_key, "/v1/destinations/b", destination()).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "destinations", 1);
    let (s, theirs) = w.call_as(&op, Method::GET, &format!("/v1/admin/tenants/{}/limits", other.id), None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        theirs["limits"][0],
        json!({"kind": "destinations", "limit": 1, "default": 1, "override": null, "used": 1})
    );

    // The change is audited with the operator and the reason.
    let audit = w.db().await.query_one("SELECT actor, detail FROM admin_actions", &[]).await.unwrap();
    let (actor, detail): (String, Value) = (audit.get(0), audit.get(1));
    assert_eq!(actor, "ops");
    assert_eq!(detail["changes"]["destinations"], json!({"old": null, "new": 3}));
    assert_eq!(
        (detail["reason"].as_str(), detail["tenant_id"].as_str()),
        (Some("three CRMs"), Some(&*w.tenant.id.to_string()))
    );

    // Pending jobs: an override applies to the next submission in this process at once.
    let (s, _) = put(&w, &op, &path, json!({"pending_jobs": 1, "destinations": null})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(w.submit("p0", json!({"task_type": "test.effect"})).await.0, StatusCode::ACCEPTED);
    let (s, e) = w.submit("p1", json!({"task_type": "test.effect"})).await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 1);
    let (s, job) = w
        .call_as(
            &other_key,
            Method::POST,
            "/v1/jobs",
            Some("p1"),
            Some(json!({"task_type": "test.effect"}).to_string().into_bytes()),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "the other tenant is not held: {job}");
    // Back to the default: three destinations exist, over the default of 1, none is removed.
    let (s, e) = put(&w, &w.key, "/v1/destinations/d", destination()).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "destinations", 1);
    assert_eq!(w.count("SELECT count(*) FROM http_destinations WHERE tenant_id = $1", &[&w.tenant.id]).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_racing_at_the_limit_leave_exactly_the_limit() {
    const LIMIT: i64 = 5;
    const RACERS: usize = 16;
    let w = world(Defaults { templates: LIMIT, suppressions: LIMIT, ..small() }).await;
    for i in 0..LIMIT - 1 {
        assert_eq!(put(&w, &w.key, &format!("/v1/templates/t{i}"), template()).await.0, StatusCode::OK);
        let a = format!("/v1/suppressions/s{i}@x.example");
        assert_eq!(put(&w, &w.key, &a, json!({})).await.0, StatusCode::NO_CONTENT);
    }
    for kind in ["templates", "suppressions"] {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
        let calls = (0..RACERS).map(|i| {
            let (router, key, barrier) = (w.router.clone(), w.key.clone(), barrier.clone());
            let (path, body) = match kind {
                "templates" => (format!("/v1/templates/race{i}"), template().to_string()),
                _ => (format!("/v1/suppressions/race{i}@x.example"), String::new()),
            };
            tokio::spawn(async move {
                let req = Request::put(path)
                    .header("authorization", format!("Bearer {key}"))
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap();
                barrier.wait().await;
                crate::support::send(&router, req).await
            })
        });
        let answers: Vec<(StatusCode, Value)> =
            futures::future::join_all(calls).await.into_iter().map(Result::unwrap).collect();
        let passed = answers.iter().filter(|(s, _)| s.is_success()).count();
        for (s, e) in answers.iter().filter(|(s, _)| !s.is_success()) {
            assert_refused(*s, e, StatusCode::CONFLICT, kind, LIMIT);
        }
        let table = if kind == "templates" { "email_templates" } else { "suppressions" };
        let rows = w.count(&format!("SELECT count(*) FROM {table}"), &[]).await;
        assert_eq!((passed, rows), (1, LIMIT), "{kind}: one racer wins, the rest are refused");
    }
}

#[tokio::test]
async fn a_batch_that_would_cross_the_pending_limit_inserts_nothing() {
    let w = world(Defaults { pending_jobs: 5, ..small() }).await;
    for i in 0..3 {
        assert_eq!(w.submit(&format!("s{i}"), json!({"task_type": "test.effect"})).await.0, StatusCode::ACCEPTED);
    }
    let batch = |keys: &[&str]| {
        let jobs: Vec<Value> = keys.iter().map(|k| json!({"task_type": "test.effect", "idempotency_key": k})).collect();
        json!({ "jobs": jobs })
    };
    let (s, e) = w.call(Method::POST, "/v1/jobs:batch", None, Some(batch(&["b0", "b1", "b2"]))).await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 5);
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 3, "nothing of the refused batch");
    // Items that are refused on their own do not count; two valid ones fit.
    let mut two = batch(&["b0", "b1"]);
    two["jobs"].as_array_mut().unwrap().push(json!({"task_type": "no.such", "idempotency_key": "b2"}));
    let (s, r) = w.call(Method::POST, "/v1/jobs:batch", None, Some(two)).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let statuses: Vec<u64> = r["results"].as_array().unwrap().iter().map(|i| i["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [202, 202, 422]);
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 5);
    // More than the limit holds at all can never pass: 409, not a wait.
    let (_, other_key) = w.other_tenant("globex").await;
    let six: Vec<String> = (0..6).map(|i| format!("x{i}")).collect();
    let six = batch(&six.iter().map(String::as_str).collect::<Vec<_>>());
    let (s, e) = w.call_as(&other_key, Method::POST, "/v1/jobs:batch", None, Some(six.to_string().into_bytes())).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "pending_jobs", 5);
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 5);
}

#[tokio::test]
async fn the_override_route_refuses_hostile_values_and_other_keys() {
    let w = world(small()).await;
    let op = operators::create(&w.db().await, "ops").await.unwrap().1;
    let path = format!("/v1/admin/tenants/{}/limits", w.tenant.id);
    for body in [
        json!({"destinations": -1}),
        json!({"destinations": 1_000_000_001_i64}),
        json!({"destinations": 1e30}),
        json!({"destinations": 1.5}),
        json!({"destinations": "5"}),
        json!({"destinations": true}),
        json!({"destinations": [5]}),
        json!({"schedules": 5}),
        json!({"templates": 5, "reason": "x".repeat(1001)}),
    ] {
        let (s, e) = put(&w, &op, &path, body.clone()).await;
        assert!(s.is_client_error(), "{body}: {s} {e}");
        assert!(e["error"]["code"].is_string(), "{body}: {e}");
    }
    for raw in [
        br#"{"destinations": 5, "reason": "a\u0000b"}"#.to_vec(),
        b"{\"destinations\": 99999999999999999999999999}".to_vec(),
        b"[5]".to_vec(),
        b"destinations=5".to_vec(),
    ] {
        let (s, e) = w.call_as(&op, Method::PUT, &path, None, Some(raw.clone())).await;
        assert!(s.is_client_error(), "{}: {s} {e}", String::from_utf8_lossy(&raw));
        assert!(e["error"]["code"].is_string(), "{e}");
    }
    assert_eq!(w.count("SELECT count(*) FROM tenant_limits", &[]).await, 0, "nothing was set");
    // A tenant key is refused on the operator routes, an operator key on the tenant's.
    let (s, _) = put(&w, &w.key, &path, json!({"destinations": 1000})).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(w.call(Method::GET, &path, None, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(w.call_as(&op, Method::GET, "/v1/limits", None, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(w.count("SELECT count(*) FROM tenant_limits", &[]).await, 0);
    for bad in ["/v1/admin/tenants/00000000-0000-0000-0000-000000000000/limits", "/v1/admin/tenants/acme/limits"] {
        let (s, e) = put(&w, &op, bad, json!({"destinations": 5})).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{bad}: {e}");
    }
    // A body naming no kind changes nothing.
    let (s, e) = put(&w, &op, &path, json!({"reason": "just looking"})).await;
    assert_eq!((s, e["limits"][0]["limit"].as_i64()), (StatusCode::OK, Some(2)), "{e}");
    assert_eq!(w.count("SELECT count(*) FROM admin_actions", &[]).await, 0, "nothing to audit");
    // Zero is a limit (no new rows), and the largest value is taken.
    let (s, e) = put(&w, &op, &path, json!({"destinations": 0, "templates": 1_000_000_000})).await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let (s, e) = put(&w, &w.key, "/v1/destinations/crm", destination()).await;
    assert_refused(s, &e, StatusCode::CONFLICT, "destinations", 0);
}

#[tokio::test]
async fn another_processes_jobs_count_within_a_second_and_finished_jobs_make_room_at_a_full_count() {
    let w = world(Defaults { pending_jobs: 4, ..small() }).await;
    // A second API process: its own router and counts, the same database.
    let other_process = taskdeck::api::router(w.platform.app_state());
    assert_eq!(submit_on(&w, &w.router, "a0").await.0, StatusCode::ACCEPTED);
    for i in 0..3 {
        assert_eq!(submit_on(&w, &other_process, &format!("b{i}")).await.0, StatusCode::ACCEPTED);
    }
    // This process has admitted one; after a second it reads the other's three.
    tokio::time::sleep(taskdeck::limits::FRESH + std::time::Duration::from_millis(100)).await;
    let (s, e) = submit_on(&w, &w.router, "a1").await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 4);
    // Once older than `SETTLE`, the four are counted with the settled jobs, which are not read
    // again but in a full count: two that finish (cancelled) make room only at the next one.
    tokio::time::sleep(taskdeck::limits::SETTLE.to_std().unwrap()).await;
    let (s, e) = submit_on(&w, &w.router, "a1").await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 4);
    for key in ["a0", "b0"] {
        let sql = "SELECT id::text FROM jobs WHERE idempotency_key = $1";
        let id: String = w.db().await.query_one(sql, &[&key]).await.unwrap().get(0);
        assert_eq!(w.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None, None).await.0, StatusCode::OK);
    }
    let (s, e) = submit_on(&w, &w.router, "a1").await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 4);
    tokio::time::sleep(taskdeck::limits::FULL).await;
    assert_eq!(submit_on(&w, &w.router, "a1").await.0, StatusCode::ACCEPTED);
    assert_eq!(submit_on(&w, &w.router, "a2").await.0, StatusCode::ACCEPTED);
    let (s, e) = submit_on(&w, &w.router, "a3").await;
    assert_refused(s, &e, StatusCode::TOO_MANY_REQUESTS, "pending_jobs", 4);
    let open = "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running', 'waiting')";
    assert_eq!(w.count(open, &[]).await, 4);
}

/// Submit a job as the world's tenant through `router`.
async fn submit_on(w: &World, router: &axum::Router, idem: &str) -> (StatusCode, Value) {
    let req = Request::post("/v1/jobs")
        .header("authorization", format!("Bearer {}", w.key))
        .header("idempotency-key", idem)
        .header("content-type", "application/json")
        .body(Body::from(json!({"task_type": "test.effect"}).to_string()))
        .unwrap();
    crate::support::send(router, req).await
}
