//! Every store function against real Postgres (tokio-postgres checks no SQL at compile time).

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use taskdeck::job::terms::{CorrelationId, IdempotencyKey, Limits, RequestHash};
use taskdeck::job::{Fence, JobId};
use taskdeck::store::jobs::{self, Failure, Inserted, JobFilter, NewJob, Retry};
use taskdeck::store::{StoreError, exceptions, migrate, modes, tenants};
use uuid::Uuid;

use crate::support::World;

fn new_job(key: &str) -> NewJob {
    NewJob {
        correlation_id: CorrelationId::parse(&format!("corr-{key}")).unwrap(),
        request_hash: RequestHash::of(key.as_bytes()),
        limits: Limits::fixed(3, 60),
        ..NewJob::new("noop", json!({}), IdempotencyKey::parse(key).unwrap())
    }
}

#[tokio::test]
async fn migrations_are_recorded_and_rerunning_or_racing_them_is_harmless() {
    let w = World::new().await;
    assert!(w.platform.migrate().await.unwrap().is_empty(), "already applied");
    let (a, b) = tokio::join!(w.platform.migrate(), w.platform.migrate());
    assert!(a.unwrap().is_empty() && b.unwrap().is_empty());
    let versions = w.count("SELECT count(*) FROM relay_migrations", &[]).await;
    assert_eq!(versions, migrate::MIGRATIONS.len() as i64);
}

#[tokio::test]
async fn tenants_are_found_by_key_hash_and_keys_rotate() {
    let w = World::new().await;
    let db = w.db().await;
    let (t, key) = tenants::create(&db, "initech").await.unwrap();
    assert!(key.starts_with("rk_") && key.len() > 40);
    assert_eq!(tenants::by_api_key(&db, &key).await.unwrap().map(|t| t.id), Some(t.id));
    assert!(tenants::by_api_key(&db, "rk_nope").await.unwrap().is_none());
    assert_eq!(tenants::by_name(&db, "initech").await.unwrap().map(|t| t.id), Some(t.id));
    let stored: Vec<u8> =
        db.query_one("SELECT api_key_hash FROM tenants WHERE id = $1", &[&t.id]).await.unwrap().get(0);
    assert_ne!(stored, key.as_bytes(), "only the hash is stored");
    let new_key = tenants::rotate_key(&db, t.id).await.unwrap();
    assert!(tenants::by_api_key(&db, &key).await.unwrap().is_none());
    assert!(tenants::by_api_key(&db, &new_key).await.unwrap().is_some());
    assert!(tenants::create(&db, "initech").await.is_err(), "names are unique");
}

#[tokio::test]
async fn insert_many_creates_new_keys_and_returns_existing_ones_in_order() {
    let w = World::new().await;
    let db = w.db().await;
    let first = jobs::insert_many(&db, w.tenant.id, &[new_job("a")], None).await.unwrap();
    assert!(matches!(&first[0], Inserted::Created(j) if j.status == taskdeck::job::JobStatus::Pending));
    let batch = [new_job("b"), new_job("a"), new_job("b")];
    let out = jobs::insert_many(&db, w.tenant.id, &batch, None).await.unwrap();
    let shape: Vec<(&str, String)> = out
        .iter()
        .map(|i| match i {
            Inserted::Created(j) => ("created", j.idempotency_key.clone()),
            Inserted::Existing(j) => ("existing", j.idempotency_key.clone()),
        })
        .collect();
    assert_eq!(shape, [("created", "b".into()), ("existing", "a".into()), ("existing", "b".into())]);
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 2);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE dispatched_at IS NOT NULL", &[]).await, 2);
    let ids: Vec<JobId> = out
        .iter()
        .take(1)
        .map(|i| match i {
            Inserted::Created(j) | Inserted::Existing(j) => j.id,
        })
        .collect();
    jobs::undispatch(&db, &ids).await.unwrap();
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE dispatched_at IS NULL", &[]).await, 1);
}

