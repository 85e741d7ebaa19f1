//! A small client of Relay for client projects, and the example of how to follow jobs:
//!
//! 1. **Verify** each callback (`Verifier`): the Standard Webhooks signature over
//!    `{webhook-id}.{webhook-timestamp}.{body}` with any of your secrets (keep both during a
//!    rotation), and a timestamp within tolerance. Then apply its `data` (the job resource).
//! 2. **Reconcile** now and then (`Projection::reconcile`): callbacks get lost, so list what
//!    changed since your cursor (`GET /v1/jobs?updated_since=`) and apply it. Relay is
//!    authoritative; your projection is a cache.
//! 3. **Refresh** one job on demand (`Client::job`).
//!
//! `Projection::apply` keeps the newest state of each job by `updated_at`, so a late callback
//! or a repeated page never moves a job backwards.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::Value;

use crate::job::JobId;

/// Most bytes of one answer read.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request failed: {0}")]
    Http(String),
    #[error("Relay answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("unexpected answer: {0}")]
    Decode(String),
}

/// Relay's API as one tenant sees it.
#[derive(Clone)]
pub struct Client {
    base: String,
    key: String,
    http: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// Jobs changed since a cursor (every page of them), and where to resume next time.
#[derive(Debug, Clone)]
pub struct Changes {
    pub jobs: Vec<Value>,
    pub resume_cursor: String,
}

#[derive(Deserialize)]
struct Page {
    jobs: Vec<Value>,
    next_cursor: Option<String>,
    resume_cursor: String,
}

impl Client {
    /// `base_url` like `https://relay.example` (no trailing path); `api_key` the tenant's key.
    pub fn new(base_url: &str, api_key: &str) -> Result<Client, ClientError> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| ClientError::Http(format!("no TLS root certificates: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Client {
            base: base_url.trim_end_matches('/').to_owned(),
            key: api_key.to_owned(),
            http: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https),
        })
    }

    async fn get(&self, path_and_query: &str) -> Result<(u16, Bytes), ClientError> {
        let req = hyper::Request::get(format!("{}{path_and_query}", self.base))
            .header("authorization", format!("Bearer {}", self.key))
            .body(Full::default())
            .map_err(|e| ClientError::Http(e.to_string()))?;
        self.send(req).await
    }

    async fn send(&self, req: hyper::Request<Full<Bytes>>) -> Result<(u16, Bytes), ClientError> {
        let res = self.http.request(req).await.map_err(|e| ClientError::Http(chain(&e)))?;
        let status = res.status().as_u16();
        let body = Limited::new(res.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }

    /// Submit one job (`POST /v1/jobs`): Relay's answer, 202 with the job or a 4xx with
    /// the reason. The same key with the same request returns the same job.
    pub async fn submit(&self, idempotency_key: &str, request: &Value) -> Result<Value, ClientError> {
        let req = hyper::Request::post(format!("{}/v1/jobs", self.base))
            .header("authorization", format!("Bearer {}", self.key))
            .header("idempotency-key", idempotency_key)
            .header("content-type", "application/json")
            .body(Full::from(request.to_string()))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let (status, body) = self.send(req).await?;
        match status {
            200..=299 => serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string())),
            _ => Err(ClientError::Status { status, body: String::from_utf8_lossy(&body).into_owned() }),
        }
    }

    /// One job as Relay has it now; `None` when Relay does not know it (or it is not yours).
    pub async fn job(&self, id: JobId) -> Result<Option<Value>, ClientError> {
        match self.get(&format!("/v1/jobs/{id}")).await? {
            (200, body) => serde_json::from_slice(&body).map(Some).map_err(|e| ClientError::Decode(e.to_string())),
            (404, _) => Ok(None),
            (status, body) => Err(ClientError::Status { status, body: String::from_utf8_lossy(&body).into_owned() }),
        }
    }

    /// Every job changed since `cursor` (a `resume_cursor` from before, or `None` for all),
    /// page by page, oldest change first.
    pub async fn changes(&self, cursor: Option<&str>) -> Result<Changes, ClientError> {
        let mut jobs = Vec::new();
        let mut page_cursor: Option<String> = None;
        loop {
            let mut q = String::from("/v1/jobs?limit=500");
            if let Some(c) = cursor {
                q.push_str(&format!("&updated_since={c}"));
            }
            if let Some(c) = &page_cursor {
                q.push_str(&format!("&cursor={c}"));
            }
            let (status, body) = self.get(&q).await?;
            if status != 200 {
                return Err(ClientError::Status { status, body: String::from_utf8_lossy(&body).into_owned() });
            }
            let page: Page = serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))?;
            jobs.extend(page.jobs);
            match page.next_cursor {
                Some(next) => page_cursor = Some(next),
                None => return Ok(Changes { jobs, resume_cursor: page.resume_cursor }),
            }
        }
    }
}

