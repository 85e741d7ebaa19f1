//! FIFO per ordering key: jobs submitted with one `ordering_key` start in submission order, one
//! at a time, other keys in parallel; a failed job holds its key's later jobs (released by an
//! operator's retry or finish, or cancelled with it) or cancels them, as it says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use chrono::Utc;
use serde_json::{Value, json};
use taskdeck::exceptions::{Action, act};
use taskdeck::job::JobId;
use tokio::sync::watch;
use uuid::Uuid;

use crate::http::{Reply, destination, receiver};
use crate::support::World;

fn id_of(job: &Value) -> JobId {
    job["id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no id in {job}"))
}

async fn get(w: &World, id: JobId) -> Value {
    w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await.1
}

async fn submit(w: &World, key: &str, body: Value) -> JobId {
    let (s, job) = w.submit(key, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    id_of(&job)
}

/// When a client sent a job and when it had the answer (a batch's items share them), and its
/// place in its batch.
#[derive(Clone, Copy)]
struct Sent {
    sent: Instant,
    answered: Instant,
    batch: Option<(usize, usize)>,
}

const KEYS: usize = 10;
const JOBS: usize = 1000;
const CLIENTS: usize = 5;

fn call(i: usize) -> Value {
    json!({"task_type": "http.request", "ordering_key": format!("user-{}", i % KEYS),
           "params": {"destination": "crm", "method": "POST", "path": format!("/k/{}/{i}", i % KEYS)}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_jobs_over_ten_keys_run_in_submission_order_per_key_and_keys_in_parallel() {
    let w = crate::http::world().await;
    // Each call is held 30 ms by the receiver, so calls of different keys overlap if they may.
    let (addr, seen) = receiver((0..JOBS).map(|_| Reply::Hang(Duration::from_millis(30))).collect()).await;
    destination(&w, &w.key, "crm", addr, json!({"rate_per_second": 1000, "max_in_flight": 100})).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let router = w.router.clone();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(2, &stop);

    // Four clients submit one job at a time over HTTP, a fifth in batches of 20 through the
    // router, all at once; each client takes every fifth run of ten jobs (one per key), so
    // every key's jobs come from every client.
    let sent: Arc<Mutex<HashMap<usize, Sent>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (sent, api, key, router) = (sent.clone(), api.clone(), w.key.clone(), w.router.clone());
        clients.push(tokio::spawn(async move {
            let mine: Vec<usize> = (0..JOBS).filter(|i| (i / KEYS) % CLIENTS == c).collect();
            if c == 0 {
                for (b, chunk) in mine.chunks(20).enumerate() {
                    let items: Vec<Value> = chunk
                        .iter()
                        .map(|i| {
                            let mut j = call(*i);
                            j["idempotency_key"] = json!(format!("job-{i}"));
                            j
                        })
                        .collect();
                    let body = json!({"jobs": items}).to_string().into_bytes();
                    let at = Instant::now();
                    let req = axum::http::Request::post("/v1/jobs:batch")
                        .header("authorization", format!("Bearer {key}"))
                        .header("content-type", "application/json")
                        .body(axum::body::Body::from(body))
                        .unwrap();
                    let (s, out) = crate::support::send(&router, req).await;
                    assert_eq!(s, StatusCode::OK, "{out}");
                    assert!(out["results"].as_array().unwrap().iter().all(|r| r["status"] == 202), "{out}");
                    let answered = Instant::now();
                    for (n, i) in chunk.iter().enumerate() {
                        sent.lock().unwrap().insert(*i, Sent { sent: at, answered, batch: Some((b, n)) });
                    }
                }
            } else {
                let client = taskdeck::client::Client::new(&api, &key).unwrap();
                for i in mine {
                    let at = Instant::now();
                    client.submit(&format!("job-{i}"), &call(i)).await.unwrap();
                    sent.lock().unwrap().insert(i, Sent { sent: at, answered: Instant::now(), batch: None });
                }
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let finished = tokio::time::timeout(Duration::from_secs(240), async {
        while seen.lock().unwrap().len() < JOBS {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // Every call has had its answer before the workers stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    let seen = seen.lock().unwrap().clone();
    assert!(finished.is_ok(), "only {} of {JOBS} calls arrived", seen.len());
    assert_eq!(seen.len(), JOBS, "each job called once");

    // The receiver's log: per key, in arrival order.
    let arrivals: Vec<(usize, usize, Instant)> = seen
        .iter()
        .map(|s| {
            let parts: Vec<usize> = s.path.split('/').filter_map(|p| p.parse().ok()).collect();
            (parts[0], parts[1], s.at)
        })
        .collect();
    let sent = sent.lock().unwrap().clone();
    let mut per_key: HashMap<usize, Vec<(usize, Instant)>> = HashMap::new();
    for (key, i, at) in &arrivals {
        per_key.entry(*key).or_default().push((*i, *at));
    }
    assert_eq!(per_key.len(), KEYS);
    for (key, calls) in &per_key {
        assert_eq!(calls.len(), JOBS / KEYS, "key {key}");
        // One at a time: each call arrives after the one before was answered (30 ms).
        for pair in calls.windows(2) {
            let gap = pair[1].1 - pair[0].1;
            assert!(
                gap >= Duration::from_millis(29),
                "key {key}: job {} started {gap:?} after job {}",
                pair[1].0,
                pair[0].0
            );
        }
        // Submission order: a job whose submit was answered before another's was sent (or
        // earlier in the same batch) arrives first.
        for (p, (late, _)) in calls.iter().enumerate() {
            for (early, _) in &calls[p + 1..] {
                let (a, b) = (sent[early], sent[late]);
                let before = a.answered < b.sent
                    || matches!((a.batch, b.batch), (Some((x, m)), Some((y, n))) if x == y && m < n);
                assert!(!before, "key {key}: job {early} was submitted before job {late} but arrived after it");
            }
        }
    }
    // Other keys in parallel: each key's calls span most of the run (run one key after
    // another, the spans would add up to the run's length), and calls of several keys were in
    // flight at once.
    let spans: Duration = per_key.values().map(|c| c.last().unwrap().1 - c[0].1).sum();
    let total = arrivals.iter().map(|a| a.2).max().unwrap() - arrivals.iter().map(|a| a.2).min().unwrap();
    let overlap = spans.as_secs_f64() / total.as_secs_f64();
    let mut most = 0;
    for (_, _, at) in &arrivals {
        let busy: std::collections::HashSet<usize> = arrivals
            .iter()
            .filter(|(_, _, t)| *t <= *at && *at < *t + Duration::from_millis(30))
            .map(|(k, _, _)| *k)
            .collect();
        most = most.max(busy.len());
    }
    let first = arrivals.iter().map(|a| a.2).min().unwrap();
    let last = arrivals.iter().map(|a| a.2).max().unwrap();
    let submitted = sent.values().map(|s| s.answered).max().unwrap() - sent.values().map(|s| s.sent).min().unwrap();
    eprintln!(
        "ordering: {JOBS} jobs over {KEYS} keys submitted in {submitted:?}, called over {:?}; keys' spans add up to \
         {overlap:.1}x the run; at most {most} keys' calls in flight at once",
        last - first
    );
    assert!(overlap >= 0.6 * KEYS as f64, "keys ran one after another, not in parallel: {overlap:.1}");
    assert!(most >= 2, "no two keys' calls were ever in flight at once");
    assert_eq!(w.count("SELECT count(*) FROM job_dependencies", &[]).await, 0, "every edge resolved");
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status <> 'succeeded'", &[]).await, 0);
}

/// `test.fail` failing for good on its first attempt, on `key`.
fn failing(key: &str, on_failure: &str) -> Value {
    json!({"task_type": "test.fail", "params": {"times": 1, "kind": "fatal"}, "max_attempts": 1,
           "ordering_key": key, "ordering_on_failure": on_failure})
}

fn noop(key: &str) -> Value {
    json!({"task_type": "noop", "ordering_key": key})
}

async fn exception_of(w: &World, id: JobId) -> Uuid {
    w.db().await.query_one("SELECT id FROM exceptions WHERE job_id = $1", &[&id]).await.unwrap().get(0)
}

async fn operator(w: &World, id: JobId, action: Action) {
    let exc = exception_of(w, id).await;
    act(&w.platform.pool, &w.platform.transport, exc, &action, Some("test"), "ops", Utc::now()).await.unwrap();
}

#[tokio::test]
async fn a_failed_job_holds_its_key_until_an_operator_retries_it_then_the_rest_run_in_order() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let a = submit(&w, "a", failing("k", "hold")).await;
    let b = submit(&w, "b", noop("k")).await;
    let c = submit(&w, "c", noop("k")).await;
    let other = submit(&w, "other", noop("k2")).await;
    let jb = get(&w, b).await;
    assert_eq!(
        (jb["waiting_reason"].as_str(), jb["ordered_behind"].as_str()),
        (Some("ordered_behind"), Some(&*a.to_string()))
    );
    assert_eq!(get(&w, c).await["ordered_behind"].as_str(), Some(&*b.to_string()));
    assert_eq!(get(&w, other).await["waiting_reason"].as_str(), Some("not_claimed"), "another key is free");
    assert_eq!(exec.run_dispatched(&[b, c]).await.unwrap().1, 0, "a job behind another is not claimable");
    exec.run_dispatched(&[a]).await.unwrap();
    assert_eq!(get(&w, a).await["status"], "failed");
    // Held behind the failed job, and so is a job submitted to the key later.
    let d = submit(&w, "d", noop("k")).await;
    for (id, ahead) in [(b, a), (c, b), (d, c)] {
        let j = get(&w, id).await;
        assert_eq!((j["status"].as_str(), j["attempt"].as_i64()), (Some("pending"), Some(0)), "{j}");
        assert_eq!(j["ordered_behind"].as_str(), Some(&*ahead.to_string()), "{j}");
    }
    assert_eq!(exec.run_dispatched(&[b, c, d]).await.unwrap().1, 0);
    // The sweep leaves a held key alone.
    tokio::time::sleep(Duration::from_millis(50)).await;
    w.platform.sweeper().pass().await.unwrap();
    assert_eq!(get(&w, b).await["status"], "pending");
    // The operator retries A: it succeeds, and B, C, D follow one by one, in order.
    operator(&w, a, Action::Retry { at: None }).await;
    exec.run_dispatched(&[a]).await.unwrap();
    assert_eq!(get(&w, a).await["status"], "succeeded");
    for (id, rest) in [(b, vec![c, d]), (c, vec![d]), (d, vec![])] {
        assert_eq!(exec.run_dispatched(&rest).await.unwrap().1, 0, "only the head runs");
        assert_eq!(exec.run_dispatched(&[id]).await.unwrap().1, 1);
        assert_eq!(get(&w, id).await["status"], "succeeded");
    }
    // The key is free: a new job runs at once.
    let e = submit(&w, "e", noop("k")).await;
    assert_eq!(exec.run_dispatched(&[e]).await.unwrap().1, 1);
}

#[tokio::test]
async fn an_operator_finish_releases_a_held_key_and_a_cancel_cancels_it() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let a = submit(&w, "a", failing("k", "hold")).await;
    let b = submit(&w, "b", noop("k")).await;
    exec.run_dispatched(&[a]).await.unwrap();
    operator(&w, a, Action::Finish { result: None }).await;
    assert_eq!(exec.run_dispatched(&[b]).await.unwrap().1, 1, "B runs once A is finished");
    assert_eq!(get(&w, b).await["status"], "succeeded");

    let x = submit(&w, "x", failing("k", "hold")).await;
    let y = submit(&w, "y", noop("k")).await;
    exec.run_dispatched(&[x]).await.unwrap();
    operator(&w, x, Action::Cancel).await;
    let jy = get(&w, y).await;
    assert_eq!(jy["status"], "cancelled", "{jy}");
    assert_eq!(jy["last_error"].as_str(), Some(format!("ordered behind {x} ended cancelled").as_str()));
}

#[tokio::test]
async fn a_tenant_cancels_a_failed_job_holding_its_key_and_the_jobs_behind_it() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let a = submit(&w, "a", failing("k", "hold")).await;
    let b = submit(&w, "b", noop("k")).await;
    let c = submit(&w, "c", noop("k")).await;
    exec.run_dispatched(&[a]).await.unwrap();
    let (s, j) = w.call(Method::POST, &format!("/v1/jobs/{a}/cancel"), None, None).await;
    assert_eq!(
        (s, j["status"].as_str(), j["dependents_cancelled"].as_u64()),
        (StatusCode::OK, Some("cancelled"), Some(2)),
        "{j}"
    );
    assert_eq!(
        (get(&w, b).await["status"].as_str(), get(&w, c).await["status"].as_str()),
        (Some("cancelled"), Some("cancelled"))
    );
    assert_eq!(
        w.count("SELECT count(*) FROM exceptions WHERE job_id = $1 AND status = 'open'", &[&a]).await,
        0,
        "its exception closed"
    );
    // A failed job that holds nothing stays not cancellable.
    let lone = submit(
        &w,
        "lone",
        json!({"task_type": "test.fail", "params": {"times": 1, "kind": "fatal"}, "max_attempts": 1}),
    )
    .await;
    exec.run_dispatched(&[lone]).await.unwrap();
    let (s, e) = w.call(Method::POST, &format!("/v1/jobs/{lone}/cancel"), None, None).await;
    assert_eq!((s, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("not_cancellable")), "{e}");
    // The key starts afresh.
    let d = submit(&w, "d", noop("k")).await;
    assert_eq!(exec.run_dispatched(&[d]).await.unwrap().1, 1);
}

#[tokio::test]
async fn a_failed_job_that_says_cancel_cancels_the_jobs_behind_it_and_the_key_starts_afresh() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let a = submit(&w, "a", failing("k", "cancel")).await;
    let b = submit(&w, "b", noop("k")).await;
    let c = submit(&w, "c", noop("k")).await;
    exec.run_dispatched(&[a]).await.unwrap();
    let (jb, jc) = (get(&w, b).await, get(&w, c).await);
    assert_eq!((jb["status"].as_str(), jc["status"].as_str()), (Some("cancelled"), Some("cancelled")));
    assert_eq!(jb["last_error"].as_str(), Some(format!("ordered behind {a} ended failed").as_str()), "{jb}");
    assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = ANY ($1)", &[&vec![b, c]]).await, 0);
    // Behind a failed job that cancelled its queue, a new job is not held.
    let a2 = submit(&w, "a2", failing("k", "cancel")).await;
    exec.run_dispatched(&[a2]).await.unwrap();
    let d = submit(&w, "d", noop("k")).await;
    assert_eq!(get(&w, d).await["waiting_reason"].as_str(), Some("not_claimed"));
    assert_eq!(exec.run_dispatched(&[d]).await.unwrap().1, 1);
}

#[tokio::test]
async fn a_replayed_submit_queues_nothing_twice_and_a_batch_queues_in_its_order() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let a = submit(&w, "a", noop("k")).await;
    let (s, again) = w.submit("a", noop("k")).await;
    assert_eq!((s, id_of(&again)), (StatusCode::OK, a), "a replay");
    let items: Vec<Value> = ["b", "a", "c", "c"]
        .iter()
        .map(|k| {
            let mut j = noop("k");
            j["idempotency_key"] = json!(k);
            j
        })
        .collect();
    let (s, out) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": items}))).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let status: Vec<i64> = out["results"].as_array().unwrap().iter().map(|r| r["status"].as_i64().unwrap()).collect();
    assert_eq!(status, [202, 200, 202, 200], "{out}");
    let (b, c) = (id_of(&out["results"][0]["job"]), id_of(&out["results"][2]["job"]));
    assert_eq!(get(&w, b).await["ordered_behind"].as_str(), Some(&*a.to_string()));
    assert_eq!(get(&w, c).await["ordered_behind"].as_str(), Some(&*b.to_string()), "behind B, not the replays");
    for id in [a, b, c] {
        assert_eq!(exec.run_dispatched(&[id]).await.unwrap().1, 1);
    }
    assert_eq!(w.count("SELECT count(*) FROM job_dependencies", &[]).await, 0);
}

#[tokio::test]
async fn hostile_ordering_fields_get_a_clear_422() {
    let w = World::new().await;
    let long = "k".repeat(201);
    for (body, field) in [
        (json!({"task_type": "noop", "ordering_key": ""}), "ordering_key"),
        (json!({"task_type": "noop", "ordering_key": long}), "ordering_key"),
        (json!({"task_type": "noop", "ordering_key": "a\u{1}b"}), "ordering_key"),
        (json!({"task_type": "noop", "ordering_key": 7}), "ordering_key"),
        (json!({"task_type": "noop", "ordering_on_failure": "hold"}), "ordering_on_failure"),
        (json!({"task_type": "noop", "ordering_key": "k", "ordering_on_failure": "retry"}), "ordering_on_failure"),
    ] {
        let (s, e) = w.submit("h", body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {e}");
        assert_eq!(e["error"]["field"].as_str(), Some(field), "{body}: {e}");
    }
    let (s, out) = w
        .call(
            Method::POST,
            "/v1/jobs:batch",
            None,
            Some(json!({"jobs": [{"task_type": "noop", "idempotency_key": "x", "ordering_key": ""}]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(out["results"][0]["error"]["field"].as_str(), Some("jobs[0].ordering_key"), "{out}");
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 0);
}
