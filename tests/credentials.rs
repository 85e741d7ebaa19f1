//! Per-task credentials against moto's STS: the identity a task runs under, default deny,
//! refresh across expiry, tenant roles with an external id, the sessions route, and a scan
//! that keeps AWS clients out of module level in task code.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::credentials::{RoleSpec, TaskCredentials, TaskRoles};
use taskdeck::executor::Executor;
use taskdeck::job::JobId;
use taskdeck::store::attempt_sessions::{self, NewSession};

use crate::support::{World, moto};

const WHOAMI_ROLE: &str = "arn:aws:iam::123456789012:role/relay-task-test-whoami";
const TENANT_ROLE: &str = "arn:aws:iam::210987654321:role/relay-sender";

fn role(arn: &str) -> RoleSpec {
    RoleSpec { role_arn: arn.into(), external_id: None }
}

fn executor(w: &World, roles: TaskRoles) -> Executor {
    let creds = Arc::new(TaskCredentials::new(roles, &moto::sdk_config()));
    w.platform.clone().with_credentials(creds).executor()
}

async fn submit(w: &World, key: &str, params: Value) -> JobId {
    let (status, job) = w.submit(key, json!({"task_type": "test.whoami", "params": params, "max_attempts": 2})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    job["id"].as_str().expect("id").parse().expect("uuid")
}

async fn job(w: &World, id: JobId) -> Value {
    w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await.1
}

#[tokio::test]
async fn a_task_runs_as_its_own_role_with_the_job_id_in_the_session_name() {
    let w = World::new().await;
    let exec = executor(&w, TaskRoles::default().map_task("test.whoami", role(WHOAMI_ROLE)).unwrap());
    let id = submit(&w, "who", json!({})).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.succeeded, 1, "{}", job(&w, id).await);
    let arn = job(&w, id).await["result"]["arn"].as_str().unwrap().to_owned();
    assert_eq!(arn, format!("arn:aws:sts::123456789012:assumed-role/relay-task-test-whoami/relay-{id}-1"));
    assert!(!arn.contains(":user/"), "never the executor's own identity");

    let (status, body) = w.call(Method::GET, &format!("/v1/jobs/{id}/sessions"), None, None).await;
    assert_eq!(status, StatusCode::OK);
    let sessions = body["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["session_arn"], arn.as_str(), "the ARN CloudTrail shows is on the attempt");
    assert_eq!(sessions[0]["role_arn"], WHOAMI_ROLE);
    assert_eq!(sessions[0]["attempt"], 1);
    assert_eq!(sessions[0]["external_id"], false);

    // Another tenant cannot see it; a malformed id is a 404 like any missing job.
    let (_, other_key) = w.other_tenant("globex").await;
    let (status, body) = w.call_as(&other_key, Method::GET, &format!("/v1/jobs/{id}/sessions"), None, None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, _) = w.call(Method::GET, "/v1/jobs/nope/sessions", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_unmapped_task_type_gets_no_credentials_and_fails_with_an_exception() {
    let w = World::new().await;
    // A mapping exists, but not for this task type; and an executor with no mapping at all.
    let mapped_elsewhere = TaskRoles::default().map_task("email.send", role(WHOAMI_ROLE)).unwrap();
    let cases = [
        ("elsewhere", Some(mapped_elsewhere), "no role is mapped for it in RELAY_TASK_ROLES"),
        ("none", None, "no task-role mapping"),
    ];
    let mut ids = Vec::new();
    for (key, roles, says) in cases {
        let exec = match roles {
            Some(r) => executor(&w, r),
            None => w.platform.executor(),
        };
        let id = submit(&w, key, json!({})).await;
        ids.push(id);
        let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
        assert_eq!(report.failed, 1, "fails for good at once, attempts left or not");
        let j = job(&w, id).await;
        assert_eq!(j["status"], "failed");
        let err = j["last_error"].as_str().unwrap();
        assert!(err.contains("\"test.whoami\"") && err.contains(says) && err.contains("default deny"), "{err}");
        let cause: String = w
            .db()
            .await
            .query_one(
                "SELECT cause FROM exceptions WHERE job_id = $1 AND kind = 'fatal_error' AND status = 'open'",
                &[&id],
            )
            .await
            .expect("one open exception")
            .get(0);
        assert!(cause.contains("test.whoami"), "{cause}");
        assert_eq!(
            w.count("SELECT count(*) FROM attempt_sessions WHERE job_id = $1", &[&id]).await,
            0,
            "nothing assumed"
        );
    }
    let moto = moto::data().await;
    let assumed = moto["sts"]["AssumedRole"].as_array().cloned().unwrap_or_default();
    for id in ids {
        let id = id.to_string();
        assert!(
            !assumed.iter().any(|r| r["session_name"].as_str().unwrap_or("").contains(&id)),
            "no role assumed for {id}"
        );
    }
}

#[tokio::test]
async fn a_long_task_keeps_working_across_a_refresh() {
    let w = World::new().await;
    // Two-second sessions (moto does not enforce STS's 900 s minimum): refreshed every ~1.5 s.
    let roles = TaskRoles::with_session_seconds(2).unwrap().map_task("test.whoami", role(WHOAMI_ROLE)).unwrap();
    let exec = executor(&w, roles);
    let id = submit(&w, "long", json!({"calls": 5, "interval_seconds": 1.0})).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(report.succeeded, 1, "{j}");
    let arns = j["result"]["arns"].as_array().unwrap();
    assert_eq!(arns.len(), 5);
    assert!(arns.iter().all(|a| a == &j["result"]["arn"]), "the same role session name throughout: {arns:?}");
    let sessions = w.count("SELECT count(*) FROM attempt_sessions WHERE job_id = $1 AND attempt = 1", &[&id]).await;
    assert!(sessions >= 3, "the session was re-assumed before expiry ({sessions} sessions over ~4 s)");
    let name = format!("relay-{id}-1");
    let moto = moto::data().await;
    let assumed =
        moto["sts"]["AssumedRole"].as_array().unwrap().iter().filter(|r| r["session_name"] == name.as_str()).count();
    assert_eq!(assumed as i64, sessions, "every AssumeRole is on record");
}

#[tokio::test]
async fn a_tenant_scoped_role_is_assumed_with_the_tenants_external_id() {
    let w = World::new().await;
    let (other, _) = w.other_tenant("globex").await;
    let external = RoleSpec { role_arn: TENANT_ROLE.into(), external_id: Some(format!("relay-{}", w.tenant.id)) };
    let roles = TaskRoles::default()
        .map_task("test.whoami", role(WHOAMI_ROLE))
        .unwrap()
        .map_tenant_task(w.tenant.id, "test.whoami", external.clone())
        .unwrap();
    assert_eq!(roles.resolve(other.id, "test.whoami"), Some(&role(WHOAMI_ROLE)), "other tenants keep the default");
    let exec = executor(&w, roles);
    let id = submit(&w, "tenant", json!({})).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(report.succeeded, 1, "{j}");
    assert_eq!(
        j["result"]["arn"],
        format!("arn:aws:sts::210987654321:assumed-role/relay-sender/relay-{id}-1"),
        "the tenant's account"
    );
    let name = format!("relay-{id}-1");
    let moto = moto::data().await;
    let seen: Vec<&Value> =
        moto["sts"]["AssumedRole"].as_array().unwrap().iter().filter(|r| r["session_name"] == name.as_str()).collect();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["role_arn"], TENANT_ROLE);
    assert_eq!(seen[0]["external_id"].as_str(), external.external_id.as_deref(), "STS received the external id");
    let (_, body) = w.call(Method::GET, &format!("/v1/jobs/{id}/sessions"), None, None).await;
    assert_eq!(body["sessions"][0]["external_id"], true);
    assert_eq!(body["sessions"][0]["role_arn"], TENANT_ROLE);
}

#[tokio::test]
async fn attempt_sessions_are_recorded_and_read_per_tenant() {
    let w = World::new().await;
    let (_, job) = w.submit("s", json!({"task_type": "noop"})).await;
    let id: JobId = job["id"].as_str().unwrap().parse().unwrap();
    let db = w.db().await;
    let at = chrono::Utc::now() + chrono::Duration::hours(1);
    for (attempt, arn) in [(2, "arn:aws:sts::1:assumed-role/r/b"), (1, "arn:aws:sts::1:assumed-role/r/a")] {
        let s = NewSession {
            job_id: id,
            attempt,
            role_arn: "arn:aws:iam::123456789012:role/r".into(),
            session_arn: arn.into(),
            external_id: false,
            expires_at: at,
        };
        attempt_sessions::record(&db, &s).await.unwrap();
    }
    let got = attempt_sessions::for_job(&db, w.tenant.id, id).await.unwrap();
    assert_eq!(got.iter().map(|s| s.attempt).collect::<Vec<_>>(), [1, 2], "ordered by attempt");
    assert_eq!(got[0].session_arn, "arn:aws:sts::1:assumed-role/r/a");
    assert!(got.iter().all(|s| s.expires_at.timestamp() == at.timestamp()));
    let (other, _) = w.other_tenant("globex").await;
    assert!(attempt_sessions::for_job(&db, other.id, id).await.unwrap().is_empty(), "tenant-scoped");
    let bad = NewSession {
        job_id: JobId::new(),
        attempt: 1,
        role_arn: "r".into(),
        session_arn: "s".into(),
        external_id: false,
        expires_at: at,
    };
    assert!(attempt_sessions::record(&db, &bad).await.is_err(), "only for a job that exists");
}

/// What must not appear in task code: an AWS client (or the platform's own SDK configuration)
/// built at module level, in a static or at start-up. Clients come from `ctx.aws()`, per run.
fn violations(path: &str, text: &str) -> Vec<String> {
    let forbidden = [
        ("static ", "a static"),
        ("OnceLock", "a process-wide cell"),
        ("OnceCell", "a process-wide cell"),
        ("LazyLock", "a lazily built global"),
        ("LazyCell", "a lazily built global"),
        ("lazy_static", "a lazily built global"),
        ("once_cell", "a lazily built global"),
        ("thread_local", "a thread-local"),
        ("aws_config::defaults", "the platform's own identity"),
        ("aws_config::load_from_env", "the platform's own identity"),
        ("aws_config::load_defaults", "the platform's own identity"),
        ("from_env()", "the platform's own identity"),
        ("SdkConfig::builder", "an SDK configuration not scoped to the job"),
        ("Credentials::new", "hand-made credentials"),
    ];
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (needle, what) in forbidden {
            // `'static` is a lifetime, not a static item.
            let hit = code.match_indices(needle).any(|(i, _)| !code[..i].ends_with('\''));
            if hit {
                found.push(format!("{path}:{}: {what}: {}", n + 1, line.trim()));
            }
        }
    }
    // A file that builds an AWS client must take its configuration from the job's context.
    let builds_client = text.contains("Client::new(") || text.contains("Client::from_conf(");
    if builds_client && text.contains("aws_sdk_") && !text.contains("ctx.aws()") {
        found.push(format!("{path}: builds an AWS client without ctx.aws()"));
    }
    found
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn task_code_builds_no_aws_client_at_module_level_or_start_up() {
    // Task code: the catalogue's own tasks, each feature's task adapter (`*/task.rs`),
    // `provider.rs` and the destinations' tasks and their call path (`destinations/`).
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src");
    let mut all = Vec::new();
    rust_files(&src, &mut all);
    let files: Vec<_> = all
        .into_iter()
        .filter(|p| {
            p.starts_with(src.join("catalogue"))
                || p.starts_with(src.join("destinations"))
                || p.file_name().is_some_and(|n| n == "task.rs")
                || p.ends_with("provider.rs")
        })
        .collect();
    assert!(files.len() >= 8, "the scan sees the catalogue and the task adapters: {files:?}");
    let mut found = Vec::new();
    let mut clients = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        clients += text.matches("Client::new(").count();
        found.extend(violations(&f.display().to_string(), &text));
    }
    assert!(found.is_empty(), "AWS clients in task code are built per run from ctx.aws():\n{}", found.join("\n"));
    assert!(clients >= 1, "the scan covers at least one task that builds a client (test.whoami)");
}

#[test]
fn the_scan_catches_what_it_forbids() {
    let bad = [
        "static SES: OnceLock<aws_sdk_sesv2::Client> = OnceLock::new();",
        "let sdk = aws_config::defaults(BehaviorVersion::latest()).load().await;",
        "thread_local! { static C: aws_sdk_sts::Client = todo!(); }",
        "fn client(sdk: &SdkConfig) -> aws_sdk_sts::Client { aws_sdk_sts::Client::new(sdk) }",
    ];
    for b in bad {
        assert!(!violations("x.rs", b).is_empty(), "missed: {b}");
    }
    let good = "let sts = aws_sdk_sts::Client::new(&ctx.aws().await?); // static is fine in a comment";
    assert!(violations("x.rs", good).is_empty());
}

#[test]
fn a_session_beyond_an_hour_is_refused_before_any_call() {
    let e = TaskRoles::with_session_seconds(3601).unwrap_err().to_string();
    assert!(e.contains("3600") && e.contains("chained"), "{e}");
    let e = TaskRoles::from_lookup(|k| (k == "RELAY_TASK_SESSION_SECONDS").then(|| "43200".to_owned())).unwrap_err();
    assert!(e.to_string().starts_with("RELAY_TASK_SESSION_SECONDS is invalid"), "{e}");
    let e =
        taskdeck::config::LambdaConfig::from_lookup(|k| (k == "RELAY_TASK_SESSION_SECONDS").then(|| "7200".to_owned()));
    assert!(e.is_err(), "the executor's container refuses to start");
}
