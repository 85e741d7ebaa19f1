//! FIFO per ordering key (migration 0036). A job submitted with an `ordering_key` runs after
//! the key's previous job through one edge of `store::dependencies` (its kind says what that
//! job's failure does: `hold` or `cancel`); `ordering_tails` keeps each key's last job, and a
//! submit locks its keys' rows (in key order) for its transaction, so the submissions of one
//! key are ordered by that lock whatever the number of API processes. The claim knows nothing
//! of ordering: a job queued behind another is held out of it as any dependent is.

use std::collections::{HashMap, HashSet};

use crate::job::terms::OnFailure;
use crate::job::{JobId, JobStatus, TenantId};
use crate::store::{GenericClient, StoreError, decode};

/// A key's last job when a submit locked it, and what that job's failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    pub job_id: JobId,
    pub on_failure: OnFailure,
}

impl Tail {
    /// Whether a job submitted now queues behind this tail (its status read under its lock):
    /// a live job, or a failed one that holds its key. Behind a succeeded or cancelled job, or
    /// a failed one that cancelled what was behind it, a key starts afresh.
    pub fn blocks(&self, status: Option<JobStatus>) -> bool {
        match status {
            Some(JobStatus::Pending | JobStatus::Running | JobStatus::Waiting) => true,
            Some(JobStatus::Failed) => self.on_failure == OnFailure::Hold,
            _ => false,
        }
    }
}

/// Inside the submit's transaction: create the rows of `keys` not seen before and lock every
/// one (in key order) until commit. Returns the tails of the keys that have one.
pub async fn lock_tails(
    db: &impl GenericClient,
    tenant_id: TenantId,
    keys: &[String],
) -> Result<HashMap<String, Tail>, StoreError> {
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    let stmt = db
        .prepare_cached(
            "INSERT INTO ordering_tails (tenant_id, key)
             SELECT $1, k FROM unnest($2::text[]) k ORDER BY k
             ON CONFLICT (tenant_id, key) DO UPDATE SET key = EXCLUDED.key
             RETURNING key, job_id, on_failure",
        )
        .await?;
    let mut tails = HashMap::new();
    for r in db.query(&stmt, &[&tenant_id, &keys]).await? {
        if let Some(job_id) = r.get::<_, Option<JobId>>(1) {
            let on_failure = decode("ordering_tails.on_failure", r.get(2), OnFailure::parse)?;
            tails.insert(r.get(0), Tail { job_id, on_failure });
        }
    }
    Ok(tails)
}

/// The keys' new last jobs (`(key, job, its policy)`), inside the transaction that locked them.
pub async fn set_tails(
    db: &impl GenericClient,
    tenant_id: TenantId,
    tails: &[(String, JobId, OnFailure)],
) -> Result<(), StoreError> {
    if tails.is_empty() {
        return Ok(());
    }
    let keys: Vec<&str> = tails.iter().map(|t| t.0.as_str()).collect();
    let ids: Vec<JobId> = tails.iter().map(|t| t.1).collect();
    let policies: Vec<&str> = tails.iter().map(|t| t.2.as_str()).collect();
    let stmt = db
        .prepare_cached(
            "UPDATE ordering_tails t SET job_id = n.id, on_failure = n.on_failure
             FROM unnest($2::text[], $3::uuid[], $4::text[]) AS n(key, id, on_failure)
             WHERE t.tenant_id = $1 AND t.key = n.key",
        )
        .await?;
    db.execute(&stmt, &[&tenant_id, &keys, &ids, &policies]).await?;
    Ok(())
}

/// Which of these idempotency keys the tenant has used (a replay makes no job to queue).
/// Read after `lock_tails`, so a concurrent submit of the same key to the same ordering key
/// has committed by then.
pub async fn taken_keys(
    db: &impl GenericClient,
    tenant_id: TenantId,
    keys: &[&str],
) -> Result<HashSet<String>, StoreError> {
    let stmt = db
        .prepare_cached("SELECT idempotency_key FROM job_keys WHERE tenant_id = $1 AND idempotency_key = ANY ($2)")
        .await?;
    Ok(db.query(&stmt, &[&tenant_id, &keys]).await?.iter().map(|r| r.get(0)).collect())
}
