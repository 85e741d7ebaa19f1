//! X-Ray subsegments for the outside calls: the real intake and executor binaries under the
//! Runtime API stand-in (whose trace header is sampled, `Parent` the function's segment) with
//! `AWS_XRAY_DAEMON_ADDRESS` naming a UDP socket of this test, as the daemon's on Lambda.

use std::time::Duration;

use serde_json::{Value, json};

use crate::functions::{deliver, env_for, response};
use crate::lambda::{fixture, sqs_world};
use crate::support::runtime_api::Function;

const ROOT: &str = "1-65f1c2a0-3c5e2b1d0f4a6b7c8d9e0f12";
const SEGMENT: &str = "53995c3f42cd8ad8";

/// Every document the "daemon" received within `within` after the last one.
async fn received(socket: &tokio::net::UdpSocket, within: Duration) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok(Ok(n)) = tokio::time::timeout(within, socket.recv(&mut buf)).await {
        let text = std::str::from_utf8(&buf[..n]).expect("UTF-8");
        let (header, doc) = text.split_once('\n').expect("a header line, then the document");
        assert_eq!(serde_json::from_str::<Value>(header).unwrap(), json!({"format": "json", "version": 1}));
        docs.push(serde_json::from_str(doc).expect("the document is JSON"));
    }
    docs
}

fn assert_well_formed(doc: &Value) {
    assert_eq!((&doc["type"], &doc["trace_id"]), (&json!("subsegment"), &json!(ROOT)), "{doc}");
    let id = doc["id"].as_str().unwrap();
    assert!(id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()), "{doc}");
    let (start, end) = (doc["start_time"].as_f64().unwrap(), doc["end_time"].as_f64().unwrap());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(start <= end && end <= now && now - start < 120.0, "{doc}");
}

fn find<'a>(docs: &'a [Value], namespace: &str, name: &str, operation: &str) -> &'a Value {
    docs.iter()
        .find(|d| {
            d["namespace"] == namespace
                && d["name"] == name
                && (d["aws"]["operation"] == operation || d["sql"]["sanitized_query"] == operation)
        })
        .unwrap_or_else(|| panic!("no {namespace} {name} {operation} among {docs:#?}"))
}

#[tokio::test]
async fn the_functions_send_a_subsegment_for_each_outside_call_under_their_segment() {
    let daemon = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let (w, url, arn) = sqs_world("xray").await;
    let mut env = env_for(&w, &url);
    env.push(("AWS_XRAY_DAEMON_ADDRESS", daemon.local_addr().unwrap().to_string()));
    let mut intake = Function::start("intake", &env).await;
    let event: Value = serde_json::from_str(&fixture(
        "apigw_v2_submit_job.json",
        &[("API_KEY", &w.key), ("IDEMPOTENCY_KEY", "xray-1")],
    ))
    .unwrap();
    let answer = response(intake.invoke(&event, Duration::from_secs(30)).await);
    assert_eq!(answer["statusCode"], 202, "{answer}");
    let from_intake = received(&daemon, Duration::from_millis(500)).await;
    find(&from_intake, "remote", "postgres", "jobs::insert_many");
    let sent = find(&from_intake, "aws", "SQS", "SendMessageBatch");

    let mut executor = Function::start("executor", &env).await;
    deliver(&mut executor, &url, &arn, Duration::from_secs(400)).await.expect("the job's message");
    let from_executor = received(&daemon, Duration::from_millis(500)).await;
    find(&from_executor, "remote", "postgres", "jobs::claim_ids");

    for doc in from_intake.iter().chain(&from_executor) {
        assert_well_formed(doc);
        assert_eq!(doc["parent_id"], SEGMENT, "each call hangs off the function's segment: {doc}");
    }
    assert!(sent["aws"]["operation"] == "SendMessageBatch" && sent.get("http").is_none());
}
