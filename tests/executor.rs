//! The executor on real Postgres: worker loops, retries, the terminal path, fencing, modes,
//! timeouts, heartbeats, and effects under duplicate delivery.

use std::time::Duration;

use axum::http::Method;
use serde_json::json;
use taskdeck::executor::{Fate, Recorded};
use taskdeck::job::{Fence, JobId};
use taskdeck::store::{effects, jobs, modes};
use tokio::sync::watch;

use crate::support::{World, test_settings};

fn id_of(job: &serde_json::Value) -> JobId {
    job["id"].as_str().expect("job id").parse().expect("uuid")
}

#[tokio::test]
async fn workers_run_every_submitted_job_once() {
    let w = World::new().await;
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(2, &stop);
    let mut ids = Vec::new();
    for i in 0..200 {
        let (_, job) = w.submit(&format!("w{i}"), json!({"task_type": "test.effect"})).await;
        ids.push(id_of(&job));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while w.count("SELECT count(*) FROM jobs WHERE status = 'succeeded'", &[]).await < 200 {
        assert!(tokio::time::Instant::now() < deadline, "jobs did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(w.count("SELECT count(*) FROM effects_ledger", &[]).await, 200);
    assert_eq!(w.count("SELECT count(DISTINCT job_id) FROM effects_ledger", &[]).await, 200);
    // A success writes no event row; each job's history shows it once, derived from the row.
    assert_eq!(w.count("SELECT count(*) FROM job_events WHERE kind = 'succeeded'", &[]).await, 0);
    for id in ids.iter().step_by(20) {
        let (_, events) = w.call(Method::GET, &format!("/v1/jobs/{id}/events"), None, None).await;
        let kinds: Vec<&str> =
            events["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["submitted", "claimed", "succeeded"], "job {id}");
    }
}

#[tokio::test]
async fn the_same_job_delivered_twice_runs_its_effect_once() {
    let w = World::new().await;
    let (_, job) = w.submit("twice", json!({"task_type": "test.effect", "params": {"sleep_seconds": 0.2}})).await;
    let id = id_of(&job);
    let exec = w.platform.executor();
    let ids = [id];
    let (a, b) = tokio::join!(exec.run_dispatched(&ids), exec.run_dispatched(&ids));
    let claimed = a.unwrap().1 + b.unwrap().1;
    assert_eq!(claimed, 1, "exactly one delivery claimed the job");
    let (_, late) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(late, 0, "a delivery after completion claims nothing");
    assert_eq!(effects::count(&w.db().await, id).await.unwrap(), 1);
}

#[tokio::test]
async fn exhausted_retries_end_failed_with_one_exception() {
    let mut settings = test_settings();
    settings.executor.poll_interval = Duration::from_millis(20);
    let w = World::with_settings(settings).await;
    let mut exec = w.platform.executor();
    exec.retry.base = Duration::ZERO;
    let (_, job) = w
        .submit(
            "doomed",
            json!({"task_type": "test.fail", "params": {"times": 10, "kind": "retryable"}, "max_attempts": 3}),
        )
        .await;
    let id = id_of(&job);
    for attempt in 1..=3 {
        let (report, n) = exec.run_dispatched(&[id]).await.unwrap();
        assert_eq!(n, 1, "attempt {attempt} claimed");
        assert_eq!(report.retried + report.failed, 1);
    }
    let job = w.wait_for(&id.to_string(), Duration::from_secs(1), |j| j["status"] == "failed").await;
    assert_eq!(job["status"], "failed");
    assert_eq!(job["attempt"], 3);
    assert!(job["last_error"].as_str().unwrap().contains("attempt 3 of 3"), "{job}");
    assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = $1 AND status = 'open'", &[&id]).await, 1);
    assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE kind = 'attempts_exhausted'", &[]).await, 1);
    let (_, ev) = w.call(Method::GET, &format!("/v1/jobs/{id}/events"), None, None).await;
    // Each attempt's claim is in the history, before what ended it, at that attempt's start.
    let events = ev["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["submitted", "claimed", "retry_scheduled", "claimed", "retry_scheduled", "claimed", "failed"]);
    let attempts: Vec<i64> = events.iter().map(|e| e["attempt"].as_i64().unwrap()).collect();
    assert_eq!(attempts, [0, 1, 1, 2, 2, 3, 3]);
    assert!(events[1..].iter().all(|e| e["started_at"].is_string()));
    for pair in events[1..].chunks(2) {
        assert_eq!(
            (pair[0]["at"].as_str(), pair[0]["to_status"].as_str()),
            (pair[1]["started_at"].as_str(), Some("running")),
            "{pair:?}"
        );
    }
    let at = |e: &serde_json::Value| e["at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    assert!(events.windows(2).all(|p| at(&p[0]) <= at(&p[1])), "in time order: {ev}");
}

#[tokio::test]
async fn every_kind_of_terminal_failure_opens_an_exception() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let mut ids = Vec::new();
    for kind in ["fatal", "ambiguous"] {
        let (_, job) = w.submit(kind, json!({"task_type": "test.fail", "params": {"times": 1, "kind": kind}})).await;
        ids.push(id_of(&job));
    }
    // A type that left the catalogue after intake (an executor running an older catalogue).
    let (_, job) = w.submit("gone", json!({"task_type": "test.effect"})).await;
    let gone = id_of(&job);
    let mut narrow = exec.clone();
    narrow.catalogue = taskdeck::catalogue::Catalogue::standard();
    narrow.run_dispatched(&[gone]).await.unwrap();
    exec.run_dispatched(&ids).await.unwrap();
    ids.push(gone);
    for id in ids {
        assert_eq!(w.count("SELECT count(*) FROM jobs WHERE id = $1 AND status = 'failed'", &[&id]).await, 1);
        assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = $1", &[&id]).await, 1);
    }
    let kinds: Vec<String> = w
        .db()
        .await
        .query("SELECT kind FROM exceptions ORDER BY kind", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kinds, ["ambiguous_outcome", "fatal_error", "unknown_task_type"]);
}

#[tokio::test]
async fn a_panicking_task_is_retried_not_fatal_to_the_worker() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let (_, job) = w.submit("p", json!({"task_type": "test.fail", "params": {"times": 1, "kind": "panic"}})).await;
    let (report, _) = exec.run_dispatched(&[id_of(&job)]).await.unwrap();
    assert_eq!(report.retried, 1);
    let job = w.wait_for(job["id"].as_str().unwrap(), Duration::from_secs(1), |_| true).await;
    assert!(job["last_error"].as_str().unwrap().contains("panicked"), "{job}");
}

#[tokio::test]
async fn a_job_over_its_timeout_is_stopped_and_retried() {
    let w = World::new().await;
    let exec = w.platform.executor();
    let (_, job) =
        w.submit("slow", json!({"task_type": "sleep", "params": {"seconds": 30}, "timeout_seconds": 1})).await;
    let started = std::time::Instant::now();
    let (report, _) = exec.run_dispatched(&[id_of(&job)]).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(report.retried, 1);
    let job = w.wait_for(job["id"].as_str().unwrap(), Duration::from_secs(1), |_| true).await;
    assert_eq!(job["last_error"], "timed out after 1s");
    assert_eq!(job["status"], "pending");
}

#[tokio::test]
async fn a_paused_task_type_waits_and_runs_after_unpause() {
    let w = World::new().await;
    let mut db = w.db().await;
    modes::set(&mut db, "pause:noop", true, "test", Some("maintenance")).await.unwrap();
    let (_, job) = w.submit("paused", json!({"task_type": "noop"})).await;
    let (_, other) = w.submit("free", json!({"task_type": "sleep", "params": {"seconds": 0}})).await;
    let exec = w.platform.executor();
    let (_, n) = exec.run_dispatched(&[id_of(&job), id_of(&other)]).await.unwrap();
    assert_eq!(n, 1, "only the unpaused type ran");
    modes::set(&mut db, "pause:noop", false, "test", None).await.unwrap();
    let (_, n) = exec.run_dispatched(&[id_of(&job)]).await.unwrap();
    assert_eq!(n, 1, "the change took effect on the next claim, no restart");
    assert_eq!(w.count("SELECT count(*) FROM operating_mode_audit WHERE name = 'pause:noop'", &[]).await, 2);
}

#[tokio::test]
async fn a_heartbeat_keeps_a_long_job_past_its_lease() {
    let mut settings = test_settings();
    settings.executor.lease = Duration::from_secs(1);
    let w = World::with_settings(settings).await;
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(1, &stop);
    let sweeper = w.platform.spawn_sweeper(&stop);
    let (_, job) = w.submit("long", json!({"task_type": "sleep", "params": {"seconds": 3}})).await;
    let done = w.wait_for(job["id"].as_str().unwrap(), Duration::from_secs(15), |j| j["status"] == "succeeded").await;
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    sweeper.await.unwrap();
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["attempt"], 1, "never recovered while it was alive");
    assert_eq!(w.count("SELECT count(*) FROM job_events WHERE kind = 'lease_expired'", &[]).await, 0);
}

#[tokio::test]
async fn a_stale_workers_late_result_changes_nothing() {
    let w = World::new().await;
    let (_, job) = w.submit("zombie", json!({"task_type": "noop"})).await;
    let id = id_of(&job);
    let db = w.db().await;
    let first = jobs::claim_ids(&db, &[id], 0.2, None).await.unwrap().jobs;
    assert_eq!(first[0].attempt, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.platform.sweeper().pass().await.unwrap();
    let second = jobs::claim_ids(&db, &[id], 30.0, None).await.unwrap().jobs;
    assert_eq!(second[0].attempt, 2);
    let refused = jobs::succeed(&db, &[(first[0].fence(), json!({"from": "zombie"}))]).await.unwrap();
    assert_eq!(refused, vec![Fence { job: id, attempt: 1 }], "the zombie's write is refused");
    let refused = jobs::succeed(&db, &[(second[0].fence(), json!({"from": "owner"}))]).await.unwrap();
    assert!(refused.is_empty());
    let job = jobs::get(&db, w.tenant.id, id).await.unwrap().unwrap();
    assert_eq!(job.result, Some(json!({"from": "owner"})));
}

#[tokio::test]
async fn stopping_a_worker_with_a_job_still_running_ends_within_the_grace_period() {
    let w = World::new().await; // lease 2 s: the shutdown grace
    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(1, &stop);
    let (_, job) = w.submit("long-stop", json!({"task_type": "sleep", "params": {"seconds": 600}})).await;
    let running = w.wait_for(job["id"].as_str().unwrap(), Duration::from_secs(10), |j| j["status"] == "running").await;
    assert_eq!(running["status"], "running");
    let stopped_at = std::time::Instant::now();
    stop_tx.send(true).unwrap();
    let joined = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(workers)).await;
    assert!(joined.is_ok(), "the worker did not stop");
    assert!(stopped_at.elapsed() < Duration::from_secs(6), "stopped after {:?}", stopped_at.elapsed());
    // Nothing was recorded for it: the lease expires and the sweep returns it.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(w.platform.sweeper().pass().await.unwrap().leases_returned, 1);
}

/// The completer writes a flush in one transaction: when one of its statements fails, none of
/// its outcomes is committed (each statement committing apart left the others written), and
/// each job's fate says so. A delivery's ids that were not claimed come back as not claimed or
/// missing, from the claim itself.
#[tokio::test]
async fn a_flush_commits_all_of_its_outcomes_or_none_and_each_id_has_its_fate() {
    let w = World::new().await;
    let db = w.db().await;
    // Both end at the same tick, one second in: the one by its end, the other by its timeout
    // (a retry), so they share one flush.
    let (_, ok) =
        w.submit("flush-ok", json!({"task_type": "sleep", "params": {"seconds": 1}, "timeout_seconds": 5})).await;
    let (_, late) =
        w.submit("flush-late", json!({"task_type": "sleep", "params": {"seconds": 5}, "timeout_seconds": 1})).await;
    let (_, done) = w.submit("flush-done", json!({"task_type": "noop"})).await;
    let (ok, late, done, nobody) = (id_of(&ok), id_of(&late), id_of(&done), JobId::new());
    let exec = w.platform.executor();
    assert_eq!(exec.run_dispatched(&[done]).await.unwrap().0.succeeded, 1);
    db.batch_execute(
        "CREATE FUNCTION refuse_retries() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
         CREATE TRIGGER refuse_retries BEFORE INSERT ON job_events FOR EACH ROW
             WHEN (NEW.kind = 'retry_scheduled') EXECUTE FUNCTION refuse_retries();",
    )
    .await
    .unwrap();
    let d = exec.run_dispatched_until(&[ok, late, done, nobody], None).await.unwrap();
    assert_eq!(d.flushes, 1, "{d:?}");
    assert_eq!(d.fate(ok), Some(Fate::Unrecorded), "{d:?}");
    assert_eq!(d.fate(late), Some(Fate::Unrecorded), "{d:?}");
    assert_eq!((d.fate(done), d.fate(nobody)), (Some(Fate::NotClaimed), Some(Fate::Missing)));
    let running = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'running'";
    assert_eq!(w.count(running, &[&vec![ok, late]]).await, 2, "the success was rolled back with the retry");

    db.batch_execute("DROP TRIGGER refuse_retries ON job_events").await.unwrap();
    db.execute(
        "UPDATE jobs SET status = 'pending', lease_until = NULL, run_at = now() WHERE id = ANY($1)",
        &[&vec![ok, late]],
    )
    .await
    .unwrap();
    let d = exec.run_dispatched_until(&[ok, late], None).await.unwrap();
    assert_eq!(d.flushes, 1, "{d:?}");
    assert_eq!(d.fates, vec![(ok, Fate::Recorded(Recorded::Succeeded)), (late, Fate::Recorded(Recorded::Retried))]);
}
