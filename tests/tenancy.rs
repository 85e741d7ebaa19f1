//! One tenant cannot slow, page or override another: what a tenant configures does not grow
//! the claim's cost, and an operator's switch for a tenant's destination wins over the tenant's.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use taskdeck::store::tooling::readouts;

use crate::http::{Reply, destination, receiver, world};
use crate::support::World;

async fn as_tenant(w: &World, key: &str, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    w.call_as(key, method, path, None, body.map(|b| b.to_string().into_bytes())).await
}

/// The reason of the job's latest event (a held job's says who holds it).
async fn last_reason(w: &World, id: JobId) -> String {
    let (s, e) = w.call(Method::GET, &format!("/v1/jobs/{id}/events"), None, None).await;
    assert_eq!(s, StatusCode::OK, "{e}");
    let last = e["events"].as_array().and_then(|a| a.last().cloned()).unwrap_or_default();
    last["reason"].as_str().unwrap_or_default().to_owned()
}

/// The fair claim's cost in buffers: the second of two readings (the first warms the plan),
/// each after a vacuum of `jobs` (a reading's claim is rolled back, and the dead row versions
/// it leaves would otherwise cost the next one a few buffers more).
async fn claim_buffers(db: &mut deadpool_postgres::Client) -> i64 {
    db.batch_execute("VACUUM jobs").await.unwrap();
    readouts::due_claim_buffers(db, 10).await.unwrap();
    db.batch_execute("VACUUM jobs").await.unwrap();
    readouts::due_claim_buffers(db, 10).await.unwrap()
}

#[tokio::test]
async fn a_claim_costs_the_same_whatever_another_tenant_configures() {
    let w = world().await;
    let mut db = w.db().await;
    // Statistics fixed once: the plan must not change between the readings for another reason.
    db.batch_execute("ALTER TABLE jobs SET (autovacuum_enabled = false)").await.unwrap();
    for i in 0..50 {
        let (s, j) = w.submit(&format!("quiet-{i}"), json!({"task_type": "noop", "params": {}})).await;
        assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    }
    db.batch_execute("ANALYZE jobs").await.unwrap();
    let before = claim_buffers(&mut db).await;

    // The loop of issue 37, as another tenant: create a destination, switch its writes off,
    // delete it; and what such a tenant keeps: destinations switched off, templates,
    // suppressions.
    let (_, noisy) = w.other_tenant("noisy").await;
    let target = json!({"base_url": "https://crm.example/api"});
    for i in 0..300 {
        let path = format!("/v1/destinations/loop-{i}");
        assert_eq!(as_tenant(&w, &noisy, Method::PUT, &path, Some(target.clone())).await.0, StatusCode::OK);
        let off = json!({"enabled": false});
        assert_eq!(as_tenant(&w, &noisy, Method::PUT, &format!("{path}/writes"), Some(off)).await.0, StatusCode::OK);
        assert_eq!(as_tenant(&w, &noisy, Method::DELETE, &path, None).await.0, StatusCode::NO_CONTENT);
    }
    for i in 0..20 {
        let path = format!("/v1/destinations/kept-{i}");
        assert_eq!(as_tenant(&w, &noisy, Method::PUT, &path, Some(target.clone())).await.0, StatusCode::OK);
        let off = json!({"enabled": false});
        assert_eq!(as_tenant(&w, &noisy, Method::PUT, &format!("{path}/writes"), Some(off)).await.0, StatusCode::OK);
        let t = json!({"subject": "Hi {{ name }}", "text": "x"});
        let (s, b) = as_tenant(&w, &noisy, Method::PUT, &format!("/v1/templates/t-{i}"), Some(t)).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let (s, b) = as_tenant(&w, &noisy, Method::PUT, &format!("/v1/suppressions/u{i}@example.com"), None).await;
        assert!(s.is_success(), "{s} {b}");
    }
    let after = claim_buffers(&mut db).await;
    println!("fair claim of 10 jobs: {before} buffers before another tenant's 300 loops, {after} after");
    // Each switch row the claim read cost it a share of a page, twice (pauses and modes):
    // 300 of them added eight buffers.
    assert!(after <= before + 2, "the claim read {after} buffers after another tenant's loop, {before} before");
    let modes = w.count("SELECT count(*) FROM operating_modes", &[]).await;
    assert!(modes <= 2, "the tenant's switches are not global rows: {modes}");
}

