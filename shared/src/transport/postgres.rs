//! The Postgres-native transport, the embedded default: NOTIFY wakes workers, which claim
//! due rows themselves with `FOR UPDATE SKIP LOCKED`. Any number of worker processes may
//! share one database.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;

use super::{Transport, TransportError};

use crate::job::Dispatch;

/// The channel workers listen on.
pub const CHANNEL: &str = "relay_jobs";

/// Dispatch here only wakes workers, and workers also poll the table, so a dispatch cannot be
/// lost in a way that loses work. Wake-ups are coalesced: one NOTIFY covers every dispatch
/// that arrived while the previous one was being sent.
pub struct PgTransport {
    pool: Pool,
    wake: Arc<Notify>,
    notifier: OnceLock<()>,
}

impl PgTransport {
    pub fn new(pool: Pool) -> Self {
        Self { pool, wake: Arc::new(Notify::new()), notifier: OnceLock::new() }
    }
}

#[async_trait::async_trait]
impl Transport for PgTransport {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn dispatch(&self, _jobs: &[Dispatch]) -> Result<(), TransportError> {
        self.notifier.get_or_init(|| {
            tokio::spawn(notify_loop(self.pool.clone(), self.wake.clone()));
        });
        self.wake.notify_one();
        Ok(())
    }
}

async fn notify_loop(pool: Pool, wake: Arc<Notify>) {
    loop {
        wake.notified().await;
        let sent = async {
            let db = pool.get().await?;
            let stmt = db.prepare_cached("SELECT pg_notify($1, '')").await?;
            db.execute(&stmt, &[&CHANNEL]).await?;
            anyhow::Ok(())
        };
        if let Err(e) = sent.await {
            // Workers poll, so this costs latency, not jobs.
            tracing::warn!(event = "relay.dispatch.notify_failed", error = %e, "NOTIFY failed; workers will poll");
        }
    }
}

/// Wakes this process's workers when a NOTIFY arrives. Holds one dedicated connection,
/// re-established after it drops; workers also poll, so a missed wake-up only costs latency.
pub fn spawn_listener(database_url: String, search_path: Option<String>) -> Arc<Notify> {
    let wake = Arc::new(Notify::new());
    let w = wake.clone();
    tokio::spawn(async move {
        loop {
            if let Err(e) = listen(&database_url, search_path.as_deref(), &w).await {
                tracing::warn!(event = "relay.listener.reconnect", error = %e, "LISTEN connection lost; reconnecting");
            }
            // A reconnect may have missed notifications: wake everyone to look.
            w.notify_waiters();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    wake
}

async fn listen(url: &str, search_path: Option<&str>, wake: &Notify) -> anyhow::Result<()> {
    let mut cfg: tokio_postgres::Config = url.parse()?;
    if let Some(p) = search_path {
        cfg.options(format!("-c search_path={p}"));
    }
    let (client, mut conn) = cfg.connect(tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(msg) = messages.next().await {
            match msg {
                Ok(AsyncMessage::Notification(_)) => {
                    if tx.send(()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    while rx.recv().await.is_some() {
        wake.notify_waiters();
    }
    driver.await??;
    anyhow::bail!("LISTEN connection closed")
}
