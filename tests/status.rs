//! The status contract: its store functions on real Postgres, `GET /v1/status` for status keys
//! only, and the served document validated against `shared/schemas/status-v1.json`.

use axum::http::{Method, StatusCode};
use chrono::{Duration, Utc};
use serde_json::{Value, json};
use taskdeck::job::terms::{CorrelationId, IdempotencyKey, Limits, RequestHash};
use taskdeck::job::{Fence, JobId};
use taskdeck::liveness::{Identity, Kind, Liveness};
use taskdeck::store::jobs::{self, Failure, NewJob};
use taskdeck::store::{status, status_keys, workers};

use crate::support::World;

pub fn job(key: &str, task_type: &str, parent: Option<JobId>) -> NewJob {
    NewJob {
        correlation_id: CorrelationId::parse(&format!("corr-{key}")).unwrap(),
        request_hash: RequestHash::of(key.as_bytes()),
        parent_id: parent,
        run_at: Utc::now() - Duration::seconds(30),
        limits: Limits::fixed(1, 60),
        ..NewJob::new(task_type, json!({}), IdempotencyKey::parse(key).unwrap())
    }
}

/// A parent with three children (one failed for good, one succeeded, one pending), one top-level
/// job that failed for good and then one that succeeded, one running top-level job, one job due
/// later. Returns the parent's id.
pub async fn populate(w: &World) -> JobId {
    let db = w.db().await;
    let parent = job("parent", "noop", None);
    let pid = parent.id;
    jobs::insert_many(&db, w.tenant.id, &[parent], None).await.unwrap();
    let mut later = job("later", "sleep", None);
    later.run_at = Utc::now() + Duration::hours(1);
    let kids = [job("c1", "noop", Some(pid)), job("c2", "noop", Some(pid)), job("c3", "sleep", Some(pid)), later];
    jobs::insert_many(&db, w.tenant.id, &kids, None).await.unwrap();
    // Claim the parent and two children (oldest run_at first: parent, c1, c2).
    let claimed = jobs::claim_ids(&db, &[pid, kids[0].id, kids[1].id], 30.0, None).await.unwrap().jobs;
    assert_eq!(claimed.len(), 3);
    jobs::fail(
        &db,
        &[(Fence { job: kids[0].id, attempt: 1 }, Failure::platform(taskdeck::job::ExceptionKind::FatalError, "boom"))],
    )
    .await
    .unwrap();
    jobs::succeed(&db, &[(Fence { job: kids[1].id, attempt: 1 }, json!({}))]).await.unwrap();
    db.execute("UPDATE jobs SET status = 'waiting', lease_until = NULL WHERE id = $1", &[&pid]).await.unwrap();
    let broke = job("broke", "noop", None);
    let broke_id = broke.id;
    jobs::insert_many(&db, w.tenant.id, &[broke], None).await.unwrap();
    jobs::claim_ids(&db, &[broke_id], 30.0, None).await.unwrap();
    jobs::fail(
        &db,
        &[(Fence { job: broke_id, attempt: 1 }, Failure::platform(taskdeck::job::ExceptionKind::FatalError, "bust"))],
    )
    .await
    .unwrap();
    let (top, busy) = (job("top", "noop", None), job("busy", "sleep", None));
    let (top_id, busy_id) = (top.id, busy.id);
    jobs::insert_many(&db, w.tenant.id, &[top, busy], None).await.unwrap();
    let claimed = jobs::claim_ids(&db, &[top_id, busy_id], 30.0, None).await.unwrap().jobs;
    let top_claim = claimed.iter().find(|c| c.id == top_id).unwrap();
    jobs::succeed(&db, &[(top_claim.fence(), json!({"ok": true}))]).await.unwrap();
    pid
}

#[tokio::test]
async fn workers_beat_list_and_prune() {
    let w = World::new().await;
    let db = w.db().await;
    let started = Utc::now() - Duration::minutes(5);
    workers::beat(&db, "worker", "worker:h:1:a", "h", Some(1), started).await.unwrap();
    workers::beat(&db, "worker", "worker:h:1:a", "h", Some(1), started).await.unwrap();
    workers::beat(&db, "sweeper", "sweeper:h:2:b", "h", Some(2), started).await.unwrap();
    let seen = workers::seen_since(&db, Utc::now() - Duration::minutes(1), 10).await.unwrap();
    assert_eq!(seen.len(), 2, "one row per instance, however many beats");
    assert!(seen.iter().all(|s| (s.started_at - started).num_milliseconds().abs() < 5));
    db.execute("UPDATE workers SET last_seen_at = now() - interval '8 days' WHERE kind = 'sweeper'", &[])
        .await
        .unwrap();
    assert_eq!(workers::seen_since(&db, Utc::now() - Duration::minutes(1), 10).await.unwrap().len(), 1);
    assert_eq!(workers::prune(&db, Utc::now() - Duration::days(7)).await.unwrap(), 1);
    assert!(workers::beat(&db, "janitor", "x", "h", None, started).await.is_err(), "kinds are checked");

    // The liveness handle upserts once, then throttles.
    let live = Liveness::new(w.platform.pool.clone(), Identity::of_this_process(Kind::Api));
    live.touch().await;
    live.touch().await;
    assert_eq!(w.count("SELECT count(*) FROM workers WHERE kind = 'api'", &[]).await, 1);
    assert!(live.identity().instance_id.starts_with("api:"));
}

