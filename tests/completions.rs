//! External completions on the real stack: a job whose task waits for an outside party
//! (`test.await`, which notes its token in the effects ledger for the test playing that party)
//! is completed once through the API or ingress, or found overdue by the sweep, which applies
//! the task's policy; a completion racing the sweep at the deadline applies exactly one of the
//! two; tenants cannot complete each other's jobs; hostile input is a JSON 4xx.

use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use taskdeck::lambda::ingress::Ingress;
use taskdeck::store::{effects, tenants};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::support::World;

/// Workers (and optionally the sweeper) until the returned switch is flipped.
pub(crate) struct Running {
    stop: watch::Sender<bool>,
    handles: Vec<JoinHandle<()>>,
}

impl Running {
    pub(crate) fn start(w: &World, sweeper: bool) -> Running {
        let (stop, rx) = watch::channel(false);
        let mut handles = w.platform.spawn_workers(1, &rx);
        if sweeper {
            handles.push(w.platform.spawn_sweeper(&rx));
        }
        Running { stop, handles }
    }

    pub(crate) async fn stop(self) {
        self.stop.send(true).unwrap();
        for h in self.handles {
            h.await.unwrap();
        }
    }
}

fn id_of(job: &Value) -> JobId {
    job["id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no id in {job}"))
}

/// Submit a `test.await` job with these params (and terms) as `key`'s tenant.
async fn submit(w: &World, api_key: &str, idem: &str, params: Value, max_attempts: i32) -> JobId {
    let body = json!({"task_type": "test.await", "params": params, "max_attempts": max_attempts});
    let (s, job) = w.call_as(api_key, Method::POST, "/v1/jobs", Some(idem), Some(body.to_string().into_bytes())).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    id_of(&job)
}

