//! The Lambda handlers, called with real event payloads (`tests/fixtures/*.json`, written from
//! the AWS documentation's formats), on real Postgres, with SQS through moto.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use taskdeck::config::LambdaConfig;
use taskdeck::job::JobId;
use taskdeck::lambda;
use taskdeck::lambda::ingress::Ingress;
use taskdeck::platform::Platform;
use taskdeck::store::{dead_letters, effects, tenants};
use taskdeck::transport::sqs::SqsTransport;
use tower::ServiceExt;

use crate::support::transports::Down;
use crate::support::{World, moto};

/// A fixture with its `{{NAME}}` placeholders filled in.
pub fn fixture(name: &str, vars: &[(&str, &str)]) -> String {
    let path = format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    for (k, v) in vars {
        text = text.replace(&format!("{{{{{k}}}}}"), v);
    }
    text
}

/// Serve an API Gateway HTTP API (v2) event through lambda_http's own conversion and the
/// router, as the intake function does.
pub async fn invoke_http(router: &axum::Router, event: &str) -> (u16, Value) {
    let req = lambda_http::request::from_str(event).expect("an API Gateway v2 event");
    let res = router.clone().oneshot(req).await.expect("router is infallible");
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).expect("JSON answer"))
}

/// A world whose transport is SQS on a fresh moto queue; returns the queue's (url, arn).
pub async fn sqs_world(prefix: &str) -> (World, String, String) {
    let (url, arn) = moto::queue(prefix).await;
    let w = World::new().await;
    let w = w.with_transport(Arc::new(SqsTransport::new(moto::sqs(), url.clone())));
    (w, url, arn)
}

fn failed(r: &SqsBatchResponse) -> Vec<String> {
    r.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect()
}

/// The platform a Lambda container builds (one verified connection), on this world's schema.
fn lambda_platform(w: &World, url: &str, db_url: &str) -> Platform {
    let vars = [("DATABASE_URL", db_url), ("RELAY_WORK_QUEUE_URL", url), ("RELAY_DB_WAIT_SECONDS", "2")];
    let cfg = LambdaConfig::from_lookup(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())).unwrap();
    let mut settings = lambda::settings(&cfg);
    settings.pool.search_path = Some(w.schema.clone());
    settings.test_tasks = true;
    Platform::new(db_url, settings).unwrap().with_transport(Arc::new(SqsTransport::new(moto::sqs(), url)))
}

#[tokio::test]
async fn intake_serves_an_api_gateway_v2_request_through_the_same_router() {
    let (w, url, _) = sqs_world("intake").await;
    let event = fixture("apigw_v2_submit_job.json", &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", "apigw-1")]);
    let (status, job) = invoke_http(&w.router, &event).await;
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["correlation_id"], "order-4711");
    assert_eq!(moto::depth(&url).await, 1, "dispatched to SQS after commit");
    let (status, again) = invoke_http(&w.router, &event).await;
    assert_eq!((status, &again["id"]), (200, &job["id"]), "a replay answers the same job");
    let get = fixture("apigw_v2_get_job.json", &[("API_KEY", &w.key), ("JOB_ID", job["id"].as_str().unwrap())]);
    let (status, read) = invoke_http(&w.router, &get).await;
    assert_eq!((status, &read["status"]), (200, &json!("pending")));
    let (status, err) = invoke_http(&w.router, &get.replace(&w.key, "rk_wrong")).await;
    assert_eq!((status, &err["error"]["code"]), (401, &json!("unauthorized")));
}

