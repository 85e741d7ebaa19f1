//! What the scenarios share: `relay` child processes, an HTTP client, a fault-injecting
//! transport wrapper, SQS consumers that drive the executor function's handler, and the
//! chaos-only SQL that reads what happened (kept here, beside the checks that need it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use aws_sdk_sqs::Client;
use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use serde_json::{Value, json};
use tokio::sync::watch;

use taskdeck::executor::Executor;
use taskdeck::job::{Dispatch, JobId};
use taskdeck::store::tooling::readouts;
use taskdeck::transport::sqs::SqsTransport;
use taskdeck::transport::{Transport, TransportError};

/// A `relay` child process (killed when dropped), its stderr in a log file.
pub struct Relay {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub log: PathBuf,
}

impl Relay {
    pub fn spawn(
        relay_bin: &Path,
        args: &[&str],
        database_url: &str,
        vars: &[(&str, String)],
        log: &Path,
    ) -> anyhow::Result<Relay> {
        let file = std::fs::File::create(log)?;
        let mut cmd = tokio::process::Command::new(relay_bin);
        cmd.args(args)
            .env("DATABASE_URL", database_url)
            .env("RELAY_LOG", "warn")
            .env("RELAY_TEST_TASKS", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn()?;
        let pid = child.id().unwrap_or_default();
        Ok(Relay { child, pid, log: log.to_owned() })
    }

    /// SIGKILL, and reap.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Send a signal by name (STOP, CONT, TERM) to this child only.
    pub fn signal(&self, name: &str) -> anyhow::Result<()> {
        let status = std::process::Command::new("kill").arg(format!("-{name}")).arg(self.pid.to_string()).status()?;
        anyhow::ensure!(status.success(), "kill -{name} {} failed", self.pid);
        Ok(())
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A free port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A small HTTP client for one API base URL.
#[derive(Clone)]
pub struct Http {
    pub base: String,
    client: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
}

impl Http {
    pub fn new(base: impl Into<String>) -> Http {
        let client =
            hyper_util::client::legacy::Client::builder(TokioExecutor::new()).pool_max_idle_per_host(256).build_http();
        Http { base: base.into(), client }
    }

    /// One call; returns the status and the body (JSON, or the text as a string).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        idem: Option<&str>,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = hyper::Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        if let Some(i) = idem {
            req = req.header("idempotency-key", i);
        }
        let req = match body {
            Some(b) => req.header("content-type", "application/json").body(Full::new(Bytes::from(b.to_string())))?,
            None => req.body(Full::default())?,
        };
        let res = self.client.request(req).await?;
        let status = res.status().as_u16();
        let retry_after = res.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = res.into_body().collect().await?.to_bytes();
        let mut value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        if let (Some(ra), Value::Object(map)) = (retry_after, &mut value) {
            map.insert("__retry_after".into(), ra.into());
        }
        Ok((status, value))
    }

    pub async fn wait_healthy(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if matches!(self.call("GET", "/healthz", None, None, None).await, Ok((200, _))) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("{} did not answer /healthz within {within:?}", self.base)
    }
}

/// `relay serve` on a free port against `database_url`, ready to answer.
pub async fn serve(
    relay_bin: &Path,
    database_url: &str,
    vars: &[(&str, String)],
    log: &Path,
) -> anyhow::Result<(Relay, Http)> {
    let addr = format!("127.0.0.1:{}", free_port()?);
    let relay = Relay::spawn(relay_bin, &["serve", "--addr", &addr], database_url, vars, log)?;
    let http = Http::new(format!("http://{addr}"));
    http.wait_healthy(Duration::from_secs(30)).await?;
    Ok((relay, http))
}

/// What happened to one job at one dispatch through `Faulty`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Handed to the real transport this many times (1 = once, more = injected duplicates).
    Sent(u32),
    /// The dispatch call failed (the caller saw an error).
    Failed,
    /// Silently lost after commit: the caller saw success, nothing was sent.
    Dropped,
}

