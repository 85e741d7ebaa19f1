//! The Postgres-native transport, the embedded default: NOTIFY wakes workers, which claim
//! due rows themselves with `FOR UPDATE SKIP LOCKED`. Any number of worker processes may
//! share one database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio::sync::{Notify, watch};
use tokio_postgres::AsyncMessage;

use super::{Transport, TransportError};

use crate::job::Dispatch;

/// The channel workers listen on.
pub const CHANNEL: &str = "relay_jobs";

/// How far ahead a job due later gets a wake-up of its own (SQS's longest delay); a later one
/// is found by the workers' polling.
const WAKE_AHEAD: Duration = Duration::from_secs(900);

/// Dispatch here only wakes workers (which also poll the table). Wake-ups are coalesced: one
/// NOTIFY covers every dispatch that arrived while the previous one was being sent, and each
/// caller learns whether the NOTIFY that covered it went out. A job due later (a retry's
/// back-off, a send held by its rate) is woken for when it comes due, as SQS delays its
/// message, rather than found by the next poll.
pub struct PgTransport {
    pool: Pool,
    notifier: OnceLock<Arc<Notifier>>,
}

struct Notifier {
    /// Dispatches asked for so far; a NOTIFY sent after reading `n` covers dispatches 1..=n.
    requested: AtomicU64,
    wake: Notify,
    /// The highest dispatch covered so far, and how its NOTIFY went.
    sent: watch::Sender<(u64, Result<(), NotifyError>)>,
}

/// Why a NOTIFY did not go out, told to every dispatch it was to cover. The text is the whole
/// cause chain (the errors' own `Display`s stop at the top).
#[derive(Debug, thiserror::Error)]
enum NotifyError {
    #[error("{}", relay_runtime::error_chain(.0))]
    Pool(deadpool_postgres::PoolError),
    #[error("{}", relay_runtime::error_chain(.0))]
    Db(tokio_postgres::Error),
}

impl PgTransport {
    pub fn new(pool: Pool) -> Self {
        Self { pool, notifier: OnceLock::new() }
    }
}

#[async_trait::async_trait]
impl Transport for PgTransport {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn commit_wake(&self) -> Option<&'static str> {
        Some(CHANNEL)
    }

    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        let notifier = self.notifier.get_or_init(|| {
            let n = Arc::new(Notifier {
                requested: AtomicU64::new(0),
                wake: Notify::new(),
                sent: watch::channel((0, Ok(()))).0,
            });
            tokio::spawn(notify_loop(self.pool.clone(), n.clone()));
            n
        });
        let now = chrono::Utc::now();
        let later: Vec<_> = jobs.iter().map(|j| j.run_at).filter(|at| *at > now).collect();
        let none_due = later.len() == jobs.len();
        wake_when_due(notifier, later);
        if none_due {
            return Ok(());
        }
        let mut sent = notifier.sent.subscribe();
        let mine = notifier.request();
        let covered = sent.wait_for(|(n, _)| *n >= mine).await;
        match covered.as_deref() {
            Ok((_, Ok(()))) => Ok(()),
            Ok((_, Err(e))) => Err(TransportError::nothing_sent("postgres", e.to_string(), jobs)),
            Err(_) => Err(TransportError::nothing_sent("postgres", "notifier stopped", jobs)),
        }
    }
}

/// A NOTIFY when each of these times comes: one timer per dispatch, through its distinct times
/// (10 ms apart at least) in order. Nobody waits for these; a lost one costs a poll's latency.
fn wake_when_due(notifier: &Arc<Notifier>, mut due: Vec<chrono::DateTime<chrono::Utc>>) {
    due.sort();
    due.dedup_by(|later, kept| *later - *kept < chrono::Duration::milliseconds(10));
    due.retain(|at| (*at - chrono::Utc::now()).to_std().is_ok_and(|wait| wait <= WAKE_AHEAD));
    if due.is_empty() {
        return;
    }
    let n = notifier.clone();
    tokio::spawn(async move {
        for at in due {
            tokio::time::sleep((at - chrono::Utc::now()).to_std().unwrap_or_default()).await;
            n.request();
        }
    });
}

impl Notifier {
    /// Ask for a NOTIFY; returns this request's number (the NOTIFY that covers it reports it).
    fn request(&self) -> u64 {
        let mine = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.wake.notify_one();
        mine
    }
}

async fn notify_loop(pool: Pool, n: Arc<Notifier>) {
    loop {
        n.wake.notified().await;
        let covers = n.requested.load(Ordering::SeqCst);
        let sent = async {
            let db = pool.get().await.map_err(NotifyError::Pool)?;
            let stmt = db.prepare_cached("SELECT pg_notify($1, '')").await.map_err(NotifyError::Db)?;
            db.execute(&stmt, &[&CHANNEL]).await.map_err(NotifyError::Db)?;
            Ok(())
        };
        let _previous = n.sent.send_replace((covers, sent.await));
    }
}

/// Wakes this process's workers when a NOTIFY arrives. Holds one dedicated connection,
/// re-established after it drops; workers also poll, so a missed wake-up only costs latency.
/// It ends (without a warning) once `stop` turns true.
pub fn spawn_listener(
    database_url: String,
    search_path: Option<String>,
    mut stop: watch::Receiver<bool>,
) -> Arc<Notify> {
    let wake = Arc::new(Notify::new());
    let w = wake.clone();
    tokio::spawn(async move {
        while !*stop.borrow() {
            let listened = tokio::select! {
                r = listen(&database_url, search_path.as_deref(), &w) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            if let Err(e) = listened {
                if *stop.borrow() {
                    return;
                }
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
    let url = crate::store::tls::DbUrl::parse(url)?;
    let tls = url.connector()?;
    let mut cfg = url.config;
    if let Some(p) = search_path {
        cfg.options(format!("-c search_path={p}"));
    }
    let (client, mut conn) = cfg.connect(tls).await?;
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
