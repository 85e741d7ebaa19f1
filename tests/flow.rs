//! Job-core flow: per-key concurrency, fan-out progress, waiting reasons, correlation.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::Method;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use taskdeck::job::terms::{CorrelationId, IdempotencyKey, Limits};
use taskdeck::store::jobs::{self, NewJob};
use taskdeck::store::{modes, progress};
use tokio::sync::watch;

use crate::support::World;

fn id_of(job: &Value) -> JobId {
    job["id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no id in {job}"))
}

/// Each succeeded job's last run: claimed at `started_at`, outcome written at `finished_at`.
async fn runs(w: &World) -> HashMap<String, Vec<(DateTime<Utc>, DateTime<Utc>)>> {
    let rows = w
        .db()
        .await
        .query(
            "SELECT coalesce(concurrency_key, ''), started_at, finished_at FROM jobs
             WHERE status = 'succeeded' ORDER BY started_at",
            &[],
        )
        .await
        .unwrap();
    let mut out: HashMap<String, Vec<_>> = HashMap::new();
    for r in rows {
        out.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_limit_one_never_runs_two_at_once_under_eight_workers() {
    let w = World::new().await;
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(8, &stop);
    let per_key = 10;
    for i in 0..per_key {
        for key in ["client-a", "client-b"] {
            let body = json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.05},
                              "concurrency_key": key, "concurrency_limit": 1});
            let (s, job) = w.submit(&format!("{key}-{i}"), body).await;
            assert_eq!(s, 202, "{job}");
            assert_eq!(job["concurrency_key"], key);
        }
        w.submit(&format!("free-{i}"), json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.05}})).await;
    }
    let done = "SELECT count(*) FROM jobs WHERE status = 'succeeded'";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while w.count(done, &[]).await < 3 * per_key && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(w.count(done, &[]).await, 3 * per_key);

    let runs = runs(&w).await;
    for key in ["client-a", "client-b"] {
        let r = &runs[key];
        assert_eq!(r.len(), per_key as usize);
        for pair in r.windows(2) {
            assert!(
                pair[1].0 >= pair[0].1,
                "{key}: a run started at {} before the previous ended at {}",
                pair[1].0,
                pair[0].1
            );
        }
        // A finished job hands its slot on promptly (its completion dispatches the next).
        let mut gaps: Vec<i64> = r.windows(2).map(|p| (p[1].0 - p[0].1).num_milliseconds()).collect();
        gaps.sort();
        assert!(gaps[gaps.len() / 2] < 200, "{key}: median hand-on gap {} ms ({gaps:?})", gaps[gaps.len() / 2]);
    }
    // Unrelated keys are not held back: the two keys ran side by side.
    let overlap = runs["client-a"].iter().any(|a| runs["client-b"].iter().any(|b| a.0 < b.1 && b.0 < a.1));
    assert!(overlap, "keys a and b never ran at the same time");
    // Each key took about per_key * 50 ms, not 2 * per_key * 50 ms.
    let span = |r: &[(DateTime<Utc>, DateTime<Utc>)]| (r[r.len() - 1].1 - r[0].0).num_milliseconds();
    let all_keyed = runs["client-a"].iter().chain(&runs["client-b"]).map(|r| r.1).max().unwrap()
        - runs["client-a"].iter().chain(&runs["client-b"]).map(|r| r.0).min().unwrap();
    assert!(
        all_keyed.num_milliseconds() < span(&runs["client-a"]) + span(&runs["client-b"]),
        "keys ran one after the other"
    );
}