#[tokio::test]
async fn an_operators_switch_for_a_destination_wins_over_the_tenants() {
    let w = world().await;
    let op = taskdeck::store::operators::create(&w.db().await, "ops").await.unwrap().1;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({})).await;
    let name = format!("write:http:{}:crm", w.tenant.id);
    let off = json!({"name": name, "enabled": false, "reason": "abuse report"});
    let (s, b) = as_tenant(&w, &op, Method::PUT, "/v1/admin/modes", Some(off)).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // The tenant turns its own switch on: that is its switch, not the operator's.
    let (s, d) = w.call(Method::PUT, "/v1/destinations/crm/writes", None, Some(json!({"enabled": true}))).await;
    assert_eq!((s, &d["writes_enabled"]), (StatusCode::OK, &json!(true)), "{d}");
    assert!(!d.to_string().contains("abuse report"), "the tenant does not read the operator's switch: {d}");
    // Deleting and re-creating the destination does not clear it either.
    assert_eq!(w.call(Method::DELETE, "/v1/destinations/crm", None, None).await.0, StatusCode::NO_CONTENT);
    destination(&w, &w.key, "crm", addr, json!({})).await;
    let (s, j) = w
        .submit(
            "held-by-operator",
            json!({"task_type": "http.request", "params": {"destination": "crm", "method": "POST", "path": "/x"}}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let id: JobId = j["id"].as_str().unwrap().parse().unwrap();
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(j["status"], "pending", "held: {j}");
    let why = last_reason(&w, id).await;
    assert!(why.contains("by the operators, for this destination"), "{why}");
    assert_eq!(seen.lock().unwrap().len(), 0, "nothing went out");
    // The tenant's own switch off holds it too once the operator allows; both on, it goes.
    let on = json!({"name": name, "enabled": true});
    assert_eq!(as_tenant(&w, &op, Method::PUT, "/v1/admin/modes", Some(on)).await.0, StatusCode::OK);
    w.call(Method::PUT, "/v1/destinations/crm/writes", None, Some(json!({"enabled": false}))).await;
    w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let why = last_reason(&w, id).await;
    assert!(why.contains("your own switch"), "{why}");
    assert_eq!(seen.lock().unwrap().len(), 0);
    w.call(Method::PUT, "/v1/destinations/crm/writes", None, Some(json!({"enabled": true}))).await;
    w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
    w.platform.executor().run_dispatched(&[id]).await.unwrap();
    let j = w.wait_for(&id.to_string(), Duration::from_secs(5), |j| j["status"] == "succeeded").await;
    assert_eq!((j["status"].as_str(), seen.lock().unwrap().len()), (Some("succeeded"), 1), "{j}");
    // A tenant cannot name the operator's switch.
    let (s, _) = w.call(Method::PUT, "/v1/admin/modes", None, Some(json!({"name": name, "enabled": true}))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// Open exceptions of a job, and the tenant faults counted for it.
async fn blame(w: &World, id: JobId) -> (i64, i64) {
    let opened = w.count("SELECT count(*) FROM exceptions WHERE job_id = $1", &[&id]).await;
    let counted =
        w.count("SELECT coalesce(sum(count), 0)::int8 FROM tenant_faults WHERE last_job_id = $1", &[&id]).await;
    (opened, counted)
}

async fn run_until_failed(w: &World, id: JobId) -> Value {
    for _ in 0..10 {
        w.db()
            .await
            .execute("UPDATE jobs SET run_at = now() WHERE id = $1 AND status = 'pending'", &[&id])
            .await
            .unwrap();
        w.platform.executor().run_dispatched(&[id]).await.unwrap();
        let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
        if j["status"] == "failed" {
            return j;
        }
    }
    panic!("job {id} did not fail");
}

#[tokio::test]
async fn a_tenants_own_endpoint_input_and_secret_page_no_operator() {
    let w = world().await;
    let busy = Reply::Status(429, vec![], "{}");
    let (addr, seen) = receiver(vec![busy.clone(), busy.clone(), busy]).await;
    destination(&w, &w.key, "busy", addr, json!({})).await;
    destination(&w, &w.key, "locked", addr, json!({"auth_header": "Authorization"})).await;
    let call = |d: &str| {
        json!({"task_type": "http.request", "max_attempts": 3,
                                "params": {"destination": d, "method": "POST", "path": "/x"}})
    };
    let (s, j) = w.submit("busy-1", call("busy")).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let busy: JobId = j["id"].as_str().unwrap().parse().unwrap();
    // No secret was ever written for `locked`.
    let (_, j) = w.submit("locked-1", call("locked")).await;
    let locked: JobId = j["id"].as_str().unwrap().parse().unwrap();
    // A sleep asked to outlast its own timeout.
    let (_, j) = w
        .submit(
            "sleepy-1",
            json!({"task_type": "sleep", "params": {"seconds": 3}, "timeout_seconds": 1,
                                             "max_attempts": 1}),
        )
        .await;
    let sleepy: JobId = j["id"].as_str().unwrap().parse().unwrap();
    for id in [busy, locked, sleepy] {
        let j = run_until_failed(&w, id).await;
        assert_eq!(j["fault"], "tenant", "{j}");
        assert_eq!(blame(&w, id).await, (0, 1), "no exception, one tenant fault: {j}");
    }
    assert_eq!(seen.lock().unwrap().len(), 3, "the busy destination was called once per attempt");
    let (_, op) = taskdeck::store::operators::create(&w.db().await, "ops").await.unwrap();
    let (s, b) =
        w.call_as(&op, Method::GET, &format!("/v1/admin/tenant-faults?tenant={}", w.tenant.id), None, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let kinds: Vec<&str> = b["tenant_faults"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"attempts_exhausted") && kinds.contains(&"fatal_error"), "{b}");
    // A platform failure stays the operators'.
    let (_, j) = w.submit("plain-1", json!({"task_type": "test.fail", "params": {"times": 5, "kind": "fatal"}})).await;
    let plain: JobId = j["id"].as_str().unwrap().parse().unwrap();
    let j = run_until_failed(&w, plain).await;
    assert_eq!((j["fault"].as_str(), blame(&w, plain).await), (Some("platform"), (1, 0)), "{j}");
}
