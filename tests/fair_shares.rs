//! Fair shares of what tenants share: no pooled connection is held across an outside call (500
//! calls hanging on a tenant's silent endpoint, a pool of 10: the API, claims and liveness of
//! everyone else carry on), a destination's calls in flight are bounded (`max_in_flight`), and
//! a worker's running slots are divided among the tenants with due work.

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::liveness::Kind;

use crate::http::{Reply, destination, receiver, world_with};
use crate::support::{World, test_settings};

/// Submit `n` jobs of `task` with `params` in batches of 500 as `key`'s tenant; returns the ids.
pub async fn submit_many(w: &World, key: &str, prefix: &str, n: usize, task: &str, params: Value) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let jobs: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"idempotency_key": format!("{prefix}-{i}"), "task_type": task, "params": params}))
            .collect();
        let body = json!({"jobs": jobs}).to_string().into_bytes();
        let (s, res) = w.call_as(key, Method::POST, "/v1/jobs:batch", None, Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{res}");
        for r in res["results"].as_array().unwrap() {
            assert_eq!(r["status"], 202, "{r}");
            ids.push(r["job"]["id"].as_str().unwrap().to_owned());
        }
    }
    ids
}

/// Submit one noop as `key`'s tenant and read it until it succeeds: the API's answers (any
/// that is not 202/200 is returned as an error) and the time to success.
async fn noop_round_trip(w: &World, key: &str, n: usize) -> Result<Duration, String> {
    let started = Instant::now();
    let body = json!({"task_type": "noop", "params": {}}).to_string().into_bytes();
    let (s, job) = w.call_as(key, Method::POST, "/v1/jobs", Some(&format!("probe-{n}")), Some(body)).await;
    if s != StatusCode::ACCEPTED {
        return Err(format!("POST /v1/jobs answered {s}: {job}"));
    }
    let id = job["id"].as_str().unwrap().to_owned();
    loop {
        let (s, job) = w.call_as(key, Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
        if s != StatusCode::OK {
            return Err(format!("GET /v1/jobs/{id} answered {s}: {job}"));
        }
        if job["status"] == "succeeded" {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(format!("noop {id} not done after 10 s: {job}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_calls_hanging_on_a_silent_endpoint_hold_no_connection_from_anyone_else() {
    const HANGING: usize = 500;
    let mut s = test_settings();
    s.pool.max_size = 10;
    s.executor.concurrency = HANGING + 20;
    s.executor.claim_batch = 100;
    s.executor.lease = Duration::from_secs(5);
    let w = world_with(s, "http.request", crate::http::ROLE).await;
    let (x, x_key) = w.other_tenant("noisy").await;
    let (addr, seen) = receiver(vec![Reply::Hang(Duration::from_secs(90)); HANGING + 10]).await;
    let d = destination(
        &w,
        &x_key,
        "silent",
        addr,
        json!({"timeout_ms": 60_000, "rate_per_second": 1000, "max_in_flight": 1000}),
    )
    .await;
    assert_eq!(d["max_in_flight"], 1000);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let handles = w.platform.spawn_workers(1, &stop);
    let params = json!({"destination": "silent", "method": "POST", "path": "/hook", "body": {"n": 1}});
    // A few more than are waited for: one connection of hundreds may fail to reach the receiver
    // on a loaded machine (its call then ends at once, not hanging).
    let mut ids = submit_many(&w, &x_key, "extra", 10, "http.request", params.clone()).await;
    ids.extend(submit_many(&w, &x_key, "x", HANGING, "http.request", params).await);
    assert_eq!(ids.len(), HANGING + 10);

    // Every call is out and hanging.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(45);
    let mut said = Instant::now();
    while seen.lock().unwrap().len() < HANGING {
        if said.elapsed() > Duration::from_secs(2) {
            eprintln!("{:?}: {} calls out", started.elapsed(), seen.lock().unwrap().len());
            said = Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {HANGING} calls reached the endpoint",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // While they hang: the other tenant's API calls, its jobs' claims and the liveness beat, and
    // the pool's own count of connections in use.
    let pool = w.platform.pool.clone();
    let sampler = tokio::spawn(async move {
        let mut most = 0;
        let until = Instant::now() + Duration::from_secs(6);
        while Instant::now() < until {
            let st = pool.status();
            most = most.max(st.size - st.available);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        most
    });
    let live = w.platform.liveness(Kind::Worker);
    let mut errors = Vec::new();
    let mut latencies = Vec::new();
    let mut beats = Vec::new();
    let until = Instant::now() + Duration::from_secs(6);
    let mut n = 0;
    while Instant::now() < until {
        match noop_round_trip(&w, &w.key, n).await {
            Ok(t) => latencies.push(t),
            Err(e) => errors.push(e),
        }
        let beat = Instant::now();
        match live.beat().await {
            Ok(()) => beats.push(beat.elapsed()),
            Err(e) => errors.push(format!("liveness beat: {e}")),
        }
        n += 1;
    }
    let in_use = sampler.await.unwrap();
    let still_hanging =
        w.count("SELECT count(*) FROM http_calls WHERE tenant_id = $1 AND outcome = 'sending'", &[&x.id]).await;
    latencies.sort();
    beats.sort();
    let p99 = |v: &[Duration]| v[(v.len() * 99 / 100).min(v.len() - 1)];
    println!(
        "{HANGING} calls hanging, pool of 10: {n} noops of the other tenant, p50 {:?} p99 {:?}; liveness beat p99 {:?}; \
         most connections in use at once {in_use}; errors {}",
        latencies[latencies.len() / 2],
        p99(&latencies),
        p99(&beats),
        errors.len()
    );
    assert!(still_hanging >= HANGING as i64, "{still_hanging} calls were still hanging after the measurement");
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(n >= 10, "only {n} round trips in 6 s");
    assert!(p99(&latencies) < Duration::from_secs(2), "the other tenant's noop p99 {:?}", p99(&latencies));
    assert!(p99(&beats) < Duration::from_secs(1), "liveness beat p99 {:?}", p99(&beats));
    assert!(in_use < 10, "{in_use} of 10 connections were in use at once while the calls hung");
    stop_tx.send(true).unwrap();
    for h in handles {
        let _ = h.await;
    }
}