#[tokio::test]
async fn executor_runs_each_job_once_keeps_malformed_bodies_and_fails_no_record() {
    let w = World::new().await;
    let (_, job) = w.submit("exec-1", json!({"task_type": "test.effect"})).await;
    let id = job["id"].as_str().unwrap().to_owned();
    let event: SqsEvent = serde_json::from_str(&fixture("sqs_work_batch.json", &[("JOB_ID", &id)])).unwrap();
    let exec = w.platform.executor();

    // Two records carry the same job (a duplicate delivery), one carries garbage.
    let res = lambda::executor::handle(&exec, event.clone(), None).await;
    assert_eq!(failed(&res), Vec::<String>::new(), "nothing returns to the queue");
    let job_id: JobId = id.parse().unwrap();
    assert_eq!(effects::count(&w.db().await, job_id).await.unwrap(), 1);
    let kept = dead_letters::recent(&w.db().await, 10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].body, "{\"jobId\": \"not-a-uuid\"}", "kept whole");
    assert_eq!(kept[0].message_id.as_deref(), Some("7b2f3a10-1c4e-4d1a-9a55-3f9f7e0c2b11"));
    assert_eq!(kept[0].source, "executor:arn:aws:sqs:eu-west-1:123456789012:relay-work");
    assert!(kept[0].reason.contains("missing field `job_id`"), "{}", kept[0].reason);

    // The same batch again (SQS redelivers): the job is done, so everything is acknowledged.
    let res = lambda::executor::handle(&exec, event, None).await;
    assert!(res.batch_item_failures.is_empty());
    assert_eq!(effects::count(&w.db().await, job_id).await.unwrap(), 1, "the effect ran once");
    assert_eq!(dead_letters::recent(&w.db().await, 10).await.unwrap().len(), 1, "kept once");
    let done = w.wait_for(&id, Duration::from_secs(1), |j| j["status"] == "succeeded").await;
    assert_eq!(done["status"], "succeeded");
}

#[tokio::test]
async fn executor_returns_records_to_the_queue_only_when_the_database_is_unreachable() {
    let w = World::new().await;
    let id = JobId::new().to_string();
    let event: SqsEvent = serde_json::from_str(&fixture("sqs_work_batch.json", &[("JOB_ID", &id)])).unwrap();
    let mut settings = crate::support::test_settings();
    settings.pool.wait_timeout = Duration::from_millis(500);
    let down = Platform::new("postgres://relay@127.0.0.1:1/relay", settings).unwrap().with_transport(Arc::new(Down));
    let res = lambda::executor::handle(&down.executor(), event.clone(), None).await;
    assert_eq!(failed(&res).len(), 3, "every record returns: nothing could be run or kept");

    // A message for a job that does not exist is acknowledged and kept as a dead letter: a
    // message without a row cannot come from Relay.
    let res = lambda::executor::handle(&w.platform.executor(), event, None).await;
    assert!(res.batch_item_failures.is_empty());
    let kept = w
        .count(
            "SELECT count(*) FROM dead_letters WHERE reason LIKE 'no job % exists%' AND body LIKE '%' || $1 || '%'",
            &[&id],
        )
        .await;
    assert!(kept >= 1, "{kept}");
}

#[tokio::test]
async fn a_lambda_container_reconnects_after_its_connection_is_dropped() {
    let (w, url, arn) = sqs_world("reconnect").await;
    let p = lambda_platform(&w, &url, &crate::support::database_url());
    let exec = p.executor();
    for round in 0..3 {
        let (_, job) = w.submit(&format!("rc-{round}"), json!({"task_type": "noop"})).await;
        let event = moto::receive_event(&url, &arn, 1).await;
        assert_eq!(event.records.len(), 1);
        let res = lambda::executor::handle(&exec, event.clone(), None).await;
        assert!(res.batch_item_failures.is_empty(), "round {round}: {:?}", failed(&res));
        moto::delete_acknowledged(&url, &event, &failed(&res)).await;
        let id = job["id"].as_str().unwrap();
        assert_eq!(w.wait_for(id, Duration::from_secs(1), |j| j["status"] == "succeeded").await["status"], "succeeded");
        // The proxy (or an outage) drops the container's one connection between invocations.
        let pids = backend_pids(&p).await;
        let killed = w
            .count("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid", &[&pids])
            .await;
        assert_eq!(killed, 1, "round {round}");
    }
    assert_eq!(p.pool.status().max_size, 1, "one connection per container");
}

/// The pid of the container's pooled connection.
async fn backend_pids(p: &Platform) -> Vec<i32> {
    let db = p.pool.get().await.unwrap();
    vec![db.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0)]
}