#[tokio::test]
async fn an_insert_given_a_wake_channel_notifies_it_when_it_commits_and_only_if_it_created_a_job() {
    let w = World::new().await;
    // A channel of this test's own: channels are database-wide, and tests run side by side.
    let channel = format!("wake_{}", Uuid::now_v7().simple());
    let (_listener, mut heard) = crate::support::listen(&channel).await;
    let quiet = Duration::from_millis(300);

    let mut db = w.db().await;
    let tx = db.transaction().await.unwrap();
    jobs::insert_many(&tx, w.tenant.id, &[new_job("w1"), new_job("w2")], Some(&channel)).await.unwrap();
    assert!(tokio::time::timeout(quiet, heard.recv()).await.is_err(), "nothing before the commit");
    tx.commit().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await.expect("woken by the commit");
    assert_eq!(got.as_deref(), Some(channel.as_str()));
    assert!(tokio::time::timeout(quiet, heard.recv()).await.is_err(), "one wake-up for the statement");

    let replay = jobs::insert_many(&db, w.tenant.id, &[new_job("w1")], Some(&channel)).await.unwrap();
    assert!(matches!(replay[0], Inserted::Existing(_)));
    assert!(tokio::time::timeout(quiet, heard.recv()).await.is_err(), "a replay creates nothing and wakes nobody");
    jobs::insert_many(&db, w.tenant.id, &[new_job("w3")], None).await.unwrap();
    assert!(tokio::time::timeout(quiet, heard.recv()).await.is_err(), "no channel, no wake-up");
}

