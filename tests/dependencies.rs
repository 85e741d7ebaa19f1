//! Jobs that run after other jobs (`after`): held pending without an attempt until every
//! dependency has succeeded, released by the write that ends the last one; cancelled, naming
//! the dependency, down the chain, when one ends otherwise; ids checked per tenant.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use tokio::sync::watch;

use crate::support::World;

fn id_of(job: &Value) -> JobId {
    job["id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no id in {job}"))
}

async fn submit(w: &World, key: &str, body: Value) -> Value {
    let (s, job) = w.submit(key, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    job
}

async fn get(w: &World, id: JobId) -> Value {
    w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await.1
}

fn at(job: &Value, field: &str) -> DateTime<Utc> {
    job[field].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no {field} in {job}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_runs_in_order_each_waiting_without_an_attempt() {
    let w = World::new().await;
    let a = submit(&w, "a", json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.4}})).await;
    let b_body = json!({"task_type": "test.effect", "after": [a["id"]]});
    let b = submit(&w, "b", b_body.clone()).await;
    let c = submit(&w, "c", json!({"task_type": "test.effect", "after": [b["id"], a["id"]]})).await;
    let (a, b, c) = (id_of(&a), id_of(&b), id_of(&c));
    for id in [b, c] {
        let j = get(&w, id).await;
        assert_eq!(
            (j["status"].as_str(), j["waiting_reason"].as_str()),
            (Some("pending"), Some("waiting_for_dependency"))
        );
        assert_eq!(j["attempt"], 0, "waiting uses no attempt");
        // The time it asked for (now), not its hold's.
        assert!(at(&j, "run_at") < Utc::now() + chrono::Duration::seconds(5), "{j}");
    }
    let (s, again) = w.submit("b", b_body).await;
    assert_eq!((s, &again["id"]), (StatusCode::OK, &json!(b)), "{again}");
    assert!(at(&again, "run_at") < Utc::now() + chrono::Duration::seconds(5), "a replay shows the time asked: {again}");
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(3, &stop);
    let done = w.wait_for(&c.to_string(), Duration::from_secs(30), |j| j["status"] == "succeeded").await;
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (ja, jb, jc) = (get(&w, a).await, get(&w, b).await, get(&w, c).await);
    assert!(at(&jb, "started_at") >= at(&ja, "finished_at"), "B started before A ended: {ja} {jb}");
    assert!(at(&jc, "started_at") >= at(&jb, "finished_at"), "C started before B ended: {jb} {jc}");
    assert_eq!((jb["attempt"].as_i64(), jc["attempt"].as_i64()), (Some(1), Some(1)));
    assert_eq!(w.count("SELECT count(*) FROM job_dependencies", &[]).await, 0, "every edge resolved");
}

