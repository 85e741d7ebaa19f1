//! The Postgres-native worker loop: claim due jobs in batches, run them concurrently, record
//! outcomes in batches, heartbeat the leases of long jobs, stop cleanly.
//!
//! Three tasks cooperate: the claimer (this loop), the recorder (hands outcomes to the
//! completer as they arrive, on its flush schedule, and refills the slots keyed jobs free with
//! their keys' next jobs in the same transaction: `record_and_refill`) and the heartbeat (renews leases; aborts
//! a job whose lease was taken over, so a zombie stops working as soon as it can know).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::AbortHandle;

use super::Executor;
use super::completer::{FlushSchedule, Refill, any_keyed};
use crate::job::{ClaimedJob, Fence, JobId, Outcome, TenantId};
use crate::store::jobs;

type InFlight = Arc<Mutex<HashMap<JobId, InSlot>>>;

/// A job running in one of the worker's slots.
struct InSlot {
    attempt: i32,
    tenant: TenantId,
    /// It runs in the long lane (`jobs::LongLane`).
    long: bool,
    handle: AbortHandle,
}
type Finished = (ClaimedJob, Outcome, OwnedSemaphorePermit);

/// How long a busy claimer waits for half a batch of free slots before claiming fewer.
const BATCH_WAIT: Duration = Duration::from_millis(5);

/// Run until `stop` turns true, then finish the jobs in flight and return.
pub async fn run(exec: Executor, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    let concurrency = exec.config.concurrency.max(1);
    let slots = Arc::new(Semaphore::new(concurrency));
    let in_flight: InFlight = Arc::default();
    // Told each time a job ends: a claim that held a tenant to its share waits for it.
    let freed = Arc::new(Notify::new());
    let (done_tx, done_rx) = mpsc::unbounded_channel::<Finished>();
    let lanes = Lanes {
        in_flight: in_flight.clone(),
        freed: freed.clone(),
        done: done_tx.downgrade(),
        stop: stop.clone(),
        heads_at: tokio::time::Instant::now(),
    };
    let recorder = tokio::spawn(record_loop(exec.clone(), done_rx, lanes));
    let heartbeat = tokio::spawn(heartbeat_loop(exec.clone(), in_flight.clone()));
    let mut backoff = Duration::from_millis(100);
    let mut keyed_turn = tokio::time::Instant::now();
    let mut backlog = false;

    let batch = exec.config.claim_batch.clamp(1, concurrency);
    while !*stop.borrow() {
        // Under a backlog, claim in real batches: with jobs in flight, wait a few milliseconds
        // for half a batch of slots to free up rather than trickle out claims of one or two
        // (each claim is a commit); then take whatever is free. Without one, fresh work after
        // a wake-up is claimed at once into whatever slots are free: it never waits on a batch.
        let busy = concurrency - slots.available_permits();
        let need = if busy == 0 || !backlog { 1 } else { (batch / 2).max(1) };
        let half_batch = tokio::time::timeout(BATCH_WAIT, slots.clone().acquire_many_owned(need as u32));
        let mut held = match half_batch.await {
            Ok(p) => p.expect("semaphore never closes"),
            Err(_) => tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("semaphore never closes"),
                _ = stop.changed() => break,
            },
        };
        let extra = batch.saturating_sub(held.num_permits()).min(slots.available_permits());
        if let Ok(more) = slots.clone().try_acquire_many_owned(extra as u32) {
            held.merge(more);
        }
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        let asked = held.num_permits();
        let claim = match claim(&exec, asked, &mut keyed_turn, &in_flight).await {
            Ok(c) => {
                backoff = Duration::from_millis(100);
                c
            }
            Err(e) => {
                tracing::warn!(event = "relay.worker.claim_failed", error = %e, retry_in_ms = backoff.as_millis() as u64,
                    "claim failed; backing off");
                drop(held);
                tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = stop.changed() => {} }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backlog = claim.more;
        let capped = claim.capped;
        let freed_now = freed.notified();
        tokio::pin!(freed_now);
        freed_now.as_mut().enable();
        if !claim.jobs.is_empty() {
            start_jobs(&exec, claim, held, &in_flight, &done_tx, &freed);
        }
        if capped && !backlog {
            // A tenant with due work is at its share of the slots: claim again when one of
            // this worker's jobs ends (or a dispatch, or the poll).
            tokio::select! {
                _ = freed_now => {},
                _ = notified => {},
                _ = tokio::time::sleep(exec.config.poll_interval) => {},
                _ = stop.changed() => {},
            }
            continue;
        }
        if !backlog {
            // Nothing more is due right now: sleep until a dispatch wakes us, or poll.
            tokio::select! {
                _ = notified => {},
                _ = tokio::time::sleep(exec.config.poll_interval) => {},
                _ = stop.changed() => {},
            }
            continue;
        }
    }

    // Stop claiming; wait for the jobs in flight to finish and be recorded.
    let grace = exec.config.lease;
    let all = u32::try_from(concurrency).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, slots.acquire_many(all)).await.is_err() {
        // Stop what still runs: nothing of it is recorded, so its leases expire and the sweep
        // returns the jobs (each an attempt, bounded like any other).
        let stragglers: Vec<_> = in_flight.lock().expect("in-flight lock").drain().collect();
        for (_, slot) in &stragglers {
            slot.handle.abort();
        }
        tracing::warn!(
            event = "relay.worker.shutdown_timeout",
            jobs = stragglers.len(),
            "jobs still running at shutdown were stopped; their leases will expire and the sweep returns them"
        );
    }
    drop(done_tx);
    heartbeat.abort();
    let _ = recorder.await;
}

