//! The sweep on real Postgres: dead workers, lost dispatches, several sweepers at once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use taskdeck::job::JobId;
use taskdeck::store::jobs;
use tokio::sync::watch;

use crate::support::World;
use crate::support::transports::{Down, Partial, Recorded};

fn id_of(job: &serde_json::Value) -> JobId {
    job["id"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_job_whose_worker_died_completes_after_its_lease_and_the_sweep() {
    let w = World::new().await;
    let (_, job) = w.submit("orphan", json!({"task_type": "test.effect"})).await;
    let id = id_of(&job);
    // A worker claims it with a short lease, then dies without a word.
    let claimed = jobs::claim_due(&w.db().await, 10, 0.3).await.unwrap().jobs;
    assert_eq!(claimed.len(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;

    let (stop_tx, stop) = watch::channel(false);
    let workers = w.platform.spawn_workers(1, &stop);
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.leases_returned, 1);
    let done = w.wait_for(&id.to_string(), Duration::from_secs(10), |j| j["status"] == "succeeded").await;
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["attempt"], 2);
    let history = jobs::events(&w.db().await, w.tenant.id, id).await.unwrap();
    let kinds: Vec<&str> = history.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["submitted", "claimed", "lease_expired", "claimed", "succeeded"], "the recovery is recorded");
    let claims: Vec<_> = history.iter().filter(|e| e.kind.as_str() == "claimed").map(|e| (e.attempt, e.at)).collect();
    assert!(claims[0].0 == 1 && claims[1].0 == 2 && claims[0].1 < claims[1].1, "each attempt's claim: {claims:?}");
    let recorded: i64 = w.count("SELECT count(*) FROM job_events WHERE job_id = $1", &[&id]).await;
    assert_eq!(recorded, 1, "only the recovery is a row; the claims and the success are read from the job");
}

#[tokio::test]
async fn an_expired_lease_on_the_last_attempt_fails_with_an_exception() {
    let w = World::new().await;
    let (_, job) = w.submit("last", json!({"task_type": "noop", "max_attempts": 1})).await;
    jobs::claim_due(&w.db().await, 10, 0.1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = w.platform.sweeper().pass().await.unwrap();
    assert_eq!((report.leases_returned, report.leases_failed), (0, 1));
    let id = id_of(&job);
    assert_eq!(
        w.count("SELECT count(*) FROM exceptions WHERE job_id = $1 AND kind = 'lease_expired'", &[&id]).await,
        1
    );
}

/// A world, the same world with a transport that refuses every dispatch, and a job submitted
/// through it (its failed dispatch has cleared its mark).
async fn submitted_while_down(task_type: &str) -> (World, World, JobId) {
    let w = World::new().await;
    let down = w.with_transport(Arc::new(Down));
    let (_, job) = down.submit("while-down", json!({"task_type": task_type})).await;
    let id = id_of(&job);
    let unmarked = "SELECT count(*) FROM jobs WHERE id = $1 AND dispatched_at IS NULL";
    assert_eq!(w.eventually(unmarked, &[&id], 1).await, 1, "the failed dispatch cleared its mark");
    (w, down, id)
}

#[tokio::test]
async fn a_job_whose_dispatch_failed_runs_after_the_sweep() {
    let (w, _, id) = submitted_while_down("test.effect").await;
    // Nothing consumes the table directly here: like SQS, work arrives only by dispatch.
    let queue = Arc::new(Recorded::default());
    let healthy = w.with_transport(queue.clone());
    let report = healthy.platform.sweeper().pass().await.unwrap();
    assert_eq!(report.redispatched, 1);
    let sent = queue.take();
    assert_eq!(sent.iter().map(|d| d.id).collect::<Vec<_>>(), vec![id]);
    let (_, ran) = healthy.platform.executor().run_dispatched(&[id]).await.unwrap();
    assert_eq!(ran, 1);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE id = $1 AND status = 'succeeded'", &[&id]).await, 1);
    assert_eq!(w.count("SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'redispatched'", &[&id]).await, 1);
    // A second pass finds nothing: the row moved on.
    assert_eq!(healthy.platform.sweeper().pass().await.unwrap().redispatched, 0);
}

#[tokio::test]
async fn while_the_queue_stays_down_the_sweep_backs_off_and_resumes_when_it_returns() {
    let (w, down, id) = submitted_while_down("noop").await;
    let sweeper = down.platform.sweeper();
    let resent: Vec<usize> = {
        let mut v = Vec::new();
        for _ in 0..9 {
            v.push(sweeper.pass().await.unwrap().redispatched);
        }
        v
    };
    // Three passes try, then one is skipped, one tries, three are skipped, one tries.
    assert_eq!(resent, vec![1, 1, 1, 0, 1, 0, 0, 0, 1]);
    // The queue returns: the next pass that may re-send does, and the backoff resets.
    let queue = Arc::new(Recorded::default());
    let mut healthy = sweeper.clone();
    healthy.transport = queue.clone();
    let mut passes = 0;
    while queue.take().is_empty() {
        passes += 1;
        assert!(passes <= 8, "still backing off after the queue returned");
        healthy.pass().await.unwrap();
    }
    assert_eq!(w.count("SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'redispatched'", &[&id]).await, 6);
}

#[tokio::test]
async fn a_fresh_dispatched_row_is_not_redispatched_early() {
    let w = World::new().await;
    let queue = Arc::new(Recorded::default());
    let w = w.with_transport(queue.clone());
    w.submit("fresh", json!({"task_type": "noop"})).await;
    assert_eq!(queue.take().len(), 1, "dispatched once at intake");
    assert_eq!(w.platform.sweeper().pass().await.unwrap().redispatched, 0);
    // Once the grace period (1 s in tests) has passed with nobody claiming it, it counts as lost.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(w.platform.sweeper().pass().await.unwrap().redispatched, 1);
}

#[tokio::test]
async fn each_resend_of_an_unclaimed_row_waits_twice_as_long_and_a_claim_resets_it() {
    // A queue that is only behind (not losing messages) must not get a copy of every row it
    // holds each grace period (1 s in tests).
    let w = World::new().await;
    let queue = Arc::new(Recorded::default());
    let w = w.with_transport(queue.clone());
    let (_, job) = w.submit("behind", json!({"task_type": "noop"})).await;
    let id = id_of(&job);
    let db = w.db().await;
    db.execute("UPDATE jobs SET run_at = now() - interval '1 hour' WHERE id = $1", &[&id]).await.unwrap();
    let sweeper = w.platform.sweeper();
    // Dispatched this long ago, is it sent again? Each re-send doubles the next wait.
    let mut resent = Vec::new();
    for secs in [1.5, 1.5, 2.5, 3.5, 4.5, 8.5] {
        db.execute("UPDATE jobs SET dispatched_at = now() - make_interval(secs => $2) WHERE id = $1", &[&id, &secs])
            .await
            .unwrap();
        resent.push(sweeper.pass().await.unwrap().redispatched);
    }
    assert_eq!(resent, vec![1, 0, 1, 0, 1, 1]);
    assert_eq!(queue.take().len(), 1 + 4);
    // The wait stops growing at 32 × the grace period.
    db.execute("UPDATE jobs SET resends = 50, dispatched_at = now() - interval '33 seconds' WHERE id = $1", &[&id])
        .await
        .unwrap();
    assert_eq!(sweeper.pass().await.unwrap().redispatched, 1);
    // A claim means the dispatch got through: the count starts again.
    assert_eq!(jobs::claim_due(&db, 10, 30.0).await.unwrap().jobs.len(), 1);
    assert_eq!(w.count("SELECT resends::bigint FROM jobs WHERE id = $1", &[&id]).await, 0);
}

#[tokio::test]
async fn a_partly_failed_dispatch_leaves_only_the_unsent_jobs_to_the_sweep() {
    let w = World::new().await;
    let partial = w.with_transport(Arc::new(Partial));
    let items: Vec<_> = (0..4).map(|i| json!({"idempotency_key": format!("p{i}"), "task_type": "noop"})).collect();
    let (status, res) =
        partial.call(axum::http::Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": items}))).await;
    assert_eq!(status, 200);
    let ids: Vec<JobId> = res["results"].as_array().unwrap().iter().map(|r| id_of(&r["job"])).collect();
    let unmarked = "SELECT count(*) FROM jobs WHERE id = ANY($1) AND dispatched_at IS NULL";
    assert_eq!(w.eventually(unmarked, &[&ids], 2).await, 2);
    let refused = vec![ids[1], ids[3]];
    assert_eq!(w.count(unmarked, &[&refused]).await, 2, "the refused entries, and only those, wait for the sweep");
    let queue = Arc::new(Recorded::default());
    let report = w.with_transport(queue.clone()).platform.sweeper().pass().await.unwrap();
    assert_eq!(report.redispatched, 2);
    let mut sent: Vec<JobId> = queue.take().iter().map(|d| d.id).collect();
    sent.sort();
    let mut expected = refused.clone();
    expected.sort();
    assert_eq!(sent, expected);
}

#[tokio::test]
async fn several_sweepers_recover_each_row_exactly_once() {
    let w = World::new().await;
    let body: Vec<_> = (0..300).map(|i| json!({"idempotency_key": format!("s{i}"), "task_type": "noop"})).collect();
    w.call(axum::http::Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": body}))).await;
    let claimed = jobs::claim_due(&w.db().await, 1000, 0.1).await.unwrap().jobs;
    assert_eq!(claimed.len(), 300);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut sweeper = w.platform.sweeper();
    sweeper.config.batch = 25;
    let passes = (0..4).map(|_| {
        let s = sweeper.clone();
        tokio::spawn(async move { s.pass().await.unwrap() })
    });
    let reports: Vec<_> = futures::future::join_all(passes).await.into_iter().map(Result::unwrap).collect();
    let returned: usize = reports.iter().map(|r| r.leases_returned).sum();
    assert_eq!(returned, 300, "{reports:?}");
    assert_eq!(w.count("SELECT count(*) FROM job_events WHERE kind = 'lease_expired'", &[]).await, 300);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'pending'", &[]).await, 300);
}

/// A maintenance service that fails does not skip the others: with the dependencies' table
/// gone, the lease before it is still returned and the instances after it still forgotten, and
/// the pass says which service failed.
#[tokio::test]
async fn a_failing_maintenance_service_skips_none_of_the_others() {
    let w = World::new().await;
    w.submit("lapsed", json!({"task_type": "noop"})).await;
    let db = w.db().await;
    assert_eq!(jobs::claim_due(&db, 10, 0.1).await.unwrap().jobs.len(), 1);
    db.batch_execute(
        "INSERT INTO workers (kind, instance_id, host, pid, started_at, last_seen_at)
             VALUES ('sweeper', 'gone', 'h', 1, now() - interval '9 days', now() - interval '8 days');
         ALTER TABLE job_dependencies RENAME TO job_dependencies_away",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failed = w.platform.sweeper().pass().await.unwrap_err();
    assert_eq!(failed.failed.iter().map(|f| f.0).collect::<Vec<_>>(), ["dependents"], "{failed}");
    assert_eq!(failed.report.leases_returned, 1, "the service before it ran");
    assert_eq!(w.count("SELECT count(*) FROM workers WHERE instance_id = 'gone'", &[]).await, 0, "and the last one");
    db.batch_execute("ALTER TABLE job_dependencies_away RENAME TO job_dependencies").await.unwrap();
    w.platform.sweeper().pass().await.expect("every service runs again");
}
