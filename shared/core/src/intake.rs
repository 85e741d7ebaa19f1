//! Putting work into Relay: insert the rows, commit, then dispatch. Every path that creates
//! jobs (the API, ingress, fan-out parents) goes through `Intake::enqueue`, so
//! dispatch-after-commit holds by construction.
//!
//! Concurrent small submissions are coalesced: a writer task takes every request waiting at
//! that moment and inserts them all in one statement (one commit), so sixteen clients cost a
//! handful of commits, not sixteen. Nobody waits on purpose: an idle writer takes a lone
//! request at once. A submission of `DIRECT_ROWS` or more is already a good batch: it is
//! inserted at once in a task of its own, beside the writers, so large batches are written in
//! parallel.
//!
//! One writer is the default: Postgres pays a large fixed cost per statement (it re-parses
//! the table's check constraints on each one), so fewer, fuller statements win. At 16 clients
//! one writer made 0.25–0.33 statements per job against four writers' 0.63, and accepted
//! ~8,000–10,500 jobs/s against ~5,900–7,400 (`relay bench`, README).
//!
//! Over the Postgres transport the insert statement NOTIFYs the workers itself
//! (`Transport::commit_wake`), so a batch costs one statement and one commit, and is answered
//! as soon as it commits; other transports dispatch after the commit, as above.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{Mutex, mpsc, oneshot};

use chrono::Utc;

use crate::job::terms::{OnFailure, Ordering};
use crate::job::{Dispatch, HELD_FOR, JobId, JobStatus, TenantId};
use crate::store::dependencies::{self, Held};
use crate::store::jobs::{self, Inserted, NewJob};
use crate::store::{StoreError, ordering};
use crate::transport::{self, Transport};

/// Most rows one coalesced statement inserts.
const MAX_ROWS: usize = 1000;
/// A submission this large skips coalescing.
const DIRECT_ROWS: usize = 100;

type Reply = oneshot::Sender<Result<Vec<Inserted>, Arc<StoreError>>>;

struct Request {
    tenant_id: TenantId,
    jobs: Vec<NewJob>,
    reply: Reply,
}

/// The way in for new jobs; cheap to clone.
#[derive(Clone)]
pub struct Intake {
    tx: mpsc::Sender<Request>,
    pool: Pool,
    transport: Arc<dyn Transport>,
}

impl Intake {
    /// Start `writers` coalescing writer tasks (at least one).
    pub fn start(pool: Pool, transport: Arc<dyn Transport>, writers: usize) -> Intake {
        let (tx, rx) = mpsc::channel::<Request>(4096);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer(pool.clone(), transport.clone(), rx.clone()));
        }
        Intake { tx, pool, transport }
    }

    /// Insert jobs for one tenant (committed on return), then hand the new ones to the
    /// transport. Keys already taken come back as `Inserted::Existing`, in input order.
    pub async fn enqueue(&self, tenant_id: TenantId, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, Arc<StoreError>> {
        if jobs.is_empty() {
            return Ok(vec![]);
        }
        let (reply, answer) = oneshot::channel();
        let closed = || Arc::new(StoreError::IntakeClosed);
        let request = Request { tenant_id, jobs, reply };
        if request.jobs.len() >= DIRECT_ROWS {
            // In its own task, as a writer would: a caller that goes away (a client hanging up)
            // does not stop the write between its commit and its dispatch.
            let (pool, transport) = (self.pool.clone(), self.transport.clone());
            tokio::spawn(async move { write(&pool, &transport, vec![request]).await });
        } else {
            self.tx.send(request).await.map_err(|_| closed())?;
        }
        answer.await.map_err(|_| closed())?
    }
}

/// What a new job is linked to: the jobs it runs after (`after`, this tenant's) and its
/// ordering key (FIFO per key, `store::ordering`).
#[derive(Debug, Clone, Default)]
pub struct Links {
    pub after: Vec<JobId>,
    pub ordering: Option<Ordering>,
}

impl Links {
    fn is_empty(&self) -> bool {
        self.after.is_empty() && self.ordering.is_none()
    }
}

impl Intake {
    /// `enqueue` for jobs of which some are linked to others (`links[i]`: `jobs[i]`'s): when
    /// any is, all are inserted in one transaction of their own, beside the writers, with
    /// their ordering keys and dependencies locked, held and resolved (`store::ordering`,
    /// `store::dependencies`); then what is due is dispatched. A held job answers with the
    /// `run_at` it asked for.
    pub async fn enqueue_linked(
        &self,
        tenant_id: TenantId,
        jobs: Vec<NewJob>,
        links: Vec<Links>,
    ) -> Result<Vec<Inserted>, Arc<StoreError>> {
        if links.iter().all(Links::is_empty) {
            return self.enqueue(tenant_id, jobs).await;
        }
        let (pool, transport) = (self.pool.clone(), self.transport.clone());
        // In its own task, so a caller that goes away does not stop it between commit and dispatch.
        let written = tokio::spawn(async move {
            let (inserted, send) = write_linked(&pool, tenant_id, jobs, links).await?;
            transport::send(&transport, &pool, &send).await;
            Ok::<_, StoreError>(inserted)
        });
        written.await.map_err(|_| Arc::new(StoreError::IntakeClosed))?.map_err(Arc::new)
    }
}