/// How often a busy worker gives keyed jobs the first pick, so a stream of unkeyed work
/// cannot starve them.
const KEYED_TURN: Duration = Duration::from_millis(100);

/// Claim up to `n` jobs: unkeyed ones on the hot path, keyed ones when that path came back
/// short (nothing else due) or when keyed work's turn has come (then they go first).
async fn claim(
    exec: &Executor,
    n: usize,
    keyed_turn: &mut tokio::time::Instant,
    in_flight: &InFlight,
) -> Result<jobs::Claim, crate::store::StoreError> {
    let lease = exec.config.lease.as_secs_f64();
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let _turn = exec.claims.acquire().await.expect("the claim gate never closes");
    let mut db = exec.pool.get().await?;
    let mut claim = jobs::Claim::default();
    let now = tokio::time::Instant::now();
    let turn = now >= *keyed_turn;
    if turn {
        *keyed_turn = now + KEYED_TURN;
        claim.merge(jobs::claim_keyed(&mut db, count(n), lease, jobs::Keyed::Due, None).await?);
    }
    let room = n - claim.jobs.len();
    if room > 0 {
        let free = jobs::claim_shared(&db, count(room), lease, &shares(exec, in_flight, room)).await?;
        let short = free.jobs.len() < room;
        claim.merge(free);
        if short && !turn {
            let room = n - claim.jobs.len();
            claim.merge(jobs::claim_keyed(&mut db, count(room), lease, jobs::Keyed::Due, None).await?);
        }
    }
    Ok(claim)
}

/// The worker's slots and what each tenant runs in them now, for its share (`jobs::Shares`).
fn shares(exec: &Executor, in_flight: &InFlight, asked: usize) -> jobs::Shares {
    let mut running: HashMap<TenantId, jobs::Running> = HashMap::new();
    for slot in in_flight.lock().expect("in-flight lock").values() {
        let r = running.entry(slot.tenant).or_insert(jobs::Running { tenant: slot.tenant, jobs: 0, long: 0 });
        r.jobs += 1;
        r.long += i64::from(slot.long);
    }
    let mut running: Vec<jobs::Running> = running.into_values().collect();
    let long_lane = exec.config.long_lane();
    if !exec.config.slot_shares {
        // As many slots as the claim asks, none taken: every tenant may take its share of the
        // claim. The long lane still counts the long jobs that run.
        running.iter_mut().for_each(|r| r.jobs = 0);
        return jobs::Shares { slots: i64::try_from(asked).unwrap_or(i64::MAX), running, long_lane };
    }
    let slots = i64::try_from(exec.config.concurrency.max(1)).unwrap_or(i64::MAX);
    jobs::Shares { slots, running, long_lane }
}

