//! Fair shares on a worker, continued: the long lane (a tenant that filled it alone leaves the
//! other slots to short jobs) and the API's own connections beside a burst of jobs.

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::fair_shares::submit_many;
use crate::http::{Reply, destination, receiver, world_with};
use crate::support::{World, test_settings};

/// What a quiet tenant's p99 may take beyond twice its solo p99 on this loaded machine: the
/// allowance `relay chaos neighbours` states (a phase's p99 is its slowest few jobs).
const LATENCY_ALLOWANCE: Duration = Duration::from_millis(250);

/// Tenant A's `noop` and `http.request` to a healthy destination, one of each every 100 ms for
/// `phase`, then (at most 15 s more) each kind's accept-to-finish p99 and how many did not
/// finish.
async fn quiet_tenant(w: &World, name: &str, phase: Duration) -> [(Duration, usize); 2] {
    let started = Instant::now();
    let mut ids: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut n = 0;
    while started.elapsed() < phase {
        let call = json!({"destination": "healthy", "method": "GET", "path": "/ok"});
        ids[0].extend(submit_many(w, &w.key, &format!("{name}-noop-{n}"), 1, "noop", json!({})).await);
        ids[1].extend(submit_many(w, &w.key, &format!("{name}-http-{n}"), 1, "http.request", call).await);
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let db = w.db().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let all: Vec<String> = ids.iter().flatten().cloned().collect();
    let open = "SELECT count(*) FROM jobs WHERE id::text = ANY($1) AND finished_at IS NULL";
    while Instant::now() < deadline && db.query_one(open, &[&all]).await.unwrap().get::<_, i64>(0) > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut out = [(Duration::ZERO, 0); 2];
    for (i, ids) in ids.iter().enumerate() {
        let rows = db
            .query(
                "SELECT (extract(epoch FROM finished_at - created_at) * 1000)::int8 FROM jobs
                 WHERE id::text = ANY($1) AND status = 'succeeded' ORDER BY 1",
                &[ids],
            )
            .await
            .unwrap();
        let ms: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let p99 = ms.get((ms.len() * 99 / 100).min(ms.len().saturating_sub(1))).copied().unwrap_or(i64::MAX);
        out[i] = (Duration::from_millis(p99.unsigned_abs()), ids.len() - ms.len());
    }
    out
}

/// Tenant X, alone, fills a worker's long lane with 300 calls to a silent endpoint (each may
/// take 10 minutes: long jobs); then tenant A's `noop` and `http.request` to a healthy
/// destination start at once in the slots outside the lane: A's p99 stays within twice its solo
/// p99 (measured in the same run) plus `LATENCY_ALLOWANCE`, and X never holds more than the
/// lane. `RELAY_TEST_LONG_LANE=off` runs it without the lane (it then fails: X's calls hold
/// every slot, and nothing is preempted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_that_filled_the_long_lane_alone_leaves_the_other_slots_to_short_jobs() {
    const SLOTS: usize = 16;
    const SILENT: usize = 300;
    let lanes = std::env::var("RELAY_TEST_LONG_LANE").map_or(true, |v| v != "off");
    let mut s = test_settings();
    s.pool.max_size = 10;
    s.executor.concurrency = SLOTS;
    s.executor.claim_batch = SLOTS;
    s.executor.lease = Duration::from_secs(5);
    if !lanes {
        s.executor.long_lane = None;
    }
    let long_slots = s.executor.long_lane().map_or(SLOTS as i64, |l| l.slots);
    let w = world_with(s, "http.request", crate::http::ROLE).await;
    let (x, x_key) = w.other_tenant("noisy").await;
    let (silent, seen) = receiver(vec![Reply::Hang(Duration::from_secs(120)); SILENT + 10]).await;
    let (healthy, _) = receiver(Vec::new()).await;
    destination(
        &w,
        &x_key,
        "silent",
        silent,
        json!({"timeout_ms": 60_000, "rate_per_second": 1000, "max_in_flight": 1000}),
    )
    .await;
    destination(&w, &w.key, "healthy", healthy, json!({"timeout_ms": 10_000, "rate_per_second": 1000})).await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let handles = w.platform.spawn_workers(1, &stop);
    let phase = Duration::from_secs(3);
    let solo = quiet_tenant(&w, "solo", phase).await;

    // X alone: calls that may each take 10 minutes (`timeout_ms`), so long jobs.
    let params = json!({"destination": "silent", "method": "POST", "path": "/hook", "timeout_ms": 600_000});
    let ids = submit_many(&w, &x_key, "x", SILENT, "http.request", params).await;
    let job = w.db().await.query_one("SELECT timeout_seconds FROM jobs WHERE id::text = $1", &[&ids[0]]).await.unwrap();
    assert!(job.get::<_, i32>(0) > taskdeck::executor::DEFAULT_LONG_AFTER, "X's jobs are long");
    let deadline = Instant::now() + Duration::from_secs(30);
    while (seen.lock().unwrap().len() as i64) < long_slots {
        assert!(Instant::now() < deadline, "X's calls fill {long_slots} slots: {} out", seen.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let running = "SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status = 'running'";
    let x_before = w.count(running, &[&x.id]).await;

    let beside = quiet_tenant(&w, "beside", phase).await;
    let x_after = w.count(running, &[&x.id]).await;
    // X's own short jobs, queued behind its long ones that wait for the lane, start too.
    let mine = submit_many(&w, &x_key, "x-short", 3, "noop", json!({})).await;
    let done = "SELECT count(*) FROM jobs WHERE id::text = ANY($1) AND status = 'succeeded'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.count(done, &[&mine]).await < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let x_short = w.count(done, &[&mine]).await;
    println!(
        "long lane {lanes} ({long_slots} of {SLOTS} slots): X ran {x_before} then {x_after} ({} calls out); \
         A's noop p99 {:?} solo, {:?} beside ({} unfinished); http.request p99 {:?} solo, {:?} beside ({} unfinished)",
        seen.lock().unwrap().len(),
        solo[0].0,
        beside[0].0,
        beside[0].1,
        solo[1].0,
        beside[1].0,
        beside[1].1
    );
    stop_tx.send(true).unwrap();
    for h in handles {
        h.abort();
    }
    assert!(x_before >= long_slots, "X filled the lane first: {x_before} running");
    assert!(x_after <= long_slots, "X holds no more than the long lane: {x_after} of {long_slots}");
    assert_eq!(x_short, 3, "X's short jobs behind its long ones: {x_short} of 3 succeeded");
    for (kind, (solo, beside)) in ["noop", "http.request"].iter().zip(solo.iter().zip(&beside)) {
        assert_eq!(solo.1, 0, "A's solo {kind} jobs all finished");
        assert_eq!(beside.1, 0, "A's {kind} jobs beside X's long calls: {} not finished 15 s after", beside.1);
        let bound = 2 * solo.0 + LATENCY_ALLOWANCE;
        assert!(beside.0 <= bound, "A's {kind} p99 {:?} beside X, over 2 × solo {:?} + 250 ms", beside.0, solo.0);
    }
}

/// Another tenant's `POST /v1/jobs` answer times (p50, p99) while tenant X's burst of 500
/// `http.request` jobs (answered after 1 s) starts in a worker of 500 slots over a pool of 10:
/// each call takes a connection before and after, so hundreds wait for the pool at once.
/// `api_pool`: the API's own connections (`Settings::api_pool_size`), or none. Also how many
/// answers were not 202 (a 503 when the wait for a connection timed out).
async fn api_beside_a_burst(api_pool: Option<usize>) -> (Duration, Duration, usize) {
    const BURST: usize = 500;
    let mut s = test_settings();
    s.pool.max_size = 10;
    s.api_pool_size = api_pool;
    s.executor.concurrency = BURST;
    s.executor.claim_batch = BURST;
    let w = world_with(s, "http.request", crate::http::ROLE).await;
    let (_, x_key) = w.other_tenant("bursty").await;
    let (addr, _) = receiver(vec![Reply::Hang(Duration::from_secs(1)); BURST]).await;
    destination(
        &w,
        &x_key,
        "slowish",
        addr,
        json!({"timeout_ms": 10_000, "rate_per_second": 1000, "max_in_flight": 1000}),
    )
    .await;
    let params = json!({"destination": "slowish", "method": "POST", "path": "/hook"});
    submit_many(&w, &x_key, "x", BURST, "http.request", params).await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let handles = w.platform.spawn_workers(1, &stop);
    let mut took = Vec::new();
    let mut refused = 0;
    let until = Instant::now() + Duration::from_secs(4);
    let body = json!({"task_type": "noop", "params": {}}).to_string().into_bytes();
    while Instant::now() < until {
        let started = Instant::now();
        let key = format!("quiet-{}", took.len());
        let (s, _) = w.call_as(&w.key, Method::POST, "/v1/jobs", Some(&key), Some(body.clone())).await;
        refused += usize::from(s != StatusCode::ACCEPTED);
        took.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_tx.send(true).unwrap();
    for h in handles {
        h.abort();
    }
    took.sort();
    (took[took.len() / 2], took[(took.len() * 99 / 100).min(took.len() - 1)], refused)
}

/// The API's own connections: another tenant's `POST /v1/jobs` during a burst of 500 jobs that
/// wait for the pool answers as it does with nothing running, against the same burst with the
/// API sharing the tasks' pool (measured in the same run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_its_own_connections_beside_a_burst_of_jobs() {
    let (shared_p50, shared_p99, shared_refused) = api_beside_a_burst(None).await;
    let (own_p50, own_p99, own_refused) = api_beside_a_burst(Some(4)).await;
    println!(
        "POST /v1/jobs beside a burst of 500 calls, pool of 10: sharing the pool p50 {shared_p50:?} p99 {shared_p99:?} \
         ({shared_refused} not 202); its own 4 connections p50 {own_p50:?} p99 {own_p99:?} ({own_refused} not 202)"
    );
    assert_eq!(own_refused, 0, "the API's own pool: {own_refused} answers not 202");
    assert!(own_p99 < shared_p99, "the API's own pool: p99 {own_p99:?}, shared {shared_p99:?}");
    assert!(own_p99 < Duration::from_secs(1), "the API's own pool: p99 {own_p99:?}");
}
