//! Putting work into Relay: insert the rows, commit, then dispatch. Every path that creates
//! jobs (the API, ingress, fan-out parents) goes through `enqueue`, so dispatch-after-commit
//! holds by construction.

use std::sync::Arc;

use deadpool_postgres::Pool;

use crate::job::{Dispatch, TenantId};
use crate::store::StoreError;
use crate::store::jobs::{self, Inserted, NewJob};
use crate::transport::{self, Transport};

/// Insert jobs for one tenant (one statement, committed on return), then hand the new ones to
/// the transport. Keys already taken come back as `Inserted::Existing`.
pub async fn enqueue(
    pool: &Pool,
    transport: &Arc<dyn Transport>,
    tenant_id: TenantId,
    new: &[NewJob],
) -> Result<Vec<Inserted>, StoreError> {
    let inserted = {
        let db = pool.get().await?;
        jobs::insert_many(&db, tenant_id, new).await?
    };
    let created: Vec<Dispatch> = inserted
        .iter()
        .filter_map(|i| match i {
            Inserted::Created(j) => Some(Dispatch { id: j.id, run_at: j.run_at }),
            Inserted::Existing(_) => None,
        })
        .collect();
    transport::send(transport, pool, &created).await;
    Ok(inserted)
}
