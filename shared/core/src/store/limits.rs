//! Per-tenant limits (`tenant_limits`, the operators' overrides) and the counts they are checked
//! against: the rows of each kind a tenant has. The rules are `limits`.

use super::{GenericClient, StoreError};
use crate::job::{JobId, TenantId};

/// A kind of row a tenant's call creates, under a limit of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Destinations,
    Templates,
    Suppressions,
    TopicOptOuts,
    PendingJobs,
}

impl Kind {
    pub const ALL: [Kind; 5] =
        [Kind::Destinations, Kind::Templates, Kind::Suppressions, Kind::TopicOptOuts, Kind::PendingJobs];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Destinations => "destinations",
            Kind::Templates => "templates",
            Kind::Suppressions => "suppressions",
            Kind::TopicOptOuts => "topic_opt_outs",
            Kind::PendingJobs => "pending_jobs",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// The table and name column (or expression) of a kind of named row; pending jobs are counted
/// apart. A topic opt-out is named `"<address> <topic>"` (`topic_opt_out_name`).
fn table(kind: Kind) -> Option<(&'static str, &'static str)> {
    match kind {
        Kind::Destinations => Some(("http_destinations", "name")),
        Kind::Templates => Some(("email_templates", "name")),
        Kind::Suppressions => Some(("suppressions", "address")),
        Kind::TopicOptOuts => Some(("topic_opt_outs", "(address || ' ' || topic)")),
        Kind::PendingJobs => None,
    }
}

/// The name `admit_row` takes for an address's opt-out of a topic (neither holds a space).
pub fn topic_opt_out_name(address: &str, topic: &str) -> String {
    format!("{address} {topic}")
}

/// The count of `kind` for a tenant, reading at most `cap` rows (through the tenant's index).
fn count_sql(kind: Kind, cap: &str) -> String {
    match table(kind) {
        Some((table, _)) => {
            format!("(SELECT count(*) FROM (SELECT 1 FROM {table} WHERE tenant_id = $1 LIMIT {cap}) s)")
        }
        None => open_count("", cap),
    }
}

/// A tenant's unfinished jobs (`$1`) matching `filter` (`AND ...` over `id`), counted up to `cap`:
/// pending and waiting ones along `jobs_tenant_open`, running ones among the running rows
/// (`jobs_leases`, as many as the workers' slots). Running jobs stay out of `jobs_tenant_open`
/// so a claim writes no entry there.
fn open_count(filter: &str, cap: &str) -> String {
    format!(
        "(SELECT count(*) FROM ((SELECT 1 FROM jobs WHERE tenant_id = $1 AND status IN ('pending', 'waiting') {filter})
                                UNION ALL
                                (SELECT 1 FROM jobs WHERE status = 'running' AND tenant_id = $1 {filter})
                                LIMIT {cap}) s)"
    )
}

/// The tenant's limit of `kind`: its override, else `default`.
const LIMIT: &str = "coalesce((SELECT max_rows FROM tenant_limits WHERE tenant_id = $1 AND kind = $2), $3::bigint)";

/// Hold, until the transaction ends, the lock that serialises the creates of one kind of row
/// for one tenant (so two creates at limit - 1 cannot both pass). Take it in a statement of its
/// own: a later statement's snapshot then sees every create that held it before.
pub async fn lock(db: &impl GenericClient, tenant: TenantId, kind: Kind) -> Result<(), StoreError> {
    let stmt = db
        .prepare_cached(
            "SELECT pg_advisory_xact_lock(hashtextextended('relay_limit:' || $2::text || ':' || $1::uuid::text, 0))",
        )
        .await?;
    db.execute(&stmt, &[&tenant, &kind.as_str()]).await?;
    Ok(())
}

/// What a create of a named row meets: the tenant's limit, whether the name exists already
/// (then it is an update), and the rows it has (counted up to the limit + 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub limit: i64,
    pub exists: bool,
    pub count: i64,
}

/// The standing of a named row for a tenant (pending jobs are counted by `open_jobs`).
pub async fn standing(
    db: &impl GenericClient,
    tenant: TenantId,
    kind: Kind,
    default: i64,
    name: &str,
) -> Result<Standing, StoreError> {
    let Some((table, column)) = table(kind) else {
        let (first, last) = (JobId::from_uuid(uuid::Uuid::nil()), JobId::from_uuid(uuid::Uuid::max()));
        let (limit, count, _) = open_jobs(db, tenant, default, first, last).await?;
        return Ok(Standing { limit, exists: false, count });
    };
    let sql = format!(
        "WITH lim AS (SELECT {LIMIT} AS n)
         SELECT n, EXISTS (SELECT 1 FROM {table} WHERE tenant_id = $1 AND {column} = $4), {}
         FROM lim",
        count_sql(kind, "(SELECT n FROM lim) + 1")
    );
    let stmt = db.prepare_cached(&sql).await?;
    let row = db.query_one(&stmt, &[&tenant, &kind.as_str(), &default, &name]).await?;
    Ok(Standing { limit: row.get(0), exists: row.get(1), count: row.get(2) })
}

/// The tenant's `pending_jobs` limit and its unfinished jobs created in two ranges of ids (ids
/// are UUIDv7, so ranges of creation time): `after < id <= upto`, and `id > upto`; each counted
/// up to the limit + 1.
pub async fn open_jobs(
    db: &impl GenericClient,
    tenant: TenantId,
    default: i64,
    after: JobId,
    upto: JobId,
) -> Result<(i64, i64, i64), StoreError> {
    let cap = "(SELECT n FROM lim) + 1";
    let sql = format!(
        "WITH lim AS (SELECT {LIMIT} AS n)
         SELECT n, {}, {} FROM lim",
        open_count("AND id > $4 AND id <= $5", cap),
        open_count("AND id > $5", cap)
    );
    let stmt = db.prepare_cached(&sql).await?;
    let row = db.query_one(&stmt, &[&tenant, &Kind::PendingJobs.as_str(), &default, &after, &upto]).await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

/// The tenant's overrides, by kind.
pub async fn overrides(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<(Kind, i64)>, StoreError> {
    let rows =
        db.query("SELECT kind, max_rows FROM tenant_limits WHERE tenant_id = $1 ORDER BY kind", &[&tenant]).await?;
    Ok(rows.iter().filter_map(|r| Some((Kind::parse(r.get(0))?, r.get(1)))).collect())
}

/// Set (`Some`) or clear (`None`) one override.
pub async fn set(
    db: &impl GenericClient,
    tenant: TenantId,
    kind: Kind,
    max_rows: Option<i64>,
    by: &str,
) -> Result<(), StoreError> {
    match max_rows {
        Some(n) => {
            db.execute(
                "INSERT INTO tenant_limits (tenant_id, kind, max_rows, updated_by) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (tenant_id, kind) DO UPDATE SET max_rows = $3, updated_by = $4, updated_at = now()",
                &[&tenant, &kind.as_str(), &n, &by],
            )
            .await?
        }
        None => {
            db.execute("DELETE FROM tenant_limits WHERE tenant_id = $1 AND kind = $2", &[&tenant, &kind.as_str()])
                .await?
        }
    };
    Ok(())
}

/// The rows of `kind` a tenant has, counted up to `cap` (for the limits' read-out).
pub async fn used(db: &impl GenericClient, tenant: TenantId, kind: Kind, cap: i64) -> Result<i64, StoreError> {
    let sql = format!("SELECT {}", count_sql(kind, "$2"));
    Ok(db.query_one(&sql, &[&tenant, &cap]).await?.get(0))
}
