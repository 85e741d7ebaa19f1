//! Scenario 9, tenant isolation: every route called by tenant B with tenant A's ids and keys
//! must answer exactly as for an id that does not exist; B's submissions under A's idempotency
//! keys make B's own jobs. Then both tenants hammer the API through a two-connection pool
//! while a share of requests is aborted mid-flight: no answer may carry the other tenant's
//! rows (nothing tenant-scoped may leak from a connection a cancelled request left behind).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde_json::{Value, json};

use super::harness::{self, Http};
use super::{Env, Report};
use crate::platform::Settings;
use crate::store::tenants;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("isolation", env.scale);
    let scratch = env.scratch(Settings::default()).await?;
    let (b_tenant, b_key) = tenants::create(&scratch.platform.pool.get().await?, "other").await?;
    let a_key = scratch.key.clone();
    let (_server, http) = harness::serve(&env.relay, &scratch.url, &[("RELAY_POOL_SIZE", "2".into())], &env.log("isolation-serve")).await?;

    // A's jobs: pending (due in an hour, so B could try to cancel them), with correlation ids.
    let n = env.n(50, 5);
    let mut a_ids = Vec::new();
    for i in 0..n {
        let body = json!({"task_type": "noop", "correlation_id": format!("a-corr-{i}"), "delay_seconds": 3600});
        let (status, job) = http.call("POST", "/v1/jobs", Some(&a_key), Some(&format!("a-{i}")), Some(&body)).await?;
        anyhow::ensure!(status == 202, "A's submit answered {status}");
        a_ids.push(job["id"].as_str().unwrap_or_default().to_owned());
    }

    // The matrix: each route with A's id versus a random id, as B.
    let routes: &[(&str, &str)] = &[
        ("GET", "/v1/jobs/{id}"),
        ("GET", "/v1/jobs/{id}/events"),
        ("GET", "/v1/jobs/{id}/sessions"),
        ("POST", "/v1/jobs/{id}/cancel"),
        ("GET", "/v1/admin/exceptions/{id}"),
        ("POST", "/v1/admin/exceptions/{id}/retry"),
        ("GET", "/v1/admin/schedules/{id}"),
    ];
    let mut cells = 0;
    let mut distinguishable = Vec::new();
    for id in &a_ids {
        let random = uuid::Uuid::now_v7().to_string();
        for (method, route) in routes {
            let body = (*method == "POST").then(|| json!({}));
            let theirs = http.call(method, &route.replace("{id}", id), Some(&b_key), None, body.as_ref()).await?;
            let missing = http.call(method, &route.replace("{id}", &random), Some(&b_key), None, body.as_ref()).await?;
            cells += 1;
            if theirs != missing {
                distinguishable.push(format!("{method} {route}: {} {} vs {} {}", theirs.0, theirs.1, missing.0, missing.1));
            }
        }
        // A's correlation id in B's change feed: nothing, like an unknown one.
        let corr = format!("a-corr-{}", a_ids.iter().position(|x| x == id).unwrap_or(0));
        let feed = http.call("GET", &format!("/v1/jobs?correlation_id={corr}"), Some(&b_key), None, None).await?;
        cells += 1;
        if feed.0 != 200 || feed.1["jobs"].as_array().is_none_or(|j| !j.is_empty()) {
            distinguishable.push(format!("GET /v1/jobs?correlation_id=<A's>: {} {}", feed.0, feed.1));
        }
    }
    // A's idempotency keys, as B: B's own new jobs, never A's.
    let mut b_ids = HashSet::new();
    let mut key_leaks = 0;
    for i in 0..n {
        let body = json!({"task_type": "noop", "correlation_id": format!("a-corr-{i}"), "delay_seconds": 3600});
        let (status, job) = http.call("POST", "/v1/jobs", Some(&b_key), Some(&format!("a-{i}")), Some(&body)).await?;
        let id = job["id"].as_str().unwrap_or_default().to_owned();
        if status != 202 || a_ids.contains(&id) {
            key_leaks += 1;
        }
        b_ids.insert(id);
    }
    let batch: Vec<Value> = (0..n.min(500)).map(|i| json!({"idempotency_key": format!("a-b{i}"), "task_type": "noop"})).collect();
    let _ = http.call("POST", "/v1/jobs:batch", Some(&a_key), None, Some(&json!({"jobs": batch}))).await?;
    let (_, b_batch) = http.call("POST", "/v1/jobs:batch", Some(&b_key), None, Some(&json!({"jobs": batch}))).await?;
    for r in b_batch["results"].as_array().into_iter().flatten() {
        let id = r["job"]["id"].as_str().unwrap_or_default().to_owned();
        if r["status"] != 202 || a_ids.contains(&id) {
            key_leaks += 1;
        }
        b_ids.insert(id);
    }
    let (_, a_feed) = http.call("GET", "/v1/jobs?limit=500", Some(&a_key), None, None).await?;
    let a_all: HashSet<String> = a_feed["jobs"].as_array().into_iter().flatten().filter_map(|j| j["id"].as_str().map(str::to_owned)).collect();

    // Aborted requests through a two-connection pool, both tenants at once.
    let requests = env.n(4000, 300);
    let (leaks, aborted, answered) = hammer(&http, &a_key, &b_key, &a_all, &b_ids, &a_ids, requests).await?;

    let db = scratch.platform.pool.get().await?;
    let a_still_pending: i64 = db
        .query_one("SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status = 'pending' AND correlation_id LIKE 'a-corr-%'", &[&scratch.tenant.id])
        .await?
        .get(0);
    let b_rows: i64 = db.query_one("SELECT count(*) FROM jobs WHERE tenant_id = $1", &[&b_tenant.id]).await?.get(0);
    let cross: i64 = db
        .query_one(
            "SELECT count(*) FROM job_keys k JOIN jobs j ON j.id = k.job_id WHERE k.tenant_id <> j.tenant_id",
            &[],
        )
        .await?
        .get(0);
    report.fig("matrix cells (route × A's id, as B)", cells);
    report.fig("cells distinguishable from not-found", distinguishable.len());
    report.fig("A's idempotency keys reused by B: leaks", key_leaks);
    report.fig("requests under abort / aborted / answered", format!("{requests} / {aborted} / {answered}"));
    report.fig("answers carrying the other tenant's rows", leaks);
    report.fig("cross-tenant rows (keys ↔ jobs)", cross);
    report.fig("A's jobs still pending after B's cancels", format!("{a_still_pending} / {n}"));
    for d in distinguishable.iter().take(5) {
        report.check(false, format!("distinguishable: {d}"));
    }
    report.check(distinguishable.is_empty(), format!("{} cells distinguishable from not-found", distinguishable.len()));
    report.check(key_leaks == 0, format!("{key_leaks} submissions under A's keys did not make B's own job"));
    report.check(leaks == 0, format!("{leaks} answers carried the other tenant's rows"));
    report.check(cross == 0, format!("{cross} cross-tenant rows"));
    report.check(a_still_pending == n as i64, "B cancelled A's jobs");
    report.check(b_rows == b_ids.len() as i64, format!("B has {b_rows} rows but was answered {} ids", b_ids.len()));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// Mixed reads by both tenants, a third of them cut off after a random 0–5 ms. Returns