#[tokio::test]
async fn after_a_failed_job_the_chain_is_cancelled_with_reasons_and_callbacks() {
    let w = crate::callbacks::world().await;
    let (s, _) = w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": "http://127.0.0.1:9/hooks"}))).await;
    assert!(s.is_success());
    let a = submit(&w, "a", json!({"task_type": "test.fail", "params": {"times": 5, "kind": "fatal"}})).await;
    let b = submit(&w, "b", json!({"task_type": "noop", "after": [a["id"]]})).await;
    let c = submit(&w, "c", json!({"task_type": "noop", "after": [b["id"]]})).await;
    let (a, b, c) = (id_of(&a), id_of(&b), id_of(&c));
    let exec = w.platform.executor();
    assert_eq!(exec.run_dispatched(&[b, c]).await.unwrap().1, 0, "a held dependent is not claimable");
    assert_eq!(exec.run_dispatched(&[a]).await.unwrap().1, 1);
    assert_eq!(get(&w, a).await["status"], "failed");
    let (jb, jc) = (get(&w, b).await, get(&w, c).await);
    assert_eq!((jb["status"].as_str(), jc["status"].as_str()), (Some("cancelled"), Some("cancelled")));
    assert_eq!(jb["last_error"].as_str(), Some(format!("dependency {a} ended failed").as_str()), "{jb}");
    assert_eq!(jc["last_error"].as_str(), Some(format!("dependency {b} ended cancelled").as_str()), "{jc}");
    assert_eq!((jb["attempt"].as_i64(), jb["waiting_reason"].as_str()), (Some(0), None));
    let (_, events) = w.call(Method::GET, &format!("/v1/jobs/{b}/events"), None, None).await;
    let last = events["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["kind"].as_str(), last["reason"].as_str()), (Some("cancelled"), jb["last_error"].as_str()));
    for id in [b, c] {
        let key = format!("callback:{id}:cancelled:0");
        assert_eq!(
            w.count("SELECT count(*) FROM jobs WHERE idempotency_key = $1", &[&key]).await,
            1,
            "{id}'s callback"
        );
        assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = $1", &[&id]).await, 0, "no exception");
    }
    assert_eq!(w.count("SELECT count(*) FROM exceptions", &[]).await, 1, "only A's");
}

#[tokio::test]
async fn dependencies_that_ended_before_the_submit_are_resolved_at_once() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let ok = id_of(&submit(&w, "ok", json!({"task_type": "noop"})).await);
    let bad =
        id_of(&submit(&w, "bad", json!({"task_type": "test.fail", "params": {"times": 5, "kind": "fatal"}})).await);
    exec.run_dispatched(&[ok, bad]).await.unwrap();
    // After a succeeded job: due at once, not held.
    let free = submit(&w, "free", json!({"task_type": "noop", "after": [ok]})).await;
    assert_eq!(free["status"], "pending");
    assert_eq!(exec.run_dispatched(&[id_of(&free)]).await.unwrap().1, 1);
    assert_eq!(get(&w, id_of(&free)).await["status"], "succeeded");
    // After a failed one (beside a succeeded one): cancelled at once, answered with the job.
    let body = json!({"task_type": "noop", "after": [ok, bad]});
    let doomed = submit(&w, "doomed", body.clone()).await;
    assert_eq!(doomed["status"], "cancelled", "{doomed}");
    assert_eq!(doomed["last_error"].as_str(), Some(format!("dependency {bad} ended failed").as_str()));
    // A replay answers the same job; the same key with other dependencies is another request.
    let (s, again) = w.submit("doomed", body).await;
    assert_eq!((s, again["id"].clone()), (StatusCode::OK, doomed["id"].clone()));
    let (s, e) = w.submit("doomed", json!({"task_type": "noop", "after": [ok]})).await;
    assert_eq!((s.as_u16(), e["error"]["code"].as_str()), (422, Some("idempotency_key_reused")), "{e}");
    // A waiting dependent cancelled by its tenant stays cancelled when its dependency succeeds.
    let slow = id_of(&submit(&w, "slow", json!({"task_type": "noop"})).await);
    let held = id_of(&submit(&w, "held", json!({"task_type": "noop", "after": [slow]})).await);
    let (s, j) = w.call(Method::POST, &format!("/v1/jobs/{held}/cancel"), None, None).await;
    assert_eq!((s, j["status"].as_str()), (StatusCode::OK, Some("cancelled")));
    exec.run_dispatched(&[slow]).await.unwrap();
    assert_eq!(get(&w, held).await["status"], "cancelled");
    w.platform.sweeper().pass().await.unwrap();
    assert_eq!(w.count("SELECT count(*) FROM job_holds", &[]).await, 0, "the sweep drops finished holds");
}