#[tokio::test]
async fn get_and_list_are_scoped_to_the_tenant() {
    let w = World::new().await;
    let db = w.db().await;
    let (other, _) = w.other_tenant("umbrella").await;
    let mine = new_job("x");
    jobs::insert_many(&db, w.tenant.id, std::slice::from_ref(&mine), None).await.unwrap();
    jobs::insert_many(&db, other.id, &[new_job("x")], None).await.unwrap();
    assert!(jobs::get(&db, w.tenant.id, mine.id).await.unwrap().is_some());
    assert!(jobs::get(&db, other.id, mine.id).await.unwrap().is_none());
    let f = JobFilter { limit: 10, ..Default::default() };
    assert_eq!(jobs::list(&db, w.tenant.id, &f).await.unwrap().len(), 1);
    let f = JobFilter { limit: 10, correlation_id: Some("corr-x".into()), ..Default::default() };
    assert_eq!(jobs::list(&db, other.id, &f).await.unwrap().len(), 1);
    assert!(jobs::events(&db, other.id, mine.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn claims_take_due_rows_once_in_run_at_order_and_bounded() {
    let w = World::new().await;
    let db = w.db().await;
    let mut later = new_job("later");
    later.run_at = Utc::now() + chrono::Duration::hours(1);
    let mut early = new_job("early");
    early.run_at = Utc::now() - chrono::Duration::seconds(10);
    jobs::insert_many(&db, w.tenant.id, &[new_job("now"), later, early.clone(), new_job("now2")], None).await.unwrap();
    let got = jobs::claim_due(&db, 2, 30.0).await.unwrap().jobs;
    assert_eq!(got.len(), 2);
    assert!(got.iter().any(|j| j.id == early.id), "oldest due first");
    assert!(got.iter().all(|j| j.attempt == 1));
    let rest = jobs::claim_due(&db, 10, 30.0).await.unwrap().jobs;
    assert_eq!(rest.len(), 1, "the future job is not due");
    assert!(jobs::claim_due(&db, 10, 30.0).await.unwrap().jobs.is_empty());
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'running' AND lease_until > now()", &[]).await, 3);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE started_at IS NOT NULL", &[]).await, 3);
}

#[tokio::test]
async fn claims_are_fair_across_tenants_however_deep_one_tenants_backlog() {
    let w = World::new().await;
    let db = w.db().await;
    let (quiet, _) = tenants::create(&db, "quiet").await.unwrap();
    let (third, _) = tenants::create(&db, "third").await.unwrap();
    // A flood of 5,000 old jobs, then one job each from two quiet tenants.
    let flood: Vec<NewJob> = (0..5000)
        .map(|i| NewJob { run_at: Utc::now() - chrono::Duration::seconds(60), ..new_job(&format!("flood-{i}")) })
        .collect();
    for chunk in flood.chunks(1000) {
        jobs::insert_many(&db, w.tenant.id, chunk, None).await.unwrap();
    }
    let q = new_job("quiet");
    jobs::insert_many(&db, quiet.id, std::slice::from_ref(&q), None).await.unwrap();
    let t = new_job("third");
    jobs::insert_many(&db, third.id, std::slice::from_ref(&t), None).await.unwrap();

    let claim = jobs::claim_due(&db, 30, 30.0).await.unwrap();
    let ids: Vec<JobId> = claim.jobs.iter().map(|j| j.id).collect();
    assert!(ids.contains(&q.id) && ids.contains(&t.id), "both quiet tenants are in the first claim");
    assert_eq!(
        claim.jobs.iter().filter(|j| j.tenant_id == w.tenant.id).count(),
        10,
        "the flood gets its share: 30 / 3"
    );
    assert!(claim.more, "the flood has more due");
    // Alone again, the flood gets whole claims, oldest first.
    let next = jobs::claim_due(&db, 30, 30.0).await.unwrap();
    assert_eq!(next.jobs.len(), 30);
    assert!(next.more);
    let drained = jobs::claim_due(&db, 10_000, 30.0).await.unwrap();
    assert_eq!(drained.jobs.len(), 5000 - 40);
    assert!(!drained.more, "nothing more is due");
}

#[tokio::test]
async fn heartbeat_extends_live_leases_and_reports_lost_ones() {
    let w = World::new().await;
    let db = w.db().await;
    jobs::insert_many(&db, w.tenant.id, &[new_job("h1"), new_job("h2")], None).await.unwrap();
    let claimed = jobs::claim_due(&db, 10, 5.0).await.unwrap().jobs;
    let fence: Vec<_> = claimed.iter().map(|j| j.fence()).collect();
    let stale = Fence { attempt: fence[1].attempt + 7, ..fence[1] };
    let lost = jobs::heartbeat(&db, &[fence[0], stale], 600.0).await.unwrap();
    assert_eq!(lost, vec![stale]);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE lease_until > now() + interval '500 seconds'", &[]).await, 1);
}

#[tokio::test]
async fn retry_and_fail_are_fenced_and_write_their_events() {
    let w = World::new().await;
    let db = w.db().await;
    jobs::insert_many(&db, w.tenant.id, &[new_job("r"), new_job("f")], None).await.unwrap();
    let c = jobs::claim_due(&db, 10, 30.0).await.unwrap().jobs;
    let at = Utc::now() + chrono::Duration::seconds(60);
    let retry = Retry { run_at: at, error: "throttled".into() };
    let fence = |j: usize, attempt| Fence { job: c[j].id, attempt };
    assert!(jobs::retry(&db, &[(fence(0, 1), retry.clone())]).await.unwrap().is_empty());
    assert_eq!(jobs::retry(&db, &[(fence(0, 1), retry)]).await.unwrap().len(), 1, "no longer running");
    let failure = || Failure::platform(taskdeck::job::ExceptionKind::FatalError, "rejected");
    assert_eq!(jobs::fail(&db, &[(fence(1, 2), failure())]).await.unwrap().len(), 1, "wrong attempt");
    assert!(jobs::fail(&db, &[(fence(1, 1), failure())]).await.unwrap().is_empty());
    let open = exceptions::for_job(&db, c[1].id).await.unwrap();
    assert_eq!((open.len(), open[0].kind.as_str(), open[0].status.as_str()), (1, "fatal_error", "open"));
    assert_eq!(exceptions::count_open(&db).await.unwrap(), 1);
    let r = jobs::get(&db, w.tenant.id, c[0].id).await.unwrap().unwrap();
    assert_eq!((r.status.as_str(), r.last_error.as_deref()), ("pending", Some("throttled")));
    assert!((r.run_at - at).num_milliseconds().abs() < 5);
}

#[tokio::test]
async fn an_exception_kind_this_build_does_not_know_is_an_error_not_a_panic() {
    let w = World::new().await;
    let db = w.db().await;
    jobs::insert_many(&db, w.tenant.id, &[new_job("k")], None).await.unwrap();
    let c = jobs::claim_due(&db, 10, 30.0).await.unwrap().jobs;
    assert!(
        jobs::fail(&db, &[(c[0].fence(), Failure::platform(taskdeck::job::ExceptionKind::AmbiguousOutcome, "?"))])
            .await
            .unwrap()
            .is_empty()
    );
    let e = &exceptions::for_job(&db, c[0].id).await.unwrap()[0];
    assert_eq!(e.kind, taskdeck::job::ExceptionKind::AmbiguousOutcome, "read back as written");
    // As a newer build would write it.
    db.execute("UPDATE exceptions SET kind = 'disk_on_fire' WHERE id = $1", &[&e.id]).await.unwrap();
    let err = exceptions::get(&db, e.id).await.unwrap_err();
    assert!(matches!(&err, StoreError::UnknownExceptionKind(k) if k.0 == "disk_on_fire"), "{err}");
    assert!(exceptions::for_job(&db, c[0].id).await.is_err());
}

#[tokio::test]
async fn expired_leases_are_locked_returned_and_fenced() {
    let w = World::new().await;
    let mut db = w.db().await;
    jobs::insert_many(&db, w.tenant.id, &[new_job("e1"), new_job("e2")], None).await.unwrap();
    jobs::claim_due(&db, 10, 0.05).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tx = db.transaction().await.unwrap();
    let expired = jobs::lock_expired_leases(&tx, 10).await.unwrap();
    assert_eq!(expired.len(), 2);
    // Another sweeper sees nothing while these rows are locked.
    let other = w.db().await;
    assert!(jobs::lock_expired_leases(&other, 10).await.unwrap().is_empty());
    let fence: Vec<_> = expired.iter().map(|e| e.fence).collect();
    assert!(jobs::return_expired(&tx, &fence).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    assert_eq!(jobs::return_expired(&other, &fence).await.unwrap().len(), 2, "already returned");
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'pending' AND lease_until IS NULL", &[]).await, 2);
}

#[tokio::test]
async fn lost_dispatches_are_taken_once_and_fresh_ones_left_alone() {
    let w = World::new().await;
    let db = w.db().await;
    let (never, fresh) = (new_job("never"), new_job("fresh"));
    let mut paused = new_job("paused");
    paused.task_type = "sleep".into();
    jobs::insert_many(&db, w.tenant.id, &[never.clone(), fresh, paused.clone()], None).await.unwrap();
    jobs::undispatch(&db, &[never.id, paused.id]).await.unwrap();
    let mut admin = w.db().await;
    modes::set(&mut admin, "pause:sleep", true, "test", None).await.unwrap();
    let taken = jobs::take_lost_dispatches(&db, 60.0, 100).await.unwrap();
    assert_eq!(taken.iter().map(|d| d.id).collect::<Vec<_>>(), vec![never.id], "paused and fresh rows wait");
    assert!(jobs::take_lost_dispatches(&db, 60.0, 100).await.unwrap().is_empty(), "marked when taken");
}

#[tokio::test]
async fn cancel_takes_pending_children_with_the_parent() {
    let w = World::new().await;
    let db = w.db().await;
    let parent = new_job("parent");
    let mut child = new_job("child");
    child.parent_id = Some(parent.id);
    jobs::insert_many(&db, w.tenant.id, &[parent.clone(), child.clone()], None).await.unwrap();
    assert!(jobs::cancel(&db, w.tenant.id, parent.id, 100).await.unwrap().job);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'cancelled'", &[]).await, 2);
    assert!(!jobs::cancel(&db, w.tenant.id, parent.id, 100).await.unwrap().job, "already cancelled");
}

#[tokio::test]
async fn modes_default_safely_and_every_change_is_audited() {
    let w = World::new().await;
    let mut db = w.db().await;
    let m = modes::load(&db).await.unwrap();
    assert!(m.shadow() && !m.writes_enabled("ses"));
    modes::set(&mut db, "shadow", false, "ops@example", Some("go live")).await.unwrap();
    modes::set(&mut db, "write:ses", true, "ops@example", None).await.unwrap();
    let m = modes::load(&db).await.unwrap();
    assert!(!m.shadow() && m.writes_enabled("ses"));
    // A claim reads the same modes in its own statement.
    jobs::insert_many(&db, w.tenant.id, &[new_job("m")], None).await.unwrap();
    assert_eq!(jobs::claim_due(&db, 1, 30.0).await.unwrap().modes, m);
    let audit = db
        .query("SELECT name, old_enabled, new_enabled, changed_by FROM operating_mode_audit ORDER BY id", &[])
        .await
        .unwrap();
    let rows: Vec<(String, Option<bool>, bool, String)> =
        audit.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    assert_eq!(rows[0], ("shadow".into(), None, false, "ops@example".into()));
    assert_eq!(rows.len(), 2);
    assert!(modes::set(&mut db, "nonsense", true, "x", None).await.is_err(), "unknown switch names are refused");
}

#[tokio::test]
async fn check_constraints_hold_the_lifecycle_invariants() {
    let w = World::new().await;
    let db = w.db().await;
    let j = new_job("inv");
    jobs::insert_many(&db, w.tenant.id, std::slice::from_ref(&j), None).await.unwrap();
    for bad in [
        "UPDATE jobs SET status = 'running' WHERE id = $1", // running without a lease
        "UPDATE jobs SET status = 'succeeded' WHERE id = $1", // terminal without finished_at
        "UPDATE jobs SET result = '{}' WHERE id = $1",      // result while pending
        "UPDATE jobs SET attempt = 9 WHERE id = $1",        // beyond max_attempts
    ] {
        assert!(db.execute(bad, &[&j.id]).await.is_err(), "{bad}");
    }
}

/// Key rows whose job is missing or belongs to another tenant: what the foreign key from
/// `job_keys` to `tenants` guarded against before it was dropped as redundant (0018).
async fn keys_without_their_job(w: &World) -> i64 {
    w.count(
        "SELECT count(*) FROM job_keys k
         WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = k.job_id AND j.tenant_id = k.tenant_id
                                                 AND j.idempotency_key = k.idempotency_key)",
        &[],
    )
    .await
}

#[tokio::test]
async fn every_key_row_is_its_jobs_on_both_insert_paths_and_an_unknown_tenant_leaves_none() {
    let mut s = crate::support::test_settings();
    s.callback_allow = taskdeck::outbound::AllowList::parse("127.0.0.1/32").unwrap();
    let w = World::with_settings(s).await;
    let db = w.db().await;
    // Path 1, the intake's insert: a tenant that does not exist is refused by the job's own
    // foreign key, and the statement leaves no key row behind.
    let ghost = taskdeck::job::TenantId::new();
    let refused = jobs::insert_many(&db, ghost, &[new_job("ghost-1"), new_job("ghost-2")], None).await;
    assert!(matches!(refused, Err(StoreError::Db(_))), "{refused:?}");
    assert_eq!(w.count("SELECT count(*) FROM job_keys WHERE tenant_id = $1", &[&ghost]).await, 0);
    // Through the API, single and batch; and path 2, a callback delivery (the platform's key,
    // made in the statement that ends the job).
    w.call(axum::http::Method::PUT, "/v1/callbacks", None, Some(json!({"url": "http://127.0.0.1:9/hooks"}))).await;
    let (_, one) = w.submit("one", json!({"task_type": "noop"})).await;
    let batch: Vec<_> = (0..20).map(|i| json!({"idempotency_key": format!("b{i}"), "task_type": "noop"})).collect();
    w.call(axum::http::Method::POST, "/v1/jobs:batch", None, Some(json!({"jobs": batch}))).await;
    let id: JobId = one["id"].as_str().unwrap().parse().unwrap();
    let claim = jobs::claim_ids(&db, &[id], 30.0, None).await.unwrap();
    let done = jobs::succeed_reporting(&db, &[(claim.jobs[0].fence(), json!({}))]).await.unwrap();
    assert_eq!(done.callbacks.len(), 1, "the success created its callback delivery");
    assert_eq!(w.count("SELECT count(*) FROM job_keys", &[]).await, 22);
    assert_eq!(keys_without_their_job(&w).await, 0);
    // The check can fail: a key row written apart from its job is counted.
    db.execute(
        "INSERT INTO job_keys (tenant_id, idempotency_key, correlation_id, job_id) VALUES ($1, 'stray', 'c', $2)",
        &[&ghost, &JobId::new()],
    )
    .await
    .unwrap();
    assert_eq!(keys_without_their_job(&w).await, 1);
}

/// A pipelined transaction that is not released after its COMMIT (an error, or dropped) takes
/// its connection out of the pool, so its writes roll back and no later user of the pool finds
/// itself inside it; released, the connection goes back to the pool with its work committed.
#[tokio::test]
async fn a_pipelined_transaction_never_returns_its_connection_to_the_pool_unfinished() {
    use taskdeck::store::pipelined::Pipelined;
    async fn pid(db: &deadpool_postgres::Client) -> i32 {
        db.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0)
    }
    let w = World::new().await;
    w.db().await.batch_execute("CREATE TABLE pipelined_probe (n int)").await.unwrap();

    let db = Pipelined::new(w.db().await);
    let first = pid(&db).await;
    let (_, inserted) =
        tokio::try_join!(db.begin(), async { Ok(db.execute("INSERT INTO pipelined_probe VALUES (1)", &[]).await?) })
            .unwrap();
    assert_eq!(inserted, 1);
    drop(db); // no COMMIT: as when a statement fails
    let next = w.db().await;
    assert_ne!(pid(&next).await, first, "the unfinished transaction's connection came back to the pool");
    let rows: i64 = next.query_one("SELECT count(*) FROM pipelined_probe", &[]).await.unwrap().get(0);
    assert_eq!(rows, 0, "the unfinished transaction's insert survived");
    // SAVEPOINT is refused outside a transaction block.
    assert!(
        next.batch_execute("SAVEPOINT probe").await.is_err(),
        "the pool handed out a connection inside a transaction"
    );
    let second = pid(&next).await;
    drop(next);

    let db = Pipelined::new(w.db().await);
    assert_eq!(pid(&db).await, second, "the pool keeps one idle connection here");
    tokio::try_join!(
        db.begin(),
        async { Ok(db.execute("INSERT INTO pipelined_probe VALUES (2)", &[]).await.map(|_| ())?) },
        db.commit()
    )
    .unwrap();
    db.release();
    let next = w.db().await;
    assert_eq!(pid(&next).await, second, "a released connection goes back to the pool");
    let rows: Vec<i32> =
        next.query("SELECT n FROM pipelined_probe", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(rows, vec![2]);
}

/// Messages whose job is missing or belongs to another tenant: what the foreign key from
/// `messages` to `tenants` guarded against before it was dropped as redundant (0019).
async fn messages_not_of_their_jobs_tenant(w: &World) -> i64 {
    w.count(
        "SELECT count(*) FROM messages m
         WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = m.job_id AND j.tenant_id = m.tenant_id)",
        &[],
    )
    .await
}