#[tokio::test]
async fn sweeper_handles_a_scheduled_event_and_resends_lost_dispatches() {
    let (w, url, _) = sqs_world("sweeper").await;
    let broken = w.with_transport(Arc::new(Down));
    let (_, job) = broken.submit("lost-1", json!({"task_type": "noop"})).await;
    let unmarked = "SELECT count(*) FROM jobs WHERE dispatched_at IS NULL";
    assert_eq!(w.eventually(unmarked, &[], 1).await, 1, "the failed dispatch cleared its mark");
    assert_eq!(moto::depth(&url).await, 0);
    let event: Value = serde_json::from_str(&fixture("eventbridge_scheduled.json", &[])).unwrap();
    let reports = lambda::sweeper::handle(&w.platform.sweeper(), &event, 2, Duration::from_millis(10)).await.unwrap();
    assert_eq!(reports.len(), 2, "two passes per invocation");
    assert_eq!(reports[0].redispatched, 1);
    assert_eq!(reports[1].redispatched, 0, "a row is re-sent once per grace period");
    let msg = moto::sqs().receive_message().queue_url(&url).send().await.unwrap();
    let body: Value = serde_json::from_str(msg.messages()[0].body().unwrap()).unwrap();
    assert_eq!(body["job_id"], job["id"]);
}