/// The token attempt `attempt` handed out, once the job waits under that attempt.
pub(crate) async fn token(w: &World, id: JobId, attempt: i32) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let row = w.db().await.query_one("SELECT status, attempt FROM jobs WHERE id = $1", &[&id]).await.unwrap();
        let (status, at): (String, i32) = (row.get(0), row.get(1));
        let notes = effects::notes(&w.db().await, id).await.unwrap();
        if status == "waiting"
            && at == attempt
            && let Some((_, t)) = notes.iter().find(|n| n.0 == attempt)
        {
            return t.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {id} never waited on attempt {attempt}: {status} attempt {at}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn complete(w: &World, api_key: &str, id: &str, body: Value) -> (StatusCode, Value) {
    w.call_as(api_key, Method::POST, &format!("/v1/jobs/{id}/complete"), None, Some(body.to_string().into_bytes()))
        .await
}

async fn count(w: &World, sql: &str, id: JobId) -> i64 {
    w.count(sql, &[&id]).await
}

const TERMINAL_EVENTS: &str = "SELECT count(*) FROM job_events WHERE job_id = $1 AND kind IN ('succeeded', 'failed')";
const CALLBACKS: &str =
    "SELECT count(*) FROM jobs WHERE task_type = 'callback.deliver' AND params->>'job_id' = $1::uuid::text";

#[tokio::test]
async fn a_completion_applied_twice_changes_nothing_the_second_time() {
    let w = World::new().await;
    tenants::ensure(&w.db().await, "platform").await.unwrap();
    let (s, b) =
        w.call(Method::PUT, "/v1/callbacks", None, Some(json!({"url": "https://hooks.example.com/relay"}))).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let run = Running::start(&w, false);
    let id = submit(&w, &w.key, "c-twice", json!({"within_seconds": 60}), 3).await;
    let token = token(&w, id, 1).await;
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(job["waiting_reason"], "waiting_for_completion", "{job}");
    let until: DateTime<Utc> = job["waiting_until"].as_str().unwrap().parse().unwrap();
    assert!(until > Utc::now() + chrono::Duration::seconds(50), "{job}");

    let body = json!({"token": token, "outcome": "success", "result": {"call": "answered", "seconds": 42}});
    let (s, first) = complete(&w, &w.key, &id.to_string(), body.clone()).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!((first["applied"].as_bool(), first["outcome"].as_str()), (Some(true), Some("success")));
    assert_eq!(first["job"]["status"], "succeeded");
    assert_eq!(first["job"]["result"], json!({"call": "answered", "seconds": 42}));
    assert!(first["job"]["waiting_until"].is_null(), "{first}");
    let before = (count(&w, TERMINAL_EVENTS, id).await, count(&w, CALLBACKS, id).await);
    assert_eq!(before, (1, 1), "one event and one callback for the transition");

    let (s, again) = complete(&w, &w.key, &id.to_string(), body).await;
    assert_eq!(s, StatusCode::OK, "an identical completion is an idempotent replay: {again}");
    assert_eq!(again["applied"], false);
    let other = json!({"token": token, "outcome": "failure", "error": "line busy"});
    let (s, refused) = complete(&w, &w.key, &id.to_string(), other).await;
    assert_eq!(s, StatusCode::CONFLICT, "{refused}");
    assert_eq!(
        (refused["error"]["code"].as_str(), refused["error"]["outcome"].as_str()),
        (Some("already_completed"), Some("success"))
    );
    let after = (count(&w, TERMINAL_EVENTS, id).await, count(&w, CALLBACKS, id).await);
    assert_eq!(after, before, "nothing changed the second and third time");
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(
        (job["status"].as_str(), &job["result"]),
        (Some("succeeded"), &json!({"call": "answered", "seconds": 42}))
    );
    run.stop().await;
}

#[tokio::test]
async fn a_failure_completion_retries_under_the_retry_policy_then_fails_with_one_exception() {
    let w = World::new().await;
    let run = Running::start(&w, false);
    let id = submit(&w, &w.key, "c-fail", json!({"within_seconds": 60}), 2).await;
    let first = token(&w, id, 1).await;
    let (s, b) =
        complete(&w, &w.key, &id.to_string(), json!({"token": first, "outcome": "failure", "error": "no answer"}))
            .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["job"]["status"], "pending", "attempts are left: a retry, after the backoff: {b}");
    assert_eq!(b["job"]["last_error"], "completion: no answer");
    let second = token(&w, id, 2).await;
    assert_ne!(first, second, "each attempt waits with a token of its own");
    let (s, b) = complete(&w, &w.key, &id.to_string(), json!({"token": first, "outcome": "success"})).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_completed")),
        "the first attempt's token: {b}"
    );
    let (s, b) =
        complete(&w, &w.key, &id.to_string(), json!({"token": second, "outcome": "failure", "error": "no answer"}))
            .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["job"]["status"], "failed", "{b}");
    // A completion is the tenant's outside party's word: its failure is the tenant's own.
    assert_eq!(b["job"]["fault"], "tenant", "{b}");
    let exceptions = "SELECT count(*) FROM exceptions WHERE job_id = $1";
    assert_eq!(count(&w, exceptions, id).await, 0);

    let fatal = submit(&w, &w.key, "c-fatal", json!({"within_seconds": 60}), 5).await;
    let t = token(&w, fatal, 1).await;
    let body = json!({"token": t, "outcome": "failure", "error": "number does not exist", "retryable": false});
    let (s, b) = complete(&w, &w.key, &fatal.to_string(), body).await;
    assert_eq!((s, b["job"]["status"].as_str()), (StatusCode::OK, Some("failed")), "{b}");
    assert_eq!((count(&w, exceptions, fatal).await, b["job"]["fault"].as_str()), (0, Some("tenant")), "{b}");
    let counted = "SELECT count(*) FROM tenant_faults WHERE last_job_id = $1 AND kind = 'fatal_error'";
    assert_eq!(count(&w, counted, fatal).await, 1);
    run.stop().await;
}