#[tokio::test]
async fn every_message_is_of_its_jobs_tenant_on_both_insert_paths_and_another_tenant_records_none() {
    use taskdeck::store::messages::{self, Intent, NewMessage, Status};
    let w = World::new().await;
    let db = w.db().await;
    let (other, _) = tenants::create(&db, "other").await.unwrap();
    let message = |job: &taskdeck::job::ClaimedJob, tenant, key: &str, status| NewMessage {
        id: Uuid::now_v7(),
        tenant_id: tenant,
        message_key: key.into(),
        job_id: job.id,
        attempt: job.attempt,
        correlation_id: "c".into(),
        status,
        reason: None,
        from: "a@acme.example".into(),
        recipients: json!({"to": ["b@example.com"]}),
        subject: "s".into(),
        preview: None,
        configuration_set: None,
    };
    jobs::insert_many(&db, w.tenant.id, &[new_job("m1"), new_job("m2")], None).await.unwrap();
    let claim = jobs::claim_due(&db, 2, 30.0).await.unwrap();
    let (a, b) = (&claim.jobs[0], &claim.jobs[1]);
    // Both paths, the intent of a send and the record of an unsent message.
    assert!(matches!(
        messages::record_intent(&db, &message(a, w.tenant.id, "k1", Status::Sending)).await.unwrap(),
        Intent::Recorded(_)
    ));
    assert!(matches!(
        messages::record_unsent(&db, &message(b, w.tenant.id, "k2", Status::Shadowed)).await.unwrap(),
        Intent::Recorded(_)
    ));
    // Another (real) tenant naming this tenant's running job records nothing, on either path.
    assert!(matches!(
        messages::record_intent(&db, &message(a, other.id, "k3", Status::Sending)).await.unwrap(),
        Intent::Fenced
    ));
    assert!(matches!(
        messages::record_unsent(&db, &message(b, other.id, "k4", Status::Refused)).await.unwrap(),
        Intent::Fenced
    ));
    assert_eq!(w.count("SELECT count(*) FROM messages", &[]).await, 2);
    assert_eq!(w.count("SELECT count(*) FROM messages WHERE tenant_id = $1", &[&other.id]).await, 0);
    assert_eq!(messages_not_of_their_jobs_tenant(&w).await, 0);
    // The check can fail: a message written apart from its job's tenant is counted.
    db.execute(
        "INSERT INTO messages (id, tenant_id, message_key, job_id, attempt, correlation_id, status, from_address, recipients, subject)
         VALUES ($1, $2, 'stray', $3, 1, 'c', 'shadowed', 'a@acme.example', '{}', 's')",
        &[&Uuid::now_v7(), &other.id, &a.id],
    )
    .await
    .unwrap();
    assert_eq!(messages_not_of_their_jobs_tenant(&w).await, 1);
}

