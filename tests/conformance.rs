//! One conformance suite, written once, run against every real transport: the Postgres-native
//! one (NOTIFY wakes a worker loop that claims due rows) and SQS through moto (messages become
//! the SQS event the executor function handles, as the Lambda event source mapping delivers).
//!
//! Each transport comes with "how to consume it"; the properties are the same for both:
//! dispatch after commit delivers the job; a failed dispatch leaves the row for the sweep;
//! a duplicate delivery runs the task's effect once; an outside party's completion applies
//! once, and a missing one is found by the sweep, whose retry the transport carries.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use taskdeck::executor::worker;
use taskdeck::job::terms::{IdempotencyKey, Limits};
use taskdeck::job::{Dispatch, JobId};
use taskdeck::platform::Platform;
use taskdeck::store::effects;
use taskdeck::store::jobs::{self, NewJob};
use taskdeck::transport::postgres::{CHANNEL, PgTransport};
use taskdeck::transport::sqs::SqsTransport;
use taskdeck::transport::{self, Transport};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::support::{World, listen, moto, test_settings};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Postgres,
    Sqs,
}

/// A world wired to one transport, and the means to consume what it carries.
struct Rig {
    world: World,
    kind: Kind,
    /// SQS: the queue's (url, arn).
    queue: Option<(String, String)>,
    /// Postgres: the running worker loop, its LISTEN connection and its stop switch.
    worker: Option<(watch::Sender<bool>, JoinHandle<()>, tokio_postgres::Client)>,
}

impl Rig {
    async fn new(kind: Kind) -> Rig {
        Rig::on(kind, World::new().await).await
    }

    /// A rig around a world set up by the caller (its modes, allow-list, credentials).
    async fn on(kind: Kind, world: World) -> Rig {
        match kind {
            Kind::Postgres => Rig { world, kind, queue: None, worker: None },
            Kind::Sqs => {
                let (url, arn) = moto::queue("conformance").await;
                let world = world.with_transport(Arc::new(SqsTransport::new(moto::sqs(), url.clone())));
                Rig { world, kind, queue: Some((url, arn)), worker: None }
            }
        }
    }

    /// The same transport, broken: a database that refuses connections, a queue that does
    /// not exist.
    fn broken(&self) -> Arc<dyn Transport> {
        match self.kind {
            Kind::Postgres => {
                let mut s = test_settings();
                s.pool.wait_timeout = Duration::from_millis(500);
                let p = Platform::new("postgres://relay@127.0.0.1:1/relay", s).unwrap();
                Arc::new(PgTransport::new(p.pool.clone()))
            }
            Kind::Sqs => {
                let url = format!("{}/123456789012/missing-{}", moto::endpoint(), Uuid::now_v7().simple());
                Arc::new(SqsTransport::new(moto::sqs(), url))
            }
        }
    }

    /// Postgres: start a worker loop that only a NOTIFY wakes (its poll interval is an hour),
    /// listening before it returns so no notification is missed.
    async fn start_consumer(&mut self) {
        if !matches!(self.kind, Kind::Postgres) || self.worker.is_some() {
            return;
        }
        let (client, mut heard) = listen(CHANNEL).await;
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        tokio::spawn(async move {
            while heard.recv().await.is_some() {
                w.notify_waiters();
            }
        });
        let mut exec = self.world.platform.executor();
        exec.config.poll_interval = Duration::from_secs(3600);
        let (stop_tx, stop) = watch::channel(false);
        let handle = tokio::spawn(worker::run(exec, wake, stop));
        self.worker = Some((stop_tx, handle, client));
    }

    /// Consume what the transport carries until `id` reaches a terminal state (or `within`).
    async fn consume_until_done(&mut self, id: &str, within: Duration) -> serde_json::Value {
        self.consume_until(id, within, |_| false).await
    }