#[tokio::test]
async fn after_refuses_unknown_foreign_too_many_and_hostile_ids_alike() {
    let w = World::new().await;
    let (_, other_key) = w.other_tenant("other").await;
    let (s, theirs) = w
        .call_as(&other_key, Method::POST, "/v1/jobs", Some("t"), Some(json!({"task_type": "noop"}).to_string().into()))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let mine = submit(&w, "mine", json!({"task_type": "noop"})).await;
    let refuse = |after: Value| json!({"task_type": "noop", "after": [mine["id"], after]});
    let (s1, foreign) = w.submit("x1", refuse(theirs["id"].clone())).await;
    let (s2, unknown) = w.submit("x2", refuse(json!(JobId::new()))).await;
    assert_eq!((s1.as_u16(), s2.as_u16()), (409, 409));
    assert_eq!(foreign, unknown, "another tenant's job answers as an unknown one");
    assert_eq!(
        (unknown["error"]["code"].as_str(), unknown["error"]["field"].as_str()),
        (Some("unknown_dependency"), Some("after[1]"))
    );
    let many: Vec<Value> = (0..101).map(|_| mine["id"].clone()).collect();
    let (s, e) = w.submit("x3", json!({"task_type": "noop", "after": many})).await;
    assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("after")), "{e}");
    for (i, bad) in [json!("not-a-uuid"), json!("\u{0}"), json!(42), json!({"id": mine["id"]}), json!(null), json!("")]
        .iter()
        .enumerate()
    {
        let (s, e) = w.submit(&format!("h{i}"), refuse(bad.clone())).await;
        assert!(s.is_client_error(), "{bad}: {s} {e}");
        assert!(e["error"]["code"].is_string(), "{bad}: {e}");
    }
    let (s, e) = w.submit("h-shape", json!({"task_type": "noop", "after": "x"})).await;
    assert!(s.is_client_error(), "{e}");
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 2, "nothing refused was inserted");
    // In a batch, each item answers for itself.
    let items = json!({"jobs": [
        {"idempotency_key": "b1", "task_type": "noop", "after": [mine["id"]]},
        {"idempotency_key": "b2", "task_type": "noop", "after": [theirs["id"]]},
    ]});
    let (s, out) = w.call(Method::POST, "/v1/jobs:batch", None, Some(items)).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let r = &out["results"];
    assert_eq!((r[0]["status"].as_u64(), r[1]["status"].as_u64()), (Some(202), Some(409)), "{out}");
    assert_eq!(r[1]["error"]["field"].as_str(), Some("jobs[1].after[0]"), "{out}");
    assert_eq!(r[0]["job"]["status"], "pending");
}

#[tokio::test]
async fn the_sweep_heals_a_release_lost_between_the_end_and_its_release() {
    let w = World::new().await;
    let a = id_of(&submit(&w, "a", json!({"task_type": "noop"})).await);
    let b = id_of(&submit(&w, "b", json!({"task_type": "noop", "after": [a]})).await);
    // A ends without its release (a crash between the two): written by hand.
    w.db()
        .await
        .execute(
            "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '1 minute', updated_at = now()
                 WHERE id = $1",
            &[&a],
        )
        .await
        .unwrap();
    assert_eq!(get(&w, b).await["waiting_reason"], "waiting_for_dependency");
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.dependents_healed, 1, "{report:?}");
    let jb = get(&w, b).await;
    assert_ne!(jb["waiting_reason"], "waiting_for_dependency", "{jb}");
    assert!(at(&jb, "run_at") <= Utc::now(), "due at the time it asked for: {jb}");
    assert_eq!(w.platform.executor().run_dispatched(&[b]).await.unwrap().1, 1);
    assert_eq!(get(&w, b).await["status"], "succeeded");
    let again = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(again.dependents_healed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependencies_ending_at_once_release_their_dependent_exactly_once() {
    let w = World::new().await;
    let mut deps = Vec::new();
    for i in 0..12 {
        let j =
            submit(&w, &format!("d{i}"), json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.2}})).await;
        deps.push(j["id"].clone());
    }
    let last = id_of(&submit(&w, "last", json!({"task_type": "test.effect", "after": deps})).await);
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(6, &stop);
    let done = w.wait_for(&last.to_string(), Duration::from_secs(30), |j| j["status"] == "succeeded").await;
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!((done["status"].as_str(), done["attempt"].as_i64()), (Some("succeeded"), Some(1)), "{done}");
    let ended: DateTime<Utc> =
        w.db().await.query_one("SELECT max(finished_at) FROM jobs WHERE id <> $1", &[&last]).await.unwrap().get(0);
    assert!(at(&done, "started_at") >= ended, "it started before its last dependency ended");
    assert_eq!(w.count("SELECT count(*) FROM effects_ledger WHERE job_id = $1", &[&last]).await, 1, "ran once");
}