/// The `jobs` table checks what its statements change after the insert (status and what goes
/// with it) and no longer what the types hold (`job::terms`, migration 0020).
#[tokio::test]
async fn jobs_check_what_statements_change_and_leave_the_terms_to_their_types() {
    let w = World::new().await;
    let db = w.db().await;
    let checks: Vec<String> = db
        .query(
            "SELECT conname::text FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'c' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        checks,
        [
            "jobs_attempts_bounded",
            "jobs_callback_url_check",
            "jobs_children_total_check",
            "jobs_fault_check",
            "jobs_finished_iff_terminal",
            "jobs_lease_iff_running",
            "jobs_max_attempts_check",
            "jobs_not_own_parent",
            "jobs_result_only_on_success",
            "jobs_running_was_claimed",
            "jobs_status_check",
        ]
    );
    // What is kept still refuses a broken state: running without a lease.
    jobs::insert_many(&db, w.tenant.id, &[new_job("kept")], None).await.unwrap();
    let err = db
        .execute(
            "UPDATE jobs SET status = 'running', attempt = 1, started_at = now() WHERE idempotency_key = 'kept'",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION), "{err}");
}

/// The index entries a job writes, read from the WAL as `relay bench` reads them: each index
/// an accepted job enters, and each one its claim and its success enter. A status change is
/// never a HOT update, so every index whose predicate a running or finished row matches costs
/// every job an entry: the running jobs stay out of `jobs_tenant_open`, and no index holds
/// every pending job beside the two split by key (issue 34). A new index on this path fails
/// this test until the table below names it.
#[tokio::test]
async fn a_job_writes_index_entries_only_where_the_design_puts_them() {
    use relay::bench::wal::RelationWal;
    use taskdeck::store::tooling::bench::{wal_position, wal_records_between};
    let w = World::new().await;
    let db = w.db().await;
    if w.count("SELECT count(*) FROM pg_extension WHERE extname = 'pg_walinspect'", &[]).await == 0 {
        eprintln!("skipped: pg_walinspect is not installed on this server");
        return;
    }
    const N: usize = 20;
    let entries = |from: i64, to: i64| {
        let (db, schema) = (&db, w.schema.clone());
        async move {
            let records =
                wal_records_between(db, &schema, from, to).await.unwrap().expect("the window's WAL is on disk");
            let mut per_index: Vec<(String, f64)> = RelationWal::from_records(&records, N as f64)
                .into_iter()
                .filter(|r| r.index_entries > 0.0 && r.relation != "(other)")
                .map(|r| (r.relation, r.index_entries))
                .collect();
            per_index.sort_by(|a, b| a.0.cmp(&b.0));
            per_index
        }
    };
    let named = |list: &[(&str, f64)]| list.iter().map(|(n, e)| (n.to_string(), *e)).collect::<Vec<_>>();

    let start = wal_position(&db).await.unwrap();
    for i in 0..N {
        let (status, _) = w.submit(&format!("entries-{i}"), json!({"task_type": "noop"})).await;
        assert_eq!(status, axum::http::StatusCode::ACCEPTED);
    }
    let accepted = wal_position(&db).await.unwrap();
    let claim = jobs::claim_due(&db, 100, 60.0).await.unwrap();
    assert_eq!(claim.jobs.len(), N);
    let done: Vec<_> = claim.jobs.iter().map(|j| (j.fence(), json!({}))).collect();
    assert!(jobs::succeed(&db, &done).await.unwrap().is_empty());
    let finished = wal_position(&db).await.unwrap();

    assert_eq!(
        entries(start, accepted).await,
        named(&[
            ("job_keys_correlation", 1.0),
            ("job_keys_pkey", 1.0),
            ("jobs_due_free", 1.0),
            ("jobs_pkey", 1.0),
            ("jobs_tenant_open", 1.0),
            ("jobs_tenant_updated", 1.0),
        ]),
        "accept"
    );
    assert_eq!(
        entries(accepted, finished).await,
        named(&[("jobs_finished_top", 1.0), ("jobs_leases", 1.0), ("jobs_pkey", 2.0), ("jobs_tenant_updated", 2.0)]),
        "claim + complete"
    );
}