#[tokio::test]
async fn status_keys_are_hashed_named_and_can_be_disabled() {
    let w = World::new().await;
    let db = w.db().await;
    let (k, key) = status_keys::create(&db, "console").await.unwrap();
    assert!(key.starts_with("rs_") && key.len() > 40);
    assert_eq!(status_keys::by_key(&db, &key).await.unwrap(), Some(k.clone()));
    assert_eq!(status_keys::by_name(&db, "console").await.unwrap(), Some(k));
    assert!(status_keys::by_key(&db, &w.key).await.unwrap().is_none(), "a tenant key is not a status key");
    assert!(status_keys::create(&db, "console").await.is_err(), "names are unique");
    assert!(status_keys::disable(&db, "console").await.unwrap());
    assert!(status_keys::by_key(&db, &key).await.unwrap().is_none());
    assert!(!status_keys::disable(&db, "console").await.unwrap());
}

#[tokio::test]
async fn status_queries_count_live_work_failures_runs_and_children() {
    let w = World::new().await;
    let pid = populate(&w).await;
    let db = w.db().await;

    let queues = status::queues(&db).await.unwrap();
    let sleep = queues.iter().find(|q| q.task_type == "sleep").unwrap();
    assert_eq!((sleep.due, sleep.scheduled, sleep.running), (1, 1, 1), "{queues:?}");
    assert!(sleep.oldest_due.is_some());
    assert!(queues.iter().all(|q| q.task_type != "noop"), "no live noop job: {queues:?}");

    assert_eq!(
        status::failure_counts(&db).await.unwrap(),
        (1, 1),
        "the failed top-level job, counted as runs are; not the child"
    );
    db.execute("UPDATE jobs SET finished_at = now() - interval '2 hours' WHERE status = 'failed'", &[]).await.unwrap();
    assert_eq!(status::failure_counts(&db).await.unwrap(), (0, 1));

    let a = status::activity(&db, 12, 300, 1000).await.unwrap();
    assert_eq!((a.runs.len(), a.runs.iter().sum::<i64>(), a.runs[11]), (12, 1, 1), "children are not runs: {a:?}");
    assert_eq!(a.failures.iter().sum::<i64>(), 0, "the failure is 2 h old");
    assert!(!a.truncated);
    let capped = status::activity(&db, 12, 300, 1).await.unwrap();
    assert!(capped.truncated);

    let runs = status::recent_runs(&db, 10).await.unwrap();
    let shape: Vec<(&str, &str)> =
        runs.iter().map(|r| (r.job.status.as_str(), r.job.idempotency_key.as_str())).collect();
    assert_eq!(shape, [("running", "busy"), ("waiting", "parent"), ("succeeded", "top"), ("failed", "broke")]);
    assert!(runs.iter().all(|r| r.tenant == "acme"));

    let counts = taskdeck::store::progress::child_counts(&db, &[pid, JobId::new()]).await.unwrap();
    assert_eq!(counts.len(), 1);
    assert_eq!(
        counts[&pid],
        taskdeck::store::progress::ChildCounts {
            total: 3,
            succeeded: 1,
            shadowed: 0,
            skipped: 0,
            failed: 1,
            cancelled: 0
        }
    );
}

/// The JSON Schema checked into the repository.
pub fn schema() -> Value {
    serde_json::from_str(include_str!("../shared/schemas/status-v1.json")).expect("the schema is JSON")
}

pub fn assert_valid(doc: &Value) {
    let validator = jsonschema::validator_for(&schema()).expect("the schema compiles");
    let errors: Vec<String> = validator.iter_errors(doc).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
}