/// Spawn one task per claimed job, each holding one slot until its outcome is recorded.
fn start_jobs(
    exec: &Executor,
    claim: jobs::Claim,
    mut held: OwnedSemaphorePermit,
    in_flight: &InFlight,
    done_tx: &mpsc::UnboundedSender<Finished>,
    freed: &Arc<Notify>,
) {
    let modes = Arc::new(claim.modes);
    let mut registry = in_flight.lock().expect("in-flight lock");
    for job in claim.jobs {
        let permit = held.split(1).expect("a slot per claimed job");
        let (exec, modes, done_tx, registry_of_job) = (exec.clone(), modes.clone(), done_tx.clone(), in_flight.clone());
        let freed = freed.clone();
        let (id, attempt, tenant) = (job.id, job.attempt, job.tenant_id);
        let long = exec.config.long_lane().is_some_and(|l| l.holds(job.timeout_seconds));
        let handle = tokio::spawn(async move {
            let outcome = exec.execute(&job, modes).await;
            // Finished: the heartbeat no longer touches this row, so it never contends with
            // the recorder's write of the outcome.
            registry_of_job.lock().expect("in-flight lock").remove(&job.id);
            let _ = done_tx.send((job, outcome, permit));
            freed.notify_one();
        });
        registry.insert(id, InSlot { attempt, tenant, long, handle: handle.abort_handle() });
    }
}

/// What the recorder needs to refill the slots its keyed jobs freed: start jobs as the claimer
/// does, unless the worker is stopping.
struct Lanes {
    in_flight: InFlight,
    freed: Arc<Notify>,
    /// Weak, so the recorder does not keep its own channel open at shutdown.
    done: mpsc::WeakUnboundedSender<Finished>,
    stop: watch::Receiver<bool>,
    /// When the next refill reads its keys' queues from their heads (see `jobs::Lane`).
    heads_at: tokio::time::Instant,
}

/// Write outcomes as they arrive, through the completer on its flush schedule. A flush that
/// fails is retried for up to one lease; after that the leases expire and the sweep returns
/// the jobs. Slots freed by keyed jobs are refilled in the same transaction
/// (`record_and_refill`).
async fn record_loop(exec: Executor, mut rx: mpsc::UnboundedReceiver<Finished>, mut lanes: Lanes) {
    let schedule = FlushSchedule::new(exec.config.concurrency.max(1));
    let mut settling = tokio::task::JoinSet::new();
    while let Some(first) = rx.recv().await {
        while settling.try_join_next().is_some() {}
        let mut batch = vec![first];
        drain(&mut rx, &mut batch, schedule.most);
        let wait = schedule.wait(batch.len(), lanes.running(), any_keyed(batch.iter().map(|(j, _, _)| j)));
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            drain(&mut rx, &mut batch, schedule.most);
        }
        let (outcomes, mut permits): (Vec<_>, Vec<_>) = batch.into_iter().map(|(j, o, p)| ((j, o), p)).unzip();
        let deadline = tokio::time::Instant::now() + exec.config.lease;
        let mut wait = Duration::from_millis(100);
        let mut refill = true;
        loop {
            match record_and_refill(&exec, &outcomes, &mut permits, &mut lanes, refill, &mut settling).await {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() + wait < deadline => {
                    tracing::warn!(event = "relay.worker.record_failed", error = %e, jobs = outcomes.len(),
                        "could not record outcomes; retrying (without refilling freed key slots)");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                    refill = false;
                }
                Err(e) => {
                    tracing::error!(event = "relay.worker.record_abandoned", error = %e, jobs = outcomes.len(),
                        "giving up on recording outcomes; the sweep will recover these jobs");
                    break;
                }
            }
        }
    }
    while settling.join_next().await.is_some() {}
}

