//! The benchmarks' own statements: rows loaded in bulk, the jobs' processing span, the
//! database's commit and statement counters, and a commit-rate probe of the database itself.

use chrono::{DateTime, Utc};

use crate::job::{JobId, TenantId};
use crate::store::jobs::PENDING_JOBS;
use crate::store::{GenericClient, StoreError};

/// Load `n` `noop` jobs in one statement, all in `status` (`succeeded` or `running`; running
/// ones with leases that expired a minute ago), ids `prefix` followed by a 12-digit hex count,
/// so a run can place old rows before live ones as UUIDv7 ids would be.
pub async fn load_noops(
    db: &impl GenericClient,
    tenant: TenantId,
    key_prefix: &str,
    status: &str,
    n: i64,
    id_prefix: &str,
) -> Result<u64, StoreError> {
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
    let sql = &format!(
        "SELECT EXISTS (SELECT 1 FROM {PENDING_JOBS} p) OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running')"
    );
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// Jobs pending and jobs finished among `n`: the children of `parent` (none finished until the
/// parent waits, when all its children exist), or every job. Only live rows are read
/// (`jobs_open_children`, the partial indexes of pending, running and waiting jobs), never the
/// finished ones, so sampling stays cheap however far a large drain has got.
pub async fn status_counts(db: &impl GenericClient, parent: Option<JobId>, n: i64) -> Result<(i64, i64), StoreError> {
    let (pending, open, all_created) = match parent {
        Some(parent) => {
            let row = db
                .query_one(
                    "SELECT count(*) FILTER (WHERE c.status = 'pending'), count(*),
                            (SELECT status <> 'running' AND status <> 'pending' FROM jobs WHERE id = $1)
                     FROM jobs c WHERE c.parent_id = $1 AND c.status IN ('pending', 'running', 'waiting')",
                    &[&parent],
                )
                .await?;
            (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, Option<bool>>(2).unwrap_or(false))
        }
        None => {
            let row = db
                .query_one(
                    &format!(
                        "SELECT (SELECT count(*) FROM {PENDING_JOBS} p),
                            (SELECT count(*) FROM jobs WHERE status = 'running'),
                            (SELECT count(*) FROM jobs WHERE status = 'waiting')"
                    ),
                    &[],
                )
                .await?;
            let pending: i64 = row.get(0);
            (pending, pending + row.get::<_, i64>(1) + row.get::<_, i64>(2), true)
        }
    };
    Ok((pending, if all_created { n - open } else { 0 }))
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

/// How one system's statements are told apart by their text (`ILIKE` patterns): those that
/// accept a job, claim it, complete it. Whatever matches none is "other" (transaction
/// control, commit records, ANALYZE, reads).
#[derive(Debug, Clone, Copy)]
pub struct StatementClasses {
    pub accept: &'static [&'static str],
    pub claim: &'static [&'static str],
    pub complete: &'static [&'static str],
}

/// Relay's statements: accept is the key lookup, the insert and any separate notify; claim
/// the modes and the claim; complete the terminal and retry transitions.
pub const RELAY: StatementClasses = StatementClasses {
    accept: &["%FROM tenants WHERE api_key_hash%", "WITH input AS%", "%pg_notify%"],
    claim: &["WITH due AS%", "WITH RECURSIVE tenants%", "SELECT name, enabled FROM operating_modes%"],
    complete: &["WITH done AS%", "WITH retried AS%", "WITH failed AS%"],
};

/// graphile-worker 0.18's statements: `add_job`/`add_jobs` (with everything they run inside),
/// the batched `get_jobs` update, and the completing delete.
pub const GRAPHILE_WORKER: StatementClasses = StatementClasses {
    accept: &["%.add_jobs(%", "%.add_job(%"],
    claim: &["%attempts = jobs.attempts +%"],
    complete: &["%delete from %._private_jobs%"],
};

/// What a set of statements did, as pg_stat_statements counted it (WAL of nested statements
/// included in their top-level statement's).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StatementCost {
    pub calls: i64,
    pub wal_bytes: i64,
    pub wal_records: i64,
    /// Full-page images among the records.
    pub wal_fpi: i64,
}

/// Statements run so far in this database: all of them, and each of `classes` (accept, claim,
/// complete). `None` when pg_stat_statements is not loaded.
pub async fn statement_costs(
    db: &impl GenericClient,
    classes: &StatementClasses,
) -> Result<Option<(StatementCost, [StatementCost; 3])>, StoreError> {
    let costs = db
        .query_one(
            "WITH s AS (
                 SELECT s.*, CASE WHEN query ILIKE ANY ($1::text[]) THEN 0
                                  WHEN query ILIKE ANY ($2::text[]) THEN 1
                                  WHEN query ILIKE ANY ($3::text[]) THEN 2 END AS phase
                 FROM public.pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                 WHERE d.datname = current_database()
             )
             SELECT array_agg(coalesce(calls, 0) ORDER BY p), array_agg(coalesce(wal_bytes, 0) ORDER BY p),
                    array_agg(coalesce(wal_records, 0) ORDER BY p), array_agg(coalesce(wal_fpi, 0) ORDER BY p)
             FROM generate_series(-1, 2) p
             LEFT JOIN LATERAL (SELECT sum(calls)::bigint AS calls, sum(wal_bytes)::bigint AS wal_bytes,
                                       sum(wal_records)::bigint AS wal_records, sum(wal_fpi)::bigint AS wal_fpi
                                FROM s WHERE p = -1 OR s.phase = p) c ON true",
            &[&classes.accept, &classes.claim, &classes.complete],
        )
        .await;
    let Ok(row) = costs else { return Ok(None) };
    let cols: [Vec<i64>; 4] = [row.get(0), row.get(1), row.get(2), row.get(3)];
    let at = |i: usize| StatementCost {
        calls: cols[0][i],
        wal_bytes: cols[1][i],
        wal_records: cols[2][i],
        wal_fpi: cols[3][i],
    };
    Ok(Some((at(0), [at(1), at(2), at(3)])))
}

