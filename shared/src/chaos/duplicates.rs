//! Scenario 2, duplicate deliveries: every dispatch is sent 2–5 times. Over SQS (moto) the
//! executor function's handler consumes the queue; over the Postgres transport every copy is a
//! NOTIFY and also a delivery of the id to `Executor::run_dispatched` from concurrent
//! executors (the id-delivering path). Each attempt must be claimed once, each effect happen
//! once, and the suppressed deliveries must equal the injected copies.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};

use super::harness::{self, Fate, Faulty};
use super::{Env, Report};
use crate::job::{Dispatch, JobId};
use crate::platform::Settings;
use crate::store::jobs::NewJob;
use crate::transport::sqs::SqsTransport;
use crate::transport::{Transport, TransportError};

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("duplicates", env.scale);
    let n = env.n(2000, 50);
    for transport in ["sqs", "postgres"] {
        one(env, transport, n, &mut report).await?;
    }
    Ok(report)
}

/// Passes each dispatch on (NOTIFY) and also delivers every id to a channel, like a queue.
struct Delivering {
    inner: Arc<dyn Transport>,
    tx: mpsc::UnboundedSender<JobId>,
}

#[async_trait::async_trait]
impl Transport for Delivering {
    fn name(&self) -> &'static str {
        "postgres"
    }
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        self.inner.dispatch(jobs).await?;
        for d in jobs {
            let _ = self.tx.send(d.id);
        }
        Ok(())
    }
}

async fn one(env: &Env, transport: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    let mut scratch = env.scratch(Settings::default()).await?;
    let received = Arc::new(harness::Received::default());
    let delivered = Arc::new(AtomicUsize::new(0));
    let claimed_by_delivery = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = watch::channel(false);
    let mut consumers = Vec::new();
    let faulty: Arc<Faulty>;
    if transport == "sqs" {
        let client = harness::sqs_client(&env.moto().await?);
        let url = harness::new_queue(&client, "chaos-dup").await?;
        faulty = Arc::new(Faulty::new(Arc::new(SqsTransport::new(client.clone(), url.clone())), 0.0, 0.0, (2, 5)));
        scratch.platform = scratch.platform.clone().with_transport(faulty.clone());
        for _ in 0..4 {
            let exec = scratch.platform.executor();
            consumers.push(tokio::spawn(harness::consume_sqs(exec, client.clone(), url.clone(), received.clone(), stop.clone())));
        }
    } else {
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Delivering { inner: scratch.platform.transport.clone(), tx });
        faulty = Arc::new(Faulty::new(inner, 0.0, 0.0, (2, 5)));
        scratch.platform = scratch.platform.clone().with_transport(faulty.clone());
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..4 {
            let (exec, rx, delivered, claimed, mut stop) =
                (scratch.platform.executor(), rx.clone(), delivered.clone(), claimed_by_delivery.clone(), stop.clone());
            consumers.push(tokio::spawn(async move {
                loop {
                    let mut ids = Vec::new();
                    {
                        let mut rx = rx.lock().await;
                        tokio::select! {
                            first = rx.recv() => match first { Some(id) => ids.push(id), None => break },
                            _ = stop.changed() => break,
                        }
                        while ids.len() < 10 {
                            match rx.try_recv() {
                                Ok(id) => ids.push(id),
                                Err(_) => break,
                            }
                        }
                    }
                    delivered.fetch_add(ids.len(), Ordering::Relaxed);
                    if let Ok((_, c)) = exec.run_dispatched(&ids).await {
                        claimed.fetch_add(c, Ordering::Relaxed);
                    }
                }
            }));
        }
    }

    // Over SQS, 40 jobs a second (about 140 messages with the copies): moto recomputes every
    // queue attribute for each message sent and received, so a queue allowed to grow to
    // thousands of messages delivers a few a second; paced, the queue stays short.
    let now = chrono::Utc::now();
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
        if transport == "sqs" {
            pace.tick().await;
        }
        let jobs: Vec<NewJob> = chunk
            .iter()
            .map(|i| NewJob {
                id: uuid::Uuid::now_v7(),
                task_type: "test.effect".into(),
                params: json!({}),
                correlation_id: format!("dup-{i}"),
                idempotency_key: format!("dup-{i}"),
                request_hash: vec![0; 32],
                parent_id: None,
                run_at: now,
                max_attempts: 5,
                timeout_seconds: 60,
                ..NewJob::default()
            })
            .collect();
        scratch.platform.intake.enqueue(scratch.tenant.id, jobs).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let injected: usize = faulty.log().iter().map(|(_, _, f)| if let Fate::Sent(k) = f { *k as usize - 1 } else { 0 }).sum();
    let copies: usize = faulty.log().iter().map(|(_, _, f)| if let Fate::Sent(k) = f { *k as usize } else { 0 }).sum();
    let pool = scratch.platform.pool.clone();
    let finished = harness::wait_until(Duration::from_secs(120), || harness::all_terminal(&pool)).await;
    // Let the last copies arrive (they find the job done and claim nothing).
    // Distinct SQS messages, or ids handed to the Postgres consumers.
    let deliveries = || received.count() + delivered.load(Ordering::Relaxed);
    harness::wait_until(Duration::from_secs(30), || async { deliveries() >= copies }).await;
    let _ = stop_tx.send(true);
    for c in consumers {
        let _ = c.await;
    }
    let db = pool.get().await?;
    let row = db
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), coalesce(sum(attempt), 0)::bigint,
                    (SELECT count(*) FROM effects_ledger),
                    (SELECT count(*) FROM (SELECT job_id FROM effects_ledger GROUP BY job_id HAVING count(*) > 1) d)
             FROM jobs",
            &[],
        )
        .await?;
    let (jobs, succeeded, claims, effects, doubled): (i64, i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let received = deliveries();
    let suppressed = received as i64 - claims;
    report.fig(&format!("{transport}: jobs"), jobs);
    report.fig(&format!("{transport}: deliveries received"), received);
    report.fig(&format!("{transport}: injected duplicate copies"), injected);
    report.fig(&format!("{transport}: claims (attempts)"), claims);
    report.fig(&format!("{transport}: suppressed deliveries"), suppressed);
    report.fig(&format!("{transport}: effects (ledger rows)"), effects);
    report.check(finished && succeeded == n as i64, format!("{transport}: {succeeded} of {n} jobs succeeded"));
    report.check(claims == n as i64, format!("{transport}: {claims} claims for {n} jobs (each attempt once)"));
    report.check(effects == n as i64 && doubled == 0, format!("{transport}: {effects} effects, {doubled} jobs with more than one"));
    report.check(suppressed == injected as i64, format!("{transport}: suppressed {suppressed} != injected {injected}"));
    if transport == "postgres" {
        report.fig("postgres: claims by delivery", claimed_by_delivery.load(Ordering::Relaxed));
    }
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(())
}
