//! `relay chaos`: Relay's guarantees (shared/docs/architecture.md) under crashes, duplicates,
//! outages and hostile input, measured. Each scenario runs against real processes, real
//! Postgres and moto, prints a table of figures, writes JSON, and reports every violation;
//! the command exits non-zero when there is one. `scale` shrinks a scenario (1.0 = the sizes
//! in the issue); the integration tests run the same code at small scales.
//!
//! Chaos-only SQL (reading what happened) lives in the scenario files, beside the checks.

pub mod harness;

pub mod auth;
pub mod completions;
pub mod db_outage;
pub mod destination;
pub mod duplicates;
pub mod fuzz;
pub mod idempotency;
pub mod isolation;
pub mod kill9;
pub mod lost_dispatch;
pub mod neighbour_sends;
pub mod neighbours;
pub mod noisy;
pub mod poison;
pub mod queue_outage;
pub mod zombie;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::bench::setup::Scratch;
use taskdeck::platform::Settings;

/// Every scenario, in the order.
pub const SCENARIOS: &[&str] = &[
    "kill9",
    "duplicates",
    "lost-dispatch",
    "zombie",
    "db-outage",
    "queue-outage",
    "poison",
    "idempotency",
    "isolation",
    "fuzz",
    "auth",
    "noisy",
    "neighbours",
    "destination",
    "completions",
];

/// Where a chaos run happens.
pub struct Env {
    /// A database to make scratch schemas in.
    pub url: String,
    /// The `relay` binary the child processes run.
    pub relay: PathBuf,
    /// Venvs, logs and private clusters (the target dir's `tmp`).
    pub tmp: PathBuf,
    /// 1.0 = the sizes and durations.
    pub scale: f64,
    moto: OnceCell<String>,
}

impl Env {
    pub fn new(url: String, relay: PathBuf, tmp: PathBuf, scale: f64) -> Env {
        Env { url, relay, tmp, scale, moto: OnceCell::new() }
    }

    /// Use this moto server (the test harness shares its own).
    pub fn with_moto(mut self, endpoint: &str) -> Env {
        self.moto = OnceCell::new_with(Some(endpoint.to_owned()));
        self
    }

    /// A count scaled down, at least `min`.
    pub fn n(&self, full: usize, min: usize) -> usize {
        ((full as f64 * self.scale).round() as usize).max(min)
    }

    /// A duration in seconds scaled down, at least `min`.
    pub fn secs(&self, full: f64, min: f64) -> std::time::Duration {
        std::time::Duration::from_secs_f64((full * self.scale).max(min))
    }

    /// moto's endpoint: `RELAY_MOTO_URL`, or a server started from the shared venv (stopped
    /// when this process exits).
    pub async fn moto(&self) -> anyhow::Result<String> {
        let url = self
            .moto
            .get_or_try_init(|| async {
                let tmp = self.tmp.clone();
                anyhow::Ok(tokio::task::spawn_blocking(move || crate::localaws::moto_for_this_process(&tmp)).await??)
            })
            .await?;
        Ok(url.clone())
    }

    /// A fresh schema with a tenant (`Scratch` from the bench), the test tasks on.
    pub async fn scratch(&self, mut settings: Settings) -> anyhow::Result<Scratch> {
        settings.test_tasks = true;
        Scratch::new(&self.url, settings).await
    }

    /// A log file for a child process of this run.
    pub fn log(&self, name: &str) -> PathBuf {
        let dir = self.tmp.join("chaos-logs");
        let _ = std::fs::create_dir_all(&dir);
        dir.join(format!("{name}-{}.log", uuid::Uuid::now_v7().simple()))
    }
}

/// One scenario's figures and violations.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub scale: f64,
    pub seconds: f64,
    pub figures: Vec<(String, Value)>,
    pub violations: Vec<String>,
}

impl Report {
    pub fn new(scenario: &str, scale: f64) -> Report {
        Report { scenario: scenario.into(), scale, seconds: 0.0, figures: vec![], violations: vec![] }
    }

    pub fn fig(&mut self, name: &str, value: impl Serialize) {
        self.figures.push((name.into(), serde_json::to_value(value).unwrap_or(Value::Null)));
    }

    /// Record a violation unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.violations.push(what.into());
        }
    }

    pub fn figure(&self, name: &str) -> Option<&Value> {
        self.figures.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    pub fn print(&self) {
        println!(
            "== {} (scale {}, {:.1} s): {}",
            self.scenario,
            self.scale,
            self.seconds,
            if self.violations.is_empty() {
                "OK".to_owned()
            } else {
                format!("{} VIOLATION(S)", self.violations.len())
            }
        );
        for (name, value) in &self.figures {
            let v = match value {
                Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() != 0.0) => {
                    format!("{:.3}", n.as_f64().unwrap_or_default())
                }
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            println!("  {name:<58} {v}");
        }
        for v in &self.violations {
            println!("  VIOLATION: {v}");
        }
    }
}

/// Run one scenario by name.
pub async fn run(name: &str, env: &Env) -> anyhow::Result<Report> {
    let start = Instant::now();
    let mut report = match name {
        "kill9" => kill9::run(env).await?,
        "duplicates" => duplicates::run(env).await?,
        "lost-dispatch" => lost_dispatch::run(env).await?,
        "zombie" => zombie::run(env).await?,
        "db-outage" => db_outage::run(env).await?,
        "queue-outage" => queue_outage::run(env).await?,
        "poison" => poison::run(env).await?,
        "idempotency" => idempotency::run(env).await?,
        "isolation" => isolation::run(env).await?,
        "fuzz" => fuzz::run(env).await?,
        "auth" => auth::run(env).await?,
        "noisy" => noisy::run(env).await?,
        "neighbours" => neighbours::run(env).await?,
        "destination" => destination::run(env).await?,
        "completions" => completions::run(env).await?,
        other => anyhow::bail!("no chaos scenario {other:?}; one of: all, {}", SCENARIOS.join(", ")),
    };
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}
