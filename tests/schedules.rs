//! Schedules on real Postgres: each slot fires once with concurrent sweepers, a missed slot
//! fires once (catch-up fires each), schedules report last and next run, pause and resume,
//! validation, cancel through an exception disables the schedule, and retention.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use taskdeck::job::terms::{CorrelationId, IdempotencyKey, Limits};
use taskdeck::schedules::{self, ScheduleSpec};
use taskdeck::store::jobs::{self, NewJob, retention};
use taskdeck::store::schedules as store;
use taskdeck::store::{operators, tenants};
use uuid::Uuid;

use crate::support::World;

/// Half past a whole minute, so minute slots are unambiguous.
fn fixed_now() -> DateTime<Utc> {
    Utc::now().duration_trunc(TimeDelta::minutes(1)).unwrap() + TimeDelta::seconds(30)
}

async fn every_minute(w: &World, name: &str, catch_up: bool) -> store::Schedule {
    let spec = ScheduleSpec {
        name: name.into(),
        task_type: "noop".into(),
        params: json!({"echo": name}),
        cron: "* * * * *".into(),
        timezone: "UTC".into(),
        tenant: None,
        enabled: true,
        catch_up,
    };
    schedules::add(&w.db().await, &w.platform.catalogue, spec, "test", Utc::now()).await.unwrap()
}

async fn set_next(w: &World, id: Uuid, at: DateTime<Utc>) {
    w.db().await.execute("UPDATE schedules SET next_run_at = $2 WHERE id = $1", &[&id, &at]).await.unwrap();
}

async fn slot_jobs(w: &World, id: Uuid) -> i64 {
    w.count("SELECT count(*) FROM jobs WHERE idempotency_key LIKE $1", &[&format!("schedule:{id}:%")]).await
}

#[tokio::test]
async fn two_concurrent_sweepers_fire_a_slot_once() {
    let w = Arc::new(World::new().await);
    let s = every_minute(&w, "twice", false).await;
    let now = fixed_now();
    let slot = now - TimeDelta::seconds(30);
    set_next(&w, s.id, slot).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let runs = (0..2).map(|_| {
        let (w, barrier) = (w.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            schedules::fire_due(&w.platform.pool, &w.platform.intake, now).await.unwrap()
        })
    });
    let reports: Vec<_> = futures::future::join_all(runs).await.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(reports.iter().map(|r| r.fired).sum::<usize>(), 1, "{reports:?}");
    assert_eq!(slot_jobs(&w, s.id).await, 1);
    let after = store::get(&w.db().await, s.id).await.unwrap().unwrap();
    assert_eq!(after.last_fired_slot, Some(slot));
    assert_eq!(after.next_run_at, slot + TimeDelta::minutes(1));
    let key = IdempotencyKey::schedule_slot(s.id, slot);
    assert_eq!(
        w.count(
            "SELECT count(*) FROM jobs WHERE idempotency_key = $1 AND id = $2",
            &[&key.as_str(), &after.last_job_id.unwrap()]
        )
        .await,
        1
    );
    // The same slot again (a sweeper that read before the advance) creates nothing.
    assert!(
        !store::advance(&w.db().await, s.id, slot, slot, after.last_job_id.unwrap(), after.next_run_at).await.unwrap()
    );
    let again = schedules::fire_due(&w.platform.pool, &w.platform.intake, now).await.unwrap();
    assert_eq!(again.fired + again.already_fired, 0, "not due any more");
}

#[tokio::test]
async fn two_sweeper_passes_at_once_fire_a_due_schedule_once() {
    let w = World::new().await;
    let s = every_minute(&w, "sweeps", false).await;
    set_next(&w, s.id, Utc::now() - TimeDelta::seconds(1)).await;
    let (a, b) = (w.platform.sweeper(), w.platform.sweeper());
    let (ra, rb) = tokio::join!(a.pass(), b.pass());
    assert_eq!(ra.unwrap().schedules_fired + rb.unwrap().schedules_fired, 1);
    assert_eq!(slot_jobs(&w, s.id).await, 1);
}

