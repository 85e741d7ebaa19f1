//! A stand-in for the Lambda Runtime API, and the real function binaries run under it.
//!
//! `RuntimeApi` serves what lambda_runtime 1.5 calls: `GET /2018-06-01/runtime/invocation/next`
//! (answering with `Lambda-Runtime-Aws-Request-Id`, `Lambda-Runtime-Deadline-Ms`,
//! `Lambda-Runtime-Invoked-Function-Arn` and `Lambda-Runtime-Trace-Id`), `POST
//! /invocation/{id}/response`, `POST /invocation/{id}/error` and `POST /init/error`.
//!
//! `Function` runs one of `functions/*` as a child process with `AWS_LAMBDA_RUNTIME_API`
//! pointing at its own stand-in, and invokes it the way the Lambda service does: one event at
//! a time, with a deadline. An invocation that outlives its deadline is killed with its
//! process, which the next invocation starts afresh (a cold start), as on AWS.
//!
//! The binaries belong to other packages of the workspace, so `CARGO_BIN_EXE_*` (same
//! package only) cannot name them. `binary` runs `cargo build -p <function>` once per test
//! process into this build's own target dir (cargo does nothing when they are fresh) and
//! returns the path: the test never runs a stale binary, and the function crates stay the
//! only place their `main` is declared.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::Value;
use tokio::sync::{Notify, mpsc, oneshot};

/// The X-Ray trace header every invocation carries: sampled, its parent the function's segment
/// (a function with `AWS_XRAY_DAEMON_ADDRESS` sends its subsegments, `tests/xray.rs`).
pub const TRACE_ID: &str = "Root=1-65f1c2a0-3c5e2b1d0f4a6b7c8d9e0f12;Parent=53995c3f42cd8ad8;Sampled=1";

/// The functions the tests run, built together once.
const FUNCTIONS: [&str; 7] = ["intake", "executor", "sweeper", "ingress", "pretraffic", "admin", "console"];

/// The path of a function's debug binary, built (or found fresh) by cargo.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").to_path_buf();
        let workspace = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.current_dir(&workspace).env("CARGO_TARGET_DIR", &target).args(["build", "--quiet"]);
        for f in FUNCTIONS {
            cmd.args(["-p", f]);
        }
        let status = cmd.status().expect("run cargo build for the functions");
        assert!(status.success(), "cargo build of the functions failed");
        target.join("debug")
    });
    dir.join(name)
}

/// What an invocation came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Invoked {
    Response(Value),
    Error(Value),
    /// The deadline passed first; the process was killed.
    TimedOut,
}

struct Pending {
    id: String,
    deadline_ms: u64,
    event: String,
    answer: oneshot::Sender<Invoked>,
}

#[derive(Default)]
struct Shared {
    next: tokio::sync::Mutex<Option<mpsc::UnboundedReceiver<Pending>>>,
    waiting: Mutex<HashMap<String, oneshot::Sender<Invoked>>>,
    init_errors: Mutex<Vec<(HeaderMap, Value)>>,
    init_failed: Notify,
}

/// The stand-in; one per function process.
pub struct RuntimeApi {
    pub addr: SocketAddr,
    events: mpsc::UnboundedSender<Pending>,
    shared: Arc<Shared>,
}