/// A real transport behind injected faults: exactly a share of dispatch calls fail and a share
/// of jobs are silently dropped (spread evenly, the first half-way in: a small run still gets
/// its faults), and every job that goes out is sent `dup` times (at random). Logs each fate.
pub struct Faulty {
    pub inner: Arc<dyn Transport>,
    pub fail: f64,
    pub drop: f64,
    pub dup: (u32, u32),
    pub log: Mutex<Vec<(JobId, DateTime<Utc>, Fate)>>,
    /// Fault credit carried between calls (failures, drops).
    credit: Mutex<(f64, f64)>,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Transport>, fail: f64, drop: f64, dup: (u32, u32)) -> Faulty {
        Faulty { inner, fail, drop, dup, log: Mutex::default(), credit: Mutex::new((0.5, 0.5)) }
    }

    /// Whether the next event fails, spending `share` of credit per event.
    fn due(credit: &mut f64, share: f64) -> bool {
        *credit += share;
        let due = *credit >= 1.0;
        if due {
            *credit -= 1.0;
        }
        due
    }

    pub fn log(&self) -> Vec<(JobId, DateTime<Utc>, Fate)> {
        self.log.lock().expect("log lock").clone()
    }
}

#[async_trait::async_trait]
impl Transport for Faulty {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        let now = Utc::now();
        let (fails, fates) = {
            let mut rng = rand::rng();
            let mut credit = self.credit.lock().expect("credit lock");
            let fails = Self::due(&mut credit.0, self.fail);
            let fates: Vec<Fate> = jobs
                .iter()
                .map(|_| {
                    if Self::due(&mut credit.1, self.drop) {
                        Fate::Dropped
                    } else {
                        Fate::Sent(rng.random_range(self.dup.0..=self.dup.1))
                    }
                })
                .collect();
            (fails, fates)
        };
        if fails {
            self.log.lock().expect("log lock").extend(jobs.iter().map(|d| (d.id, now, Fate::Failed)));
            return Err(TransportError::nothing_sent("faulty", "injected dispatch failure", jobs));
        }
        // Round r sends every job that still has a copy to go.
        let most = fates.iter().map(|f| if let Fate::Sent(k) = f { *k } else { 0 }).max().unwrap_or(0);
        let mut result = Ok(());
        for round in 0..most {
            let batch: Vec<Dispatch> = jobs
                .iter()
                .zip(&fates)
                .filter(|(_, f)| matches!(f, Fate::Sent(k) if *k > round))
                .map(|(d, _)| *d)
                .collect();
            if let Err(e) = self.inner.dispatch(&batch).await {
                result = Err(e);
            }
        }
        // A job the real transport did not send failed; the others went out as planned.
        let unsent: &[JobId] = result.as_ref().err().map_or(&[], |e: &TransportError| &e.unsent);
        let mut log = self.log.lock().expect("log lock");
        log.extend(
            jobs.iter().zip(fates).map(|(d, f)| (d.id, now, if unsent.contains(&d.id) { Fate::Failed } else { f })),
        );
        result
    }
}

/// An SQS client for a local endpoint with the same operation timeout the transport uses.
pub fn sqs_client(endpoint: &str) -> Client {
    SqsTransport::client(&crate::localaws::sdk_config(endpoint))
}

/// A queue of its own; returns its URL.
pub async fn new_queue(client: &Client, prefix: &str) -> anyhow::Result<String> {
    let name = format!("{prefix}-{}", uuid::Uuid::now_v7().simple());
    let out = client
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
    out.queue_url.ok_or_else(|| anyhow::anyhow!("no queue url"))
}

