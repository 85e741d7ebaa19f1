//! Scenario 1, kill -9: jobs of several kinds submitted over HTTP while 4 `relay worker`
//! processes run and one of them is killed with SIGKILL every 2 s and restarted. Nothing may
//! be lost, every job must end terminal, every recovery must be an event, each recovered
//! within lease + sweep interval + pickup, and effects must be counted once per attempt (a
//! job runs its effect again only after a recorded recovery).
//!
//! The job kinds are a list (`KINDS`): a kind with effects names where they are recorded
//! as (job, attempt). `test.effect` may repeat its effect after a recorded
//! recovery (once per attempt); `email.send` in shadow mode records at most one message per
//! job whatever happens (once per job).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rand::Rng;
use serde_json::{Value, json};

use super::harness::{self, Relay};
use super::{Env, Report};
use taskdeck::job::{JobId, JobStatus};
use taskdeck::platform::Settings;
use taskdeck::store::effects;
use taskdeck::store::tooling::readouts;

pub const LEASE_SECS: u64 = 3;
pub const SWEEP_SECS: u64 = 1;
/// Pickup: a worker's poll interval (a NOTIFY usually wakes it at once).
pub const PICKUP_SECS: f64 = 1.0;
const WORKERS: usize = 4;
const KILL_EVERY: Duration = Duration::from_secs(2);

/// One kind of job in the mix.
pub struct Kind {
    pub task_type: &'static str,
    pub params: fn(usize) -> Value,
    /// Jobs at scale 1.
    pub count: usize,
    /// Where every effect this kind performed is recorded, if anywhere.
    pub effects: Option<Effects>,
    /// The effect happens at most once per job (an email), not once per attempt.
    pub once_per_job: bool,
}

/// Where a kind's effects are recorded, each as (job, attempt).
#[derive(Debug, Clone, Copy)]
pub enum Effects {
    /// A message per `email.send` attempt that got as far as recording one.
    Messages,
    /// The effects ledger of the test-only tasks.
    Ledger,
}

impl Effects {
    async fn read(self, db: &impl taskdeck::store::GenericClient) -> anyhow::Result<Vec<(JobId, i32)>> {
        Ok(match self {
            Effects::Messages => readouts::message_attempts(db).await?,
            Effects::Ledger => effects::all(db).await?,
        })
    }
}

