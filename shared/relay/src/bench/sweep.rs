//! Sweep cost: one pass over 10,000 expired leases while the table also holds 10,000 vs
//! 1,000,000 terminal rows. The pass should cost the same: its queries read only live rows.

use std::time::Instant;

use serde::Serialize;

use super::setup::Scratch;
use taskdeck::platform::Settings;
use taskdeck::store::tooling::bench;

#[derive(Debug, Clone, Serialize)]
pub struct SweepCost {
    pub terminal_rows: i64,
    pub due_rows: i64,
    pub pass_ms: f64,
    pub recovered: usize,
}

pub async fn run(base_url: &str, terminal: i64, due: i64) -> anyhow::Result<SweepCost> {
    let scratch = Scratch::new(base_url, Settings::default()).await?;
    {
        let db = scratch.platform.pool.get().await?;
        // Bulk rows straight from SQL: `terminal` succeeded jobs, then `due` running jobs
        // whose leases expired a minute ago. Ids are time-ordered like the UUIDv7 ids Relay
        // mints: old terminal rows sort before the live ones.
        let old = "01000000-0000-7000-8000-";
        let recent = "01f00000-0000-7000-8000-";
        bench::load_noops(&db, scratch.tenant.id, "t", "succeeded", terminal, old).await?;
        bench::load_noops(&db, scratch.tenant.id, "d", "running", due, recent).await?;
        bench::analyze_jobs(&db, true).await?;
    }
    let sweeper = scratch.platform.sweeper();
    let start = Instant::now();
    let report = sweeper.pass().await?;
    let pass_ms = start.elapsed().as_secs_f64() * 1000.0;
    scratch.drop_schema(base_url).await?;
    Ok(SweepCost { terminal_rows: terminal, due_rows: due, pass_ms, recovered: report.leases_returned })
}
