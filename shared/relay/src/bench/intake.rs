//! Intake over HTTP against a real `relay serve` child process: single submissions at several
//! concurrencies (accepted/s, p50/p99) and 500-job batches (jobs/s), each beside the CPU an
//! accepted job cost the database, the server and this client (`cpu`). No workers run meanwhile.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::json;

use super::cpu::{CpuPerUnit, CpuTimes, postmaster_pid};
use super::setup::{Lifecycle, Scratch, db_counters};
use taskdeck::platform::Settings;

type Http = Client<HttpConnector, Full<Bytes>>;

#[derive(Debug, Clone, Serialize)]
pub struct SingleIntake {
    pub clients: usize,
    pub accepted_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub lifecycle: Lifecycle,
    /// What each accepted job cost the database, `relay serve` and the client.
    pub cpu_per_job: CpuPerUnit,
}

#[derive(Debug, Clone, Serialize)]
pub struct Intake {
    pub single: Vec<SingleIntake>,
    pub batch_jobs_per_sec: f64,
    pub batch_cpu_per_job: CpuPerUnit,
}

/// A `relay serve` child on a free port, with its scratch schema.
pub struct Server {
    pub scratch: Scratch,
    pub base: String,
    pub http: Http,
    child: tokio::process::Child,
}

impl Server {
    pub async fn start(base_url: &str) -> anyhow::Result<Server> {
        let scratch = Scratch::new(base_url, Settings::default()).await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &scratch.url)
            .env("RELAY_LOG", "warn")
            .env("RELAY_POOL_SIZE", "64")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let http: Http = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(256).build_http();
        let base = format!("http://127.0.0.1:{port}");
        let server = Server { scratch, base, http, child };
        for _ in 0..200 {
            if server.get("/healthz").await.is_ok() {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        anyhow::bail!("relay serve did not come up")
    }

    async fn get(&self, path: &str) -> anyhow::Result<u16> {
        let req = hyper::Request::get(format!("{}{path}", self.base)).body(Full::default())?;
        Ok(self.http.request(req).await?.status().as_u16())
    }

    /// POST a JSON body as the scratch tenant; returns the status.
    pub async fn post(&self, path: &str, key: Option<&str>, body: &serde_json::Value) -> anyhow::Result<u16> {
        Ok(self.request(hyper::Method::POST, path, key, Some(body)).await?.0)
    }

    /// Any request as the scratch tenant; returns the status and the JSON body (`Null` if none).
    pub async fn request(
        &self,
        method: hyper::Method,
        path: &str,
        key: Option<&str>,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        self.request_as(&self.scratch.key, method, path, key, body).await
    }

    /// Any request with this API key (another tenant's, an operator's).
    pub async fn request_as(
        &self,
        api_key: &str,
        method: hyper::Method,
        path: &str,
        key: Option<&str>,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {api_key}"))
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let body = body.map_or(Bytes::new(), |b| Bytes::from(b.to_string()));
        let res = self.http.request(req.body(Full::new(body))?).await?;
        let status = res.status().as_u16();
        let bytes = res.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)))
    }

    pub async fn stop(mut self, base_url: &str) -> anyhow::Result<()> {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.scratch.drop_schema(base_url).await
    }
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn run(base_url: &str, secs: f64) -> anyhow::Result<Intake> {
    let server = Arc::new(Server::start(base_url).await?);
    let postmaster = postmaster_pid(&server.scratch.platform.pool.get().await?).await;
    let mut single = Vec::new();
    for clients in [1, 16, 64] {
        let before = db_counters(&server.scratch.platform.pool).await?;
        let cpu_before = CpuTimes::read(postmaster, server.child.id());
        let until = Instant::now() + Duration::from_secs_f64(secs);
        let start = Instant::now();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let server = server.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::new();
                    let mut i = 0u64;
                    while Instant::now() < until {
                        let t = Instant::now();
                        let status = server
                            .post("/v1/jobs", Some(&format!("s{clients}-{c}-{i}")), &json!({"task_type": "noop"}))
                            .await?;
                        anyhow::ensure!(status == 202, "intake answered {status}");
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                        i += 1;
                    }
                    anyhow::Ok(lat)
                })
            })
            .collect();
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await??);
        }
        let elapsed = start.elapsed().as_secs_f64();
        let cpu_per_job = CpuTimes::read(postmaster, server.child.id()).per_unit(cpu_before, lat.len() as u64);
        let after = db_counters(&server.scratch.platform.pool).await?;
        lat.sort_by(f64::total_cmp);
        single.push(SingleIntake {
            clients,
            accepted_per_sec: lat.len() as f64 / elapsed,
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            lifecycle: Lifecycle::between(before, after, lat.len()),
            cpu_per_job,
        });
    }
    // Batches of 500 from 4 clients.
    let cpu_before = CpuTimes::read(postmaster, server.child.id());
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|c| {
            let server = server.clone();
            tokio::spawn(async move {
                let mut n = 0usize;
                let mut round = 0;
                while Instant::now() < until {
                    let jobs: Vec<_> = (0..500)
                        .map(|i| json!({"idempotency_key": format!("b{c}-{round}-{i}"), "task_type": "noop"}))
                        .collect();
                    let status = server.post("/v1/jobs:batch", None, &json!({ "jobs": jobs })).await?;
                    anyhow::ensure!(status == 200, "batch intake answered {status}");
                    n += 500;
                    round += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    let mut n = 0;
    for t in tasks {
        n += t.await??;
    }
    let batch_jobs_per_sec = n as f64 / start.elapsed().as_secs_f64();
    let batch_cpu_per_job = CpuTimes::read(postmaster, server.child.id()).per_unit(cpu_before, n as u64);
    let server = Arc::into_inner(server).ok_or_else(|| anyhow::anyhow!("server still shared"))?;
    server.stop(base_url).await?;
    Ok(Intake { single, batch_jobs_per_sec, batch_cpu_per_job })
}