/// An error with its causes ("client error (Connect): tcp connect error: Connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// A client's local copy of its jobs: the newest known state of each, and the cursor to
/// reconcile from.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    pub jobs: HashMap<JobId, Value>,
    pub cursor: Option<String>,
}

fn updated_at(job: &Value) -> Option<DateTime<Utc>> {
    job["updated_at"].as_str()?.parse().ok()
}

impl Projection {
    /// Keep `job` unless a newer state of it is already known. Returns whether it was kept.
    pub fn apply(&mut self, job: Value) -> bool {
        let Some(id) = job["id"].as_str().and_then(|s| s.parse::<JobId>().ok()) else { return false };
        let newer = match self.jobs.get(&id) {
            Some(known) => updated_at(&job) >= updated_at(known),
            None => true,
        };
        if newer {
            self.jobs.insert(id, job);
        }
        newer
    }

    /// Apply every change since the last reconciliation; returns how many jobs it read.
    pub async fn reconcile(&mut self, client: &Client) -> Result<usize, ClientError> {
        let changes = client.changes(self.cursor.as_deref()).await?;
        let n = changes.jobs.len();
        for job in changes.jobs {
            self.apply(job);
        }
        self.cursor = Some(changes.resume_cursor);
        Ok(n)
    }

    /// Re-read one job from Relay and apply it.
    pub async fn refresh(&mut self, client: &Client, id: JobId) -> Result<Option<&Value>, ClientError> {
        if let Some(job) = client.job(id).await? {
            self.apply(job);
        }
        Ok(self.jobs.get(&id))
    }
}

/// A verified callback: `type` is `job.<status>`, `data` the job resource.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub timestamp: DateTime<Utc>,
    pub data: Value,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    #[error("bad signature: {0}")]
    Signature(#[from] crate::callbacks::SignatureError),
    #[error("the body is not a callback event: {0}")]
    Body(String),
}

/// Checks callbacks against your signing secrets: during a rotation, give both.
#[derive(Debug, Clone)]
pub struct Verifier {
    pub secrets: Vec<String>,
    /// How far the `webhook-timestamp` may be from now, in seconds (default 300).
    pub tolerance_s: i64,
}

impl Verifier {
    pub fn new(secrets: impl IntoIterator<Item = impl Into<String>>) -> Verifier {
        Verifier { secrets: secrets.into_iter().map(Into::into).collect(), tolerance_s: 300 }
    }

    /// Verify a callback from its headers and raw body (before parsing it), then parse it.
    pub fn verify(&self, headers: &hyper::HeaderMap, body: &[u8]) -> Result<Event, VerifyError> {
        let header = |name: &'static str| {
            headers.get(name).and_then(|v| v.to_str().ok()).ok_or(VerifyError::MissingHeader(name))
        };
        let (id, ts, sig) = (header("webhook-id")?, header("webhook-timestamp")?, header("webhook-signature")?);
        let ts: i64 = ts.parse().map_err(|_| crate::callbacks::SignatureError::Timestamp)?;
        let secrets: Vec<&str> = self.secrets.iter().map(String::as_str).collect();
        crate::callbacks::verify(&secrets, id, ts, body, sig, Utc::now().timestamp(), self.tolerance_s)?;
        serde_json::from_slice(body).map_err(|e| VerifyError::Body(e.to_string()))
    }
}
