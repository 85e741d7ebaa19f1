//! The completer: the one way a run's outcomes reach the database, for the worker loop
//! (`worker`) and for a delivery of ids (`Executor::run_dispatched_until`, the Lambda executor).
//!
//! One flush schedule (`FlushSchedule`): the first of a batch's ended jobs waits at most
//! `FLUSH_WINDOW` for others, and not at all when nothing else runs, when enough have ended,
//! or when a keyed job is among them (its key's slots stay taken until it is written, so at
//! the key's limit the wait would be the lane's speed).
//!
//! One transaction per flush (`Executor::flush`): BEGIN, every outcome's statement and, for a
//! worker's lanes, the claim of the freed keys' next jobs go in one flight on one connection,
//! then COMMIT (`store::pipelined`); a flush of one kind of outcome is one statement, a
//! transaction of its own. A result per job comes back (`Recorded`), and what follows
//! the commit (`AfterCommit`: alerts, parents, dispatches, hand-ons) for the caller to run,
//! inline or off the lane's path.

use std::time::Duration;

use super::record::Written;
use super::{Executor, Recorded, RunReport, freed_keys};
use crate::job::{ClaimedJob, JobId, Outcome};
use crate::store::StoreError;
use crate::store::jobs;
use crate::store::pipelined::Pipelined;

/// How long the first of a batch's ended jobs waits for others before its outcome is written:
/// outcomes of one claim end within moments of each other, and a millisecond's wait turns many
/// one-row flushes (each a commit) into one.
pub const FLUSH_WINDOW: Duration = Duration::from_millis(1);

/// Most outcomes one flush writes: half the worker's slots (at most 2,000), so while one
/// half's outcomes are being written the slots of the other half, already written, are
/// claimed again. One statement for all of them would free every slot only at its end, and a
/// loop would alternate claiming and recording instead of doing both at once.
const FLUSH_MOST: usize = 2000;

/// When a flush goes (see the module's comment).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlushSchedule {
    /// Most outcomes per flush.
    pub most: usize,
}

impl FlushSchedule {
    pub fn new(concurrency: usize) -> FlushSchedule {
        FlushSchedule { most: (concurrency / 2).clamp(1, FLUSH_MOST) }
    }

    /// How long `ready` ended outcomes wait for more, with `running` jobs still running.
    pub fn wait(&self, ready: usize, running: usize, keyed: bool) -> Duration {
        if running == 0 || keyed || ready >= (self.most / 8).max(1) { Duration::ZERO } else { FLUSH_WINDOW }
    }
}

/// How many kinds of outcome these are (the statements their write sends).
fn kinds(outcomes: &[(ClaimedJob, Outcome)]) -> usize {
    let mut seen: Vec<std::mem::Discriminant<Outcome>> = Vec::new();
    for (_, o) in outcomes {
        let d = std::mem::discriminant(o);
        if !seen.contains(&d) {
            seen.push(d);
        }
    }
    seen.len()
}

/// Whether any of these outcomes is a keyed job's.
pub(crate) fn any_keyed<'a>(jobs: impl IntoIterator<Item = &'a ClaimedJob>) -> bool {
    jobs.into_iter().any(|j| j.concurrency_key.is_some())
}

/// A worker's lanes, refilled in the flush's transaction: claim up to `room` due jobs of these
/// keys (`claim_keyed`'s lock-then-count, so limits hold across workers).
pub(crate) struct Refill<'a> {
    pub room: i64,
    pub lanes: &'a [jobs::Lane],
}

/// What one flush did.
pub(crate) struct Flushed {
    /// Each job's result, in the order of the outcomes.
    pub results: Vec<(JobId, Recorded)>,
    pub report: RunReport,
    /// The lanes' next jobs, claimed in the same transaction (given a `Refill`).
    pub claim: Option<jobs::Claim>,
    pub after: AfterCommit,
}