/// Jobs without `after` pay nothing for dependencies: statement triggers on the dependency
/// tables record any statement that writes them (a release always does, even of no row), and
/// after submits (one and a batch), claims, successes, a failure and a cancel none has run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_without_after_run_no_statement_on_the_dependency_tables() {
    let w = World::new().await;
    w.db()
        .await
        .batch_execute(
            "CREATE TABLE dependency_touches (what text NOT NULL);
             CREATE FUNCTION touched() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN INSERT INTO dependency_touches VALUES (TG_TABLE_NAME || ' ' || TG_OP); RETURN NULL; END $$;
             CREATE TRIGGER touched AFTER INSERT OR UPDATE OR DELETE ON job_dependencies
                 FOR EACH STATEMENT EXECUTE FUNCTION touched();
             CREATE TRIGGER touched AFTER INSERT OR UPDATE OR DELETE ON job_holds
                 FOR EACH STATEMENT EXECUTE FUNCTION touched();",
        )
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(id_of(&submit(&w, &format!("p{i}"), json!({"task_type": "test.effect"})).await));
    }
    let bad =
        id_of(&submit(&w, "bad", json!({"task_type": "test.fail", "params": {"times": 5, "kind": "fatal"}})).await);
    let items: Vec<Value> =
        (0..5).map(|i| json!({"idempotency_key": format!("b{i}"), "task_type": "test.effect"})).collect();
    let (s, out) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": items}))).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    ids.extend(out["results"].as_array().unwrap().iter().map(|r| id_of(&r["job"])));
    let later = id_of(&submit(&w, "later", json!({"task_type": "noop", "delay_seconds": 600})).await);
    let (s, j) = w.call(Method::POST, &format!("/v1/jobs/{later}/cancel"), None, None).await;
    assert_eq!((s, j["status"].as_str()), (StatusCode::OK, Some("cancelled")), "{j}");
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(2, &stop);
    let ended = "SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed')";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while w.count(ended, &[]).await < 16 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'succeeded' AND id = ANY($1)", &[&ids]).await, 15);
    assert_eq!(get(&w, bad).await["status"], "failed");
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE has_dependents IS NOT NULL", &[]).await, 0);
    assert_eq!(
        w.count("SELECT count(*) FROM dependency_touches", &[]).await,
        0,
        "a statement wrote the dependency tables"
    );
    // The trap springs: a job held for a dependency does write them.
    let pending = submit(&w, "pending", json!({"task_type": "noop", "delay_seconds": 600})).await;
    submit(&w, "dependent", json!({"task_type": "noop", "after": [pending["id"]]})).await;
    assert!(w.count("SELECT count(*) FROM dependency_touches", &[]).await > 0);
}

/// A chain of `n` jobs, each after the one before; the head is `head`. Returns the ids in order.
async fn chain(w: &World, n: usize, head: Value) -> Vec<JobId> {
    let mut ids = vec![id_of(&submit(w, "link-0", head).await)];
    for i in 1..n {
        let body = json!({"task_type": "noop", "after": [ids[i - 1]]});
        ids.push(id_of(&submit(w, &format!("link-{i}"), body).await));
    }
    ids
}

/// Issue 51, 1: a cancel over a 3,000-job chain (each job after the one before, the head an
/// hour away) applies whole, in one transaction, and answers 200 at once with how many
/// dependents it cancelled (it answered 503 after 15 s, 2,343 cancelled and 656 left pending).
#[tokio::test]
async fn a_cancel_over_a_3000_job_chain_applies_whole_and_answers_for_it_at_once() {
    let w = World::new().await;
    let made = std::time::Instant::now();
    let ids = chain(&w, 3000, json!({"task_type": "noop", "delay_seconds": 3600})).await;
    println!("3,000 links submitted in {:?}", made.elapsed());
    let started = std::time::Instant::now();
    let (s, j) = w.call(Method::POST, &format!("/v1/jobs/{}/cancel", ids[0]), None, None).await;
    let took = started.elapsed();
    println!("cancel over 3,000 links: {s} in {took:?}");
    assert_eq!((s, j["status"].as_str()), (StatusCode::OK, Some("cancelled")), "{j}");
    assert_eq!(
        (j["dependents_cancelled"].as_i64(), j["dependents_remaining"].as_bool()),
        (Some(2999), Some(false)),
        "{j}"
    );
    let pending = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status <> 'cancelled'";
    assert_eq!(w.count(pending, &[&ids]).await, 0, "applied whole");
    assert!(took < Duration::from_secs(5), "answered in {took:?}");
    let last = get(&w, ids[2999]).await;
    assert_eq!(
        last["last_error"].as_str(),
        Some(format!("dependency {} ended cancelled", ids[2998]).as_str()),
        "{last}"
    );
    assert_eq!(w.count("SELECT count(*) FROM job_dependencies", &[]).await, 0, "every edge resolved");
    let events = "SELECT count(*) FROM job_events WHERE kind = 'cancelled' AND job_id = ANY($1)";
    assert_eq!(w.count(events, &[&ids]).await, 3000, "one event each");
    // A second cancel changes nothing and says so; the sweep has nothing left to heal.
    let (s, again) = w.call(Method::POST, &format!("/v1/jobs/{}/cancel", ids[0]), None, None).await;
    assert_eq!((s, again["dependents_cancelled"].as_i64()), (StatusCode::OK, Some(0)), "{again}");
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.dependents_healed, 0, "{report:?}");
}

