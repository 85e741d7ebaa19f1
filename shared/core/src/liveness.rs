//! Liveness: each process or function instance upserts its row in `workers` every few
//! seconds (a loop for long-running processes, at most once per `every` per invocation for
//! Lambda handlers), so the status contract can say when each was last seen. Never per job.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::{StoreError, workers};

/// How often a process says it is alive.
pub const BEAT_EVERY: Duration = Duration::from_secs(5);

/// The kinds of process in the `workers` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Api,
    Worker,
    Sweeper,
    Executor,
    Ingress,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Api => "api",
            Kind::Worker => "worker",
            Kind::Sweeper => "sweeper",
            Kind::Executor => "executor",
            Kind::Ingress => "ingress",
        }
    }
}

/// Who this instance is: for a process `kind:host:pid:<uuid>`; in Lambda the log stream
/// (one per container) and the function name as the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub kind: Kind,
    pub instance_id: String,
    pub host: String,
    pub pid: Option<i32>,
    pub started_at: DateTime<Utc>,
}

impl Identity {
    pub fn of_this_process(kind: Kind) -> Identity {
        let lookup = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let pid = i32::try_from(std::process::id()).ok();
        let (instance_id, host) = match (lookup("AWS_LAMBDA_LOG_STREAM_NAME"), lookup("AWS_LAMBDA_FUNCTION_NAME")) {
            (Some(stream), Some(function)) => (format!("{}:{function}:{stream}", kind.as_str()), function),
            _ => {
                let host = std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
                    .or_else(|| lookup("HOSTNAME"))
                    .unwrap_or_else(|| "localhost".into());
                let boot = uuid::Uuid::now_v7().simple().to_string();
                (format!("{}:{host}:{}:{}", kind.as_str(), pid.unwrap_or(0), &boot[..12]), host)
            }
        };
        Identity { kind, instance_id, host, pid, started_at: Utc::now() }
    }
}

/// A handle that records this instance's liveness. Cheap to clone.
#[derive(Clone)]
pub struct Liveness {
    pool: Pool,
    identity: Arc<Identity>,
    last: Arc<Mutex<Option<Instant>>>,
    every: Duration,
}

impl Liveness {
    pub fn new(pool: Pool, identity: Identity) -> Liveness {
        Liveness { pool, identity: Arc::new(identity), last: Arc::default(), every: BEAT_EVERY }
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Upsert the row now.
    pub async fn beat(&self) -> Result<(), StoreError> {
        let id = &self.identity;
        let db = self.pool.get().await?;
        workers::beat(&db, id.kind.as_str(), &id.instance_id, &id.host, id.pid, id.started_at).await
    }

    /// Upsert unless this instance did so within `every`; a failure is logged, never raised
    /// (liveness must not fail the work it accompanies).
    pub async fn touch(&self) {
        {
            let Ok(mut last) = self.last.lock() else { return };
            if last.is_some_and(|at| at.elapsed() < self.every) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(e) = self.beat().await {
            tracing::warn!(event = "relay.liveness.failed", kind = self.identity.kind.as_str(), error = %e,
                "could not record liveness");
        }
    }

    /// Beat every `every` until `stop` turns true.
    pub fn spawn(self, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            while !*stop.borrow() {
                self.touch().await;
                tokio::select! { _ = tokio::time::sleep(self.every) => {}, _ = stop.changed() => {} }
            }
        })
    }
}

/// Record liveness on requests through this router (at most once per `every`): for the
/// intake function, which has no loop of its own.
pub fn track(router: axum::Router, live: Liveness) -> axum::Router {
    router.layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        let live = live.clone();
        async move {
            live.touch().await;
            next.run(req).await
        }
    }))
}