/// (answers with the other tenant's ids, aborted, answered).
async fn hammer(
    http: &Http,
    a_key: &str,
    b_key: &str,
    a_all: &HashSet<String>,
    b_ids: &HashSet<String>,
    a_ids: &[String],
    requests: usize,
) -> anyhow::Result<(usize, usize, usize)> {
    let a_all = Arc::new(a_all.clone());
    let b_ids = Arc::new(b_ids.clone());
    let b_list: Vec<String> = b_ids.iter().cloned().collect();
    let mut leaks = 0;
    let mut aborted = 0;
    let mut answered = 0;
    for chunk in (0..requests).collect::<Vec<_>>().chunks(32) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let as_a = i % 2 == 0;
                let (key, own_ids) = if as_a { (a_key.to_owned(), a_ids) } else { (b_key.to_owned(), &b_list[..]) };
                let own = if own_ids.is_empty() { String::new() } else { own_ids[i % own_ids.len()].clone() };
                let path = match i % 3 {
                    0 => "/v1/jobs?limit=500".to_owned(),
                    1 => format!("/v1/jobs/{own}"),
                    _ => format!("/v1/jobs/{own}/events"),
                };
                let cut = rand::rng().random_bool(1.0 / 3.0).then(|| Duration::from_micros(rand::rng().random_range(0..5000)));
                let (http, a_all, b_ids) = (http.clone(), a_all.clone(), b_ids.clone());
                tokio::spawn(async move {
                    let call = http.call("GET", &path, Some(&key), None, None);
                    let answer = match cut {
                        Some(d) => match tokio::time::timeout(d, call).await {
                            Ok(a) => a?,
                            Err(_) => return anyhow::Ok((0, 1, 0)),
                        },
                        None => call.await?,
                    };
                    let other: &HashSet<String> = if as_a { &b_ids } else { &a_all };
                    let text = answer.1.to_string();
                    let leaked = other.iter().any(|id| text.contains(id.as_str()));
                    anyhow::Ok((usize::from(leaked), 0, 1))
                })
            })
            .collect();
        for t in tasks {
            let (l, a, n) = t.await??;
            leaks += l;
            aborted += a;
            answered += n;
        }
    }
    Ok((leaks, aborted, answered))
}
