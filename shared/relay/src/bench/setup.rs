//! Benchmark scaffolding: a fresh schema per measurement, bulk job rows, and the probes that
//! read what Postgres did (commits, statements). Benchmark-only SQL lives here and in
//! `probe.rs`, beside the measurements that need it.

use std::time::{Duration, Instant};

use chrono::Utc;
use deadpool_postgres::Pool;
use serde_json::{Value, json};
use uuid::Uuid;

use taskdeck::job::JobId;
use taskdeck::job::terms::{CorrelationId, IdempotencyKey, Limits};
use taskdeck::platform::{Platform, Settings};
use taskdeck::store::jobs::{self, NewJob};
use taskdeck::store::tenants;
use taskdeck::store::tooling;

/// One measurement's world: its own schema in the benchmark database.
pub struct Scratch {
    pub platform: Platform,
    pub url: String,
    pub schema: String,
    pub tenant: tenants::Tenant,
    pub key: String,
}

/// A URL that selects `schema` on every connection (for child processes).
pub fn url_with_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

impl Scratch {
    pub async fn new(base_url: &str, mut settings: Settings) -> anyhow::Result<Scratch> {
        let schema = format!("bench_{}", Uuid::now_v7().simple());
        tooling::create_schema(&admin(base_url).await?, &schema).await?;
        settings.pool.search_path = Some(schema.clone());
        let platform = Platform::new(base_url, settings)?;
        platform.migrate().await?;
        let (tenant, key) = tenants::create(&platform.pool.get().await?, "bench").await?;
        Ok(Scratch { platform, url: url_with_schema(base_url, &schema), schema, tenant, key })
    }

    /// Enqueue `params.len()` jobs of `task` for `tenant` (keys `prefix-i`) through the intake.
    pub async fn submit(
        &self,
        tenant: taskdeck::job::TenantId,
        prefix: &str,
        task: &str,
        params: Vec<Value>,
    ) -> anyhow::Result<Vec<JobId>> {
        let admits = taskdeck::api::submit::Admission {
            callback_allow: self.platform.settings.callback_allow.clone(),
            max_timeout_seconds: self.platform.settings.max_timeout_seconds,
        };
        let mut jobs = Vec::with_capacity(params.len());
        for (i, p) in params.into_iter().enumerate() {
            let req: taskdeck::api::submit::JobRequest =
                serde_json::from_value(json!({"task_type": task, "params": p}))?;
            let key = IdempotencyKey::parse(&format!("{prefix}-{i}"))?;
            let new = req
                .into_new_job(key, &self.platform.catalogue, &admits, chrono::Utc::now())
                .map_err(|e| anyhow::anyhow!(e.message))?;
            jobs.push(new);
        }
        let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        for chunk in jobs.chunks(1000) {
            self.platform.intake.enqueue(tenant, chunk.to_vec()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(ids)
    }

    pub async fn drop_schema(self, base_url: &str) -> anyhow::Result<()> {
        self.platform.pool.close();
        self.platform.api_pool.close();
        tooling::drop_schema(&admin(base_url).await?, &self.schema).await?;
        Ok(())
    }

    /// Insert `n` due `noop` jobs straight into the table, 5,000 per statement.
    pub async fn preload_noops(&self, n: usize) -> anyhow::Result<()> {
        let db = self.platform.pool.get().await?;
        let now = Utc::now();
        let mut made = 0;
        while made < n {
            let chunk: Vec<NewJob> = (made..n.min(made + 5000))
                .map(|i| NewJob {
                    correlation_id: CorrelationId::parse(&format!("bench-{i}")).expect("a valid correlation id"),
                    run_at: now,
                    limits: Limits::fixed(3, 60),
                    ..NewJob::new("noop", json!({}), IdempotencyKey::parse(&format!("pre-{i}")).expect("a valid key"))
                })
                .collect();
            made += chunk.len();
            jobs::insert_many(&db, self.tenant.id, &chunk, None).await?;
        }
        tooling::bench::analyze_jobs(&db, false).await?;
        Ok(())
    }

    /// Wait until no job is pending or running; returns false on timeout.
    pub async fn wait_all_terminal(&self, limit: Duration) -> anyhow::Result<bool> {
        let db = self.platform.pool.get().await?;
        let start = Instant::now();
        loop {
            if !tooling::bench::any_pending_or_running(&db).await? {
                return Ok(true);
            }
            if start.elapsed() > limit {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Seconds from the first claim to the last finish, and how many succeeded.
    pub async fn processing_span(&self) -> anyhow::Result<(f64, i64)> {
        Ok(tooling::bench::processing_span(&self.platform.pool.get().await?).await?)
    }
}

/// What Postgres counted: commits, and (when pg_stat_statements is loaded) statements, in
/// total and by lifecycle phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbCounters {
    pub commits: i64,
    pub statements: Option<i64>,
    /// Statements of accept (key lookup, insert, any separate notify), claim (modes, claim) and complete.
    pub phases: Option<[i64; 3]>,
}

pub async fn db_counters(pool: &Pool) -> anyhow::Result<DbCounters> {
    let db = pool.get().await?;
    // Statistics are flushed about once a second; give the last ones time to land.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let commits = tooling::bench::commits(&db).await?;
    let counted = tooling::bench::statement_costs(&db, &tooling::bench::RELAY).await?;
    let (statements, phases) = (counted.map(|c| c.0.calls), counted.map(|c| c.1.map(|p| p.calls)));
    Ok(DbCounters { commits, statements, phases })
}

/// Statements per job in each phase of the lifecycle, between two readings. Every one of
/// these statements runs in autocommit, so each is also one commit.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Lifecycle {
    pub commits_per_job: f64,
    pub accept: Option<f64>,
    pub claim: Option<f64>,
    pub complete: Option<f64>,
}

impl Lifecycle {
    pub fn between(before: DbCounters, after: DbCounters, jobs: usize) -> Lifecycle {
        let n = jobs.max(1) as f64;
        let phase = |i: usize| after.phases.zip(before.phases).map(|(a, b)| (a[i] - b[i]) as f64 / n);
        Lifecycle {
            commits_per_job: (after.commits - before.commits) as f64 / n,
            accept: phase(0),
            claim: phase(1),
            complete: phase(2),
        }
    }
}

/// Close the pool's idle connections. A backend sends its table statistics when it exits, but
/// an idle one may keep them up to ten seconds (PGSTAT_IDLE_INTERVAL): before reading
/// pg_stat_user_tables after work done through a pool, close its idle connections.
pub fn close_idle(pool: &Pool) {
    pool.retain(|_, _| false);
}

/// Peak resident memory of a process, in MiB (Linux).
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// A connection of its own to the database at `url`, outside any scratch schema.
pub async fn admin(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}