/// Receive up to 10 messages as the SQS event Lambda would deliver (the documented shape).
pub async fn receive_event(client: &Client, url: &str, wait_secs: i32) -> anyhow::Result<SqsEvent> {
    let out = client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait_secs)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
    let records: Vec<Value> = out
        .messages()
        .iter()
        .map(|m| {
            json!({
                "messageId": m.message_id(), "receiptHandle": m.receipt_handle(), "body": m.body(),
                "attributes": m.attributes().map(|a| a.iter().map(|(k, v)| (k.as_str().to_owned(), v.clone())).collect::<std::collections::BTreeMap<_, _>>()).unwrap_or_default(),
                "messageAttributes": {}, "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs", "eventSourceARN": format!("arn:aws:sqs:us-east-1:123456789012:{}", url.rsplit('/').next().unwrap_or("q")),
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    Ok(serde_json::from_value(json!({ "Records": records }))?)
}

/// Delete every record the handler did not return as failed, in one `DeleteMessageBatch` (what
/// the event source mapping does).
pub async fn delete_acknowledged(
    client: &Client,
    url: &str,
    event: &SqsEvent,
    failed: &[String],
) -> anyhow::Result<()> {
    let entries: Vec<_> = event
        .records
        .iter()
        .filter(|r| !failed.iter().any(|f| Some(f) == r.message_id.as_ref()))
        .filter_map(|r| r.receipt_handle.clone())
        .enumerate()
        .filter_map(|(i, handle)| {
            aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(handle)
                .build()
                .ok()
        })
        .collect();
    if !entries.is_empty() {
        let out = client
            .delete_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
        anyhow::ensure!(out.failed().is_empty(), "{} deletes refused", out.failed().len());
    }
    Ok(())
}

/// The distinct SQS messages consumers have received, and the job each named. A message SQS
/// delivers again (after a handler failure, a slow delete, or a receive whose answer was lost
/// under load) keeps its message id and counts once: only copies the scenario sent count as
/// duplicates.
#[derive(Default)]
pub struct Received(Mutex<std::collections::HashMap<String, Option<JobId>>>);

impl Received {
    pub fn count(&self) -> usize {
        self.0.lock().expect("received lock").len()
    }

    /// Distinct messages received per job they named (bodies that name none are left out).
    pub fn per_job(&self) -> std::collections::HashMap<JobId, usize> {
        let mut out = std::collections::HashMap::new();
        for job in self.0.lock().expect("received lock").values().flatten() {
            *out.entry(*job).or_default() += 1;
        }
        out
    }

    fn add(&self, event: &SqsEvent) {
        let mut seen = self.0.lock().expect("received lock");
        for r in &event.records {
            let job = r
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str::<taskdeck::transport::sqs::WorkMessage>(b).ok())
                .map(|m| m.job_id);
            if let Some(id) = r.message_id.clone() {
                seen.entry(id).or_insert(job);
            }
        }
    }
}

/// Feed the executor function's handler from an SQS queue until `stop`, counting the distinct
/// messages received.
pub async fn consume_sqs(
    exec: Executor,
    client: Client,
    url: String,
    received: Arc<Received>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let event = tokio::select! {
            e = receive_event(&client, &url, 1) => e,
            _ = stop.changed() => break,
        };
        let Ok(event) = event else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if event.records.is_empty() {
            continue;
        }
        received.add(&event);
        let response = taskdeck::lambda::executor::handle(&exec, event.clone(), None).await;
        let failed: Vec<String> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
        // A failed delete only means SQS delivers the record again (a duplicate claims nothing).
        let _ = delete_acknowledged(&client, &url, &event, &failed).await;
    }
}

/// Percentile of sorted values (nearest rank); NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Sorted copy.
pub fn sorted(mut xs: Vec<f64>) -> Vec<f64> {
    xs.sort_by(f64::total_cmp);
    xs
}

/// Counts of jobs by status in the scratch schema.
pub async fn status_counts(
    db: &impl taskdeck::store::GenericClient,
) -> anyhow::Result<std::collections::BTreeMap<String, i64>> {
    Ok(readouts::status_counts(db).await?)
}

/// Wait until `check` holds or `within` passes; returns whether it held.
pub async fn wait_until<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// True when no job is pending, running or waiting.
pub async fn all_terminal(pool: &deadpool_postgres::Pool) -> bool {
    let Ok(db) = pool.get().await else { return false };
    readouts::all_terminal(&db).await.unwrap_or(false)
}

/// A TCP proxy in front of a server that can be taken down: while down, new connections are
/// closed at once and open ones are cut.
pub struct Proxy {
    pub url: String,
    up: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(target: &str) -> anyhow::Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (up, watch_up) = watch::channel(true);
        let target = target.trim_start_matches("http://").to_owned();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !*watch_up.borrow() {
                    continue; // dropped: the connection closes
                }
                let (target, mut up) = (target.clone(), watch_up.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {},
                        _ = up.wait_for(|u| !*u) => {},
                    }
                });
            }
        });
        Ok(Proxy { url, up })
    }

    pub fn set_up(&self, up: bool) {
        let _ = self.up.send(up);
    }
}

/// Serve the API router of a platform in this process on a free port (for scenarios whose
/// transport `relay serve` cannot take, like SQS through a proxy).
pub async fn serve_in_process(
    platform: &taskdeck::platform::Platform,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Http> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let http = Http::new(format!("http://{}", listener.local_addr()?));
    let router = taskdeck::api::router(platform.app_state());
    let mut stop = stop;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
    });
    http.wait_healthy(Duration::from_secs(10)).await?;
    Ok(http)
}
