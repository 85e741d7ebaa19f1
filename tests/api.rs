//! The HTTP API against real Postgres: durability of 202, idempotency, isolation, bad input.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::World;

#[tokio::test]
async fn accepted_means_committed_and_readable() {
    let w = World::new().await;
    let (status, job) = w.submit("k1", json!({"task_type": "noop", "params": {"echo": 1}})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    assert_eq!(job["status"], "pending");
    // Visible from a fresh connection: the row committed before the answer.
    let id: taskdeck::job::JobId = job["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE id = $1", &[&id]).await, 1);
    let (status, read) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["params"], json!({"echo": 1}));
    assert_eq!(read["correlation_id"], job["id"], "a correlation id is minted when absent");
}

#[tokio::test]
async fn same_key_same_request_replays_and_different_request_is_refused() {
    let w = World::new().await;
    let body = json!({"task_type": "noop", "correlation_id": "order-7"});
    let (s1, first) = w.submit("order-7", body.clone()).await;
    let (s2, again) = w.submit("order-7", body).await;
    assert_eq!((s1, s2), (StatusCode::ACCEPTED, StatusCode::OK));
    assert_eq!(first["id"], again["id"]);
    let (s3, err) = w.submit("order-7", json!({"task_type": "noop", "correlation_id": "order-8"})).await;
    assert_eq!(s3, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(err["error"]["code"], "idempotency_key_reused");
    assert_eq!(err["error"]["idempotency_key"], "order-7");
    assert!(err["error"]["message"].as_str().unwrap().contains("order-7"));
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 1);
}

#[tokio::test]
async fn fifty_concurrent_identical_requests_make_one_job() {
    let w = Arc::new(World::new().await);
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let calls = (0..50).map(|_| {
        let (w, barrier) = (w.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            w.submit("burst", json!({"task_type": "noop"})).await
        })
    });
    let answers: Vec<(StatusCode, Value)> =
        futures::future::join_all(calls).await.into_iter().map(|r| r.unwrap()).collect();
    let created = answers.iter().filter(|(s, _)| *s == StatusCode::ACCEPTED).count();
    let replayed = answers.iter().filter(|(s, _)| *s == StatusCode::OK).count();
    assert_eq!((created, replayed), (1, 49), "{answers:?}");
    let id = &answers[0].1["id"];
    assert!(answers.iter().all(|(_, b)| &b["id"] == id), "every answer names the one job");
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 1);
}