#[tokio::test]
async fn a_missed_slot_fires_once_and_catch_up_fires_each() {
    let w = World::new().await;
    let now = fixed_now();
    let behind = now - TimeDelta::seconds(30) - TimeDelta::minutes(5);
    let once = every_minute(&w, "once", false).await;
    let each = every_minute(&w, "each", true).await;
    set_next(&w, once.id, behind).await;
    set_next(&w, each.id, behind).await;
    let report = schedules::fire_due(&w.platform.pool, &w.platform.intake, now).await.unwrap();
    assert_eq!(report.fired, 1 + 6);
    assert_eq!(slot_jobs(&w, once.id).await, 1, "downtime of six slots fires the latest only");
    assert_eq!(slot_jobs(&w, each.id).await, 6);
    let once = store::by_name(&w.db().await, "once").await.unwrap().unwrap();
    assert_eq!(once.last_fired_slot, Some(now - TimeDelta::seconds(30)));
    let each = store::by_name(&w.db().await, "each").await.unwrap().unwrap();
    assert_eq!(each.next_run_at, now + TimeDelta::seconds(30));
}

#[tokio::test]
async fn schedules_are_managed_over_the_api_and_report_last_and_next_run() {
    let w = World::new().await;
    let key = operators::create(&w.db().await, "ops").await.unwrap().1;
    let call = |m: Method, p: String, b: Option<Value>| {
        let (w, key) = (&w, key.clone());
        async move { w.call_as(&key, m, &p, None, b.map(|b| b.to_string().into_bytes())).await }
    };
    let body = json!({"name": "nightly", "task_type": "noop", "cron": "0 9 * * *", "timezone": "Europe/Paris"});
    let (s, created) = call(Method::POST, "/v1/admin/schedules".into(), Some(body.clone())).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert_eq!((created["last_outcome"].clone(), created["enabled"].clone()), (Value::Null, json!(true)));
    let next: DateTime<Utc> = created["next_run_at"].as_str().unwrap().parse().unwrap();
    assert!(next > Utc::now());
    let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let (s, err) = call(Method::POST, "/v1/admin/schedules".into(), Some(body)).await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("schedule_exists")));
    for (patch, status, code) in [
        (json!({"cron": "every day"}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_cron"),
        (json!({"timezone": "Mars/Olympus"}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_timezone"),
        // Params the schedule's own task type refuses conflict with the schedule.
        (json!({"params": {"surprise": 1}}), StatusCode::CONFLICT, "invalid_params"),
    ] {
        let (s, err) = call(Method::PATCH, format!("/v1/admin/schedules/{id}"), Some(patch)).await;
        assert_eq!((s, err["error"]["code"].as_str()), (status, Some(code)));
    }
    let (s, err) = call(
        Method::POST,
        "/v1/admin/schedules".into(),
        Some(json!({"name": "x", "task_type": "nope", "cron": "* * * * *"})),
    )
    .await;
    assert_eq!((s, err["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_task_type")));

    // Fire it, run the job: the schedule reports the last run and its outcome.
    set_next(&w, id, Utc::now() - TimeDelta::seconds(1)).await;
    w.platform.sweeper().pass().await.unwrap();
    let (_, shown) = call(Method::GET, format!("/v1/admin/schedules/{id}"), None).await;
    assert_eq!(shown["last_outcome"], "pending");
    let job: JobId = shown["last_job_id"].as_str().unwrap().parse().unwrap();
    w.platform.executor().run_dispatched(&[job]).await.unwrap();
    let (_, listed) = call(Method::GET, "/v1/admin/schedules".into(), None).await;
    assert_eq!(listed["schedules"][0]["last_outcome"], "succeeded");
    assert!(listed["schedules"][0]["last_fired_slot"].is_string());

    // Pause: no longer due; resume: next run from now on.
    let (s, paused) = call(Method::PATCH, format!("/v1/admin/schedules/{id}"), Some(json!({"enabled": false}))).await;
    assert_eq!(
        (s, paused["enabled"].clone(), paused["updated_by"].clone()),
        (StatusCode::OK, json!(false), json!("ops"))
    );
    set_next(&w, id, Utc::now() - TimeDelta::hours(1)).await;
    assert!(store::due(&w.db().await, Utc::now(), 10).await.unwrap().is_empty());
    let (_, resumed) = call(Method::PATCH, format!("/v1/admin/schedules/{id}"), Some(json!({"enabled": true}))).await;
    let next: DateTime<Utc> = resumed["next_run_at"].as_str().unwrap().parse().unwrap();
    assert!(next > Utc::now(), "slots passed while paused do not fire");
    let (s, _) = call(Method::DELETE, format!("/v1/admin/schedules/{id}"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call(Method::GET, format!("/v1/admin/schedules/{id}"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = w.call(Method::GET, "/v1/admin/schedules", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "a tenant key is refused");
}

#[tokio::test]
async fn cancelling_a_scheduled_jobs_exception_disables_its_schedule() {
    let w = World::new().await;
    let spec = ScheduleSpec {
        name: "flaky".into(),
        task_type: "test.fail".into(),
        params: json!({"times": 9, "kind": "fatal"}),
        cron: "* * * * *".into(),
        timezone: "UTC".into(),
        tenant: Some("acme".into()),
        enabled: true,
        catch_up: false,
    };
    let s = schedules::add(&w.db().await, &w.platform.catalogue, spec, "test", Utc::now()).await.unwrap();
    assert_eq!(s.tenant_id, w.tenant.id);
    set_next(&w, s.id, Utc::now() - TimeDelta::seconds(1)).await;
    w.platform.sweeper().pass().await.unwrap();
    let job = store::get(&w.db().await, s.id).await.unwrap().unwrap().last_job_id.unwrap();
    w.platform.executor().run_dispatched(&[job]).await.unwrap();
    let exc: Uuid =
        w.db().await.query_one("SELECT id FROM exceptions WHERE job_id = $1", &[&job]).await.unwrap().get(0);
    let out = taskdeck::exceptions::act(
        &w.platform.pool,
        &w.platform.transport,
        exc,
        &taskdeck::exceptions::Action::Cancel,
        None,
        "ops",
        Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(out.schedule_disabled, Some(s.id));
    let after = store::get(&w.db().await, s.id).await.unwrap().unwrap();
    assert!(!after.enabled);
    assert_eq!(after.last_outcome.as_deref(), Some("cancelled"));
}

fn old_job(key: &str, days: i64, parent: Option<JobId>) -> NewJob {
    let at = Utc::now() - TimeDelta::days(days);
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, u64::try_from(at.timestamp()).unwrap(), 0);
    NewJob {
        id: JobId::from_uuid(Uuid::new_v7(ts)),
        correlation_id: CorrelationId::parse(key).unwrap(),
        parent_id: parent,
        run_at: at,
        limits: Limits::fixed(1, 10),
        ..NewJob::new("noop", json!({}), IdempotencyKey::parse(key).unwrap())
    }
}

#[tokio::test]
async fn retention_deletes_only_old_terminal_jobs_with_their_events_and_keys() {
    let w = World::new().await;
    let db = w.db().await;
    let old = old_job("old", 40, None);
    let parent = old_job("parent", 40, None);
    let child = old_job("child", 40, Some(parent.id));
    let jobs_in = [
        old.clone(),
        old_job("old-pending", 40, None),
        old_job("old-failed", 40, None),
        parent.clone(),
        child.clone(),
        old_job("recent", 5, None),
    ];
    jobs::insert_many(&db, w.tenant.id, &jobs_in, None).await.unwrap();
    db.batch_execute(&format!(
        "UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '40 days' WHERE idempotency_key IN ('old', 'parent', 'child');
         UPDATE jobs SET status = 'succeeded', finished_at = now() - interval '5 days' WHERE idempotency_key = 'recent';
         UPDATE jobs SET status = 'failed', finished_at = now() - interval '40 days' WHERE idempotency_key = 'old-failed';
         INSERT INTO exceptions (id, job_id, tenant_id, task_type, kind, cause)
             SELECT gen_random_uuid(), id, tenant_id, task_type, 'fatal_error', 'x' FROM jobs WHERE idempotency_key = 'old-failed';
         INSERT INTO job_events (job_id, kind, attempt) VALUES ('{old}', 'succeeded', 1);
         INSERT INTO messages (id, tenant_id, message_key, job_id, attempt, correlation_id, status, from_address, recipients, subject)
             SELECT gen_random_uuid(), tenant_id, idempotency_key, id, 1, 'c', 'sent', 'a@example.com', '[]', 's'
             FROM jobs WHERE idempotency_key IN ('old', 'recent');
         INSERT INTO message_events (event_key, message_id, event_type, detail, tenant_id)
             SELECT 'ev-' || message_key, id, 'delivery', '{{}}', tenant_id FROM messages;
         INSERT INTO callback_attempts (job_id, tenant_id, delivery_job_id, attempt, event, url, outcome)
             SELECT id, tenant_id, id, 1, 'job.succeeded', 'https://x.example', 'delivered'
             FROM jobs WHERE idempotency_key IN ('old', 'recent');",
        old = old.id
    ))
    .await
    .unwrap();
    let cutoff = Utc::now() - TimeDelta::days(30);
    // A parent waits for its child: the child goes in the first batch, the parent after.
    assert_eq!(retention::delete_terminal_before(&db, cutoff, 1000).await.unwrap(), 2);
    assert_eq!(retention::delete_terminal_before(&db, cutoff, 1000).await.unwrap(), 1);
    assert_eq!(retention::delete_terminal_before(&db, cutoff, 1000).await.unwrap(), 0);
    let left: Vec<String> = db
        .query("SELECT idempotency_key FROM jobs ORDER BY idempotency_key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["old-failed", "old-pending", "recent"], "open exceptions, live and recent jobs stay");
    assert_eq!(w.count("SELECT count(*) FROM job_events WHERE job_id = $1", &[&old.id]).await, 0);
    assert_eq!(
        w.count("SELECT count(*) FROM job_keys WHERE idempotency_key IN ('old', 'parent', 'child')", &[]).await,
        0
    );
    assert_eq!(w.count("SELECT count(*) FROM job_keys", &[]).await, 3);
    // The old job's message, its provider event and its callback attempt went with it; the
    // recent job's stay.
    for (table, rows) in [
        ("messages", "SELECT message_key FROM messages"),
        ("message_events", "SELECT m.message_key FROM message_events e JOIN messages m ON m.id = e.message_id"),
        ("callback_attempts", "SELECT j.idempotency_key FROM callback_attempts a JOIN jobs j ON j.id = a.job_id"),
    ] {
        let keys: Vec<String> = db.query(rows, &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(keys, ["recent"], "{table}");
    }
    assert_eq!(w.count("SELECT count(*) FROM message_events", &[]).await, 1, "no event left without its message");
    assert_eq!(w.count("SELECT count(*) FROM callback_attempts", &[]).await, 1);
}

#[tokio::test]
async fn the_built_in_retention_schedule_runs_the_retention_task() {
    let w = World::new().await;
    let s = schedules::ensure_builtin(&w.platform.pool, 30, Utc::now()).await.unwrap();
    assert_eq!((s.name.as_str(), s.params.clone()), ("relay.retention", json!({"older_than_days": 30})));
    let again = schedules::ensure_builtin(&w.platform.pool, 7, Utc::now()).await.unwrap();
    assert_eq!((again.id, again.params.clone()), (s.id, json!({"older_than_days": 30})), "created once");
    let platform = tenants::by_name(&w.db().await, "platform").await.unwrap().unwrap();
    assert_eq!(s.tenant_id, platform.id);
    jobs::insert_many(&w.db().await, w.tenant.id, &[old_job("ancient", 60, None)], None).await.unwrap();
    w.db()
        .await
        .execute("UPDATE jobs SET status = 'cancelled', finished_at = now() - interval '60 days'", &[])
        .await
        .unwrap();
    set_next(&w, s.id, Utc::now() - TimeDelta::seconds(1)).await;
    w.platform.sweeper().pass().await.unwrap();
    let job = store::get(&w.db().await, s.id).await.unwrap().unwrap().last_job_id.unwrap();
    let (report, _) = w.platform.executor().run_dispatched(&[job]).await.unwrap();
    assert_eq!(report.succeeded, 1);
    let result: Value = w.db().await.query_one("SELECT result FROM jobs WHERE id = $1", &[&job]).await.unwrap().get(0);
    assert_eq!(result["deleted_jobs"], 1);
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE idempotency_key = 'ancient'", &[]).await, 0);
}
