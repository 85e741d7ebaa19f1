//! Operations on real Postgres: every action on an exception with its audit row and the
//! resulting job state, bulk actions, self-resolution, one exception per failing job, modes,
//! operator authentication, and the OpenAPI document.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::job::terms::{IdempotencyKey, Limits};
use taskdeck::job::{ExceptionKind, JobId};
use taskdeck::store::jobs::{self, Failure, NewJob};
use taskdeck::store::{exceptions, operators, tenants};
use uuid::Uuid;

use crate::support::World;

fn id_of(v: &Value) -> JobId {
    v.as_str().or_else(|| v["id"].as_str()).unwrap().parse().unwrap()
}

async fn operator(w: &World, name: &str) -> String {
    operators::create(&w.db().await, name).await.unwrap().1
}

/// A job that failed for good (fatal on its first attempt) and its open exception.
async fn failed_job(w: &World, key: &str, params: Value) -> (JobId, Uuid) {
    let (s, job) = w.submit(key, json!({"task_type": "test.fail", "params": params, "max_attempts": 1})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    let id = id_of(&job);
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let exc: Uuid = w.db().await.query_one("SELECT id FROM exceptions WHERE job_id = $1", &[&id]).await.unwrap().get(0);
    (id, exc)
}

fn fatal() -> Value {
    json!({"times": 1, "kind": "fatal"})
}

async fn op_call(w: &World, key: &str, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    w.call_as(key, method, path, None, body.map(|b| b.to_string().into_bytes())).await
}

async fn audit(w: &World, exc: Uuid) -> Vec<(String, String, Option<String>)> {
    w.db()
        .await
        .query("SELECT action, actor, reason FROM exception_actions WHERE exception_id = $1 ORDER BY id", &[&exc])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

async fn event_kinds(w: &World, job: JobId) -> Vec<String> {
    // The history as operators read it, without the steps every job has (submission, claims).
    let history = taskdeck::store::jobs::operator::events_any(&w.db().await, job).await.unwrap();
    history.into_iter().map(|e| e.kind.as_str().to_owned()).filter(|k| k != "submitted" && k != "claimed").collect()
}

#[tokio::test]
async fn retry_now_requeues_and_the_system_resolves_the_exception_when_the_job_succeeds() {
    let w = World::new().await;
    let key = operator(&w, "alice").await;
    let (job, exc) = failed_job(&w, "r1", fatal()).await;
    let (s, out) = op_call(
        &w,
        &key,
        Method::POST,
        &format!("/v1/admin/exceptions/{exc}/retry"),
        Some(json!({"reason": "fixed upstream"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!(out["job"]["status"], "pending");
    assert_eq!(out["job"]["max_attempts"], 2, "one more attempt, bounded");
    assert_eq!(out["exception"]["status"], "open", "open until the job succeeds");
    assert_eq!(audit(&w, exc).await, [("retry".into(), "alice".into(), Some("fixed upstream".into()))]);
    // The retry was dispatched after commit; run it: attempt 2 succeeds.
    let (report, _) = w.platform.executor().run_dispatched(&[job]).await.unwrap();
    assert_eq!(report.succeeded, 1);
    let e = exceptions::get(&w.db().await, exc).await.unwrap().unwrap();
    assert_eq!((e.status.as_str(), e.closed_by.as_deref()), ("resolved", Some("system")));
    assert_eq!(audit(&w, exc).await[1], ("resolve".into(), "system".into(), Some("the job succeeded".into())));
    assert_eq!(event_kinds(&w, job).await, ["failed", "operator_retry", "succeeded"]);
    assert_eq!(exceptions::count_open(&w.db().await).await.unwrap(), 0);
}

#[tokio::test]
async fn retry_at_a_time_waits_and_a_failing_retry_keeps_one_exception() {
    let w = World::new().await;
    let key = operator(&w, "alice").await;
    let (job, exc) = failed_job(&w, "r2", json!({"times": 5, "kind": "fatal"})).await;
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    let (s, out) =
        op_call(&w, &key, Method::POST, &format!("/v1/admin/exceptions/{exc}/retry"), Some(json!({"run_at": at})))
            .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let run_at: chrono::DateTime<chrono::Utc> = out["job"]["run_at"].as_str().unwrap().parse().unwrap();
    assert!((run_at - at).num_milliseconds().abs() < 2, "{run_at} vs {at}");
    assert!(jobs::claim_due(&w.db().await, 10, 5.0).await.unwrap().jobs.is_empty(), "not due yet");
    let audit_rows = audit(&w, exc).await;
    assert_eq!((audit_rows[0].0.as_str(), audit_rows[0].2.as_deref()), ("retry", None));
    // Retried again now, it fails again: the one open exception stays, none is added.
    w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&job]).await.unwrap();
    let claimed = jobs::claim_due(&w.db().await, 10, 5.0).await.unwrap().jobs;
    let failed = jobs::fail_reporting(
        &w.db().await,
        &[(claimed[0].fence(), Failure::platform(ExceptionKind::FatalError, "again"))],
    )
    .await
    .unwrap();
    assert!(failed.refused.is_empty());
    assert!(failed.opened.is_empty(), "no new exception, so no second alert");
    assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = $1", &[&job]).await, 1);
    // A retry needs a failed job: a second one while it is pending is refused.
    let (_, e2) = failed_job(&w, "r3", fatal()).await;
    op_call(&w, &key, Method::POST, &format!("/v1/admin/exceptions/{e2}/retry"), Some(json!({}))).await;
    let (s, err) = op_call(&w, &key, Method::POST, &format!("/v1/admin/exceptions/{e2}/retry"), Some(json!({}))).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("job_state")), "{err}");
}

#[tokio::test]
async fn cancel_cancels_the_job_and_its_pending_children() {
    let w = World::new().await;
    let key = operator(&w, "bob").await;
    let (job, exc) = failed_job(&w, "c1", fatal()).await;
    let child = NewJob {
        parent_id: Some(job),
        run_at: chrono::Utc::now() + chrono::Duration::hours(1),
        limits: Limits::fixed(1, 10),
        ..NewJob::new("noop", json!({}), IdempotencyKey::parse("child").unwrap())
    };
    jobs::insert_many(&w.db().await, w.tenant.id, std::slice::from_ref(&child), None).await.unwrap();
    let (s, out) = op_call(
        &w,
        &key,
        Method::POST,
        &format!("/v1/admin/exceptions/{exc}/cancel"),
        Some(json!({"reason": "obsolete"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!(out["job"]["status"], "cancelled");
    assert_eq!(out["cancelled"], json!([job, child.id]));
    assert_eq!(out["exception"]["status"], "resolved");
    assert_eq!(out["exception"]["closed_by"], "bob");
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE id = $1 AND status = 'cancelled'", &[&child.id]).await, 1);
    assert_eq!(audit(&w, exc).await, [("cancel".into(), "bob".into(), Some("obsolete".into()))]);
    assert_eq!(event_kinds(&w, job).await, ["failed", "cancelled"]);
    // A closed exception takes no more actions.
    let (s, err) =
        op_call(&w, &key, Method::POST, &format!("/v1/admin/exceptions/{exc}/ignore"), Some(json!({"reason": "x"})))
            .await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("exception_closed")));
}

#[tokio::test]
async fn force_finish_needs_a_reason_and_records_it_in_the_result() {
    let w = World::new().await;
    let key = operator(&w, "carol").await;
    let (job, exc) = failed_job(&w, "f1", fatal()).await;
    let path = format!("/v1/admin/exceptions/{exc}/finish");
    let (s, err) = op_call(&w, &key, Method::POST, &path, Some(json!({}))).await;
    assert_eq!(
        (s, err["error"]["code"].as_str(), err["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_field"), Some("reason"))
    );
    let (s, err) = op_call(&w, &key, Method::POST, &path, Some(json!({"reason": " \u{3000}"}))).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("reason_required")));
    assert!(audit(&w, exc).await.is_empty(), "a refused action writes nothing");
    let (s, out) =
        op_call(&w, &key, Method::POST, &path, Some(json!({"reason": "sent by hand", "result": {"ticket": 7}}))).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!(out["job"]["status"], "succeeded");
    assert_eq!(
        out["job"]["result"],
        json!({"forced": true, "by": "carol", "reason": "sent by hand", "result": {"ticket": 7}})
    );
    assert_eq!(out["exception"]["status"], "resolved");
    assert_eq!(audit(&w, exc).await, [("finish".into(), "carol".into(), Some("sent by hand".into()))]);
    assert_eq!(event_kinds(&w, job).await, ["failed", "force_finished"]);
}

#[tokio::test]
async fn ignore_closes_the_exception_and_leaves_the_job_failed() {
    let w = World::new().await;
    let key = operator(&w, "dave").await;
    let (job, exc) = failed_job(&w, "i1", fatal()).await;
    let path = format!("/v1/admin/exceptions/{exc}/ignore");
    let (s, _) = op_call(&w, &key, Method::POST, &path, Some(json!({"reason": "  "}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "a blank reason is no reason");
    let (s, out) = op_call(&w, &key, Method::POST, &path, Some(json!({"reason": "known test noise"}))).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!((out["job"]["status"].as_str(), out["exception"]["status"].as_str()), (Some("failed"), Some("ignored")));
    assert_eq!(audit(&w, exc).await, [("ignore".into(), "dave".into(), Some("known test noise".into()))]);
    assert_eq!(event_kinds(&w, job).await, ["failed", "exception_ignored"]);
    // Show: the exception with its job, history and audit.
    let (s, shown) = op_call(&w, &key, Method::GET, &format!("/v1/admin/exceptions/{exc}"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(shown["job"]["id"], json!(job));
    let kinds: Vec<&str> = shown["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["submitted", "claimed", "failed", "exception_ignored"],
        "the history with its submission and claim"
    );
    assert_eq!(shown["actions"][0]["actor"], "dave");
    let (s, _) = op_call(&w, &key, Method::GET, &format!("/v1/admin/exceptions/{}", Uuid::now_v7()), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn exceptions_list_by_filter_and_bulk_actions_answer_with_a_count() {
    let w = World::new().await;
    let key = operator(&w, "erin").await;
    let (other, other_key) = w.other_tenant("globex").await;
    for k in ["b1", "b2", "b3"] {
        failed_job(&w, k, fatal()).await;
    }
    let (_, job) = w
        .call_as(
            &other_key,
            Method::POST,
            "/v1/jobs",
            Some("g1"),
            Some(
                json!({"task_type": "test.fail", "params": {"times": 1, "kind": "ambiguous"}}).to_string().into_bytes(),
            ),
        )
        .await;
    w.platform.executor().run_dispatched(&[id_of(&job)]).await.unwrap();
    let list = |q: &str| {
        let path = format!("/v1/admin/exceptions{q}");
        let key = key.clone();
        let w = &w;
        async move { op_call(w, &key, Method::GET, &path, None).await }
    };
    let (s, all) = list("").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(all["exceptions"].as_array().unwrap().len(), 4);
    let (_, amb) = list("?kind=ambiguous_outcome").await;
    assert_eq!(amb["exceptions"].as_array().unwrap().len(), 1);
    let (_, by_tenant) = list("?tenant=globex").await;
    assert_eq!(by_tenant["exceptions"][0]["tenant_id"], json!(other.id));
    let (_, by_cause) = list("?cause=FORCED%20FAILURE&task_type=test.fail&status=open").await;
    assert_eq!(by_cause["exceptions"].as_array().unwrap().len(), 4);
    let (_, page) = list("?limit=3").await;
    let (_, rest) = list(&format!("?limit=3&cursor={}", page["next_cursor"].as_str().unwrap())).await;
    assert_eq!(rest["exceptions"].as_array().unwrap().len(), 1);
    let (s, err) = list("?status=closed").await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_query")));
    let (s, err) = list("?tenant=nobody").await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("unknown_tenant")));

    let bulk = |body: Value| op_call(&w, &key, Method::POST, "/v1/admin/exceptions:bulk", Some(body));
    let (s, err) = bulk(json!({"action": "ignore", "filter": {"tenant": "acme"}})).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("reason_required")));
    let (s, out) = bulk(json!({"action": "ignore", "filter": {"tenant": "acme"}, "reason": "batch noise"})).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!((out["matched"].as_u64(), out["count"].as_u64()), (Some(3), Some(3)));
    assert_eq!(
        w.count("SELECT count(*) FROM exception_actions WHERE action = 'ignore' AND actor = 'erin'", &[]).await,
        3
    );
    let (_, out) = bulk(json!({"action": "retry", "filter": {"kind": "ambiguous_outcome"}})).await;
    assert_eq!(out["count"], 1);
    let (s, _) = bulk(json!({"action": "explode"})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn operator_routes_refuse_tenant_keys_and_tenant_routes_refuse_operator_keys() {
    let w = World::new().await;
    let key = operator(&w, "frank").await;
    let (s, err) = w.call(Method::GET, "/v1/admin/exceptions", None, None).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    let (s, err) = op_call(&w, &key, Method::GET, "/v1/jobs", None).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("unauthorized")));
    let (s, _) = op_call(&w, &key, Method::GET, "/v1/admin/modes", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(operators::revoke(&w.db().await, "frank").await.unwrap());
    assert!(!operators::revoke(&w.db().await, "frank").await.unwrap());
    let (s, _) = op_call(&w, &key, Method::GET, "/v1/admin/modes", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "a revoked operator key stops at once");
    assert!(operators::by_key(&w.db().await, &key).await.unwrap().is_none());
    // Tenants: revoke disables the key; platform-only tasks are not submittable.
    let (s, err) = w.submit("ret", json!({"task_type": "relay.retention"})).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_task_type")));
    assert!(!err["error"]["available"].as_array().unwrap().contains(&json!("relay.retention")));
    let (t, tkey) = w.other_tenant("initech").await;
    assert!(tenants::revoke(&w.db().await, "initech").await.unwrap());
    assert!(tenants::by_api_key(&w.db().await, &tkey).await.unwrap().is_none());
    assert!(tenants::by_name(&w.db().await, "initech").await.unwrap().is_some_and(|x| x.id == t.id));
}

#[tokio::test]
async fn modes_are_read_and_set_with_an_audit_row_naming_the_operator() {
    let w = World::new().await;
    let key = operator(&w, "grace").await;
    let (s, m) = op_call(&w, &key, Method::GET, "/v1/admin/modes", None).await;
    assert_eq!((s, &m), (StatusCode::OK, &json!({"switches": {}, "shadow": true})));
    let (s, m) = op_call(
        &w,
        &key,
        Method::PUT,
        "/v1/admin/modes",
        Some(json!({"name": "pause:noop", "enabled": true, "reason": "drain"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(m["switches"]["pause:noop"], true);
    assert_eq!(
        w.count("SELECT count(*) FROM operating_mode_audit WHERE changed_by = 'grace' AND reason = 'drain'", &[]).await,
        1
    );
    for (name, code) in [
        ("pause:nope", "unknown_task_type"),
        ("write:SES", "invalid_mode"),
        ("write:bogus", "invalid_mode"),
        ("turbo", "invalid_mode"),
    ] {
        let (s, err) =
            op_call(&w, &key, Method::PUT, "/v1/admin/modes", Some(json!({"name": name, "enabled": true}))).await;
        assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(code)), "{name}");
    }
    let (s, _) = op_call(&w, &key, Method::PUT, "/v1/admin/modes", Some(json!({"name": "shadow"}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn the_served_openapi_document_is_the_checked_in_one() {
    let w = World::new().await;
    let (s, served) = w.call(Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(served["openapi"], "3.1.0");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi.json");
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        served == checked_in,
        "shared/openapi.json is stale: regenerate with `cargo run --bin relay -- openapi > shared/openapi.json`"
    );
    assert_eq!(taskdeck::api::openapi::document_json(), std::fs::read_to_string(path).unwrap());
}