/// The WAL written so far: the current insert position, in bytes from the start.
pub async fn wal_position(db: &impl GenericClient) -> Result<i64, StoreError> {
    Ok(db.query_one("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint", &[]).await?.get(0))
}

/// Heap writes so far to one table of a schema, and how many indexes the table has.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TableWrites {
    pub table: String,
    pub inserted: i64,
    pub updated: i64,
    /// Of `updated`, those that were HOT (no index entry written).
    pub hot_updated: i64,
    pub deleted: i64,
    pub indexes: i64,
}

/// Every table of `schema` with its write counters (pg_stat_user_tables: what committed and
/// aborted transactions wrote, as flushed by the backends so far).
pub async fn table_writes(db: &impl GenericClient, schema: &str) -> Result<Vec<TableWrites>, StoreError> {
    db.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let rows = db
        .query(
            "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
                    (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid)
             FROM pg_stat_user_tables t WHERE schemaname = $1 ORDER BY relname",
            &[&schema],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| TableWrites {
            table: r.get(0),
            inserted: r.get(1),
            updated: r.get(2),
            hot_updated: r.get(3),
            deleted: r.get(4),
            indexes: r.get(5),
        })
        .collect())
}

/// WAL records of one kind whose first block belongs to one relation, between two WAL positions.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WalRecords {
    /// The relation (table or index) of the record's first block when it is in the schema asked
    /// for; `None` for records of no block (commits) and of other relations (catalogs, other
    /// schemas and databases, TOAST).
    pub relation: Option<String>,
    /// `resource_manager/record_type`, as `pg_get_wal_stats` names it: `Btree/INSERT_LEAF`.
    pub kind: String,
    pub count: i64,
    /// Record lengths, full-page images included.
    pub bytes: i64,
}

/// Every WAL record between two WAL positions (pg_walinspect's `pg_get_wal_records_info`),
/// counted and summed by record type and by the relation of its first block, named when it is
/// in `schema` of this database. `None` when the extension is not loaded
/// (`enable_statement_counts`) or that WAL is no longer on disk.
pub async fn wal_records_between(
    db: &impl GenericClient,
    schema: &str,
    from: i64,
    to: i64,
) -> Result<Option<Vec<WalRecords>>, StoreError> {
    let lsn = |x: i64| format!("{:X}/{:X}", (x as u64) >> 32, (x as u64) & 0xffff_ffff);
    let (from, to) = (lsn(from), lsn(to));
    // PG 15 refuses an end past the flushed WAL; the WAL writer flushes within wal_writer_delay.
    let flushed = "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn";
    for _ in 0..50 {
        if db.query_one(flushed, &[&to]).await?.get::<_, bool>(0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let rows = db
        .query(
            // `block_ref` starts `blkref #0: rel <tablespace>/<database>/<relfilenode> fork …`;
            // grouped by that text first (a regex per record costs six times the read).
            "WITH r AS (
                  SELECT resource_manager || '/' || record_type AS kind,
                         CASE WHEN block_ref LIKE 'blkref #0: rel %' THEN split_part(block_ref, ' ', 4) END AS rel,
                         count(*) AS n, sum(record_length) AS bytes
                  FROM public.pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                  GROUP BY 1, 2
              ), g AS (
                  SELECT kind, rel[1] AS spc, rel[2] AS dbid, rel[3] AS node, n, bytes
                  FROM (SELECT kind, string_to_array(rel, '/')::oid[] AS rel, n, bytes FROM r) r
              )
              SELECT c.relname::text, g.kind, sum(g.n)::bigint, sum(g.bytes)::bigint
              FROM g
              LEFT JOIN pg_database d ON d.datname = current_database() AND d.oid = g.dbid
              LEFT JOIN (pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace AND s.nspname = $3)
                     ON d.oid IS NOT NULL AND c.relfilenode = g.node
                        AND g.spc = CASE c.reltablespace WHEN 0 THEN d.dattablespace ELSE c.reltablespace END
              GROUP BY 1, 2 ORDER BY 1, 2",
            &[&from, &to, &schema],
        )
        .await;
    Ok(rows.ok().map(|rows| {
        rows.iter()
            .map(|r| WalRecords { relation: r.get(0), kind: r.get(1), count: r.get(2), bytes: r.get(3) })
            .collect()
    }))
}

/// Fresh planner statistics for one table after a bulk load (the peer's, by qualified name).
pub async fn analyze_table(db: &impl GenericClient, schema: &str, table: &str) -> Result<(), StoreError> {
    Ok(db.batch_execute(&format!("ANALYZE {}.{}", super::quoted(schema), super::quoted(table))).await?)
}

/// Rows left in one table of a schema (whether the peer drained its queue).
pub async fn rows_in(db: &impl GenericClient, schema: &str, table: &str) -> Result<i64, StoreError> {
    let sql = format!("SELECT count(*) FROM {}.{}", super::quoted(schema), super::quoted(table));
    Ok(db.query_one(&sql, &[]).await?.get(0))
}

/// Load pg_stat_statements where the server preloads it (elsewhere the figures show commits
/// only), and pg_walinspect where it is installed (elsewhere index entries are estimated).
pub async fn enable_statement_counts(db: &tokio_postgres::Client) {
    let _ = db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public").await;
    let _ = db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect SCHEMA public").await;
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