/// Insert `jobs` in one transaction with their links (see `Intake::enqueue_linked`).
/// Returns the rows, and what to dispatch after commit: the jobs due now, and the callbacks of
/// those cancelled at once for a dependency that had already failed.
async fn write_linked(
    pool: &Pool,
    tenant_id: TenantId,
    mut jobs: Vec<NewJob>,
    links: Vec<Links>,
) -> Result<(Vec<Inserted>, Vec<Dispatch>), StoreError> {
    let mut db = pool.get().await?;
    let tx = db.transaction().await?;
    // The keys first (their lock orders the submissions of each key), then the jobs.
    let keys: Vec<String> = links.iter().filter_map(|l| Some(l.ordering.as_ref()?.key().to_owned())).collect();
    let (tails, mut taken) = if keys.is_empty() {
        (HashMap::new(), HashSet::new())
    } else {
        let tails = ordering::lock_tails(&tx, tenant_id, &keys).await?;
        let asked: Vec<&str> = jobs
            .iter()
            .zip(&links)
            .filter(|(_, l)| l.ordering.is_some())
            .map(|(j, _)| j.idempotency_key.as_str())
            .collect();
        (tails, ordering::taken_keys(&tx, tenant_id, &asked).await?)
    };
    let mut all: Vec<JobId> = links.iter().flat_map(|l| l.after.iter().copied()).collect();
    all.extend(tails.values().map(|t| t.job_id));
    all.sort();
    all.dedup();
    let statuses = dependencies::lock(&tx, tenant_id, &all, !tails.is_empty()).await?;
    // The API checked they exist; one deleted since (retention) is the caller's to retry.
    if let Some(gone) = links.iter().flat_map(|l| &l.after).find(|id| !statuses.contains_key(id)) {
        return Err(StoreError::Vanished(format!("job {gone} (named in after)")));
    }
    let (mut holds, mut queued) = (Vec::new(), Vec::new());
    // Each key's last job so far in this submit, and what its failure does.
    let mut last: HashMap<&str, (JobId, OnFailure)> = HashMap::new();
    for (job, link) in jobs.iter_mut().zip(&links) {
        let waits: Vec<JobId> = link.after.iter().copied().filter(|a| statuses[a] != JobStatus::Succeeded).collect();
        let mut behind = None;
        // A replay (a key used before, or twice in this submit) makes no job to queue.
        if let Some(o) = &link.ordering
            && taken.insert(job.idempotency_key.as_str().to_owned())
        {
            behind = match last.get(o.key()) {
                Some(ahead) => Some(*ahead),
                None => tails
                    .get(o.key())
                    .filter(|t| t.blocks(statuses.get(&t.job_id).copied()))
                    .map(|t| (t.job_id, t.on_failure)),
            };
            last.insert(o.key(), (job.id, o.on_failure()));
            queued.push(job.id);
        }
        if !waits.is_empty() || behind.is_some() {
            holds.push(Held { job_id: job.id, run_at: job.run_at, after: waits, behind });
            job.run_at = Utc::now() + HELD_FOR;
        }
    }
    let mut inserted = jobs::insert_many(&tx, tenant_id, &jobs, None).await?;
    let created: HashMap<JobId, usize> = inserted
        .iter()
        .enumerate()
        .filter_map(|(n, i)| match i {
            Inserted::Created(j) => Some((j.id, n)),
            Inserted::Existing(_) => None,
        })
        .collect();
    // Only a submit of the same key racing this one, outside any ordering key, lands here.
    if let Some(lost) = queued.iter().find(|id| !created.contains_key(id)) {
        return Err(StoreError::Vanished(format!("the idempotency key of job {lost}")));
    }
    // The jobs of this submit that others queue behind end knowing it.
    let ahead: Vec<JobId> =
        holds.iter().filter_map(|h| h.behind.map(|b| b.0)).filter(|b| created.contains_key(b)).collect();
    if !ahead.is_empty() {
        dependencies::lock(&tx, tenant_id, &ahead, false).await?;
    }
    let new_tails: Vec<(String, JobId, OnFailure)> =
        last.into_iter().map(|(key, (id, on_failure))| (key.to_owned(), id, on_failure)).collect();
    ordering::set_tails(&tx, tenant_id, &new_tails).await?;
    holds.retain(|h| created.contains_key(&h.job_id));
    let mut send = dependencies::hold(&tx, tenant_id, &holds).await?;
    for h in &holds {
        // Read again: one whose dependency had failed is cancelled already.
        let mut job =
            jobs::get(&tx, tenant_id, h.job_id).await?.ok_or_else(|| StoreError::Vanished(h.job_id.to_string()))?;
        if job.status == JobStatus::Pending {
            job.run_at = h.run_at;
        }
        inserted[created[&h.job_id]] = Inserted::Created(job);
    }
    // A replay of a job still held answers with the time it asked for too.
    let replays: Vec<JobId> = inserted
        .iter()
        .filter_map(|i| match i {
            Inserted::Existing(j) if j.status == JobStatus::Pending => Some(j.id),
            _ => None,
        })
        .collect();
    if !replays.is_empty() {
        let asked: HashMap<JobId, _> = dependencies::held(&tx, &replays).await?.into_iter().collect();
        for i in &mut inserted {
            if let Inserted::Existing(j) = i
                && let Some(hold) = asked.get(&j.id)
            {
                j.run_at = hold.run_at;
            }
        }
    }
    tx.commit().await?;
    let held: HashSet<JobId> = holds.iter().map(|h| h.job_id).collect();
    send.extend(inserted.iter().filter_map(|i| match i {
        Inserted::Created(j) if !held.contains(&j.id) => {
            Some(Dispatch { id: j.id, run_at: j.run_at, tenant: Some(tenant_id) })
        }
        _ => None,
    }));
    Ok((inserted, send))
}