#[tokio::test]
async fn a_keyed_job_delivered_by_id_waits_for_its_slot_and_is_handed_on() {
    // The SQS shape: the executor claims the ids it is given.
    let w = World::new().await;
    let body = |n: i32| {
        json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.2},
                               "concurrency_key": "cfg-set", "concurrency_limit": 1, "correlation_id": format!("c{n}")})
    };
    let first = id_of(&w.submit("k1", body(1)).await.1);
    let second = id_of(&w.submit("k2", body(2)).await.1);
    let exec = w.platform.executor();
    let (e1, e2) = (exec.clone(), exec.clone());
    let a = tokio::spawn(async move { e1.run_dispatched(&[first]).await.unwrap().1 });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The key's one slot is taken: the second is not claimed, and says why.
    assert_eq!(e2.run_dispatched(&[second]).await.unwrap().1, 0);
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{second}"), None, None).await;
    assert_eq!(job["waiting_reason"], "concurrency_key_busy", "{job}");
    assert_eq!(a.await.unwrap(), 1);
    // The first's completion handed the slot on: the second was dispatched again (marked).
    let marked = "SELECT count(*) FROM jobs WHERE id = $1 AND dispatched_at > (SELECT finished_at - interval '1 second' FROM jobs WHERE id = $2)";
    assert_eq!(w.count(marked, &[&second, &first]).await, 1);
    assert_eq!(exec.run_dispatched(&[second]).await.unwrap().1, 1);
    // Bad input: a key without a limit, a limit out of range.
    let (s, e) = w.submit("bad1", json!({"task_type": "noop", "concurrency_key": "k"})).await;
    assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("concurrency_limit")));
    let (s, e) = w.submit("bad2", json!({"task_type": "noop", "concurrency_key": "k", "concurrency_limit": 0})).await;
    assert_eq!((s.as_u16(), e["error"]["field"].as_str()), (422, Some("concurrency_limit")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_refilling_its_key_still_takes_a_job_due_before_its_place() {
    // A worker refills the slots its keyed jobs free, reading the key's queue from the place of
    // the jobs that ended. A job placed before that (here: inserted late with an earlier
    // `run_at`) is taken by the claim from the key's head the worker makes every 100 ms, not
    // left until the backlog drains.
    let w = World::new().await;
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(1, &stop);
    let limit = 2;
    let backlog: Vec<Value> = (0..120)
        .map(|i| json!({"idempotency_key": format!("lane-{i}"), "task_type": "test.effect", "params": {"sleep_seconds": 0.02},
                        "concurrency_key": "lane", "concurrency_limit": limit}))
        .collect();
    let (s, res) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": backlog}))).await;
    assert_eq!(s, 200, "{res}");
    let done = "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND concurrency_key = 'lane'";
    while w.count(done, &[]).await < 10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let early = NewJob {
        run_at: Utc::now() - chrono::Duration::hours(1),
        limits: Limits::fixed(3, 60),
        concurrency: taskdeck::job::terms::Concurrency::parse(Some("lane".into()), Some(limit)).unwrap(),
        ..NewJob::new("noop", json!({}), IdempotencyKey::parse("lane-early").unwrap())
    };
    jobs::insert_many(&w.db().await, w.tenant.id, std::slice::from_ref(&early), None).await.unwrap();
    let inserted_at = Utc::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while w.count(done, &[]).await < 121 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(w.count(done, &[]).await, 121, "the backlog and the early job all ran");
    let runs = runs(&w).await;
    let lane = &runs["lane"];
    // The most running at once, from each run's claim to its recorded outcome.
    let mut edges: Vec<(DateTime<Utc>, i32)> = lane.iter().flat_map(|r| [(r.0, 1), (r.1, -1)]).collect();
    edges.sort();
    let most = edges.iter().scan(0, |n, e| {
        *n += e.1;
        Some(*n)
    });
    assert_eq!(most.max(), Some(limit), "the key's limit is {limit}");
    let early_start: DateTime<Utc> =
        w.db().await.query_one("SELECT started_at FROM jobs WHERE id = $1", &[&early.id]).await.unwrap().get(0);
    let last_end = lane.iter().map(|r| r.1).max().unwrap();
    println!(
        "early job started {} ms after its insert; the backlog ended {} ms after it",
        (early_start - inserted_at).num_milliseconds(),
        (last_end - inserted_at).num_milliseconds()
    );
    assert!(
        (early_start - inserted_at).num_milliseconds() < 600,
        "the early job waited {} ms",
        (early_start - inserted_at).num_milliseconds()
    );
    assert!(
        last_end - early_start > chrono::Duration::milliseconds(300),
        "the backlog was over before the early job ran: nothing was shown"
    );
}

#[tokio::test]
async fn waiting_reasons_say_why_a_job_is_not_running() {
    let w = World::new().await;
    let reason = |id: JobId| {
        let w = &w;
        async move { w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await.1["waiting_reason"].clone() }
    };
    let later = id_of(&w.submit("later", json!({"task_type": "noop", "delay_seconds": 60})).await.1);
    assert_eq!(reason(later).await, "not_due");
    let now = id_of(&w.submit("now", json!({"task_type": "noop"})).await.1);
    assert_eq!(reason(now).await, "not_claimed");
    modes::set(&mut w.db().await, "pause:sleep", true, "test", None).await.unwrap();
    let paused = id_of(&w.submit("paused", json!({"task_type": "sleep", "params": {"seconds": 0}})).await.1);
    assert_eq!(reason(paused).await, "paused");
    let parent = id_of(&w.submit("parent", json!({"task_type": "noop"})).await.1);
    assert!(jobs::wait_for_children(&w.db().await, w.tenant.id, parent, 2).await.unwrap());
    assert_eq!(reason(parent).await, "waiting_for_children");
    let (_, page) = w.call(Method::GET, "/v1/jobs", None, None).await;
    assert!(page["jobs"].as_array().unwrap().iter().all(|j| j["waiting_reason"].is_string()), "{page}");
    // Running and finished jobs have none.
    w.platform.executor().run_dispatched(&[now]).await.unwrap();
    assert_eq!(reason(now).await, Value::Null);
}

/// Read a parent's count progress through the API.
async fn count_of(w: &World, id: JobId) -> (i64, i64, i64) {
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    let p = &job["progress"];
    assert_eq!(p["kind"], "count", "{job}");
    let (total, pending) = (p["total"].as_i64().unwrap(), p["pending"].as_i64().unwrap());
    let finished = p["succeeded"].as_i64().unwrap() + p["failed"].as_i64().unwrap() + p["cancelled"].as_i64().unwrap();
    assert_eq!(finished + pending, total, "{p}");
    (finished, total, pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_progress_never_decreases_and_never_exceeds_the_total() {
    let w = World::new().await;
    let (_, parent) =
        w.submit("campaign", json!({"task_type": "noop", "correlation_id": "camp-1", "delay_seconds": 3600})).await;
    let pid = id_of(&parent);
    let total = 40;
    assert!(jobs::wait_for_children(&w.db().await, w.tenant.id, pid, total).await.unwrap());
    let parent = jobs::get(&w.db().await, w.tenant.id, pid).await.unwrap().unwrap();
    assert_eq!(count_of(&w, pid).await, (0, 40, 40), "declared before any child exists");
    let correlation = CorrelationId::parse(&parent.correlation_id).unwrap();

    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(2, &stop);
    let sweeper = w.platform.spawn_sweeper(&stop);
    let mut seen = Vec::new();
    // Children arrive in chunks while earlier ones run; some fail for good, one dies mid-run.
    for chunk in 0..4 {
        let kids: Vec<NewJob> = (0..10)
            .map(|i| {
                let n = chunk * 10 + i;
                let (task_type, params) = if n % 7 == 3 {
                    ("test.fail", json!({"times": 5, "kind": "fatal"}))
                } else {
                    ("test.effect", json!({"sleep_seconds": 0.02}))
                };
                NewJob::child_of(
                    parent.id,
                    &correlation,
                    NewJob {
                        limits: Limits::fixed(1, 30),
                        ..NewJob::new(task_type, params, IdempotencyKey::parse(&format!("campaign:{n}")).unwrap())
                    },
                )
            })
            .collect();
        w.platform.intake.enqueue(w.tenant.id, kids).await.unwrap();
        for _ in 0..5 {
            seen.push(count_of(&w, pid).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = count_of(&w, pid).await;
        seen.push(c);
        let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{pid}"), None, None).await;
        if job["status"] == "succeeded" || job["status"] == "failed" || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    sweeper.await.unwrap();

    for pair in seen.windows(2) {
        assert!(pair[1].0 >= pair[0].0, "progress went back: {:?} then {:?}", pair[0], pair[1]);
    }
    assert!(seen.iter().all(|(done, total, _)| *total == 40 && *done <= 40), "{seen:?}");
    assert!(seen.iter().any(|(done, ..)| *done > 0 && *done < 40), "no intermediate reading: {seen:?}");
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{pid}"), None, None).await;
    // Finished when every child has; failed, as six children did, saying how many and why.
    assert_eq!(job["status"], "failed", "the parent finishes when every child has: {job}");
    let error = job["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("6 of 40 children failed; 6 with: "), "{error}");
    assert_eq!(w.count("SELECT count(*) FROM exceptions", &[]).await, 1, "one exception, the parent's");
    assert_eq!(job["progress"]["succeeded"], 34);
    // Every child carries the parent's correlation id: the chain comes back by it.
    let (_, chain) = w.call(Method::GET, "/v1/jobs?correlation_id=camp-1&limit=500", None, None).await;
    assert_eq!(chain["jobs"].as_array().unwrap().len(), 41);
}

#[tokio::test]
async fn a_running_job_is_measured_against_its_task_types_baseline() {
    let w = World::new().await;
    // Five earlier runs of `sleep` of 1 s each, finished top-level jobs.
    let db = w.db().await;
    for i in 0..5 {
        let (_, j) = w.submit(&format!("old{i}"), json!({"task_type": "sleep", "params": {"seconds": 0}})).await;
        db.execute(
            "UPDATE jobs SET status = 'succeeded', attempt = 1, started_at = now() - interval '11 s',
                             finished_at = now() - interval '10 s' WHERE id = $1",
            &[&id_of(&j)],
        )
        .await
        .unwrap();
    }
    assert_eq!(progress::refresh_baselines(&db).await.unwrap(), 1);
    let (_, j) = w.submit("now", json!({"task_type": "sleep", "params": {"seconds": 60}})).await;
    let id = id_of(&j);
    jobs::claim_ids(&db, &[id], 30.0, None).await.unwrap();
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    let p = &job["progress"];
    assert_eq!(
        (p["kind"].as_str(), p["runs_in_baseline"].as_i64(), p["stuck"].as_bool()),
        (Some("elapsed"), Some(5), Some(false)),
        "{p}"
    );
    assert!((p["baseline_p50_s"].as_f64().unwrap() - 1.0).abs() < 0.01, "{p}");
    // Started 4 s ago: past 3 x p95 (3 s), so stuck.
    db.execute("UPDATE jobs SET started_at = now() - interval '4 s' WHERE id = $1", &[&id]).await.unwrap();
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(job["progress"]["stuck"], true, "{job}");
}

/// Submit `n` noop jobs behind one concurrency key (limit 10), in batches of 500.
async fn behind_key(w: &World, key: &str, n: usize) {
    for start in (0..n).step_by(500) {
        let jobs: Vec<Value> = (start..n.min(start + 500))
            .map(|i| {
                json!({"idempotency_key": format!("{key}-{i}"), "task_type": "noop",
                            "concurrency_key": key, "concurrency_limit": 10})
            })
            .collect();
        let (s, res) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": jobs}))).await;
        assert_eq!(s, 200, "{res}");
    }
}

#[tokio::test]
async fn a_keyed_claim_costs_the_same_with_twenty_thousand_jobs_behind_the_key_as_with_a_hundred() {
    let w = World::new().await;
    let mut db = w.db().await;
    db.batch_execute("ALTER TABLE jobs SET (autovacuum_enabled = false)").await.unwrap();
    behind_key(&w, "few", 100).await;
    // The claim's plan is made now, with a hundred jobs in the table, and kept, as a worker's
    // connection keeps it while a fan-out fills a key behind it.
    let few = taskdeck::store::tooling::readouts::keyed_claim_buffers(&mut db, "few", 1000).await.unwrap();
    behind_key(&w, "many", 20_000).await;
    let many = taskdeck::store::tooling::readouts::keyed_claim_buffers(&mut db, "many", 1000).await.unwrap();
    println!("keyed claim of 10 jobs: {few} buffers with 100 behind the key, {many} with 20,000");
    // Sorting every waiting job, or locking a thousand rows to claim ten, reads thousands.
    assert!(many <= 2 * few + 20, "a claim behind 20,000 jobs read {many} buffers, behind 100 {few}");
}
