//! The benchmarks' own statements: rows loaded in bulk, the jobs' processing span, the
//! database's commit and statement counters, and a commit-rate probe of the database itself.

use chrono::{DateTime, Utc};

use crate::job::{JobId, TenantId};
use crate::store::{GenericClient, StoreError};

/// Load `n` `noop` jobs in one statement, all in `status` (`succeeded` or `running`; running
/// ones with leases that expired a minute ago), ids `prefix` followed by a 12-digit hex count,
/// so a run can place old rows before live ones as UUIDv7 ids would be.
pub async fn load_noops(db: &impl GenericClient, tenant: TenantId, key_prefix: &str, status: &str, n: i64, id_prefix: &str) -> Result<u64, StoreError> {
    let sql = "INSERT INTO jobs (id, tenant_id, task_type, params, correlation_id, idempotency_key,
                                 request_hash, status, run_at, attempt, max_attempts, timeout_seconds,
                                 lease_until, started_at, result, finished_at)
               SELECT ($5 || lpad(to_hex(i), 12, '0'))::uuid, $1, 'noop', '{}', 'c' || i, $2 || i, decode(repeat('00', 32), 'hex'),
                      $3, now(), 1, 3, 60,
                      CASE WHEN $3 = 'running' THEN now() - interval '1 minute' END, now(),
                      CASE WHEN $3 = 'succeeded' THEN '{}'::jsonb END,
                      CASE WHEN $3 = 'succeeded' THEN now() END
               FROM generate_series(1, $4::bigint) i";
    Ok(db.execute(sql, &[&tenant, &key_prefix, &status, &n, &id_prefix]).await?)
}

/// Fresh planner statistics for the jobs table after a bulk load (`vacuum` also sets the
/// visibility map, as a table that has lived a while would have it).
pub async fn analyze_jobs(db: &impl GenericClient, vacuum: bool) -> Result<(), StoreError> {
    Ok(db.batch_execute(if vacuum { "VACUUM ANALYZE jobs" } else { "ANALYZE jobs" }).await?)
}

/// Every job id, in order.
pub async fn job_ids(db: &impl GenericClient) -> Result<Vec<JobId>, StoreError> {
    Ok(db.query("SELECT id FROM jobs ORDER BY id", &[]).await?.iter().map(|r| r.get(0)).collect())
}

/// True while a job is pending or running.
pub async fn any_pending_or_running(db: &impl GenericClient) -> Result<bool, StoreError> {
    let sql = "SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'pending') OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running')";
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// Seconds from the first claim to the last finish (0 before any), and how many jobs succeeded.
pub async fn processing_span(db: &impl GenericClient) -> Result<(f64, i64), StoreError> {
    let row = db
        .query_one(
            "SELECT EXTRACT(EPOCH FROM (SELECT max(finished_at) FROM jobs) - (SELECT min(started_at) FROM jobs))::float8,
                    (SELECT count(*) FROM jobs WHERE status = 'succeeded')",
            &[],
        )
        .await?;
    Ok((row.get::<_, Option<f64>>(0).unwrap_or(0.0), row.get(1)))
}

/// Seconds from `t` to the first job finished after it, if any.
pub async fn first_finish_after(db: &impl GenericClient, t: DateTime<Utc>) -> Result<Option<f64>, StoreError> {
    let sql = "SELECT EXTRACT(EPOCH FROM (min(finished_at) - $1))::float8 FROM jobs WHERE finished_at > $1";
    Ok(db.query_one(sql, &[&t]).await?.get(0))
}

/// The database's committed transactions so far (after the statistics snapshot is cleared,
/// so the reading is current).
pub async fn commits(db: &impl GenericClient) -> Result<i64, StoreError> {
    db.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let sql = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// Statements run so far, in total and in the job's lifecycle phases (accept: key lookup,
/// insert, any separate notify; claim: modes, claim; complete), from pg_stat_statements.
/// `None` when that extension is not loaded.
pub async fn statement_counts(db: &impl GenericClient) -> Result<Option<(i64, [i64; 3])>, StoreError> {
    let counted = db
        .query_one(
            "SELECT sum(calls)::bigint,
                    coalesce(sum(calls) FILTER (WHERE query LIKE '%FROM tenants WHERE api_key_hash%'
                                                   OR query LIKE 'WITH input AS%'
                                                   OR query LIKE '%pg_notify%'), 0)::bigint,
                    coalesce(sum(calls) FILTER (WHERE query LIKE 'WITH due AS%' OR query LIKE 'WITH RECURSIVE tenants%'
                                                   OR query LIKE 'SELECT name, enabled FROM operating_modes%'), 0)::bigint,
                    coalesce(sum(calls) FILTER (WHERE query LIKE 'WITH done AS%' OR query LIKE 'WITH retried AS%'
                                                   OR query LIKE 'WITH failed AS%'), 0)::bigint
             FROM public.pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = current_database()",
            &[],
        )
        .await;
    Ok(match counted {
        Ok(r) => r.get::<_, Option<i64>>(0).map(|total| (total, [r.get(1), r.get(2), r.get(3)])),
        Err(_) => None,
    })
}

/// Load pg_stat_statements where the server preloads it; elsewhere the figures show commits only.
pub async fn enable_statement_counts(db: &tokio_postgres::Client) {
    let _ = db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await;
}

/// The process id of the server backend behind this connection.
pub async fn backend_pid(db: &impl GenericClient) -> Result<i32, StoreError> {
    Ok(db.query_one("SELECT pg_backend_pid()", &[]).await?.get(0))
}

/// The commit-rate probe's table: one insert per commit measures the database, not Relay.
pub async fn create_probe(db: &impl GenericClient) -> Result<(), StoreError> {
    Ok(db.batch_execute("CREATE TABLE probe (id bigserial PRIMARY KEY, payload text NOT NULL)").await?)
}

/// One probe row per commit.
pub async fn probe_insert(db: &impl GenericClient, payload: &str) -> Result<(), StoreError> {
    let stmt = db.prepare_cached("INSERT INTO probe (payload) SELECT $1::text").await?;
    db.execute(&stmt, &[&payload]).await?;
    Ok(())
}

/// Many probe rows in one commit.
pub async fn probe_insert_many(db: &impl GenericClient, payloads: &[String]) -> Result<(), StoreError> {
    let stmt = db.prepare_cached("INSERT INTO probe (payload) SELECT unnest($1::text[])").await?;
    db.execute(&stmt, &[&payloads]).await?;
    Ok(())
}
