//! Scenario 12, noisy neighbour: a quiet tenant submits 5 jobs/s; then a noisy tenant floods
//! at 100× that rate. With a per-tenant intake limit below the workers' capacity, the flood is
//! refused with 429 + `Retry-After` beyond the limit, and the quiet tenant's accept→start p99
//! should stay within 1.5× of its baseline. Claims stay FIFO by due time (no per-tenant
//! fairness in the claim): the limit is what keeps the backlog from forming.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::harness::{self, Http, Relay};
use super::{Env, Report};
use crate::platform::Settings;
use crate::store::tenants;

const QUIET_RATE: f64 = 5.0;
/// Each tenant's limit, jobs/s: below the workers' capacity (32 slots / 0.1 s = 320 jobs/s).
const TENANT_RATE: f64 = 100.0;
const JOB_SECONDS: f64 = 0.1;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("noisy", env.scale);
    let scratch = env.scratch(Settings::default()).await?;
    let (noisy_tenant, noisy_key) = tenants::create(&scratch.platform.pool.get().await?, "noisy").await?;
    let rate = TENANT_RATE.to_string();
    let (_server, http) = harness::serve(&env.relay, &scratch.url, &[("RELAY_TENANT_RATE", rate.clone()), ("RELAY_POOL_SIZE", "32".into())], &env.log("noisy-serve")).await?;
    let _worker = Relay::spawn(&env.relay, &["worker", "--workers", "1", "--concurrency", "32"], &scratch.url, &[], &env.log("noisy-worker"))?;
    let phase = env.secs(30.0, 6.0);

    let baseline_from = chrono::Utc::now();
    quiet(&http, &scratch.key, "base", phase).await?;
    let baseline = p99(&scratch, scratch.tenant.id, baseline_from).await?;

    let flood_from = chrono::Utc::now();
    let flooding = tokio::spawn(flood(http.clone(), noisy_key.clone(), phase));
    quiet(&http, &scratch.key, "flood", phase).await?;
    let (attempted, limited, with_retry_after) = flooding.await??;
    let pool = scratch.platform.pool.clone();
    harness::wait_until(Duration::from_secs(60), || harness::all_terminal(&pool)).await;
    let loaded = p99(&scratch, scratch.tenant.id, flood_from).await?;
    let noisy_jobs = p99(&scratch, noisy_tenant.id, flood_from).await?;
    let ratio = loaded.1 / baseline.1;
    report.fig("quiet tenant rate jobs/s / noisy attempted jobs/s", format!("{QUIET_RATE} / {:.0}", attempted as f64 / phase.as_secs_f64()));
    report.fig("per-tenant limit jobs/s; worker capacity jobs/s", format!("{TENANT_RATE}; {:.0}", 32.0 / JOB_SECONDS));
    report.fig("noisy jobs attempted / refused 429 (with Retry-After)", format!("{attempted} / {limited} ({with_retry_after})"));
    report.fig("noisy jobs admitted", noisy_jobs.0);
    report.fig("quiet accept→start p50 / p99 ms, alone", format!("{:.1} / {:.1}", baseline.2, baseline.1));
    report.fig("quiet accept→start p50 / p99 ms, under the flood", format!("{:.1} / {:.1}", loaded.2, loaded.1));
    report.fig("noisy accept→start p99 ms", noisy_jobs.1);
    report.fig("quiet p99 ratio (target ≤ 1.5)", ratio);
    report.check(limited > 0 && limited == with_retry_after, "the flood was not refused with 429 + Retry-After");
    report.check(ratio <= 1.5, format!("the quiet tenant's p99 grew {ratio:.2}× under the flood (target 1.5×)"));
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// One job at a time at `QUIET_RATE` for `phase`.
async fn quiet(http: &Http, key: &str, tag: &str, phase: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + phase;
    let mut i = 0;
    while Instant::now() < end {
        let (status, body) = http.call("POST", "/v1/jobs", Some(key), Some(&format!("quiet-{tag}-{i}")), Some(&job())).await?;
        anyhow::ensure!(status == 202, "the quiet tenant was answered {status}: {body}");
        i += 1;
        tokio::time::sleep(Duration::from_secs_f64(1.0 / QUIET_RATE)).await;
    }
    Ok(())
}

fn job() -> Value {
    json!({"task_type": "test.effect", "params": {"sleep_seconds": JOB_SECONDS}})
}

/// Batches of 10 from 5 clients, 100× the quiet rate in all. Returns (jobs attempted, jobs
/// refused 429, of which with a Retry-After header).
async fn flood(http: Http, key: String, phase: Duration) -> anyhow::Result<(usize, usize, usize)> {
    let end = Instant::now() + phase;
    let key = Arc::new(key);
    let per_client_gap = Duration::from_secs_f64(10.0 * 5.0 / (QUIET_RATE * 100.0));
    let tasks: Vec<_> = (0..5)
        .map(|c| {
            let (http, key) = (http.clone(), key.clone());
            tokio::spawn(async move {
                let (mut attempted, mut limited, mut with_header) = (0, 0, 0);
                let mut round = 0;
                while Instant::now() < end {
                    let jobs: Vec<Value> = (0..10)
                        .map(|i| { let mut j = job(); j["idempotency_key"] = json!(format!("n-{c}-{round}-{i}")); j })
                        .collect();
                    let (status, body) = http.call("POST", "/v1/jobs:batch", Some(&key), None, Some(&json!({"jobs": jobs}))).await?;
                    attempted += 10;
                    if status == 429 {
                        limited += 10;
                        if body["__retry_after"].as_str().is_some() && body["error"]["code"] == "rate_limited" {
                            with_header += 10;
                        }
                    }
                    round += 1;
                    tokio::time::sleep(per_client_gap).await;
                }
                anyhow::Ok((attempted, limited, with_header))
            })
        })
        .collect();
    let mut sum = (0, 0, 0);
    for t in tasks {
        let (a, l, h) = t.await??;
        sum = (sum.0 + a, sum.1 + l, sum.2 + h);
    }
    Ok(sum)
}

/// (jobs, p99 ms, p50 ms) of accept→start for a tenant's jobs created since `from`.
async fn p99(scratch: &crate::bench::setup::Scratch, tenant: uuid::Uuid, from: chrono::DateTime<chrono::Utc>) -> anyhow::Result<(usize, f64, f64)> {
    let pool = scratch.platform.pool.clone();
    harness::wait_until(Duration::from_secs(60), || harness::all_terminal(&pool)).await;
    let db = pool.get().await?;
    let lat = harness::sorted(
        db.query(
            "SELECT EXTRACT(EPOCH FROM (coalesce(e.started_at, j.started_at) - j.created_at))::float8 * 1000
             FROM jobs j LEFT JOIN job_events e ON e.job_id = j.id AND e.attempt = 1
             WHERE j.tenant_id = $1 AND j.created_at >= $2",
            &[&tenant, &from],
        )
        .await?
        .iter()
        .filter_map(|r| r.get::<_, Option<f64>>(0))
        .collect(),
    );
    Ok((lat.len(), harness::percentile(&lat, 0.99), harness::percentile(&lat, 0.5)))
}
