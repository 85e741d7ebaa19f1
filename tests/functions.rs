//! The real function binaries (`functions/*`, built by cargo) run as child processes under the
//! Runtime API stand-in (`support::runtime_api`), with moto for AWS and the real Postgres: the
//! runtime loop, config, init errors and the invocation's deadline as on Lambda.

use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use serde_json::{Value, json};

use crate::lambda::{fixture, sqs_world};
use crate::support::runtime_api::{Function, Invoked};
use crate::support::{World, database_url, moto};

/// The variables a function needs on this test's schema and queue.
pub(crate) fn env_for(w: &World, queue_url: &str) -> Vec<(&'static str, String)> {
    let base = database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    vec![
        ("DATABASE_URL", format!("{base}{sep}options=-c%20search_path%3D{}", w.schema)),
        ("RELAY_WORK_QUEUE_URL", queue_url.to_owned()),
        ("AWS_ENDPOINT_URL", moto::endpoint().to_owned()),
        ("RELAY_DB_WAIT_SECONDS", "2".to_owned()),
    ]
}

/// The event source mapping, once: receive up to 10 visible messages, invoke the function
/// with them, delete what the partial batch response does not name and make the named records
/// visible again (a function error or timeout returns the whole batch). `None`: nothing came.
pub(crate) async fn deliver(f: &mut Function, url: &str, arn: &str, timeout: Duration) -> Option<(SqsEvent, Invoked)> {
    let event = moto::receive_event(url, arn, 2).await;
    if event.records.is_empty() {
        return None;
    }
    let invoked = f.invoke(&serde_json::to_value(&event).expect("event as JSON"), timeout).await;
    let named: Vec<String> = match &invoked {
        Invoked::Response(r) => r["batchItemFailures"]
            .as_array()
            .map(|a| a.iter().filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default(),
        _ => event.records.iter().filter_map(|r| r.message_id.clone()).collect(),
    };
    moto::delete_acknowledged(url, &event, &named).await;
    for r in event.records.iter().filter(|r| r.message_id.as_ref().is_some_and(|m| named.contains(m))) {
        let handle = r.receipt_handle.as_deref().expect("receipt handle");
        moto::sqs()
            .change_message_visibility()
            .queue_url(url)
            .receipt_handle(handle)
            .visibility_timeout(0)
            .send()
            .await
            .expect("visible again");
    }
    Some((event, invoked))
}

pub(crate) fn response(invoked: Invoked) -> Value {
    match invoked {
        Invoked::Response(v) => v,
        other => panic!("expected a response, got {other:?}"),
    }
}

#[tokio::test]
async fn an_api_gateway_request_runs_through_the_intake_queue_and_executor_binaries() {
    let (w, url, arn) = sqs_world("fn-e2e").await;
    let env = env_for(&w, &url);
    let mut intake = Function::start("intake", &env).await;
    let mut executor = Function::start("executor", &env).await;
    let event: Value = serde_json::from_str(&fixture(
        "apigw_v2_submit_job.json",
        &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", "fn-e2e-1")],
    ))
    .unwrap();
    let answer = response(intake.invoke(&event, Duration::from_secs(30)).await);
    assert_eq!(answer["statusCode"], 202, "{answer}");
    let job: Value = serde_json::from_str(answer["body"].as_str().expect("a body")).unwrap();
    let id = job["id"].as_str().unwrap();

    // The job's default timeout (300 s) must fit in what the invocation has left, as on AWS.
    let (batch, invoked) =
        deliver(&mut executor, &url, &arn, Duration::from_secs(400)).await.expect("the job's message");
    assert_eq!(batch.records.len(), 1);
    assert_eq!(response(invoked)["batchItemFailures"], json!([]));
    let done = w.wait_for(id, Duration::from_secs(5), |j| j["status"] == "succeeded").await;
    assert_eq!((&done["status"], &done["result"]), (&json!("succeeded"), &json!({"echo": "from api gateway"})));
    assert_eq!(moto::depth(&url).await, 0, "the acknowledged message was deleted");
    assert_eq!((intake.starts, executor.starts), (1, 1), "one container each served everything");
}

/// Ten jobs in one delivery, one of which cannot finish before the invocation's deadline:
/// the nine are recorded within the invocation, the tenth is not started (no attempt charged,
/// a reason in its events), comes back in a later delivery and runs once.
#[tokio::test]
async fn a_batch_under_a_deadline_records_nine_and_defers_the_job_that_cannot_fit() {
    let (w, url, arn) = sqs_world("fn-deadline").await;
    let mut env = env_for(&w, &url);
    env.push(("RELAY_DEADLINE_RESERVE_SECONDS", "1".into()));
    let mut executor = Function::start("executor", &env).await;
    // Warm: the 4 s below are the batch's, not the cold start's (a loaded machine starts slowly).
    let warm = executor.invoke(&json!({"Records": []}), Duration::from_secs(60)).await;
    assert_eq!(response(warm)["batchItemFailures"], json!([]));
    let mut quick = Vec::new();
    for i in 0..9 {
        let (_, job) = w
            .submit(
                &format!("quick-{i}"),
                json!({"task_type": "sleep", "params": {"seconds": 0.2}, "timeout_seconds": 2}),
            )
            .await;
        quick.push(job["id"].as_str().unwrap().to_owned());
    }
    let (_, long) =
        w.submit("long", json!({"task_type": "sleep", "params": {"seconds": 6}, "timeout_seconds": 8})).await;
    let long = long["id"].as_str().unwrap().to_owned();

    // A 4 s invocation: 3 s fit after the reserve; the long job's 8 s do not.
    let (batch, invoked) = deliver(&mut executor, &url, &arn, Duration::from_secs(4)).await.expect("ten messages");
    assert_eq!(batch.records.len(), 10, "one delivery of ten");
    assert_eq!(
        response(invoked)["batchItemFailures"],
        json!([]),
        "the deferred job was sent again, so its message is done"
    );
    let succeeded = "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND attempt = 1 AND id::text = ANY($1)";
    assert_eq!(w.count(succeeded, &[&quick]).await, 9, "the nine outcomes were recorded within the invocation");
    let (status, attempt): (String, i32) = {
        let row =
            w.db().await.query_one("SELECT status, attempt FROM jobs WHERE id::text = $1", &[&long]).await.unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((status.as_str(), attempt), ("pending", 0), "not started, not charged an attempt");
    let (_, events) = w.call(axum::http::Method::GET, &format!("/v1/jobs/{long}/events"), None, None).await;
    let reasons: Vec<&str> = events["events"].as_array().unwrap().iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons.iter().any(|r| r.contains("its timeout (8 s) does not fit")), "{events}");

    // The later delivery (a fresh invocation with its full time) runs it, once.
    let (again, invoked) =
        deliver(&mut executor, &url, &arn, Duration::from_secs(20)).await.expect("the re-sent message");
    assert_eq!(again.records.len(), 1);
    assert_eq!(response(invoked)["batchItemFailures"], json!([]));
    let done = w.wait_for(&long, Duration::from_secs(2), |j| j["status"] == "succeeded").await;
    assert_eq!((&done["status"], &done["attempt"]), (&json!("succeeded"), &json!(1)), "{done}");
    assert_eq!(executor.starts, 1, "no invocation ran past its deadline");
}

#[tokio::test]
async fn the_sweeper_binary_accepts_the_schedulers_payload_a_rules_an_empty_and_a_custom_one() {
    let (w, url, _) = sqs_world("fn-sweeper").await;
    let mut env = env_for(&w, &url);
    env.extend([("RELAY_SWEEP_PASSES", "1".to_owned()), ("RELAY_SWEEP_GAP_SECONDS", "0".to_owned())]);
    let mut sweeper = Function::start("sweeper", &env).await;
    let scheduler: Value = serde_json::from_str(&fixture("scheduler_default.json", &[])).unwrap();
    assert_eq!(scheduler["detail"], json!("{}"), "EventBridge Scheduler sends detail as a string");
    let rule: Value = serde_json::from_str(&fixture("eventbridge_scheduled.json", &[])).unwrap();
    for payload in [scheduler, rule, json!({}), json!({"reason": "operator run"})] {
        let reports = response(sweeper.invoke(&payload, Duration::from_secs(20)).await);
        assert_eq!(reports.as_array().map(Vec::len), Some(1), "one pass for {payload}: {reports}");
    }
}

/// The sweeper Lambda reads the SES account's rate and quota (`GetAccount`, through the SES
/// stand-in, which passes everything else on to moto), so sends keep SES's own rate with no
/// operator setting.
#[tokio::test]
async fn the_sweeper_binary_reads_the_ses_accounts_rate_and_quota() {
    use relay::ses_standin::{self, Faults};
    use taskdeck::store::send_rates::{self, Scope};
    let (w, url, _) = sqs_world("fn-sweeper-ses").await;
    let ses = ses_standin::start(moto::endpoint(), Faults { account: Some((14.0, 50_000.0)), ..Faults::default() }, 1)
        .expect("the SES stand-in");
    let mut env = env_for(&w, &url);
    env.retain(|(k, _)| *k != "AWS_ENDPOINT_URL");
    env.extend([
        ("AWS_ENDPOINT_URL", ses.url.clone()),
        ("RELAY_SWEEP_PASSES", "1".to_owned()),
        ("RELAY_SWEEP_GAP_SECONDS", "0".to_owned()),
    ]);
    let mut sweeper = Function::start("sweeper", &env).await;
    let reports = response(sweeper.invoke(&json!({}), Duration::from_secs(20)).await);
    assert_eq!(reports[0]["ses_account_read"], json!(true), "{reports}");
    let account = send_rates::get(&w.db().await, Scope::Account, "default").await.unwrap().expect("the account's row");
    assert_eq!((account.provider_rate, account.max_24h), (Some(14.0), Some(50_000.0)));
    assert_eq!(account.read_error, None);
}

#[tokio::test]
async fn a_missing_variable_fails_the_init_and_the_init_error_names_it() {
    let w = World::new().await;
    let env: Vec<_> = env_for(&w, "http://unused").into_iter().filter(|(k, _)| *k != "RELAY_WORK_QUEUE_URL").collect();
    let mut executor = Function::start("executor", &env).await;
    let (headers, body) = executor.api.init_error(Duration::from_secs(20)).await.expect("an init error reported");
    assert_eq!(headers["lambda-runtime-function-error-type"], "Runtime.InitError");
    assert!(body["errorMessage"].as_str().unwrap().contains("RELAY_WORK_QUEUE_URL is not set"), "{body}");
    let status = executor.exited(Duration::from_secs(10)).await.expect("the process ends");
    assert!(!status.success());
}

/// Item 7 of issue 31: a long job has its own lane. The short lane's executor (batches of ten,
/// a short timeout) sends a job whose timeout it cannot give to the long lane's queue and
/// records the nine short ones at once; its invocation ends without waiting for the long job,
/// which the long lane's executor (batch size 1) then runs.
#[tokio::test]
async fn a_long_job_goes_to_its_own_lane_and_the_short_lanes_invocation_does_not_wait_for_it() {
    let (w, url, arn) = sqs_world("fn-lanes").await;
    let (long_url, long_arn) = moto::queue("fn-lanes-long").await;
    let mut short_env = env_for(&w, &url);
    short_env.extend([
        ("RELAY_DEADLINE_RESERVE_SECONDS", "1".to_owned()),
        ("RELAY_EXECUTOR_TIMEOUT_SECONDS", "60".to_owned()),
        ("RELAY_LANE_TIMEOUT_SECONDS", "10".to_owned()),
        ("RELAY_LONG_QUEUE_URL", long_url.clone()),
    ]);
    let mut long_env = env_for(&w, &url);
    long_env.extend([
        ("RELAY_DEADLINE_RESERVE_SECONDS", "1".to_owned()),
        ("RELAY_EXECUTOR_TIMEOUT_SECONDS", "60".to_owned()),
    ]);
    let mut short = Function::start("executor", &short_env).await;
    let mut long = Function::start("executor", &long_env).await;
    for f in [&mut short, &mut long] {
        let warm = f.invoke(&json!({"Records": []}), Duration::from_secs(60)).await;
        assert_eq!(response(warm)["batchItemFailures"], json!([]));
    }
    let mut quick = Vec::new();
    for i in 0..9 {
        let body = json!({"task_type": "sleep", "params": {"seconds": 0.2}, "timeout_seconds": 2});
        quick.push(w.submit(&format!("lane-quick-{i}"), body).await.1["id"].as_str().unwrap().to_owned());
    }
    let body = json!({"task_type": "sleep", "params": {"seconds": 4}, "timeout_seconds": 12});
    let long_id = w.submit("lane-long", body).await.1["id"].as_str().unwrap().to_owned();

    // The short lane's invocation (10 s, as its Timeout) gets all ten and ends with the nine.
    let started = std::time::Instant::now();
    let (batch, invoked) = deliver(&mut short, &url, &arn, Duration::from_secs(10)).await.expect("ten messages");
    let took = started.elapsed();
    assert_eq!(batch.records.len(), 10);
    assert_eq!(response(invoked)["batchItemFailures"], json!([]));
    assert!(took < Duration::from_secs(3), "the short lane did not wait for the 4 s job: {took:?}");
    let succeeded = "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND id::text = ANY($1)";
    assert_eq!(w.count(succeeded, &[&quick]).await, 9);
    let (_, events) = w.call(axum::http::Method::GET, &format!("/v1/jobs/{long_id}/events"), None, None).await;
    assert!(events.to_string().contains("sent to the long-job lane"), "{events}");
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE attempt = 0 AND id::text = $1", &[&long_id]).await, 1);
    assert_eq!((moto::depth(&url).await, moto::depth(&long_url).await), (0, 1), "handed to the long lane's queue");

    // The long lane runs it, alone in its invocation.
    let (one, invoked) = deliver(&mut long, &long_url, &long_arn, Duration::from_secs(30)).await.expect("the long job");
    assert_eq!(one.records.len(), 1);
    assert_eq!(response(invoked)["batchItemFailures"], json!([]));
    let done = w.wait_for(&long_id, Duration::from_secs(2), |j| j["status"] == "succeeded").await;
    assert_eq!((&done["status"], &done["attempt"]), (&json!("succeeded"), &json!(1)), "{done}");
}

/// A database outage, seen by the metrics: the executor and intake answer it without failing
/// their invocations (records returned, a 503), so only their EMF metrics show it —
/// `DatabaseErrors`, also published without a dimension for the outage alarm. The same
/// functions with the database up print zero.
#[tokio::test]
async fn a_database_outage_raises_the_outage_metric() {
    let (w, url, arn) = sqs_world("fn-outage").await;
    let up = env_for(&w, &url);
    let mut down = up.clone();
    down[0].1 = "postgres://relay@127.0.0.1:1/relay".into();
    let errors = |docs: &[Value]| -> f64 { docs.iter().filter_map(|d| d["DatabaseErrors"].as_f64()).sum() };
    for (db, expect_errors) in [("up", false), ("down", true)] {
        let env = if db == "up" { &up } else { &down };
        let mut executor = Function::start("executor", env).await;
        let mut intake = Function::start("intake", env).await;
        let (_, job) = w.submit(&format!("outage-{db}"), json!({"task_type": "noop"})).await;
        assert!(job["id"].is_string());
        // The jobs' default timeout (300 s) must fit in what the invocation has left.
        let (batch, invoked) = deliver(&mut executor, &url, &arn, Duration::from_secs(400)).await.expect("a message");
        let returned = response(invoked)["batchItemFailures"].as_array().map(Vec::len);
        assert_eq!(returned, Some(if expect_errors { batch.records.len() } else { 0 }), "{db}");
        let event: Value = serde_json::from_str(&fixture(
            "apigw_v2_submit_job.json",
            &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", &format!("outage-api-{db}"))],
        ))
        .unwrap();
        let answer = response(intake.invoke(&event, Duration::from_secs(30)).await);
        assert_eq!(answer["statusCode"], if expect_errors { 503 } else { 202 }, "{db}: {answer}");
        if !expect_errors {
            // Let the next round's executor see only its own message.
            let (rest, _) = deliver(&mut executor, &url, &arn, Duration::from_secs(400)).await.expect("the API's job");
            assert_eq!(rest.records.len(), 1);
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // the last stdout lines
        for (name, f) in [("executor", &executor), ("intake", &intake)] {
            let docs = f.metrics();
            assert!(!docs.is_empty(), "{db}: {name} printed its metrics");
            let n = errors(&docs);
            assert_eq!(n > 0.0, expect_errors, "{db}: {name} DatabaseErrors = {n}: {docs:?}");
            if expect_errors {
                let summed =
                    docs.iter().any(|d| {
                        d["_aws"]["CloudWatchMetrics"].as_array().into_iter().flatten().any(|m| {
                            m["Dimensions"][0] == json!([]) && m["Metrics"].to_string().contains("DatabaseErrors")
                        })
                    });
                assert!(summed, "{name}: DatabaseErrors is published without a dimension: {docs:?}");
            }
        }
        if !expect_errors {
            let claimed: f64 = executor.metrics().iter().filter_map(|d| d["Claimed"].as_f64()).sum();
            assert_eq!(claimed, 2.0, "the healthy executor counts its claims");
        }
    }
}

/// The console function's tokens come from Secrets Manager (moto here), not its environment:
/// the project it polls receives the token from the secret.
#[tokio::test]
async fn the_console_function_reads_its_tokens_from_secrets_manager() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let project = axum::Router::new().route(
        "/v1/status",
        axum::routing::get(move |h: axum::http::HeaderMap| async move {
            let auth = h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            record.lock().unwrap().push(auth);
            (axum::http::StatusCode::UNAUTHORIZED, "{}")
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, project).await });
    let name = format!("relay-console-tokens-{}", uuid::Uuid::now_v7().simple());
    let sm = aws_sdk_secretsmanager::Client::new(&moto::sdk_config());
    let arn = sm
        .create_secret()
        .name(&name)
        .secret_string(r#"{"shop": "rs_from_the_secret"}"#)
        .send()
        .await
        .unwrap()
        .arn
        .unwrap();
    let env = vec![
        (
            "RELAY_CONSOLE_PROJECTS",
            json!({"projects": [{"name": "shop", "status_url": format!("http://{addr}/v1/status")}], "timeout_seconds": 2})
                .to_string(),
        ),
        ("RELAY_CONSOLE_TOKENS_SECRET", arn),
        ("AWS_ENDPOINT_URL", moto::endpoint().to_owned()),
    ];
    let mut console = Function::start("console", &env).await;
    let mut event: Value =
        serde_json::from_str(&fixture("apigw_v2_get_job.json", &[("API_KEY", "none"), ("JOB_ID", "x")])).unwrap();
    event["rawPath"] = json!("/");
    event["requestContext"]["http"]["path"] = json!("/");
    let page = response(console.invoke(&event, Duration::from_secs(30)).await);
    assert_eq!(page["statusCode"], 200, "{page}");
    assert_eq!(seen.lock().unwrap().first().map(String::as_str), Some("Bearer rs_from_the_secret"));

    // A secret naming no project fails the init, naming the variable.
    let bad = sm.create_secret().name(format!("{name}-bad")).secret_string(r#"{"nope": "x"}"#).send().await.unwrap();
    let mut env = env;
    env[1].1 = bad.arn.unwrap();
    let broken = Function::start("console", &env).await;
    let (_, body) = broken.api.init_error(Duration::from_secs(20)).await.expect("an init error");
    assert!(
        body["errorMessage"].as_str().unwrap().contains("RELAY_CONSOLE_TOKENS_SECRET: a token for \"nope\""),
        "{body}"
    );
}

/// The JSON lines a function printed that are logs (not EMF documents).
fn log_lines(f: &Function) -> Vec<Value> {
    let lines = f.stdout.lock().unwrap();
    lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|v| v.get("_aws").is_none()).collect()
}

/// A log line in the Lambda Powertools shape, flat: when, how bad, what, which service,
/// whether the container was cold, which invocation and trace.
fn assert_powertools_shaped(name: &str, line: &Value) {
    let ts = line["timestamp"].as_str().unwrap_or_else(|| panic!("{name}: a timestamp: {line}"));
    assert!(chrono::DateTime::parse_from_rfc3339(ts).is_ok(), "{name}: an RFC 3339 timestamp: {line}");
    assert!(["DEBUG", "INFO", "WARN", "ERROR"].contains(&line["level"].as_str().unwrap_or_default()), "{name}: {line}");
    assert!(line["message"].as_str().is_some_and(|m| !m.is_empty()), "{name}: a message at the top level: {line}");
    assert_eq!(line["service"], name, "{name}: {line}");
    assert!(line["cold_start"].is_boolean(), "{name}: cold_start: {line}");
    assert!(line["function_request_id"].as_str().is_some_and(|r| !r.is_empty()), "{name}: the request id: {line}");
    assert_eq!(line["xray_trace_id"], crate::support::runtime_api::TRACE_ID, "{name}: {line}");
    for nested in ["fields", "span", "spans"] {
        assert!(line.get(nested).is_none(), "{name}: nothing nested under {nested}: {line}");
    }
}

/// Every function's log lines parse as Powertools-shaped JSON (`relay_runtime`), the job's
/// lines carry its correlation id at the top level, and each container's first metrics line
/// is Powertools' `ColdStart`.
#[tokio::test]
async fn every_function_logs_powertools_shaped_json_and_counts_its_cold_start() {
    let (w, url, arn) = sqs_world("fn-logs").await;
    let aws = crate::support::aws_standin::AwsStandIn::start(vec![]).await;
    let with = |service: &str, extra: &[(&'static str, String)]| {
        let mut env = env_for(&w, &url);
        env.extend([("RELAY_LOG", "info".to_owned()), ("POWERTOOLS_SERVICE_NAME", service.to_owned())]);
        env.extend(extra.iter().cloned());
        env
    };
    let mut intake = Function::start("intake", &with("intake", &[])).await;
    // The job's own line (`relay.job.started`, inside its span) is a debug one.
    let mut executor =
        Function::start("executor", &with("executor", &[("RELAY_LOG", "info,taskdeck=debug".into())])).await;
    let mut sweeper = Function::start("sweeper", &with("sweeper", &[("RELAY_SWEEP_PASSES", "1".into())])).await;
    let mut ingress = Function::start("ingress", &with("ingress", &[])).await;
    let mut admin = Function::start("admin", &with("admin", &[])).await;
    let hook_env = [
        ("RELAY_PRETRAFFIC_INTAKE", "relay-intake".to_owned()),
        ("RELAY_PRETRAFFIC_EXECUTOR", "relay-executor".to_owned()),
        ("AWS_ENDPOINT_URL_LAMBDA", aws.url.clone()),
        ("AWS_ENDPOINT_URL_CODEDEPLOY", aws.url.clone()),
    ];
    let mut hook = Function::start("pretraffic", &with("pretraffic", &hook_env)).await;
    let console_env = [
        ("RELAY_LOG", "info".to_owned()),
        ("POWERTOOLS_SERVICE_NAME", "console".to_owned()),
        (
            "RELAY_CONSOLE_PROJECTS",
            json!({"projects": [{"name": "gone", "status_url": "http://127.0.0.1:1/v1/status"}], "timeout_seconds": 1})
                .to_string(),
        ),
    ];
    let mut console = Function::start("console", &console_env).await;

    let correlation = format!("fn-logs-{}", uuid::Uuid::now_v7());
    let mut event: Value = serde_json::from_str(&fixture(
        "apigw_v2_submit_job.json",
        &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", "fn-logs-1")],
    ))
    .unwrap();
    let mut body: Value = serde_json::from_str(event["body"].as_str().unwrap()).unwrap();
    body["correlation_id"] = json!(correlation);
    event["body"] = json!(body.to_string());
    assert_eq!(response(intake.invoke(&event, Duration::from_secs(30)).await)["statusCode"], 202);
    let (_, ran) = deliver(&mut executor, &url, &arn, Duration::from_secs(400)).await.expect("the job's message");
    assert_eq!(response(ran)["batchItemFailures"], json!([]));
    assert!(matches!(sweeper.invoke(&json!({}), Duration::from_secs(30)).await, Invoked::Response(_)));
    let unparseable = json!({"Records": [{"messageId": "m-logs", "receiptHandle": "r", "body": "not json",
        "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}, "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:relay-ingress"}]});
    assert!(matches!(ingress.invoke(&unparseable, Duration::from_secs(30)).await, Invoked::Response(_)));
    let refused = json!({"action": "nothing.such", "actor": "fn-logs"});
    assert_eq!(response(admin.invoke(&refused, Duration::from_secs(30)).await)["ok"], false);
    let _ = hook.invoke(&json!({}), Duration::from_secs(60)).await;
    let mut page: Value =
        serde_json::from_str(&fixture("apigw_v2_get_job.json", &[("API_KEY", "none"), ("JOB_ID", "x")])).unwrap();
    page["rawPath"] = json!("/");
    page["requestContext"]["http"]["path"] = json!("/");
    assert_eq!(response(console.invoke(&page, Duration::from_secs(30)).await)["statusCode"], 200);
    tokio::time::sleep(Duration::from_millis(300)).await; // the last stdout lines

    for (name, f) in [
        ("intake", &intake),
        ("executor", &executor),
        ("sweeper", &sweeper),
        ("ingress", &ingress),
        ("admin", &admin),
        ("pretraffic", &hook),
        ("console", &console),
    ] {
        let lines = log_lines(f);
        let during: Vec<&Value> = lines.iter().filter(|l| l.get("function_request_id").is_some()).collect();
        assert!(!during.is_empty(), "{name} logged inside its invocation: {lines:#?}");
        for line in &during {
            assert_powertools_shaped(name, line);
        }
        assert_eq!(during[0]["cold_start"], true, "{name}: the container's first invocation is cold");
        if name != "console" {
            // The console links no platform and prints no metrics.
            let docs = f.metrics();
            assert_eq!(docs.first().map(|d| &d["ColdStart"]), Some(&json!(1)), "{name}: ColdStart first: {docs:?}");
            assert_eq!(docs.iter().filter(|d| d.get("ColdStart").is_some()).count(), 1, "{name}: once");
        }
    }
    let lines = log_lines(&executor);
    assert!(
        lines.iter().any(|l| l["correlation_id"] == correlation.as_str()),
        "the job's lines carry its correlation id at the top level: {lines:#?}"
    );
}

/// In a database outage the ingress function stores nothing: it counts no `Duplicates` (none
/// were found to exist) and returns every record; the sweeper's failed pass fails its invocation
/// with an error type that says what failed, not a boxed error's Rust type name.
#[tokio::test]
async fn in_an_outage_ingress_counts_no_duplicates_and_the_sweeper_names_its_failure() {
    let (w, url, _) = sqs_world("fn-outage-signals").await;
    let mut down = env_for(&w, &url);
    down[0].1 = "postgres://relay@127.0.0.1:1/relay".into();
    let mut ingress = Function::start("ingress", &down).await;
    let batch: Value = serde_json::from_str(&fixture("sqs_ingress_batch.json", &[])).unwrap();
    let n = batch["Records"].as_array().unwrap().len();
    let answer = response(ingress.invoke(&batch, Duration::from_secs(30)).await);
    assert_eq!(answer["batchItemFailures"].as_array().map(Vec::len), Some(n), "every record returns: {answer}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let docs = ingress.metrics();
    let counted = docs.iter().find(|d| d.get("Received").is_some()).unwrap_or_else(|| panic!("{docs:?}"));
    assert!(counted["Received"].as_f64().unwrap() > 0.0, "{counted}");
    assert_eq!((&counted["Created"], &counted["Duplicates"]), (&json!(0.0), &json!(0.0)), "{counted}");
    assert!(counted["DatabaseErrors"].as_f64().unwrap() >= 1.0, "{counted}");
    let mut sweeper = Function::start("sweeper", &down).await;
    match sweeper.invoke(&json!({}), Duration::from_secs(60)).await {
        Invoked::Error(e) => {
            assert_eq!(e["errorType"], "Relay.SweepFailed", "{e}");
            assert!(e["errorMessage"].as_str().unwrap().starts_with("sweep pass failed: "), "{e}");
        }
        other => panic!("the pass fails the invocation: {other:?}"),
    }
}