pub const KINDS: &[Kind] = &[
    Kind { task_type: "noop", params: |i| json!({"echo": i}), count: 10_000, effects: None, once_per_job: false },
    // Shadow mode (the default): every message is recorded, none sent; one per job, ever.
    Kind {
        task_type: "email.send",
        params: |i| json!({"from": "noreply@chaos.example", "to": [format!("r{i}@example.com")], "subject": format!("chaos {i}"), "text": "x"}),
        count: 2_000,
        effects: Some(Effects::Messages),
        once_per_job: true,
    },
    // An effect per run, long enough that kills land mid-run.
    Kind {
        task_type: "test.effect",
        params: |_| json!({"sleep_seconds": 2.0}),
        count: 2_000,
        effects: Some(Effects::Ledger),
        once_per_job: false,
    },
];

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("kill9", env.scale);
    let scratch = env.scratch(Settings::default()).await?;
    taskdeck::store::sending_identities::set(
        &mut scratch.platform.pool.get().await?,
        scratch.tenant.id,
        &["chaos.example".into()],
    )
    .await?;
    let url = scratch.url.clone();
    let lease = LEASE_SECS.to_string();
    let worker_args = ["worker", "--workers", "1", "--concurrency", "64", "--lease-seconds", lease.as_str()];
    let spawn_worker =
        |i: usize| Relay::spawn(&env.relay, &worker_args, &url, &[], &env.log(&format!("kill9-worker{i}")));
    let mut workers: Vec<Relay> = (0..WORKERS).map(spawn_worker).collect::<anyhow::Result<_>>()?;
    let sweep_secs = SWEEP_SECS.to_string();
    let _sweeper = Relay::spawn(
        &env.relay,
        &["sweep", "--loop", "--sweep-interval-seconds", &sweep_secs, "--lease-seconds", &lease],
        &url,
        &[],
        &env.log("kill9-sweep"),
    )?;
    let (_server, http) = harness::serve(&env.relay, &url, &[], &env.log("kill9-serve")).await?;

    // The mix, interleaved, submitted in batches of 100 over 20 s (at least 6 s).
    let mut mix: Vec<(&Kind, usize)> =
        KINDS.iter().flat_map(|k| (0..env.n(k.count, 20)).map(move |i| (k, i))).collect();
    {
        let mut rng = rand::rng();
        for i in (1..mix.len()).rev() {
            mix.swap(i, rng.random_range(0..=i));
        }
    }
    let total = mix.len();
    let batches: Vec<Vec<Value>> = mix
        .chunks(100)
        .enumerate()
        .map(|(b, chunk)| {
            chunk
                .iter()
                .enumerate()
                .map(|(j, (k, i))| json!({"idempotency_key": format!("k9-{b}-{j}"), "task_type": k.task_type, "params": (k.params)(*i)}))
                .collect()
        })
        .collect();
    let submit_gap = env.secs(20.0, 6.0) / u32::try_from(batches.len().max(1))?;
    let key = scratch.key.clone();
    let submitter = tokio::spawn(async move {
        let mut accepted: Vec<JobId> = Vec::new();
        for jobs in batches {
            let (status, body) =
                http.call("POST", "/v1/jobs:batch", Some(&key), None, Some(&json!({ "jobs": jobs }))).await?;
            anyhow::ensure!(status == 200, "batch answered {status}: {body}");
            for r in body["results"].as_array().into_iter().flatten() {
                anyhow::ensure!(r["status"] == 202, "an item was refused: {r}");
                accepted.push(r["job"]["id"].as_str().unwrap_or_default().parse()?);
            }
            tokio::time::sleep(submit_gap).await;
        }
        anyhow::Ok(accepted)
    });

    // Kill one worker every 2 s until submissions end and a few seconds more, restarting it.
    let mut kills: Vec<DateTime<Utc>> = Vec::new();
    let kill_phase_end = Instant::now() + env.secs(24.0, 8.0);
    while Instant::now() < kill_phase_end || !submitter.is_finished() {
        tokio::time::sleep(KILL_EVERY).await;
        let victim = rand::rng().random_range(0..WORKERS);
        kills.push(Utc::now());
        workers[victim].kill9().await;
        workers[victim] = spawn_worker(victim)?;
    }
    let accepted = submitter.await??;
    let pool = scratch.platform.pool.clone();
    let bound = LEASE_SECS as f64 + SWEEP_SECS as f64 + PICKUP_SECS;
    let finished = harness::wait_until(Duration::from_secs(120), || harness::all_terminal(&pool)).await;
    let alive = workers.iter_mut().map(|w| w.alive()).filter(|a| *a).count();

    let db = pool.get().await?;
    let counts = harness::status_counts(&db).await?;
    let all = readouts::jobs(&db).await?;
    // Why any job failed (a job every one of whose attempts a kill ended fails for good).
    let mut failures: std::collections::BTreeMap<String, i64> = Default::default();
    for j in all.iter().filter(|j| j.status == JobStatus::Failed) {
        *failures.entry(format!("{}: {}", j.task_type, j.last_error.as_deref().unwrap_or("?"))).or_default() += 1;
    }
    let ours = readouts::jobs_among(&db, &accepted).await?;
    let present = ours.len() as i64;
    let terminal = ours.iter().filter(|j| j.status.is_terminal()).count() as i64;
    // Every attempt beyond the first follows a recovery (these kinds never retry otherwise).
    let unrecorded = readouts::reruns_without_recovery(&db).await?;
    // Recovery delay: from the kill that ended an attempt to the next attempt's claim.
    let recoveries: Vec<(DateTime<Utc>, DateTime<Utc>, DateTime<Utc>)> =
        readouts::recoveries(&db).await?.iter().map(|r| (r.began, r.expired, r.claimed_again)).collect();
    // The kill that ended an attempt came after its claim and at least two thirds of a lease
    // (the heartbeat's renewal) before its lease expired: the latest such kill.
    let renewal = chrono::Duration::milliseconds((LEASE_SECS * 2000 / 3) as i64);
    // (kill → lease returned by the sweep, returned → next claim) per recovery.
    let mut landed = std::collections::HashSet::new();
    let (returned, picked): (Vec<f64>, Vec<f64>) = recoveries
        .iter()
        .filter_map(|(began, expired, next)| {
            let kill = kills.iter().filter(|k| *k >= began && **k <= *expired - renewal).max()?;
            landed.insert(*kill);
            Some(((*expired - *kill).as_seconds_f64(), (*next - *expired).as_seconds_f64()))
        })
        .unzip();
    let (returned, picked) = (harness::sorted(returned), harness::sorted(picked));
    let spread = |xs: &[f64]| {
        format!(
            "{:.2} / {:.2} / {:.2}",
            harness::percentile(xs, 0.5),
            harness::percentile(xs, 0.99),
            xs.last().copied().unwrap_or(0.0)
        )
    };
    report.fig("jobs accepted (202)", accepted.len());
    report.fig("jobs by status", &counts);
    if !failures.is_empty() {
        report.fig("failed jobs by task type and last error", &failures);
    }
    report.fig("SIGKILLs", kills.len());
    report.fig("recoveries (lease_expired events)", recoveries.len());
    report.fig("recoveries matched to their kill", returned.len());
    report.fig("kills that ended a running attempt", format!("{} of {}", landed.len(), kills.len()));
    report.fig("kill → lease returned p50 / p99 / max s (bound: lease + sweep)", spread(&returned));
    report.fig("returned → claimed again p50 / p99 / max s (pickup, queue wait)", spread(&picked));
    report.fig("bound: lease + sweep interval + pickup s", bound);
    report.check(accepted.len() == total, format!("{} of {total} submissions accepted", accepted.len()));
    report
        .check(present == accepted.len() as i64, format!("{} accepted jobs missing", accepted.len() as i64 - present));
    report.check(
        finished && terminal == accepted.len() as i64,
        format!("{} jobs not terminal", accepted.len() as i64 - terminal),
    );
    report.check(unrecorded == 0, format!("{unrecorded} jobs ran again without a recorded recovery"));
    let recovery_bound = (LEASE_SECS + SWEEP_SECS) as f64 + 0.5;
    report.check(
        returned.last().is_none_or(|d| *d <= recovery_bound),
        format!("a lease was returned more than {recovery_bound} s after its worker died"),
    );
    let total = harness::sorted(returned.iter().zip(&picked).map(|(a, b)| a + b).collect());
    report.fig(
        "kill → claimed again p99 / max s",
        format!("{:.2} / {:.2}", harness::percentile(&total, 0.99), total.last().copied().unwrap_or(0.0)),
    );
    report.check(
        total.last().is_none_or(|d| *d <= bound + 0.5),
        format!("a recovered job waited more than {bound} s from the kill to its next claim"),
    );
    report
        .check(!recoveries.is_empty() && !landed.is_empty(), "no kill landed on a running job: nothing was recovered");
    report.check(alive == WORKERS, format!("only {alive} of {WORKERS} workers alive at the end"));
    for kind in KINDS {
        let Some(recorded) = kind.effects else { continue };
        let effects = recorded.read(&db).await?;
        let jobs: HashMap<JobId, (i32, JobStatus)> =
            all.iter().filter(|j| j.task_type == kind.task_type).map(|j| (j.id, (j.attempt, j.status))).collect();
        let mut per_attempt: HashMap<(JobId, i32), usize> = HashMap::new();
        for e in &effects {
            *per_attempt.entry(*e).or_default() += 1;
        }
        let mut per_job: HashMap<JobId, usize> = HashMap::new();
        for (id, _) in &effects {
            *per_job.entry(*id).or_default() += 1;
        }
        let (twice, missing) = if kind.once_per_job {
            (
                per_job.values().filter(|c| **c > 1).count(),
                jobs.iter().filter(|(id, (_, s))| *s == JobStatus::Succeeded && !per_job.contains_key(*id)).count(),
            )
        } else {
            (
                per_attempt.values().filter(|c| **c > 1).count(),
                jobs.iter()
                    .filter(|(id, (a, s))| *s == JobStatus::Succeeded && !per_attempt.contains_key(&(**id, *a)))
                    .count(),
            )
        };
        let beyond = per_attempt.keys().filter(|(id, a)| jobs.get(id).is_none_or(|(last, _)| a > last)).count();
        let rerun = jobs.iter().filter(|(id, _)| per_attempt.keys().filter(|(j, _)| j == *id).count() > 1).count();
        report.fig(&format!("{}: effects / jobs", kind.task_type), format!("{} / {}", effects.len(), jobs.len()));
        report.fig(&format!("{}: jobs whose effect ran again after a recovery", kind.task_type), rerun);
        let unit = if kind.once_per_job { "jobs" } else { "attempts" };
        report.check(twice == 0, format!("{}: {twice} {unit} performed their effect twice", kind.task_type));
        report.check(
            missing == 0,
            format!("{}: {missing} succeeded jobs have no effect for their last attempt", kind.task_type),
        );
        report.check(beyond == 0, format!("{}: {beyond} effects from attempts that never existed", kind.task_type));
    }
    drop(db);
    drop(workers);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
