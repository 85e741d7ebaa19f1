//! Sweep cost: one pass over 10,000 expired leases while the table also holds 10,000 vs
//! 1,000,000 terminal rows. The pass should cost the same: its queries read only live rows.

use std::time::Instant;

use serde::Serialize;

use super::setup::Scratch;
use taskdeck::platform::Settings;

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
        let insert = "INSERT INTO jobs (id, tenant_id, task_type, params, correlation_id, idempotency_key,
                                        request_hash, status, run_at, attempt, max_attempts, timeout_seconds,
                                        lease_until, started_at, result, finished_at)
             SELECT ($5 || lpad(to_hex(i), 12, '0'))::uuid, $1, 'noop', '{}', 'c' || i, $2 || i, decode(repeat('00', 32), 'hex'),
                    $3, now(), 1, 3, 60,
                    CASE WHEN $3 = 'running' THEN now() - interval '1 minute' END, now(),
                    CASE WHEN $3 = 'succeeded' THEN '{}'::jsonb END,
                    CASE WHEN $3 = 'succeeded' THEN now() END
             FROM generate_series(1, $4::bigint) i";
        let old = "01000000-0000-7000-8000-";
        let recent = "01f00000-0000-7000-8000-";
        db.execute(insert, &[&scratch.tenant.id, &"t", &"succeeded", &terminal, &old]).await?;
        db.execute(insert, &[&scratch.tenant.id, &"d", &"running", &due, &recent]).await?;
        db.batch_execute("VACUUM ANALYZE jobs").await?;
    }
    let sweeper = scratch.platform.sweeper();
    let start = Instant::now();
    let report = sweeper.pass().await?;
    let pass_ms = start.elapsed().as_secs_f64() * 1000.0;
    scratch.drop_schema(base_url).await?;
    Ok(SweepCost { terminal_rows: terminal, due_rows: due, pass_ms, recovered: report.leases_returned })
}