    /// Consume until `id` is terminal or `until` holds of it (or `within` passes).
    async fn consume_until(
        &mut self,
        id: &str,
        within: Duration,
        until: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.start_consumer().await;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some((url, arn)) = &self.queue {
                let event = moto::receive_event(url, arn, 1).await;
                if !event.records.is_empty() {
                    let res =
                        taskdeck::lambda::executor::handle(&self.world.platform.executor(), event.clone(), None).await;
                    let failed: Vec<String> =
                        res.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
                    moto::delete_acknowledged(url, &event, &failed).await;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (_, job) = self.world.call(axum::http::Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
            let status = job["status"].as_str().unwrap_or_default();
            if ["succeeded", "failed", "cancelled"].contains(&status)
                || until(&job)
                || tokio::time::Instant::now() > deadline
            {
                return job;
            }
        }
    }

    async fn stop(self) {
        if let Some((stop, handle, _client)) = self.worker {
            stop.send(true).unwrap();
            handle.await.unwrap();
        }
    }
}

async fn dispatch_after_commit_delivers_the_job(kind: Kind) {
    let mut rig = Rig::new(kind).await;
    rig.start_consumer().await;
    let (status, job) = rig.world.submit("c-deliver", json!({"task_type": "test.effect"})).await;
    assert_eq!(status, 202);
    let id = job["id"].as_str().unwrap().to_owned();
    let done = rig.consume_until_done(&id, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "succeeded", "{kind:?}: {done}");
    assert_eq!(done["attempt"], 1);
    rig.stop().await;
}

async fn a_failed_dispatch_leaves_the_row_for_the_sweep(kind: Kind) {
    let mut rig = Rig::new(kind).await;
    // A committed job whose dispatch fails, as at intake (the SQS transport) or on a re-send by
    // the sweep (both); the Postgres transport's intake wakes workers in the commit itself.
    let id = JobId::new();
    let key = IdempotencyKey::parse("c-lost").unwrap();
    let job = NewJob { id, limits: Limits::fixed(3, 60), ..NewJob::new("test.effect", json!({}), key) };
    let pool = &rig.world.platform.pool;
    jobs::insert_many(&pool.get().await.unwrap(), rig.world.tenant.id, &[job], None).await.unwrap();
    assert!(
        !transport::send(&rig.broken(), pool, &[Dispatch { id, run_at: Utc::now(), tenant: None }]).await,
        "{kind:?}: failed"
    );
    let unmarked = "SELECT count(*) FROM jobs WHERE id = $1 AND status = 'pending' AND dispatched_at IS NULL";
    assert_eq!(rig.world.eventually(unmarked, &[&id], 1).await, 1, "{kind:?}: pending, dispatch mark cleared");
    if let Some((url, _)) = &rig.queue {
        assert_eq!(moto::depth(url).await, 0, "no message went out");
    }
    let report = rig.world.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.redispatched, 1, "{kind:?}");
    let done = rig.consume_until_done(&id.to_string(), Duration::from_secs(15)).await;
    assert_eq!(done["status"], "succeeded", "{kind:?}: {done}");
    let redispatched = "SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'redispatched'";
    assert_eq!(rig.world.count(redispatched, &[&id]).await, 1, "the recovery is recorded");
    rig.stop().await;
}

async fn a_duplicate_delivery_runs_the_effect_once(kind: Kind) {
    let mut rig = Rig::new(kind).await;
    let (_, job) =
        rig.world.submit("c-dup", json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.1}})).await;
    let id: JobId = job["id"].as_str().unwrap().parse().unwrap();
    // The transport carries the job twice more (a redelivery, a sweep racing intake).
    let again = Dispatch { id, run_at: chrono::Utc::now(), tenant: None };
    rig.world.platform.transport.dispatch(&[again, again]).await.unwrap();
    let done = rig.consume_until_done(&id.to_string(), Duration::from_secs(15)).await;
    assert_eq!(done["status"], "succeeded", "{kind:?}: {done}");
    // Let every copy arrive and be handled.
    if let Some((url, _)) = &rig.queue {
        let url = url.clone();
        rig.consume_until_done(&id.to_string(), Duration::ZERO).await;
        rig.consume_until_done(&id.to_string(), Duration::ZERO).await;
        assert_eq!(moto::depth(&url).await, 0, "every copy was acknowledged, none failed");
    }
    assert_eq!(effects::count(&rig.world.db().await, id).await.unwrap(), 1, "{kind:?}");
    assert_eq!(done["attempt"], 1);
    rig.stop().await;
}

/// An `http.request` on this transport whose first call is answered 503 (then 200), submitted
/// under `key` and consumed until its first attempt has ended and it waits for its retry: the
/// rig, what the receiver saw, the job's id and its view then.
async fn an_http_request_answered_503(kind: Kind, key: &str) -> (Rig, crate::http::SeenLog, JobId, serde_json::Value) {
    use crate::http::{Reply, destination, receiver};
    let mut rig = Rig::on(kind, crate::http::world().await).await;
    let (addr, seen) = receiver(vec![Reply::Status(503, vec![], "")]).await;
    let api_key = rig.world.key.clone();
    destination(&rig.world, &api_key, "crm", addr, json!({})).await;
    let params = json!({"destination": "crm", "method": "POST", "path": "/v1/x", "body": {"n": 1}});
    let (status, job) = rig.world.submit(key, json!({"task_type": "http.request", "params": params})).await;
    assert_eq!(status, 202, "{job}");
    let id: JobId = job["id"].as_str().unwrap().parse().unwrap();
    let first = rig
        .consume_until(&id.to_string(), Duration::from_secs(15), |j| j["attempt"] == 1 && j["status"] == "pending")
        .await;
    assert_eq!((first["status"].as_str(), first["attempt"].as_i64()), (Some("pending"), Some(1)), "{kind:?}: {first}");
    (rig, seen, id, first)
}

