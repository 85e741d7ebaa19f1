//! The deploy that proves itself: the pre-traffic hook binary (`functions/pretraffic`) under
//! the Runtime API stand-in, reaching the real intake and executor binaries through a Lambda
//! Invoke stand-in and reporting to a CodeDeploy stand-in (`support::aws_standin`; moto has
//! neither call), with moto's SQS and the real Postgres. It migrates a bare schema, runs a job
//! through the new versions, and reports Succeeded; with the executor absent or broken it
//! reports Failed.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::aws_standin::AwsStandIn;
use crate::support::runtime_api::{Function, Invoked};
use crate::support::{bare_schema, database_url, moto};

const INTAKE: &str = "arn:aws:lambda:us-east-1:123456789012:function:relay-intake:7";
const EXECUTOR: &str = "arn:aws:lambda:us-east-1:123456789012:function:relay-executor:7";

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

/// The hook, pointed at the stand-in, on `schema`.
async fn hook(schema: &str, queue_url: &str, aws: &AwsStandIn) -> Function {
    let mut env = env_for(schema, queue_url);
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
async fn the_hook_migrates_runs_a_job_through_the_new_versions_and_reports_succeeded() {
    let schema = bare_schema().await;
    let (url, _) = moto::queue("hook-ok").await;
    let env = env_for(&schema, &url);
    let aws = AwsStandIn::start(vec![
        ("relay-intake", Function::start("intake", &env).await),
        ("relay-executor", Function::start("executor", &env).await),
    ])
    .await;
    let mut hook = hook(&schema, &url, &aws).await;
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
    // The versions named, not the functions' $LATEST or aliases.
    let invoked = aws.invoked();
    assert!(invoked.contains(&("relay-intake".into(), "7".into())), "{invoked:?}");
    assert!(invoked.contains(&("relay-executor".into(), "7".into())), "{invoked:?}");

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
        [("no-db", no_db, "returned the job's message unrecorded"), ("no-config", no_queue, "RELAY_WORK_QUEUE_URL")]
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