#[tokio::test]
async fn the_served_status_validates_against_its_schema_and_needs_a_status_key() {
    let w = World::new().await;
    let pid = populate(&w).await;
    w.platform.liveness(Kind::Worker).beat().await.unwrap();
    let (_, key) = status_keys::create(&w.db().await, "console").await.unwrap();
    let letter = taskdeck::store::dead_letters::NewDeadLetter {
        source: "executor:test".into(),
        message_id: Some("m-1".into()),
        body: "not a work message".into(),
        reason: "not JSON".into(),
    };
    taskdeck::store::dead_letters::insert_many(&w.db().await, &[letter]).await.unwrap();
    taskdeck::schedules::ensure_builtin(&w.platform.pool, 30, chrono::Utc::now()).await.unwrap();

    let (s, doc) = w.call_as(&key, Method::GET, "/v1/status", None, None).await;
    assert_eq!(s, StatusCode::OK, "{doc}");
    assert_valid(&doc);
    assert_eq!((doc["contract"].as_str(), doc["version"].as_str()), (Some("relay.status/v1"), Some("1.6")));
    assert_eq!(doc["project"], "relay");
    assert_eq!(doc["workers"][0]["kind"], "worker");
    let schedules = doc["schedules"].as_array().unwrap();
    assert_eq!(schedules.len(), 1, "{doc}");
    assert_eq!(schedules[0]["name"], "relay.retention");
    assert!(schedules[0]["next_run_at"].is_string() && schedules[0]["last_run_at"].is_null());
    assert_eq!(doc["failures"], json!({"last_hour": 1, "last_24h": 1, "open_exceptions": 1, "dead_letters_24h": 1}));
    let open = doc["exceptions"].as_array().unwrap();
    assert_eq!((open.len(), open[0]["tenant"].as_str()), (1, Some("acme")), "{doc}");
    let sleep = doc["queues"].as_array().unwrap().iter().find(|q| q["name"] == "sleep").unwrap();
    assert_eq!((sleep["depth"].as_i64(), sleep["transport"].as_str()), (Some(1), Some("postgres")));
    let noop = doc["queues"].as_array().unwrap().iter().find(|q| q["name"] == "noop").unwrap();
    assert_eq!(noop["depth"], 0, "every catalogue task has a queue");
    let parent = doc["recent_runs"].as_array().unwrap().iter().find(|r| r["id"] == pid.to_string()).unwrap();
    assert_eq!(
        parent["progress"],
        json!({"kind": "count", "total": 3, "succeeded": 1, "shadowed": 0, "skipped": 0, "failed": 1,
        "cancelled": 0, "pending": 1, "done": 2, "fraction": 2.0 / 3.0})
    );
    assert_eq!(parent["status"], "waiting");
    assert!(parent.get("params").is_none() && parent.get("result").is_none(), "client data stays out");
    let busy = doc["recent_runs"].as_array().unwrap().iter().find(|r| r["status"] == "running").unwrap();
    assert_eq!(busy["progress"]["kind"], "elapsed");
    assert_eq!(
        (busy["progress"]["runs_in_baseline"].as_i64(), busy["progress"]["stuck"].as_bool()),
        (Some(0), Some(false))
    );
    assert_eq!(doc["activity"]["runs"].as_array().unwrap().len(), 12);

    // The same document parses with the console's reader.
    let parsed = relay_status::StatusDoc::parse(doc.to_string().as_bytes()).unwrap();
    assert_eq!(parsed.recent_runs.len(), 4);

    // Tenant keys, unknown keys and no key: 401, JSON, stable code.
    for bad in [w.key.as_str(), "rs_nope"] {
        let (s, body) = w.call_as(bad, Method::GET, "/v1/status", None, None).await;
        assert_eq!((s, body["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    }
    let req = axum::http::Request::get("/v1/status").body(axum::body::Body::empty()).unwrap();
    let (s, body) = crate::support::send(&w.router, req).await;
    assert_eq!((s, body["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    // A status key cannot read jobs.
    let (s, _) = w.call_as(&key, Method::GET, "/v1/jobs", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_empty_platform_serves_a_valid_status() {
    let w = World::new().await;
    let (_, key) = status_keys::create(&w.db().await, "console").await.unwrap();
    let (s, doc) = w.call_as(&key, Method::GET, "/v1/status", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_valid(&doc);
    assert_eq!(doc["recent_runs"], json!([]));
}

#[test]
fn the_schema_refuses_what_the_contract_forbids() {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    let ok: Value = serde_json::from_str(include_str!("fixtures/status_v1_0_minimal.json")).unwrap();
    assert!(validator.is_valid(&ok), "the v1.0 fixture (with unknown fields) is valid");
    for (field, bad) in
        [("contract", json!("relay.status/v2")), ("version", json!("2.0")), ("queues", json!([{"name": "q"}]))]
    {
        let mut doc = ok.clone();
        doc[field] = bad;
        assert!(!validator.is_valid(&doc), "{field}");
    }
}