/// `http.request` on this transport: a 503 is retried (the job dispatched again when due), the
/// retry carries the same `Idempotency-Key`, and the second call's 200 is the result.
async fn an_http_request_is_retried_with_its_key_and_succeeds(kind: Kind) {
    let (mut rig, seen, id, _) = an_http_request_answered_503(kind, "c-http").await;
    rig.world.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
    rig.world.platform.transport.dispatch(&[Dispatch { id, run_at: Utc::now(), tenant: None }]).await.unwrap();
    let done = rig.consume_until_done(&id.to_string(), Duration::from_secs(15)).await;
    assert_eq!((done["status"].as_str(), done["attempt"].as_i64()), (Some("succeeded"), Some(2)), "{kind:?}: {done}");
    assert_eq!(done["result"]["status"], 200);
    let keys: Vec<String> = seen.lock().unwrap().iter().map(|r| r.headers["idempotency-key"].clone()).collect();
    assert_eq!(keys, ["c-http", "c-http"], "{kind:?}");
    rig.stop().await;
}

/// A retry's back-off on this transport: the job is carried again when it comes due, with no
/// nudge. The Postgres consumer here polls once an hour, so only the transport's own wake-up at
/// the job's `run_at` starts it in time; SQS delays the message.
async fn a_retry_is_carried_when_it_comes_due(kind: Kind) {
    let (mut rig, _seen, id, first) = an_http_request_answered_503(kind, "c-due").await;
    let due: chrono::DateTime<Utc> = first["run_at"].as_str().unwrap().parse().unwrap();
    let done = rig.consume_until_done(&id.to_string(), Duration::from_secs(30)).await;
    assert_eq!((done["status"].as_str(), done["attempt"].as_i64()), (Some("succeeded"), Some(2)), "{kind:?}: {done}");
    let started: chrono::DateTime<Utc> = done["started_at"].as_str().unwrap().parse().unwrap();
    let late = (started - due).num_milliseconds();
    // Far below the Postgres consumer's hourly poll, with room for a loaded machine; SQS delays
    // in whole seconds, and moto delivers on the next receive.
    let bound = if matches!(kind, Kind::Postgres) { 2_000 } else { 5_000 };
    assert!((0..bound).contains(&late), "{kind:?}: the retry started {late} ms after it was due ({due} → {started})");
    rig.stop().await;
}

/// `test.await` on this transport: a completion applies once; a missing one is found by the
/// sweep at its deadline and the retried attempt is carried by the transport.
async fn a_completion_applies_once_and_a_missing_one_is_swept_and_retried(kind: Kind) {
    let mut rig = Rig::new(kind).await;
    let (_, a) =
        rig.world.submit("c-complete", json!({"task_type": "test.await", "params": {"within_seconds": 60}})).await;
    let (_, b) = rig
        .world
        .submit(
            "c-overdue",
            json!({"task_type": "test.await",
        "params": {"within_seconds": 1, "on_overdue": "retry", "wait_attempts": 1}}),
        )
        .await;
    let (a, b) = (a["id"].as_str().unwrap().to_owned(), b["id"].as_str().unwrap().to_owned());
    let waiting = |j: &serde_json::Value| j["status"] == "waiting";
    assert_eq!(rig.consume_until(&a, Duration::from_secs(15), waiting).await["status"], "waiting", "{kind:?}");
    assert_eq!(rig.consume_until(&b, Duration::from_secs(15), waiting).await["status"], "waiting", "{kind:?}");
    let token = crate::completions::token(&rig.world, a.parse().unwrap(), 1).await;
    let body = json!({"token": token, "outcome": "success", "result": {"n": 1}});
    let path = format!("/v1/jobs/{a}/complete");
    let (s, first) = rig.world.call(axum::http::Method::POST, &path, None, Some(body.clone())).await;
    assert_eq!((s.as_u16(), first["applied"].as_bool()), (200, Some(true)), "{kind:?}: {first}");
    let (s, again) = rig.world.call(axum::http::Method::POST, &path, None, Some(body)).await;
    assert_eq!((s.as_u16(), again["applied"].as_bool()), (200, Some(false)), "{kind:?}: {again}");
    let ended = "SELECT count(*) FROM job_events WHERE job_id = $1::text::uuid AND kind IN ('succeeded', 'failed')";
    assert_eq!(rig.world.count(ended, &[&a]).await, 1, "{kind:?}: applied once");
    // The deadline passes: a sweep pass retries the attempt, and the transport carries it.
    let mut handled = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while handled == 0 && tokio::time::Instant::now() < until {
        handled = rig.world.platform.sweeper().pass().await.unwrap().completions_overdue;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(handled, 1, "{kind:?}");
    let done = rig.consume_until_done(&b, Duration::from_secs(20)).await;
    assert_eq!((done["status"].as_str(), done["attempt"].as_i64()), (Some("succeeded"), Some(2)), "{kind:?}: {done}");
    rig.stop().await;
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test] async fn $name() { super::$name(super::Kind::Postgres).await })*
        }
        mod sqs {
            $(#[tokio::test] async fn $name() { super::$name(super::Kind::Sqs).await })*
        }
    };
}

conformance!(
    dispatch_after_commit_delivers_the_job,
    a_failed_dispatch_leaves_the_row_for_the_sweep,
    a_duplicate_delivery_runs_the_effect_once,
    an_http_request_is_retried_with_its_key_and_succeeds,
    a_retry_is_carried_when_it_comes_due,
    a_completion_applies_once_and_a_missing_one_is_swept_and_retried,
);
