//! Polling: each project's status document is fetched with a timeout (pull, so a dead project
//! shows as unreachable) into a cache that keeps the last good document and since when the
//! project has been unreachable. The cache is all the console holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{Mutex, RwLock};

use super::config::{ConsoleConfig, Project};
use relay_status::StatusDoc;

/// The largest status document read.
pub const MAX_DOC_BYTES: usize = 4 * 1024 * 1024;

type Http = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Why a project's status document could not be had (shown on the page as the project's error).
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error("no answer within {} s", .0.as_secs_f64())]
    Timeout(Duration),
    #[error("bad request: {0}")]
    Request(hyper::http::Error),
    /// The message carries the whole cause chain (the client's own `Display` stops at the top).
    #[error("unreachable: {}", relay_runtime::error_chain(.0))]
    Unreachable(hyper_util::client::legacy::Error),
    #[error("reading the answer: {0}")]
    Reading(Box<dyn std::error::Error + Send + Sync>),
    #[error("HTTP {0}")]
    Status(u16),
    #[error("{0}")]
    Contract(relay_status::ContractError),
}

/// What the console knows of one project.
#[derive(Debug, Clone)]
pub struct ProjectState {
    pub name: String,
    pub status_url: String,
    /// The last document that parsed as `relay.status/v1`, and when it was fetched.
    pub last_good: Option<(StatusDoc, DateTime<Utc>)>,
    /// Set at the first failed poll after a good one (or the first poll); cleared on success.
    pub unreachable_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub polled_at: Option<DateTime<Utc>>,
}

impl ProjectState {
    pub fn reachable(&self) -> bool {
        self.polled_at.is_some() && self.unreachable_since.is_none()
    }
}

/// The console: its projects, an HTTP client, and the cache. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    pub config: Arc<ConsoleConfig>,
    http: Http,
    cache: Arc<RwLock<Vec<ProjectState>>>,
    last_refresh: Arc<Mutex<Option<Instant>>>,
}

impl Console {
    pub fn new(config: ConsoleConfig) -> anyhow::Result<Console> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| anyhow::anyhow!("no TLS root certificates: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let http: Http = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(https);
        let cache = config
            .projects
            .iter()
            .map(|p| ProjectState {
                name: p.name.clone(),
                status_url: p.status_url.clone(),
                last_good: None,
                unreachable_since: None,
                last_error: None,
                polled_at: None,
            })
            .collect();
        Ok(Console {
            config: Arc::new(config),
            http,
            cache: Arc::new(RwLock::new(cache)),
            last_refresh: Arc::default(),
        })
    }

    /// A copy of the cache.
    pub async fn snapshot(&self) -> Vec<ProjectState> {
        self.cache.read().await.clone()
    }

    /// Poll every project at once unless the set was polled within `min_age` (concurrent
    /// callers wait for one poll rather than each starting their own).
    pub async fn refresh_if_older(&self, min_age: Duration) {
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|at| at.elapsed() < min_age) {
            return;
        }
        self.refresh().await;
        *last = Some(Instant::now());
    }

    /// Poll every project now, each bounded by the configured timeout.
    pub async fn refresh(&self) {
        let polls = self.config.projects.iter().map(|p| self.poll(p));
        let results = futures::future::join_all(polls).await;
        let now = Utc::now();
        let mut cache = self.cache.write().await;
        for (state, result) in cache.iter_mut().zip(results) {
            state.polled_at = Some(now);
            match result {
                Ok(doc) => {
                    state.last_good = Some((doc, now));
                    state.unreachable_since = None;
                    state.last_error = None;
                }
                Err(e) => {
                    tracing::warn!(event = "relay.console.unreachable", project = %state.name, error = %e, "project unreachable");
                    state.unreachable_since.get_or_insert(now);
                    state.last_error = Some(e.to_string());
                }
            }
        }
    }

    async fn poll(&self, p: &Project) -> Result<StatusDoc, PollError> {
        match tokio::time::timeout(self.config.timeout, self.fetch(p)).await {
            Ok(r) => r,
            Err(_) => Err(PollError::Timeout(self.config.timeout)),
        }
    }

    async fn fetch(&self, p: &Project) -> Result<StatusDoc, PollError> {
        let mut req = hyper::Request::get(&p.status_url).header("accept", "application/json");
        if let Some(t) = &p.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Empty::new()).map_err(PollError::Request)?;
        let res = self.http.request(req).await.map_err(PollError::Unreachable)?;
        let status = res.status();
        let body = Limited::new(res.into_body(), MAX_DOC_BYTES).collect().await.map_err(PollError::Reading)?.to_bytes();
        if !status.is_success() {
            return Err(PollError::Status(status.as_u16()));
        }
        StatusDoc::parse(&body).map_err(PollError::Contract)
    }
}