/// What follows a flush's commit: its settling (`Executor::settle`) and the hand-on of the
/// keys whose freed slots no claim of this flush refilled.
pub(crate) struct AfterCommit {
    written: Written,
    hand_on: Vec<String>,
}

impl Executor {
    /// Write these outcomes (fenced), and claim a refill's jobs, in one transaction. Nothing of
    /// it is committed unless all of it is.
    pub(crate) async fn flush(
        &self,
        outcomes: &[(ClaimedJob, Outcome)],
        refill: Option<Refill<'_>>,
    ) -> Result<Flushed, StoreError> {
        if refill.is_none() && kinds(outcomes) <= 1 {
            // One statement is a transaction of its own: no BEGIN and COMMIT round trip on the
            // hottest path (a batch of successes). Only the release of a finished job's
            // dependents, when it has any, follows in a statement of its own, as after any
            // terminal write (`store::dependencies`; the sweep heals a crash in between).
            let written = self.write(&self.pool.get().await?, outcomes).await?;
            let results = written.results.clone();
            let after = AfterCommit { written, hand_on: freed_keys(outcomes) };
            return Ok(Flushed { report: RunReport::of(&results), results, claim: None, after });
        }
        let db = Pipelined::new(self.pool.get().await?);
        let claim_sql = match &refill {
            Some(_) => Some(db.prepare_cached(&jobs::keyed_claim_sql(false)).await?),
            None => None,
        };
        // COMMIT goes as soon as the outcomes' last statement has answered.
        let write_and_commit = async {
            let written = self.write(&*db, outcomes).await?;
            db.commit().await?;
            Ok::<_, StoreError>(written)
        };
        let (written, claim) = match (&refill, &claim_sql) {
            (Some(r), Some(claim_sql)) => {
                // One flight: BEGIN, the claim's settings, the keys' locks, the outcomes and the
                // claim (of the keys locked, which it reads from the transaction: no answer
                // awaited in between). Written in that order, the claim counts the slots the
                // outcomes freed (a statement the write sends later only leaves its slots to the
                // hand-on).
                let (lease, which) = (self.config.lease.as_secs_f64(), jobs::Keyed::Lanes(r.lanes));
                let (_, _, _, written, claim) = tokio::try_join!(
                    db.begin(),
                    jobs::plan_keyed_claim(&*db, false),
                    jobs::lock_keys(&*db, r.room, which),
                    write_and_commit,
                    jobs::claim_locked(&*db, claim_sql, r.room, lease, which, None),
                )?;
                (written, Some(claim))
            }
            _ => (tokio::try_join!(db.begin(), write_and_commit)?.1, None),
        };
        db.release();
        // A key another claimer held (it sees the freed slots), or nothing more due now: a
        // hand-on covers jobs that become due later.
        let hand_on = match (&refill, &claim) {
            (Some(r), Some(c)) if (c.jobs.len() as i64) < r.room => r.lanes.iter().map(|l| l.key.clone()).collect(),
            (Some(_), _) => Vec::new(),
            (None, _) => freed_keys(outcomes),
        };
        let results = written.results.clone();
        Ok(Flushed { report: RunReport::of(&results), results, claim, after: AfterCommit { written, hand_on } })
    }

    /// Run what follows a flush's commit.
    pub(crate) async fn after_commit(&self, after: AfterCommit) {
        self.settle(after.written).await;
        self.hand_on(&after.hand_on).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_waits_only_while_others_run_few_have_ended_and_none_is_keyed() {
        let s = FlushSchedule::new(64);
        assert_eq!(s.most, 32);
        assert_eq!(s.wait(1, 5, false), FLUSH_WINDOW);
        assert_eq!(s.wait(1, 0, false), Duration::ZERO, "nothing else can come");
        assert_eq!(s.wait(1, 5, true), Duration::ZERO, "a keyed job's slot waits on its write");
        assert_eq!(s.wait(4, 5, false), Duration::ZERO, "enough for a batch");
        assert_eq!(FlushSchedule::new(100_000).most, 2000);
    }
}