#[tokio::test]
async fn ingress_turns_provider_records_into_jobs_once_and_keeps_what_it_cannot_parse() {
    let (w, url, arn) = sqs_world("ingress").await;
    let p = &w.platform;
    let ingress = Ingress::new(p, "platform");
    let event: SqsEvent = serde_json::from_str(&fixture("sqs_ingress_batch.json", &[])).unwrap();
    let res = ingress.handle(event.clone()).await;
    assert!(res.batch_item_failures.is_empty(), "{:?}", failed(&res));

    let tenant = tenants::by_name(&w.db().await, "platform").await.unwrap().expect("platform tenant created");
    let keys: Vec<String> = w
        .db()
        .await
        .query(
            "SELECT idempotency_key FROM jobs WHERE tenant_id = $1 AND task_type = 'provider.event' ORDER BY 1",
            &[&tenant.id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keys, ["sns:da41e39f-ea4d-435a-b922-c6aae3915ebe", "sqs:d9b3c2a1-5e6f-4a7b-8c9d-0e1f2a3b4c5d"]);
    let params: Value =
        w.db().await.query_one("SELECT params FROM jobs WHERE idempotency_key LIKE 'sns:%'", &[]).await.unwrap().get(0);
    assert_eq!(params["source"], "arn:aws:sns:eu-west-1:123456789012:relay-ses-events");
    assert_eq!(params["message"]["eventType"], "Delivery", "the SNS Message is kept as parsed JSON");
    assert_eq!(params["message"]["mail"]["tags"]["relay_correlation_id"][0], "order-4711");
    let correlation: String = w
        .db()
        .await
        .query_one("SELECT correlation_id FROM jobs WHERE idempotency_key LIKE 'sns:%'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        correlation, "order-4711",
        "the event joins the message's correlation id (SES's tag, as Relay sends it)"
    );
    let kept = dead_letters::recent(&w.db().await, 10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert!(kept[0].body.starts_with("From: someone@example.org\r\n"), "kept whole");
    assert!(kept[0].reason.contains("not JSON"), "{}", kept[0].reason);
    assert_eq!(kept[0].source, "ingress:arn:aws:sqs:eu-west-1:123456789012:relay-ingress");

    // Redelivery of the whole batch: no new job, no second dead letter.
    let res = ingress.handle(event).await;
    assert!(res.batch_item_failures.is_empty());
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 2);
    assert_eq!(w.count("SELECT count(*) FROM dead_letters", &[]).await, 1);

    // Never processed inline: the jobs went to the work queue, and the executor runs them.
    let work = moto::receive_event(&url, &arn, 1).await;
    assert_eq!(work.records.len(), 2);
    let res = lambda::executor::handle(&p.executor(), work, None).await;
    assert!(res.batch_item_failures.is_empty());
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'succeeded'", &[]).await, 2);
}

#[tokio::test]
async fn ingress_returns_records_to_the_queue_when_the_database_is_unreachable() {
    let mut settings = crate::support::test_settings();
    settings.pool.wait_timeout = Duration::from_millis(500);
    let down = Platform::new("postgres://relay@127.0.0.1:1/relay", settings).unwrap().with_transport(Arc::new(Down));
    let ingress = Ingress::new(&down, "platform");
    let event: SqsEvent = serde_json::from_str(&fixture("sqs_ingress_batch.json", &[])).unwrap();
    assert_eq!(failed(&ingress.handle(event).await).len(), 3);
}

#[tokio::test]
async fn the_console_function_serves_its_page_on_its_own() {
    // A function URL event for `/`; the console has no database and one project that is down.
    let mut event: Value =
        serde_json::from_str(&fixture("apigw_v2_get_job.json", &[("API_KEY", "none"), ("JOB_ID", "x")])).unwrap();
    event["rawPath"] = json!("/");
    event["requestContext"]["http"]["path"] = json!("/");
    event["requestContext"]["http"]["method"] = json!("GET");
    let cfg = relay_console::ConsoleConfig::parse(
        r#"{"projects": [{"name": "gone", "status_url": "http://127.0.0.1:1/v1/status"}], "timeout_seconds": 1}"#,
        "test",
    )
    .unwrap();
    let router = relay_console::lambda::router(cfg).unwrap();
    let req = lambda_http::request::from_str(&event.to_string()).expect("an API Gateway v2 event");
    let res = router.oneshot(req).await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let html = String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(html.contains(r#"data-project="gone" data-state="unreachable""#), "{html}");
}

/// A job goes intake (API Gateway v2 event) → SQS (moto) → executor handler → Postgres, with
/// the SQS transport, as it does on AWS.
#[tokio::test]
async fn a_job_runs_end_to_end_through_intake_sqs_and_the_executor() {
    let (w, url, arn) = sqs_world("e2e").await;
    let p = lambda_platform(&w, &url, &crate::support::database_url());
    let intake = taskdeck::api::router(p.app_state());
    let event = fixture("apigw_v2_submit_job.json", &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", "e2e-1")]);
    let (status, job) = invoke_http(&intake, &event).await;
    assert_eq!(status, 202);
    let batch = moto::receive_event(&url, &arn, 2).await;
    assert_eq!(batch.records.len(), 1, "one message for one committed row");
    let body: Value = serde_json::from_str(batch.records[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(body.as_object().unwrap().keys().collect::<Vec<_>>(), ["job_id", "run_at"]);
    let res = lambda::executor::handle(&p.executor(), batch.clone(), None).await;
    moto::delete_acknowledged(&url, &batch, &failed(&res)).await;
    let get = fixture("apigw_v2_get_job.json", &[("API_KEY", &w.key), ("JOB_ID", job["id"].as_str().unwrap())]);
    let (_, done) = invoke_http(&intake, &get).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["result"], json!({"echo": "from api gateway"}));
    assert_eq!(moto::depth(&url).await, 0, "the acknowledged message is gone");
}

/// On Lambda an attempt lives inside one executor invocation: intake refuses a timeout that no
/// invocation can give (900 s less the 5 s reserve), naming the limit.
#[tokio::test]
async fn on_lambda_intake_refuses_a_timeout_no_executor_invocation_can_give() {
    let (w, url, _) = sqs_world("limit").await;
    let p = lambda_platform(&w, &url, &crate::support::database_url());
    let intake = taskdeck::api::router(p.app_state());
    let submit = |key: &str, timeout: i32| {
        let mut event: Value = serde_json::from_str(&fixture(
            "apigw_v2_submit_job.json",
            &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", key)],
        ))
        .unwrap();
        event["body"] = json!(json!({"task_type": "noop", "timeout_seconds": timeout}).to_string());
        event["headers"].as_object_mut().unwrap().remove("content-length");
        event.to_string()
    };
    let (status, err) = invoke_http(&intake, &submit("too-long", 896)).await;
    assert_eq!(status, 422, "{err}");
    assert_eq!((&err["error"]["field"], &err["error"]["limit"]), (&json!("timeout_seconds"), &json!(895)), "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("between 1 and 895"), "{err}");
    let (status, _) = invoke_http(&intake, &submit("fits", 895)).await;
    assert_eq!(status, 202);
    // Elsewhere (the Postgres transport) the day-long limit stands.
    let (status, _) = w.submit("long-elsewhere", json!({"task_type": "noop", "timeout_seconds": 3600})).await;
    assert_eq!(status, 202);
}

/// Item 6 of issue 31: the re-send loop ends. A job that does not fit the time an invocation
/// has left is re-sent with a doubling backoff (not at once, for ever), and one whose timeout
/// no executor invocation can give (a row from before the limit, or written around intake)
/// fails for good at once, with the reason, through the one terminal path (an exception).
#[tokio::test]
async fn the_resend_loop_backs_off_and_a_job_that_can_never_fit_fails_for_good() {
    let (w, url, arn) = sqs_world("never-fits").await;
    let p = lambda_platform(&w, &url, &crate::support::database_url());
    let exec = p.executor();
    let deadline = || Some(std::time::SystemTime::now() + Duration::from_secs(8));
    // Fits a fresh invocation (895 s), not one with 8 s left: re-sent, each time later.
    let (_, fits) = w.submit("later", json!({"task_type": "noop", "timeout_seconds": 60})).await;
    let fits = fits["id"].as_str().unwrap().to_owned();
    let mut delays = Vec::new();
    for round in 0..3 {
        let event = moto::receive_event(&url, &arn, 20).await;
        assert_eq!(event.records.len(), 1, "round {round}: the re-sent message arrives");
        let res = lambda::executor::handle(&exec, event.clone(), deadline()).await;
        assert!(res.batch_item_failures.is_empty());
        moto::delete_acknowledged(&url, &event, &[]).await;
        let row = w
            .db()
            .await
            .query_one(
                "SELECT extract(epoch FROM run_at - now())::float8, resends, attempt FROM jobs WHERE id::text = $1",
                &[&fits],
            )
            .await
            .unwrap();
        let (delay, resends, attempt): (f64, i16, i32) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((resends, attempt), (round + 1, 0), "round {round}: counted, never charged an attempt");
        delays.push(delay);
    }
    assert!(delays[0] < 0.5 && delays[1] > 0.0 && delays[2] > delays[1] + 0.5, "a doubling backoff: {delays:?}");

    // Can never fit: 3600 s (accepted by the Postgres transport's day-long limit).
    let (_, never) = w.submit("never", json!({"task_type": "noop", "timeout_seconds": 3600})).await;
    let never = never["id"].as_str().unwrap().to_owned();
    let event = moto::receive_event(&url, &arn, 2).await;
    let mut only_never = SqsEvent::default();
    only_never.records =
        event.records.into_iter().filter(|r| r.body.as_deref().unwrap_or_default().contains(&never)).collect();
    let event = only_never;
    assert_eq!(event.records.len(), 1);
    let res = lambda::executor::handle(&exec, event.clone(), deadline()).await;
    assert!(res.batch_item_failures.is_empty());
    let job = w.wait_for(&never, Duration::from_secs(2), |j| j["status"] == "failed").await;
    assert_eq!(job["status"], "failed", "{job}");
    let error = job["error"].as_str().or(job["last_error"].as_str()).unwrap_or_default().to_owned();
    let events = w.call(axum::http::Method::GET, &format!("/v1/jobs/{never}/events"), None, None).await.1.to_string();
    assert!(
        format!("{error}{events}")
            .contains("its timeout (3600 s) exceeds the 895 s the longest executor invocation can give"),
        "{job} {events}"
    );
    let opened =
        w.count("SELECT count(*) FROM exceptions WHERE job_id::text = $1 AND kind = 'fatal_error'", &[&never]).await;
    assert_eq!(opened, 1, "the one terminal path opened an exception");
}
