//! The deploy that proves itself: the pre-traffic hook binary (`functions/pretraffic`) under
//! the Runtime API stand-in, reaching the real function binaries through a Lambda Invoke
//! stand-in and reporting to a CodeDeploy stand-in (`support::aws_standin`; moto has neither
//! call), with moto's SQS and the real Postgres. It migrates a bare schema, checks each new
//! version (intake and both executor lanes with a job each, a sweeper pass, an ingress event)
//! and reports Succeeded; with the executor absent or broken it reports Failed, and a live
//! executor consuming the queue cannot make it pass on the old version's work.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::aws_standin::AwsStandIn;
use crate::support::runtime_api::{Function, Invoked};
use crate::support::{bare_schema, database_url, moto};

const INTAKE: &str = "arn:aws:lambda:us-east-1:123456789012:function:relay-intake:7";
const EXECUTOR: &str = "arn:aws:lambda:us-east-1:123456789012:function:relay-executor:7";
/// The other versions a full deployment checks.
const OTHERS: [(&str, &str); 3] = [
    ("RELAY_PRETRAFFIC_EXECUTOR_LONG", "arn:aws:lambda:us-east-1:123456789012:function:relay-executor-long:7"),
    ("RELAY_PRETRAFFIC_SWEEPER", "arn:aws:lambda:us-east-1:123456789012:function:relay-sweeper:7"),
    ("RELAY_PRETRAFFIC_INGRESS", "arn:aws:lambda:us-east-1:123456789012:function:relay-ingress:7"),
];

/// Variables for a function on `schema` and the queue.
fn env_for(schema: &str, queue_url: &str) -> Vec<(&'static str, String)> {
    let base = database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    vec![
        ("DATABASE_URL", format!("{base}{sep}options=-c%20search_path%3D{schema}")),
        ("RELAY_WORK_QUEUE_URL", queue_url.to_owned()),
        ("AWS_ENDPOINT_URL", moto::endpoint().to_owned()),
        ("RELAY_DB_WAIT_SECONDS", "2".to_owned()),
    ]
}

/// The hook, pointed at the stand-in, on `schema`, checking intake and the executor.
async fn hook(schema: &str, queue_url: &str, aws: &AwsStandIn) -> Function {
    hook_with(schema, queue_url, aws, &[]).await
}

