//! Scenario 2, duplicate deliveries: every dispatch is sent 2–5 times. Over SQS (moto) the
//! executor function's handler consumes the queue; over the Postgres transport every copy is a
//! NOTIFY and also a delivery of the id to `Executor::run_dispatched` from concurrent
//! executors (the id-delivering path). Counted job by job at both ends: every copy sent must
//! reach the executor (the duplicates really arrive: deliveries observed per job = copies
//! sent), and the effects ledger (`test.effect` writes one row per run) must hold exactly one
//! effect per job, from attempt 1, however many copies it was delivered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};

use super::harness::{self, Fate, Faulty};
use super::{Env, Report};
use taskdeck::job::terms::{IdempotencyKey, Limits};
use taskdeck::job::{Dispatch, JobId, JobStatus};
use taskdeck::platform::Settings;
use taskdeck::store::effects;
use taskdeck::store::jobs::NewJob;
use taskdeck::store::tooling::readouts;
use taskdeck::transport::sqs::SqsTransport;
use taskdeck::transport::{Transport, TransportError};

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
    // Ids handed to the Postgres path's consumers, per job.
    let delivered: Arc<Mutex<HashMap<JobId, usize>>> = Arc::default();
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
            consumers.push(tokio::spawn(harness::consume_sqs(
                exec,
                client.clone(),
                url.clone(),
                received.clone(),
                stop.clone(),
            )));
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
                    {
                        let mut seen = delivered.lock().expect("delivered lock");
                        for id in &ids {
                            *seen.entry(*id).or_default() += 1;
                        }
                    }
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
                run_at: now,
                limits: Limits::fixed(5, 60),
                ..NewJob::new(
                    "test.effect",
                    json!({}),
                    IdempotencyKey::parse(&format!("dup-{i}")).expect("a valid key"),
                )
            })
            .collect();
        scratch.platform.intake.enqueue(scratch.tenant.id, jobs).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    // Copies sent per job, from the fault log.
    let mut sent: HashMap<JobId, usize> = HashMap::new();
    for (id, _, fate) in faulty.log() {
        if let Fate::Sent(k) = fate {
            *sent.entry(id).or_default() += k as usize;
        }
    }
    let copies: usize = sent.values().sum();
    let pool = scratch.platform.pool.clone();
    let finished = harness::wait_until(Duration::from_secs(120), || harness::all_terminal(&pool)).await;
    // Let the last copies arrive (they find the job done and claim nothing): SQS messages
    // received, or ids handed to the Postgres consumers, per job.
    let observed = || -> HashMap<JobId, usize> {
        let mut per_job = received.per_job();
        for (id, k) in delivered.lock().expect("delivered lock").iter() {
            *per_job.entry(*id).or_default() += k;
        }
        per_job
    };
    harness::wait_until(Duration::from_secs(30), || async { observed().values().sum::<usize>() >= copies }).await;
    let _ = stop_tx.send(true);
    for c in consumers {
        let _ = c.await;
    }
    let observed = observed();
    let db = pool.get().await?;
    let jobs: HashMap<JobId, (JobStatus, i32)> =
        readouts::jobs(&db).await?.into_iter().map(|j| (j.id, (j.status, j.attempt))).collect();
    // The effects ledger: (job, attempt) of every effect that really happened.
    let mut effects: HashMap<JobId, Vec<i32>> = HashMap::new();
    for (job, attempt) in effects::all(&db).await? {
        effects.entry(job).or_default().push(attempt);
    }
    let succeeded = jobs.values().filter(|(s, _)| *s == JobStatus::Succeeded).count();
    let claims: i64 = jobs.values().map(|(_, a)| i64::from(*a)).sum();
    let deliveries: usize = observed.values().sum();
    let duplicates_seen: usize = observed.values().map(|k| k.saturating_sub(1)).sum();
    let multi: Vec<&JobId> = observed.iter().filter(|(_, k)| **k > 1).map(|(id, _)| id).collect();
    let most = observed.values().copied().max().unwrap_or(0);
    // Each job's copies all reached the executor.
    let short =
        jobs.keys().filter(|id| observed.get(*id).copied().unwrap_or(0) != sent.get(*id).copied().unwrap_or(0)).count();
    // Each job performed its effect exactly once, in attempt 1.
    let one_effect = |id: &JobId| effects.get(id).is_some_and(|e| e == &[1]);
    let not_once = jobs.keys().filter(|id| !one_effect(id)).count();
    let multi_once = multi.iter().filter(|id| one_effect(id)).count();
    let effect_rows: usize = effects.values().map(Vec::len).sum();
    let extra_effects = effect_rows.saturating_sub(effects.len());
    report.fig(&format!("{transport}: jobs"), jobs.len());
    report.fig(
        &format!("{transport}: copies sent (of which duplicates)"),
        format!("{copies} ({})", copies.saturating_sub(sent.len())),
    );
    report.fig(
        &format!("{transport}: deliveries observed at the executor (of which duplicates)"),
        format!("{deliveries} ({duplicates_seen})"),
    );
    report.fig(&format!("{transport}: duplicate deliveries observed"), duplicates_seen);
    report.fig(
        &format!("{transport}: jobs delivered 2+ times / most deliveries of one job"),
        format!("{} / {most}", multi.len()),
    );
    report.fig(&format!("{transport}: jobs whose observed deliveries differ from copies sent"), short);
    report.fig(
        &format!("{transport}: effects (ledger rows) / effects beyond one per job"),
        format!("{effect_rows} / {extra_effects}"),
    );
    report.fig(&format!("{transport}: jobs delivered 2+ times with exactly one effect"), multi_once);
    report.fig(&format!("{transport}: claims (attempts)"), claims);
    report.check(finished && succeeded == n, format!("{transport}: {succeeded} of {n} jobs succeeded"));
    report.check(short == 0 && duplicates_seen > 0,
        format!("{transport}: {short} jobs' observed deliveries differ from the copies sent ({duplicates_seen} duplicates observed)"));
    report.check(not_once == 0, format!("{transport}: {not_once} jobs did not perform their effect exactly once in attempt 1 ({extra_effects} extra effects)"));
    report.check(claims == n as i64, format!("{transport}: {claims} claims for {n} jobs (each attempt once)"));
    if transport == "postgres" {
        report.fig("postgres: claims by delivery", claimed_by_delivery.load(Ordering::Relaxed));
    }
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(())
}