#[tokio::test]
async fn another_tenants_job_is_not_found_on_every_route() {
    let w = World::new().await;
    let (_, job) = w.submit("mine", json!({"task_type": "noop", "correlation_id": "c-1"})).await;
    let id = job["id"].as_str().unwrap();
    let (_, other_key) = w.other_tenant("globex").await;
    let missing = uuid::Uuid::now_v7();
    for path in ["/v1/jobs/{}", "/v1/jobs/{}/events"] {
        for target in [id.to_owned(), missing.to_string()] {
            let (s, body) = w.call_as(&other_key, Method::GET, &path.replace("{}", &target), None, None).await;
            assert_eq!((s, &body["error"]["code"]), (StatusCode::NOT_FOUND, &json!("not_found")), "{path}");
        }
    }
    let (s, _) = w.call_as(&other_key, Method::POST, &format!("/v1/jobs/{id}/cancel"), None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, list) = w.call_as(&other_key, Method::GET, "/v1/jobs?correlation_id=c-1", None, None).await;
    assert_eq!((s, list["jobs"].as_array().unwrap().len()), (StatusCode::OK, 0));
    // The same idempotency key is free for another tenant.
    let (s, _) =
        w.call_as(&other_key, Method::POST, "/v1/jobs", Some("mine"), Some(br#"{"task_type":"noop"}"#.to_vec())).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    // And the owner's job was not cancelled by the other tenant.
    let (_, mine) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(mine["status"], "pending");
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_json_error_and_stores_nothing() {
    let w = World::new().await;
    let post = |idem: Option<&'static str>, body: Vec<u8>| {
        let w = &w;
        async move { w.call_as(&w.key.clone(), Method::POST, "/v1/jobs", idem, Some(body)).await }
    };
    let cases: Vec<(Option<&str>, Vec<u8>, StatusCode, &str)> = vec![
        (None, br#"{"task_type":"noop"}"#.to_vec(), StatusCode::BAD_REQUEST, "missing_idempotency_key"),
        (Some("k"), b"{not json".to_vec(), StatusCode::BAD_REQUEST, "malformed_json"),
        (
            Some("k"),
            br#"{"task_type":"noop","params":{"echo":"a\u0000b"}}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "nul_character",
        ),
        (Some("k"), br#"{"task_type":"no\u0000op"}"#.to_vec(), StatusCode::BAD_REQUEST, "nul_character"),
        (Some("k"), br#"{"task_type":42}"#.to_vec(), StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"),
        (
            Some("k"),
            br#"{"task_type":"noop","max_attempts":"three"}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            Some("k"),
            br#"{"task_type":"noop","surprise":1}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            Some("k"),
            br#"{"task_type":"launch_rockets"}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_task_type",
        ),
        (
            Some("k"),
            br#"{"task_type":"sleep","params":{"seconds":"long"}}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_params",
        ),
        (
            Some("k"),
            br#"{"task_type":"noop","delay_seconds":5,"run_at":"2030-01-01T00:00:00Z"}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            Some("k"),
            br#"{"task_type":"noop","max_attempts":0}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (Some("k"), br#"[1,2,3]"#.to_vec(), StatusCode::UNPROCESSABLE_ENTITY, "invalid_field"),
        (Some("k"), vec![b'x'; taskdeck::api::MAX_JOB_BODY_BYTES + 1], StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
    ];
    for (idem, body, status, code) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let (s, err) = post(idem, body).await;
        assert_eq!((s, err["error"]["code"].as_str()), (status, Some(code)), "{shown}: {err}");
        assert!(err["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (_, err) = post(Some("k"), br#"{"task_type":"launch_rockets"}"#.to_vec()).await;
    assert_eq!(
        err["error"]["available"],
        json!([
            "email.campaign",
            "email.send",
            "http.request",
            "noop",
            "sleep",
            "test.await",
            "test.effect",
            "test.fail",
            "test.whoami",
            "webhook.send"
        ])
    );
    let (_, err) = post(Some("k"), br#"{"task_type":"sleep","params":{"seconds":"long"}}"#.to_vec()).await;
    assert_eq!(err["error"]["field"], "params.seconds");

    let (s, err) = w.call_as("rk_wrong", Method::POST, "/v1/jobs", Some("k"), Some(b"{}".to_vec())).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    let req = axum::http::Request::builder().uri("/v1/jobs").body(axum::body::Body::empty()).unwrap();
    let (s, err) = crate::support::send(&w.router, req).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    let (s, err) = w.call(Method::GET, "/v1/jobs?status=sideways", None, None).await;
    assert_eq!((s, err["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("status")));
    let (s, _) = w.call(Method::GET, "/v1/jobs?cursor=garbage", None, None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, err) = w.call(Method::GET, "/v1/nothing-here", None, None).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (s, err) = w.call(Method::DELETE, "/v1/jobs", None, None).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed")));
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 0, "nothing stored");
}

#[tokio::test]
async fn batch_answers_per_item_and_stores_the_valid_ones() {
    let w = World::new().await;
    let (_, existing) = w.submit("b-0", json!({"task_type": "noop"})).await;
    let body = json!({"jobs": [
        {"idempotency_key": "b-0", "task_type": "noop"},
        {"idempotency_key": "b-1", "task_type": "noop", "params": {"echo": 1}},
        {"idempotency_key": "b-2", "task_type": "nope"},
        {"task_type": "noop"},
        {"idempotency_key": "b-3", "task_type": "sleep", "params": {"seconds": 0}},
        {"idempotency_key": "b-1", "task_type": "noop", "params": {"echo": 2}},
    ]});
    let (s, res) = w.call(Method::POST, "/v1/jobs:batch", None, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{res}");
    let statuses: Vec<u64> = res["results"].as_array().unwrap().iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [200, 202, 422, 422, 202, 422]);
    assert_eq!(res["results"][0]["job"]["id"], existing["id"]);
    assert_eq!(res["results"][2]["error"]["code"], "unknown_task_type");
    assert_eq!(res["results"][2]["error"]["field"], "jobs[2].task_type");
    assert_eq!(res["results"][3]["error"]["code"], "missing_idempotency_key");
    assert_eq!(res["results"][5]["error"]["code"], "idempotency_key_reused");
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 3);

    let too_many: Vec<Value> =
        (0..501).map(|i| json!({"idempotency_key": format!("x{i}"), "task_type": "noop"})).collect();
    let (s, err) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": too_many}))).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_batch")));
    let full: Vec<Value> = (0..500).map(|i| json!({"idempotency_key": format!("y{i}"), "task_type": "noop"})).collect();
    let (s, res) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": full}))).await;
    assert_eq!(s, StatusCode::OK);
    assert!(res["results"].as_array().unwrap().iter().all(|r| r["status"] == 202));
}

#[tokio::test]
async fn listing_filters_and_pages_through_a_change_feed() {
    let w = World::new().await;
    for i in 0..7 {
        let task = if i % 2 == 0 { "noop" } else { "sleep" };
        let params = if task == "sleep" { json!({"seconds": 0}) } else { json!({}) };
        w.submit(
            &format!("l{i}"),
            json!({"task_type": task, "params": params, "correlation_id": format!("c{}", i % 3)}),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/jobs?limit=3".to_owned();
    loop {
        let (s, page) = w.call(Method::GET, &path, None, None).await;
        assert_eq!(s, StatusCode::OK);
        seen.extend(page["jobs"].as_array().unwrap().iter().map(|j| j["idempotency_key"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/jobs?limit=3&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, (0..7).map(|i| format!("l{i}")).collect::<Vec<_>>());
    let (_, sleeps) = w.call(Method::GET, "/v1/jobs?task_type=sleep", None, None).await;
    assert_eq!(sleeps["jobs"].as_array().unwrap().len(), 3);
    let (_, chain) = w.call(Method::GET, "/v1/jobs?correlation_id=c0", None, None).await;
    assert_eq!(chain["jobs"].as_array().unwrap().len(), 3);
    let (_, pending) = w.call(Method::GET, "/v1/jobs?status=pending", None, None).await;
    assert_eq!(pending["jobs"].as_array().unwrap().len(), 7);
    let (_, none) = w.call(Method::GET, "/v1/jobs?updated_since=2999-01-01T00:00:00Z", None, None).await;
    assert_eq!(none["jobs"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn cancel_stops_pending_jobs_and_refuses_finished_ones() {
    let w = World::new().await;
    let (_, later) = w.submit("c1", json!({"task_type": "noop", "delay_seconds": 3600})).await;
    let id = later["id"].as_str().unwrap();
    let (s, job) = w.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None, None).await;
    assert_eq!((s, job["status"].as_str()), (StatusCode::OK, Some("cancelled")));
    assert!(job["finished_at"].is_string());
    let (s, again) = w.call(Method::POST, &format!("/v1/jobs/{id}/cancel"), None, None).await;
    assert_eq!((s, again["status"].as_str()), (StatusCode::OK, Some("cancelled")), "cancel is idempotent");

    let (_, now) = w.submit("c2", json!({"task_type": "noop"})).await;
    let exec = w.platform.executor();
    let id2: taskdeck::job::JobId = now["id"].as_str().unwrap().parse().unwrap();
    exec.run_dispatched(&[id2]).await.unwrap();
    let (s, err) = w.call(Method::POST, &format!("/v1/jobs/{id2}/cancel"), None, None).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("not_cancellable")));
    assert_eq!(err["error"]["status"], "succeeded");
}

#[tokio::test]
async fn the_catalogue_lists_tasks_with_parameter_schemas() {
    let w = World::new().await;
    let (s, body) = w.call(Method::GET, "/v1/tasks", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let sleep = body["tasks"].as_array().unwrap().iter().find(|t| t["name"] == "sleep").unwrap();
    assert_eq!(sleep["params_schema"]["required"], json!(["seconds"]));
}

#[tokio::test]
async fn a_failed_dispatch_never_fails_the_request() {
    let w = World::new().await.with_transport(Arc::new(crate::support::transports::Down));
    let (s, job) = w.submit("d1", json!({"task_type": "noop"})).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let id: taskdeck::job::JobId = job["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        w.eventually(
            "SELECT count(*) FROM jobs WHERE id = $1 AND status = 'pending' AND dispatched_at IS NULL",
            &[&id],
            1
        )
        .await,
        1,
        "left pending, marked undispatched for the sweep"
    );
}

#[tokio::test]
async fn a_running_jobs_history_shows_its_submission_and_claim() {
    let w = World::new().await;
    let (_, job) = w.submit("running", json!({"task_type": "noop"})).await;
    let id: taskdeck::job::JobId = job["id"].as_str().unwrap().parse().unwrap();
    let (_, ev) = w.call(Method::GET, &format!("/v1/jobs/{id}/events"), None, None).await;
    assert_eq!(
        ev["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect::<Vec<_>>(),
        ["submitted"]
    );
    assert_eq!(
        (ev["events"][0]["at"].clone(), ev["events"][0]["to_status"].clone()),
        (job["created_at"].clone(), json!("pending"))
    );
    taskdeck::store::jobs::claim_ids(&w.db().await, &[id], 30.0, None).await.unwrap();
    let (_, ev) = w.call(Method::GET, &format!("/v1/jobs/{id}/events"), None, None).await;
    let (_, running) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    let claimed = &ev["events"][1];
    assert_eq!(ev["events"].as_array().unwrap().len(), 2, "{ev}");
    assert_eq!(
        (claimed["kind"].as_str(), claimed["attempt"].as_i64(), claimed["from_status"].as_str()),
        (Some("claimed"), Some(1), Some("pending"))
    );
    assert_eq!(claimed["at"], running["started_at"], "the claim is the running attempt's start");
}

#[test]
fn every_event_kind_is_documented_and_storable() {
    use taskdeck::store::jobs::EventKind;
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/");
    for doc in ["state_machine.md", "api.md"] {
        let text = std::fs::read_to_string(format!("{docs}{doc}")).unwrap();
        let missing: Vec<_> = EventKind::ALL.iter().filter(|k| !text.contains(&format!("`{k}`"))).collect();
        assert!(missing.is_empty(), "{doc} does not name {missing:?}");
    }
    // Every kind but the two derived ones (`submitted`, `claimed`) is one the table may hold.
    let migrations = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations/");
    let mut latest = String::new();
    let mut names: Vec<_> = std::fs::read_dir(migrations).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for path in names {
        let sql = std::fs::read_to_string(path).unwrap();
        if let Some(at) = sql.rfind("job_events_kind_check CHECK (kind IN (") {
            latest = sql[at..].split("))").next().unwrap().to_owned();
        }
    }
    let stored: Vec<&str> = latest.split('\'').skip(1).step_by(2).collect();
    assert!(stored.len() >= 12, "{latest}");
    let unstorable: Vec<_> = EventKind::ALL[2..].iter().filter(|k| !stored.contains(&k.as_str())).collect();
    // ... and every kind the table may hold is one this build reads (reading is strict).
    let unreadable: Vec<_> = stored.iter().filter(|k| EventKind::parse(k).is_none()).collect();
    assert!(unreadable.is_empty(), "the table may hold {unreadable:?}, which EventKind does not name");
    assert!(
        unstorable.is_empty() && !stored.contains(&"submitted") && !stored.contains(&"claimed"),
        "{unstorable:?} / {stored:?}"
    );
}