/// The same, checking more versions too.
async fn hook_with(schema: &str, queue_url: &str, aws: &AwsStandIn, more: &[(&'static str, &str)]) -> Function {
    let mut env = env_for(schema, queue_url);
    env.extend(more.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env.extend([
        ("RELAY_PRETRAFFIC_INTAKE", INTAKE.to_owned()),
        ("RELAY_PRETRAFFIC_EXECUTOR", EXECUTOR.to_owned()),
        ("RELAY_PRETRAFFIC_WITHIN_SECONDS", "10".to_owned()),
        ("AWS_ENDPOINT_URL_LAMBDA", aws.url.clone()),
        ("AWS_ENDPOINT_URL_CODEDEPLOY", aws.url.clone()),
    ]);
    Function::start("pretraffic", &env).await
}

fn codedeploy_event(id: &str) -> Value {
    json!({"DeploymentId": format!("d-{id}"), "LifecycleEventHookExecutionId": format!("hook-{id}")})
}

async fn db(schema: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.batch_execute(&format!("SET search_path = {schema}")).await.unwrap();
    client
}

fn response(invoked: Invoked) -> Value {
    match invoked {
        Invoked::Response(v) => v,
        other => panic!("expected a response, got {other:?}"),
    }
}

#[tokio::test]
async fn the_hook_migrates_checks_every_new_version_and_reports_succeeded() {
    let schema = bare_schema().await;
    let (url, _) = moto::queue("hook-ok").await;
    let env = env_for(&schema, &url);
    let aws = AwsStandIn::start(vec![
        ("relay-intake", Function::start("intake", &env).await),
        ("relay-executor", Function::start("executor", &env).await),
        ("relay-executor-long", Function::start("executor", &env).await),
        ("relay-sweeper", Function::start("sweeper", &env).await),
        ("relay-ingress", Function::start("ingress", &env).await),
    ])
    .await;
    let mut hook = hook_with(&schema, &url, &aws, &OTHERS).await;
    let verdict = response(hook.invoke(&codedeploy_event("ok"), Duration::from_secs(120)).await);
    assert_eq!(verdict["passed"], true, "{verdict}");
    assert_eq!(
        aws.statuses(),
        [json!({"deploymentId": "d-ok", "lifecycleEventHookExecutionId": "hook-ok", "status": "Succeeded"})]
    );
    // It migrated the bare schema first: every migration is recorded.
    let db = db(&schema).await;
    let migrated: i64 = db.query_one("SELECT count(*) FROM relay_migrations", &[]).await.unwrap().get(0);
    assert_eq!(migrated as usize, taskdeck::store::migrate::MIGRATIONS.len());
    assert_eq!(verdict["migrations_applied"].as_array().map(Vec::len), Some(migrated as usize), "{verdict}");
    // A real job of the deploy-check tenant, run by the executor it handed the job to.
    let id = verdict["job_id"].as_str().expect("the job's id");
    let row = db
        .query_one(
            "SELECT j.status::text, j.task_type, t.name FROM jobs j JOIN tenants t ON t.id = j.tenant_id WHERE j.id::text = $1",
            &[&id],
        )
        .await
        .unwrap();
    let (status, task, tenant): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((status.as_str(), task.as_str(), tenant.as_str()), ("succeeded", "noop", "relay-deploy-check"));
    // The versions named, not the functions' $LATEST or aliases: each new version was
    // invoked (the stand-in's log), and each did its own check.
    let invoked = aws.invoked();
    for f in ["relay-intake", "relay-executor", "relay-executor-long", "relay-sweeper", "relay-ingress"] {
        assert!(invoked.contains(&(f.into(), "7".into())), "{f}: {invoked:?}");
    }
    assert!(invoked.iter().all(|(_, v)| v == "7"), "{invoked:?}");
    let checked = verdict["checked"].as_array().unwrap();
    assert_eq!(checked.len(), 4, "{verdict}");
    assert!(checked[1]["function"].as_str().unwrap().contains("relay-executor-long"), "{verdict}");
    assert!(checked[2]["passes"].as_array().is_some_and(|p| p.len() == 1), "one sweep pass: {verdict}");
    assert_eq!(checked[3]["answer"]["task_type"], "provider.event", "{verdict}");
    // Two jobs, one per executor lane, each run by the version it was handed to; the ingress
    // check stored nothing.
    let done: i64 = db
        .query_one("SELECT count(*) FROM jobs WHERE task_type = 'noop' AND status = 'succeeded'", &[])
        .await
        .unwrap()
        .get(0);
    let other: i64 = db.query_one("SELECT count(*) FROM jobs WHERE task_type <> 'noop'", &[]).await.unwrap().get(0);
    let letters: i64 = db.query_one("SELECT count(*) FROM dead_letters", &[]).await.unwrap().get(0);
    assert_eq!((done, other, letters), (2, 0, 0));

    // A second run (the next function's deployment) migrates nothing and passes again.
    let again = response(hook.invoke(&codedeploy_event("again"), Duration::from_secs(120)).await);
    assert_eq!((&again["passed"], &again["migrations_applied"]), (&json!(true), &json!([])), "{again}");
}

#[tokio::test]
async fn the_hook_reports_failed_when_the_new_executor_is_absent() {
    let schema = bare_schema().await;
    let (url, _) = moto::queue("hook-absent").await;
    let env = env_for(&schema, &url);
    let aws = AwsStandIn::start(vec![("relay-intake", Function::start("intake", &env).await)]).await;
    let mut hook = hook(&schema, &url, &aws).await;
    let verdict = response(hook.invoke(&codedeploy_event("absent"), Duration::from_secs(120)).await);
    assert_eq!(verdict["passed"], false, "{verdict}");
    let reason = verdict["reason"].as_str().unwrap();
    assert!(reason.contains("the executor") && reason.contains("relay-executor"), "{reason}");
    assert_eq!(aws.statuses()[0]["status"], "Failed");
    // The job was accepted by the new intake, and nothing ran it.
    let id = verdict["job_id"].as_str().or(None);
    let db = db(&schema).await;
    let pending: i64 = db
        .query_one("SELECT count(*) FROM jobs WHERE task_type = 'noop' AND status = 'pending'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((pending, id), (1, None), "the job waits; the verdict came from the executor's invocation");
}

#[tokio::test]
async fn the_hook_reports_failed_when_the_new_executor_is_broken() {
    let schema = bare_schema().await;
    let (url, _) = moto::queue("hook-broken").await;
    let env = env_for(&schema, &url);
    // One executor that cannot reach its database, one whose configuration is incomplete.
    let mut no_db = env.clone();
    no_db[0].1 = "postgres://relay@127.0.0.1:1/relay".into();
    let no_queue: Vec<_> = env.iter().filter(|(k, _)| *k != "RELAY_WORK_QUEUE_URL").cloned().collect();
    for (case, executor_env, expect) in
        [("no-db", no_db, "could not claim or record"), ("no-config", no_queue, "RELAY_WORK_QUEUE_URL")]
    {
        let aws = AwsStandIn::start(vec![
            ("relay-intake", Function::start("intake", &env).await),
            ("relay-executor", Function::start("executor", &executor_env).await),
        ])
        .await;
        let mut hook = hook(&schema, &url, &aws).await;
        let verdict = response(hook.invoke(&codedeploy_event(case), Duration::from_secs(120)).await);
        assert_eq!(verdict["passed"], false, "{case}: {verdict}");
        assert!(verdict["reason"].as_str().unwrap().contains(expect), "{case}: {verdict}");
        assert_eq!(
            aws.statuses(),
            [
                json!({"deploymentId": format!("d-{case}"), "lifecycleEventHookExecutionId": format!("hook-{case}"), "status": "Failed"})
            ]
        );
    }
}

/// After a stack's first deploy CodeDeploy runs no hook: the operator invokes it by hand, and
/// a failed check fails that invocation (the CLI exits non-zero) instead of reporting.
#[tokio::test]
async fn invoked_by_hand_a_failed_check_fails_the_invocation() {
    let schema = bare_schema().await;
    let (url, _) = moto::queue("hook-hand").await;
    let aws = AwsStandIn::start(vec![]).await;
    let mut hook = hook(&schema, &url, &aws).await;
    match hook.invoke(&json!({}), Duration::from_secs(120)).await {
        Invoked::Error(e) => {
            assert!(e["errorMessage"].as_str().unwrap().contains("the deploy check failed: submit"), "{e}")
        }
        other => panic!("expected a function error, got {other:?}"),
    }
    assert!(aws.statuses().is_empty(), "nothing reported: CodeDeploy did not ask");
}

/// The race the old hook lost: the smoke job's message sits on the shared work queue, where the
/// **live** (old) executor consumes it. Here the new executor cannot run the job (its
/// invocation leaves 5 s, the job needs 30 s: it hands the job back to the queue), while a live
/// executor polls the queue as the event source mapping would. A hook that only waits for the
/// job to succeed passes on the old version's work; this hook must fail, because the new
/// version did not run it.
#[tokio::test]
async fn the_hook_fails_when_only_the_live_executor_could_run_the_job() {
    let schema = bare_schema().await;
    let (url, arn) = moto::queue("hook-race").await;
    let env = env_for(&schema, &url);
    let mut cramped = env.clone();
    cramped.push(("RELAY_DEADLINE_RESERVE_SECONDS", "55".to_owned()));
    let aws = AwsStandIn::start(vec![
        ("relay-intake", Function::start("intake", &env).await),
        ("relay-executor", Function::start("executor", &cramped).await),
    ])
    .await;
    // The live executor, fed by the queue for as long as the test runs.
    let mut live = Function::start("executor", &env).await;
    let live_log = live.stdout.clone();
    let (live_url, live_arn) = (url.clone(), arn.clone());
    let feeding = tokio::spawn(async move {
        loop {
            if crate::functions::deliver(&mut live, &live_url, &live_arn, Duration::from_secs(60)).await.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let mut hook = hook(&schema, &url, &aws).await;
    let verdict = response(hook.invoke(&codedeploy_event("race"), Duration::from_secs(120)).await);
    feeding.abort();
    let claimed_by_live: u64 = live_log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|d| d["Claimed"].as_f64())
        .map(|c| c as u64)
        .sum();
    eprintln!("race: verdict {verdict}; jobs the live executor claimed: {claimed_by_live}");
    assert_eq!(verdict["passed"], false, "the new executor never ran the job: {verdict}");
    assert!(verdict["reason"].as_str().unwrap().contains("did not claim the check job"), "{verdict}");
    assert_eq!(aws.statuses()[0]["status"], "Failed");
    assert_eq!(claimed_by_live, 0, "the live executor could not take the check job either");
}