impl RuntimeApi {
    pub async fn start() -> RuntimeApi {
        let (events, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        *shared.next.lock().await = Some(rx);
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/response", post(response))
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        RuntimeApi { addr, events, shared }
    }

    /// Hand an event to the function with `timeout` to answer; `Invoked::TimedOut` if it did
    /// not answer by the deadline.
    pub async fn invoke(&self, event: &Value, timeout: Duration) -> Invoked {
        let deadline = SystemTime::now() + timeout;
        let deadline_ms = deadline.duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_millis() as u64;
        let (answer, answered) = oneshot::channel();
        let id = uuid::Uuid::now_v7().to_string();
        self.events
            .send(Pending { id: id.clone(), deadline_ms, event: event.to_string(), answer })
            .expect("stand-in alive");
        match tokio::time::timeout(timeout, answered).await {
            Ok(Ok(invoked)) => invoked,
            _ => {
                self.shared.waiting.lock().expect("lock").remove(&id);
                Invoked::TimedOut
            }
        }
    }

    /// The first init error reported within `within` (its headers and JSON body).
    pub async fn init_error(&self, within: Duration) -> Option<(HeaderMap, Value)> {
        let reported = self.shared.init_failed.notified();
        if let Some(e) = self.shared.init_errors.lock().expect("lock").first() {
            return Some(e.clone());
        }
        let _ = tokio::time::timeout(within, reported).await;
        self.shared.init_errors.lock().expect("lock").first().cloned()
    }
}

async fn next(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let mut guard = s.next.lock().await;
    let Some(p) = guard.as_mut().expect("receiver").recv().await else {
        return (StatusCode::GONE, HeaderMap::new(), String::new());
    };
    s.waiting.lock().expect("lock").insert(p.id.clone(), p.answer);
    let mut headers = HeaderMap::new();
    let mut set = |k: &'static str, v: String| headers.insert(k, v.parse().expect("header value"));
    set("lambda-runtime-aws-request-id", p.id);
    set("lambda-runtime-deadline-ms", p.deadline_ms.to_string());
    set("lambda-runtime-invoked-function-arn", "arn:aws:lambda:us-east-1:123456789012:function:relay-test".into());
    set("lambda-runtime-trace-id", TRACE_ID.into());
    (StatusCode::OK, headers, p.event)
}

fn answer(s: &Shared, id: &str, invoked: Invoked) -> StatusCode {
    match s.waiting.lock().expect("lock").remove(id) {
        Some(tx) => {
            let _ = tx.send(invoked);
            StatusCode::ACCEPTED
        }
        // Too late (the deadline passed) or unknown, as the real API answers.
        None => StatusCode::BAD_REQUEST,
    }
}

async fn response(State(s): State<Arc<Shared>>, Path(id): Path<String>, body: String) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    answer(&s, &id, Invoked::Response(value))
}

async fn error(State(s): State<Arc<Shared>>, Path(id): Path<String>, body: String) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    answer(&s, &id, Invoked::Error(value))
}

async fn init_error(State(s): State<Arc<Shared>>, headers: HeaderMap, body: String) -> StatusCode {
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    s.init_errors.lock().expect("lock").push((headers, value));
    s.init_failed.notify_waiters();
    StatusCode::ACCEPTED
}

/// One function's process under its own stand-in.
pub struct Function {
    pub api: RuntimeApi,
    name: String,
    env: Vec<(String, String)>,
    child: Option<tokio::process::Child>,
    /// Processes started so far (1 + the restarts after a timeout).
    pub starts: usize,
    /// Every line the processes wrote on stdout (their JSON logs and EMF metrics).
    pub stdout: Arc<Mutex<Vec<String>>>,
}

impl Function {
    /// Start `name` (one of `functions/*`) with these variables besides the Lambda ones.
    pub async fn start(name: &str, env: &[(&str, String)]) -> Function {
        let api = RuntimeApi::start().await;
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        let mut f = Function { api, name: name.to_owned(), env, child: None, starts: 0, stdout: Arc::default() };
        f.spawn();
        f
    }

    fn spawn(&mut self) {
        let mut cmd = tokio::process::Command::new(binary(&self.name));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AWS_LAMBDA_RUNTIME_API", self.api.addr.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", format!("relay-{}", self.name))
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("RELAY_LOG", std::env::var("RELAY_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("start the function binary");
        if let Some(out) = child.stdout.take() {
            let lines = self.stdout.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut reader = tokio::io::BufReader::new(out).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().expect("lock").push(line);
                }
            });
        }
        self.child = Some(child);
        self.starts += 1;
    }

    /// Invoke once; a timeout kills the process and starts a fresh one for the next call.
    pub async fn invoke(&mut self, event: &Value, timeout: Duration) -> Invoked {
        let invoked = self.api.invoke(event, timeout).await;
        if invoked == Invoked::TimedOut {
            if let Some(mut child) = self.child.take() {
                let _ = child.kill().await;
            }
            self.spawn();
        }
        invoked
    }

    /// The EMF documents the processes printed (`metrics::emf`), oldest first.
    pub fn metrics(&self) -> Vec<Value> {
        let lines = self.stdout.lock().expect("lock");
        lines.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|v| v.get("_aws").is_some()).collect()
    }

    /// The process's exit status, if it has ended (an init failure ends it).
    pub async fn exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        tokio::time::timeout(within, child.wait()).await.ok().and_then(Result::ok)
    }
}