/// When the sweep closed a wait, and the wait's deadline.
async fn handled(w: &World, id: JobId, attempt: i32) -> (DateTime<Utc>, DateTime<Utc>, String) {
    let row = w
        .db()
        .await
        .query_one(
            "SELECT closed_at, deadline, closed_by FROM completion_waits WHERE job_id = $1 AND attempt = $2",
            &[&id, &attempt],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_completion_is_found_by_the_sweep_within_one_interval_and_handled_by_its_policy() {
    let w = World::new().await;
    let interval = w.platform.settings.sweep_interval;
    let run = Running::start(&w, true);
    let retry =
        submit(&w, &w.key, "o-retry", json!({"within_seconds": 1, "on_overdue": "retry", "wait_attempts": 1}), 3).await;
    let later = submit(
        &w,
        &w.key,
        "o-later",
        json!({"within_seconds": 1, "on_overdue": "reschedule", "reschedule_seconds": 3600}),
        1,
    )
    .await;
    let fail = submit(&w, &w.key, "o-fail", json!({"within_seconds": 1, "on_overdue": "fail"}), 3).await;
    let fail_token = token(&w, fail, 1).await;
    let done = |j: &Value| j["status"] == "succeeded";
    let j = w.wait_for(&retry.to_string(), Duration::from_secs(20), done).await;
    assert_eq!(
        (j["status"].as_str(), j["attempt"].as_i64()),
        (Some("succeeded"), Some(2)),
        "retried as a new attempt: {j}"
    );
    let j = w.wait_for(&later.to_string(), Duration::from_secs(10), |j| j["status"] == "pending").await;
    assert_eq!(
        (j["status"].as_str(), j["attempt"].as_i64(), j["max_attempts"].as_i64()),
        (Some("pending"), Some(1), Some(2)),
        "rescheduled without using its only attempt: {j}"
    );
    let run_at: DateTime<Utc> = j["run_at"].as_str().unwrap().parse().unwrap();
    assert!(run_at > Utc::now() + chrono::Duration::minutes(55), "rescheduled an hour after the deadline: {j}");
    assert_eq!(j["waiting_reason"], "not_due");
    let j = w.wait_for(&fail.to_string(), Duration::from_secs(10), |j| j["status"] == "failed").await;
    assert_eq!(j["status"], "failed", "{j}");
    // No completion from the tenant's outside party by the deadline: the tenant's fault.
    assert_eq!(j["fault"], "tenant", "{j}");
    let counted = "SELECT count(*) FROM tenant_faults WHERE last_job_id = $1 AND kind = 'completion_overdue'";
    assert_eq!(count(&w, counted, fail).await, 1, "counted for the tenant");
    let all_exceptions = "SELECT count(*) FROM exceptions WHERE job_id = $1";
    assert_eq!((count(&w, all_exceptions, retry).await, count(&w, all_exceptions, later).await), (0, 0));
    // Within one sweep interval of the deadline (and the pass's own time).
    for id in [retry, later, fail] {
        let (closed, deadline, by) = handled(&w, id, 1).await;
        assert_eq!(by, "overdue");
        let late = (closed - deadline).to_std().unwrap_or_default();
        assert!(
            late <= interval + Duration::from_millis(500),
            "{id} handled {late:?} after its deadline (interval {interval:?})"
        );
    }
    let (s, b) = complete(&w, &w.key, &fail.to_string(), json!({"token": fail_token, "outcome": "success"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(
        (b["error"]["code"].as_str(), b["error"]["on_overdue"].as_str()),
        (Some("completion_overdue"), Some("fail"))
    );
    let (_, status) = w.call(Method::GET, &format!("/v1/jobs/{fail}"), None, None).await;
    assert_eq!(status["status"], "failed", "a late completion changed nothing");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_racing_the_sweep_at_the_deadline_applies_exactly_one_of_the_two() {
    let w = World::new().await;
    let run = Running::start(&w, false);
    let n = 30;
    let mut jobs = Vec::new();
    for i in 0..n {
        jobs.push(
            submit(&w, &w.key, &format!("race-{i}"), json!({"within_seconds": 2, "on_overdue": "fail"}), 3).await,
        );
    }
    let mut tokens = Vec::new();
    for id in &jobs {
        tokens.push(token(&w, *id, 1).await);
    }
    run.stop().await;
    let mut deadlines = Vec::new();
    for id in &jobs {
        let row =
            w.db().await.query_one("SELECT deadline FROM completion_waits WHERE job_id = $1", &[id]).await.unwrap();
        deadlines.push(row.get::<_, DateTime<Utc>>(0));
    }
    // Three sweepers pass over and over while the completions arrive, concurrently, each from
    // 150 ms before its job's deadline to 750 ms after: early ones tend to win, late ones lose.
    let (stop, rx) = watch::channel(false);
    let sweepers: Vec<_> = (0..3)
        .map(|_| {
            let (sweeper, rx) = (w.platform.sweeper(), rx.clone());
            tokio::spawn(async move {
                let mut handled = 0;
                while !*rx.borrow() {
                    handled += sweeper.pass().await.unwrap().completions_overdue;
                }
                handled
            })
        })
        .collect();
    let calls: Vec<_> = jobs
        .iter()
        .zip(&tokens)
        .zip(deadlines)
        .enumerate()
        .map(|(i, ((id, t), deadline))| {
            let (router, key, path) = (w.router.clone(), w.key.clone(), format!("/v1/jobs/{id}/complete"));
            let body = json!({"token": t, "outcome": "success", "result": {"won": "completion"}}).to_string();
            tokio::spawn(async move {
                let at = deadline + chrono::Duration::milliseconds(30 * i as i64 - 150);
                tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await;
                let req = axum::http::Request::post(path)
                    .header("authorization", format!("Bearer {key}"))
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body))
                    .unwrap();
                crate::support::send(&router, req).await
            })
        })
        .collect();
    let mut applied = 0;
    let mut overdue = 0;
    for c in calls {
        let (s, b) = c.await.unwrap();
        match (s, b["error"]["code"].as_str()) {
            (StatusCode::OK, _) => applied += 1,
            (StatusCode::CONFLICT, Some("completion_overdue")) => overdue += 1,
            other => panic!("neither applied nor overdue: {other:?} {b}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).unwrap();
    let mut swept = 0;
    for s in sweepers {
        swept += s.await.unwrap();
    }
    eprintln!(
        "race at the deadline: {applied} completions applied, {overdue} refused as overdue, {swept} handled by the sweep"
    );
    assert_eq!(applied + overdue, n);
    assert!(applied > 0 && overdue > 0, "both sides won some: the two really raced");
    assert_eq!(swept, overdue, "every job the sweep handled refused its completion, and no other");
    let succeeded =
        w.count("SELECT count(*) FROM jobs WHERE task_type = 'test.await' AND status = 'succeeded'", &[]).await;
    let failed = w.count("SELECT count(*) FROM jobs WHERE task_type = 'test.await' AND status = 'failed'", &[]).await;
    assert_eq!((succeeded, failed), (applied as i64, overdue as i64));
    let events = "SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id
                  WHERE j.task_type = 'test.await' AND e.kind IN ('succeeded', 'failed')";
    assert_eq!(w.count(events, &[]).await, n as i64, "one terminal transition per job");
    let counted = "SELECT coalesce(sum(count), 0)::int8 FROM tenant_faults WHERE kind = 'completion_overdue'";
    assert_eq!(w.count(counted, &[]).await, overdue as i64);
}

#[tokio::test]
async fn a_tenant_cannot_complete_another_tenants_job() {
    let w = World::new().await;
    let (_, other_key) = w.other_tenant("globex").await;
    let run = Running::start(&w, false);
    let mine = submit(&w, &w.key, "t-mine", json!({"within_seconds": 60}), 3).await;
    let theirs = submit(&w, &other_key, "t-theirs", json!({"within_seconds": 60}), 3).await;
    let (my_token, their_token) = (token(&w, mine, 1).await, token(&w, theirs, 1).await);
    run.stop().await;
    let success = |t: &str| json!({"token": t, "outcome": "success", "result": {"by": "intruder"}});
    // The other tenant, with its real key, on my job: with my real token, with its own.
    let (s, with_mine) = complete(&w, &other_key, &mine.to_string(), success(&my_token)).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{with_mine}");
    let (s, with_theirs) = complete(&w, &other_key, &mine.to_string(), success(&their_token)).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{with_theirs}");
    let (s, nothing) = complete(&w, &other_key, &JobId::new().to_string(), success(&my_token)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(with_mine, nothing, "another tenant's job answers exactly as no job");
    assert_eq!(with_theirs, nothing);
    // My key on my job with their real token: refused, and their job is untouched.
    let (s, b) = complete(&w, &w.key, &mine.to_string(), success(&their_token)).await;
    assert_eq!((s, b["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("invalid_token")), "{b}");
    let waiting = "SELECT count(*) FROM jobs WHERE id = $1 AND status = 'waiting'";
    assert_eq!((count(&w, waiting, mine).await, count(&w, waiting, theirs).await), (1, 1), "both still wait");
    let (s, b) = complete(&w, &w.key, &mine.to_string(), success(&my_token)).await;
    assert_eq!((s, b["job"]["status"].as_str()), (StatusCode::OK, Some("succeeded")), "{b}");
    assert_eq!(count(&w, waiting, theirs).await, 1);
}

#[tokio::test]
async fn hostile_tokens_paths_and_bodies_answer_json_4xx_never_500() {
    let w = World::new().await;
    let run = Running::start(&w, false);
    let id = submit(&w, &w.key, "h-1", json!({"within_seconds": 60}), 3).await;
    let t = token(&w, id, 1).await;
    run.stop().await;
    let path = format!("/v1/jobs/{id}/complete");
    let bodies: Vec<(&str, Vec<u8>)> = vec![
        ("malformed", b"{\"token\": ".to_vec()),
        ("nul in token", json!({"token": "rc_\u{0}x", "outcome": "success"}).to_string().into_bytes()),
        ("token not a string", json!({"token": 7, "outcome": "success"}).to_string().into_bytes()),
        ("empty token", json!({"token": "", "outcome": "success"}).to_string().into_bytes()),
        ("long token", json!({"token": "x".repeat(5000), "outcome": "success"}).to_string().into_bytes()),
        ("guessed token", json!({"token": format!("{t}x"), "outcome": "success"}).to_string().into_bytes()),
        ("sql in token", json!({"token": "' OR 1=1 --", "outcome": "success"}).to_string().into_bytes()),
        ("unknown outcome", json!({"token": t, "outcome": "maybe"}).to_string().into_bytes()),
        ("result on failure", json!({"token": t, "outcome": "failure", "result": 1}).to_string().into_bytes()),
        ("error on success", json!({"token": t, "outcome": "success", "error": "x"}).to_string().into_bytes()),
        ("nul in result", json!({"token": t, "outcome": "success", "result": {"a": "\u{0}"}}).to_string().into_bytes()),
        (
            "huge result",
            json!({"token": t, "outcome": "success", "result": "x".repeat(300_000)}).to_string().into_bytes(),
        ),
        ("long error", json!({"token": t, "outcome": "failure", "error": "e".repeat(4001)}).to_string().into_bytes()),
        ("unknown field", json!({"token": t, "outcome": "success", "job_id": id}).to_string().into_bytes()),
        ("array", b"[1, 2]".to_vec()),
        ("not utf-8", vec![0xff, 0xfe, b'{']),
    ];
    for (what, body) in bodies {
        let (s, b) = w.call_as(&w.key, Method::POST, &path, None, Some(body)).await;
        assert!(s.is_client_error(), "{what}: {s} {b}");
        assert!(b["error"]["code"].is_string(), "{what}: {b}");
    }
    let ok = json!({"token": t, "outcome": "success"}).to_string().into_bytes();
    for p in [
        "/v1/jobs/%00/complete",
        "/v1/jobs/not-a-job/complete",
        "/v1/jobs/%2e%2e/complete",
        "/v1/jobs/%F0%28%8C%28/complete",
        &format!("/v1/jobs/{}/complete", "9".repeat(3000)),
        &format!("/v1/jobs/{id}/complete?token=%00"),
    ] {
        let (s, b) = w.call_as(&w.key, Method::POST, p, None, Some(ok.clone())).await;
        assert!(s.is_client_error(), "{p}: {s} {b}");
        assert!(b["error"]["code"].is_string(), "{p}: {b}");
    }
    let (s, _) = w.call_as(&w.key, Method::GET, &path, None, None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    let (s, _) = w.call_as("rk_not_a_key", Method::POST, &path, None, Some(ok.clone())).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(
        count(&w, "SELECT count(*) FROM jobs WHERE id = $1 AND status = 'waiting'", id).await,
        1,
        "still waiting"
    );
    let (s, b) = w.call_as(&w.key, Method::POST, &path, None, Some(ok)).await;
    assert_eq!(s, StatusCode::OK, "the real token still completes it: {b}");
}

/// One SQS record written to the ingress queue directly, with this body.
fn record(message_id: &str, body: &Value) -> Value {
    json!({"messageId": message_id, "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:relay-ingress",
        "body": body.to_string(), "attributes": {}, "messageAttributes": {}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_through_ingress_applies_once() {
    let w = World::new().await;
    let run = Running::start(&w, false);
    let id = submit(&w, &w.key, "i-1", json!({"within_seconds": 60}), 3).await;
    let t = token(&w, id, 1).await;
    let event = |c: Value| json!({"relay_completion": c});
    let success = event(json!({"token": t, "outcome": "success", "result": {"via": "ingress"}}));
    let failure = event(json!({"token": t, "outcome": "failure", "error": "late"}));
    let unknown = event(json!({"token": "rc_nobody", "outcome": "success"}));
    // The provider delivers the same completion twice (two messages), then another one, and
    // SQS redelivers the first message.
    let records = [record("m-1", &success), record("m-2", &success), record("m-3", &failure), record("m-4", &unknown)];
    let ingress = Ingress::new(&w.platform, "platform");
    for r in records.iter().chain(std::iter::once(&records[0])) {
        let sqs: SqsEvent = serde_json::from_value(json!({"Records": [r]})).unwrap();
        assert!(ingress.handle(sqs).await.batch_item_failures.is_empty());
        // One at a time, so the order is the provider's.
        let last = "SELECT count(*) FROM jobs WHERE task_type = 'provider.event' AND status <> 'succeeded'";
        assert_eq!(w.eventually(last, &[], 0).await, 0);
    }
    run.stop().await;
    let outcomes: Vec<(String, Value)> = w
        .db()
        .await
        .query("SELECT params->>'message_id', result FROM jobs WHERE task_type = 'provider.event' ORDER BY params->>'message_id'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let said: Vec<(&str, &str)> =
        outcomes.iter().map(|(m, r)| (m.as_str(), r["completion"].as_str().unwrap_or("?"))).collect();
    assert_eq!(said, [("m-1", "applied"), ("m-2", "replayed"), ("m-3", "refused"), ("m-4", "refused")], "{outcomes:?}");
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!((job["status"].as_str(), &job["result"]), (Some("succeeded"), &json!({"via": "ingress"})));
    assert_eq!(count(&w, TERMINAL_EVENTS, id).await, 1, "applied once");
    let via =
        w.db().await.query_one("SELECT via, outcome FROM completion_waits WHERE job_id = $1", &[&id]).await.unwrap();
    assert_eq!((via.get::<_, String>(0), via.get::<_, String>(1)), ("ingress".into(), "success".into()));
}
