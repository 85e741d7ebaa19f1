//! Stand-ins for the two AWS services moto does not serve the way the pre-traffic hook needs:
//! **Lambda's Invoke** (moto runs functions in Docker, which is not here) forwards to the real
//! function binaries under their Runtime API stand-ins (`runtime_api::Function`), so an invoke
//! of "the new intake version" runs the real intake; **CodeDeploy's
//! `PutLifecycleEventHookExecutionStatus`** (moto 5 has no such call) records what it is told.
//! The hook reaches both over HTTP with the real AWS SDK (`AWS_ENDPOINT_URL_LAMBDA`,
//! `AWS_ENDPOINT_URL_CODEDEPLOY`), as it reaches AWS.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::runtime_api::{Function, Invoked};

#[derive(Default)]
struct Shared {
    functions: HashMap<String, Arc<tokio::sync::Mutex<Function>>>,
    /// (function name, qualifier or version) of each invoke, in order.
    invoked: Mutex<Vec<(String, String)>>,
    /// The bodies of each `PutLifecycleEventHookExecutionStatus`.
    statuses: Mutex<Vec<Value>>,
}

pub struct AwsStandIn {
    pub url: String,
    shared: Arc<Shared>,
}

impl AwsStandIn {
    /// Serve these functions by name (`relay-intake`, ...), each invoked with a 60 s deadline.
    pub async fn start(functions: Vec<(&str, Function)>) -> AwsStandIn {
        let shared = Arc::new(Shared {
            functions: functions
                .into_iter()
                .map(|(n, f)| (n.to_owned(), Arc::new(tokio::sync::Mutex::new(f))))
                .collect(),
            ..Shared::default()
        });
        let app = Router::new()
            .route("/2015-03-31/functions/{name}/invocations", post(invoke))
            .route("/", post(codedeploy))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        AwsStandIn { url: format!("http://{addr}"), shared }
    }

    pub fn invoked(&self) -> Vec<(String, String)> {
        self.shared.invoked.lock().expect("lock").clone()
    }

    pub fn statuses(&self) -> Vec<Value> {
        self.shared.statuses.lock().expect("lock").clone()
    }
}

/// `Invoke` (RequestResponse): the function's answer as the payload; a function error as
/// `X-Amz-Function-Error: Unhandled`; an unknown function as Lambda's 404.
async fn invoke(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
    query: axum::extract::RawQuery,
    body: Bytes,
) -> Response {
    // A version's ARN (arn:aws:lambda:<region>:<account>:function:<name>:<version>) or a name.
    let parts: Vec<&str> = name.split(':').collect();
    let (function, version) = if parts.len() >= 7 {
        (parts[6].to_owned(), parts.get(7).copied().unwrap_or("$LATEST").to_owned())
    } else {
        let q = query.0.unwrap_or_default();
        (name.clone(), q.strip_prefix("Qualifier=").unwrap_or("$LATEST").to_owned())
    };
    s.invoked.lock().expect("lock").push((function.clone(), version.clone()));
    let Some(f) = s.functions.get(&function).cloned() else {
        let mut h = HeaderMap::new();
        h.insert("x-amzn-errortype", "ResourceNotFoundException".parse().expect("header"));
        let msg = json!({"Type": "User", "message": format!("Function not found: {name}")});
        return (StatusCode::NOT_FOUND, h, msg.to_string()).into_response();
    };
    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let f = f.lock().await;
    // As Lambda does, a function whose init failed answers with that error at once.
    let invoked = tokio::select! {
        invoked = f.api.invoke(&event, Duration::from_secs(60)) => invoked,
        Some((_, init)) = f.api.init_error(Duration::from_secs(60)) => Invoked::Error(init),
    };
    let mut h = HeaderMap::new();
    h.insert("x-amz-executed-version", version.parse().unwrap_or_else(|_| "1".parse().expect("header")));
    match invoked {
        Invoked::Response(v) => (StatusCode::OK, h, v.to_string()).into_response(),
        Invoked::Error(v) => {
            h.insert("x-amz-function-error", "Unhandled".parse().expect("header"));
            (StatusCode::OK, h, v.to_string()).into_response()
        }
        Invoked::TimedOut => {
            h.insert("x-amz-function-error", "Unhandled".parse().expect("header"));
            (StatusCode::OK, h, json!({"errorMessage": "Task timed out"}).to_string()).into_response()
        }
    }
}

/// CodeDeploy's JSON 1.1 protocol: only `PutLifecycleEventHookExecutionStatus`.
async fn codedeploy(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/x-amz-json-1.1".parse().expect("header"));
    if target != "CodeDeploy_20141006.PutLifecycleEventHookExecutionStatus" {
        let err = json!({"__type": "UnknownOperationException", "message": target});
        return (StatusCode::BAD_REQUEST, h, err.to_string()).into_response();
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = v["lifecycleEventHookExecutionId"].clone();
    s.statuses.lock().expect("lock").push(v);
    (StatusCode::OK, h, json!({"lifecycleEventHookExecutionId": id}).to_string()).into_response()
}