/// Record outcomes through the completer, and refill the slots the keyed ones freed: in the
/// same transaction, claim those keys' next jobs and, once committed, start them in the same
/// slots. A key's backlog so runs as a lane: one transaction and one commit per batch of
/// outcomes, with no dispatch, wake-up or search of every key in between. What the claim
/// cannot take (a key locked by another claimer), or everything when `refill` is off or the
/// worker is stopping, is handed on. What follows the commit (parents, dispatches, alerts,
/// hand-ons) goes on in `settling`, off the lane's path.
async fn record_and_refill(
    exec: &Executor,
    outcomes: &[(ClaimedJob, Outcome)],
    permits: &mut Vec<OwnedSemaphorePermit>,
    lanes: &mut Lanes,
    refill: bool,
    settling: &mut tokio::task::JoinSet<()>,
) -> Result<(), crate::store::StoreError> {
    let room = outcomes.iter().filter(|(j, _)| j.concurrency_key.is_some()).count();
    let done_tx = lanes.done.upgrade().filter(|_| refill && room > 0 && !*lanes.stop.borrow());
    let lane_of = if done_tx.is_some() { lanes.of(outcomes) } else { Vec::new() };
    let refill = done_tx.as_ref().map(|_| Refill { room: room as i64, lanes: &lane_of });
    let flushed = exec.flush(outcomes, refill).await?;
    if let (Some(claim), Some(done_tx)) = (flushed.claim, done_tx) {
        let held = permits.drain(..claim.jobs.len()).reduce(|mut a, b| {
            a.merge(b);
            a
        });
        if let Some(held) = held {
            start_jobs(exec, claim, held, &lanes.in_flight, &done_tx, &lanes.freed);
        }
    }
    let exec = exec.clone();
    let after = flushed.after;
    settling.spawn(async move { exec.after_commit(after).await });
    Ok(())
}

impl Lanes {
    /// Jobs of this worker still running (not yet finished).
    fn running(&self) -> usize {
        self.in_flight.lock().expect("in-flight lock").len()
    }

    /// The keys of these ended jobs, each with the place to read its queue from: that of its
    /// first job among them, or its head when the turn for heads has come (`jobs::Lane`).
    fn of(&mut self, outcomes: &[(ClaimedJob, Outcome)]) -> Vec<jobs::Lane> {
        let from_heads = tokio::time::Instant::now() >= self.heads_at;
        if from_heads {
            self.heads_at = tokio::time::Instant::now() + KEYED_TURN;
        }
        let mut lanes: Vec<jobs::Lane> = Vec::new();
        for (job, _) in outcomes {
            let Some(key) = &job.concurrency_key else { continue };
            let place = (!from_heads).then_some((job.run_at, job.id));
            match lanes.iter_mut().find(|l| &l.key == key) {
                Some(lane) => lane.after = lane.after.min(place),
                None => lanes.push(jobs::Lane { key: key.clone(), after: place }),
            }
        }
        lanes
    }
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Finished>, batch: &mut Vec<Finished>, most: usize) {
    while batch.len() < most {
        match rx.try_recv() {
            Ok(f) => batch.push(f),
            Err(_) => break,
        }
    }
}

/// Renew the leases of jobs in flight every third of a lease. A job whose lease was lost
/// (the sweep returned it and another worker may hold it) is aborted.
async fn heartbeat_loop(exec: Executor, in_flight: InFlight) {
    let every = exec.config.lease / 3;
    loop {
        tokio::time::sleep(every).await;
        let fence: Vec<Fence> = in_flight
            .lock()
            .expect("in-flight lock")
            .iter()
            .map(|(id, slot)| Fence { job: *id, attempt: slot.attempt })
            .collect();
        if fence.is_empty() {
            continue;
        }
        let lost = async {
            let db = exec.pool.get().await?;
            jobs::heartbeat(&db, &fence, exec.config.lease.as_secs_f64()).await
        };
        match lost.await {
            Ok(lost) => {
                let mut registry = in_flight.lock().expect("in-flight lock");
                for Fence { job: id, attempt } in lost {
                    // Still in flight and still lost: stop the zombie.
                    if let Some(slot) = registry.get(&id)
                        && slot.attempt == attempt
                    {
                        slot.handle.abort();
                        registry.remove(&id);
                        tracing::warn!(event = "relay.worker.lease_lost", job_id = %id, attempt,
                            "lease lost; the job was aborted here");
                    }
                }
            }
            Err(e) => tracing::warn!(event = "relay.worker.heartbeat_failed", error = %e, "heartbeat failed"),
        }
    }
}