#[async_trait::async_trait]
impl crate::task::Jobs for Intake {
    async fn enqueue(&self, tenant_id: TenantId, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, Arc<StoreError>> {
        Intake::enqueue(self, tenant_id, jobs).await
    }

    fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }
}

async fn writer(pool: Pool, transport: Arc<dyn Transport>, rx: Arc<Mutex<mpsc::Receiver<Request>>>) {
    loop {
        let mut batch = Vec::new();
        {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut rows = first.jobs.len();
            batch.push(first);
            while rows < MAX_ROWS {
                match rx.try_recv() {
                    Ok(r) => {
                        rows += r.jobs.len();
                        batch.push(r);
                    }
                    Err(_) => break,
                }
            }
        }
        write(&pool, &transport, batch).await;
    }
}

/// Insert each tenant's share of the batch in one statement, dispatch what was created, and
/// answer every request.
async fn write(pool: &Pool, transport: &Arc<dyn Transport>, batch: Vec<Request>) {
    let mut by_tenant: BTreeMap<TenantId, Vec<Request>> = BTreeMap::new();
    for r in batch {
        by_tenant.entry(r.tenant_id).or_default().push(r);
    }
    let wake = transport.commit_wake();
    for (tenant_id, requests) in by_tenant {
        let all: Vec<NewJob> = requests.iter().flat_map(|r| r.jobs.iter().cloned()).collect();
        let inserted = async { jobs::insert_many(&pool.get().await?, tenant_id, &all, wake).await }.await;
        let inserted = match inserted {
            Ok(i) => i,
            Err(e) => {
                let e = Arc::new(e);
                for r in requests {
                    let _ = r.reply.send(Err(e.clone()));
                }
                continue;
            }
        };
        if wake.is_some() {
            // The commit sent the wake-up.
            answer(requests, inserted);
            continue;
        }
        let created: Vec<Dispatch> = inserted
            .iter()
            .filter_map(|i| match i {
                Inserted::Created(j) => Some(Dispatch { id: j.id, run_at: j.run_at, tenant: Some(tenant_id) }),
                Inserted::Existing(_) => None,
            })
            .collect();
        // Committed: dispatch, then answer. Dispatching first matters on Lambda, where work
        // left after the response may be frozen with the container; a failed dispatch still
        // never fails the request (the sweep sends those rows). In a task of its own, so the
        // writer goes on to the next insert meanwhile (and a slow queue does not hold it up).
        let (pool, transport) = (pool.clone(), transport.clone());
        tokio::spawn(async move {
            transport::send(&transport, &pool, &created).await;
            answer(requests, inserted);
        });
    }
}

/// Give each request its share of the inserted rows, in order.
fn answer(requests: Vec<Request>, inserted: Vec<Inserted>) {
    let mut rest = inserted.into_iter();
    for r in requests {
        let mine: Vec<Inserted> = rest.by_ref().take(r.jobs.len()).collect();
        let _ = r.reply.send(Ok(mine));
    }
}
