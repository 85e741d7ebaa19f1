//! Settling fan-out parents once their children end: whoever records children's ends (the
//! executor's outcomes, a completion or an overdue wait) finishes, right after its commit, the
//! parents whose last child this was. The sweep stays the safety net (`store::jobs::finish_parents`).

use deadpool_postgres::Pool;

use crate::job::{Dispatch, JobId};
use crate::store::jobs;

/// Children just ended (committed): their parents whose last child this was finish now, not
/// on the next sweep (which stays the safety net: a failure here only delays them until it).
/// Called after recording outcomes and after a wait's end. Returns the parents' callback
/// deliveries.
pub async fn finish_parents(pool: &Pool, mut parents: Vec<JobId>) -> Vec<Dispatch> {
    if parents.is_empty() {
        return vec![];
    }
    parents.sort();
    parents.dedup();
    let finished = async { jobs::finish_parents_of(&pool.get().await?, &parents).await };
    match finished.await {
        Ok(f) => {
            crate::exceptions::alert_parents(&f);
            f.callbacks
        }
        Err(e) => {
            tracing::warn!(event = "relay.executor.finish_parents_failed", error = %e,
                "could not finish parents whose children ended; the sweep will");
            vec![]
        }
    }
}