/// Issue 51, 1: the sweep's report counts the jobs it healed, cancellations down a chain
/// included (it said `dependents_healed: 0` while cancelling a chain's tail).
#[tokio::test]
async fn the_sweep_counts_the_chain_it_cancels_when_a_cancel_was_lost() {
    let w = World::new().await;
    let ids = chain(&w, 40, json!({"task_type": "noop", "delay_seconds": 3600})).await;
    // The head is cancelled without its release (a crash between the two): written by hand.
    w.db()
        .await
        .execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = now() - interval '1 minute', updated_at = now()
                 WHERE id = $1",
            &[&ids[0]],
        )
        .await
        .unwrap();
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.dependents_healed, 39, "{report:?}");
    let pending = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status <> 'cancelled'";
    assert_eq!(w.count(pending, &[&ids]).await, 0);
    assert_eq!(w.platform.sweeper().pass().await.unwrap().dependents_healed, 0);
}

/// A chain longer than one cancel takes on: the cancel changes at most its budget, commits,
/// says the rest is left; the sweep goes on from where it stopped and counts what it cancelled.
#[tokio::test]
async fn a_chain_longer_than_one_cancel_takes_on_is_finished_by_the_sweep() {
    let w = World::new().await;
    let ids = chain(&w, 30, json!({"task_type": "noop", "delay_seconds": 3600})).await;
    let mut db = w.db().await;
    let tx = db.transaction().await.unwrap();
    let c = taskdeck::store::jobs::cancel(&tx, w.tenant.id, ids[0], 10).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(c, taskdeck::store::jobs::Cancelled { job: true, dependents: 10, dependents_left: true });
    let cancelled = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'cancelled'";
    assert_eq!(w.count(cancelled, &[&ids]).await, 11, "the head and its budget");
    assert_eq!(get(&w, ids[11]).await["waiting_reason"], "waiting_for_dependency");
    // Once the ends have settled (backdated here), the sweep finishes the chain.
    db.execute("UPDATE jobs SET finished_at = finished_at - interval '1 minute' WHERE status = 'cancelled'", &[])
        .await
        .unwrap();
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.dependents_healed, 19, "{report:?}");
    assert_eq!(w.count(cancelled, &[&ids]).await, 30);
    assert_eq!(w.count("SELECT count(*) FROM job_dependencies", &[]).await, 0, "every edge resolved");
    let last = get(&w, ids[29]).await;
    assert_eq!(last["last_error"].as_str(), Some(format!("dependency {} ended cancelled", ids[28]).as_str()), "{last}");
}

/// A job down the chain with more dependents than one cancel has room for: the cancel stops at
/// its budget and says so (none is missed for being beyond the cut), and the sweep finishes.
#[tokio::test]
async fn a_wide_chain_cut_at_the_budget_says_so_and_the_sweep_finishes_it() {
    let w = World::new().await;
    let head = id_of(&submit(&w, "head", json!({"task_type": "noop", "delay_seconds": 3600})).await);
    let mid = id_of(&submit(&w, "mid", json!({"task_type": "noop", "after": [head]})).await);
    let mut ids = vec![head, mid];
    for i in 0..25 {
        ids.push(id_of(&submit(&w, &format!("leaf-{i}"), json!({"task_type": "noop", "after": [mid]})).await));
    }
    let mut db = w.db().await;
    let tx = db.transaction().await.unwrap();
    let c = taskdeck::store::jobs::cancel(&tx, w.tenant.id, head, 10).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(c, taskdeck::store::jobs::Cancelled { job: true, dependents: 10, dependents_left: true });
    db.execute("UPDATE jobs SET finished_at = finished_at - interval '1 minute' WHERE status = 'cancelled'", &[])
        .await
        .unwrap();
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.dependents_healed, 16, "{report:?}");
    let cancelled = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'cancelled'";
    assert_eq!(w.count(cancelled, &[&ids]).await, 27);
}
