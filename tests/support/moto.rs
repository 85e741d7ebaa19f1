//! moto's server mode, the local AWS-protocol server every AWS code path is tested against.
//!
//! `RELAY_MOTO_URL` when set; otherwise a venv under the target dir (`python3 -m venv`, then
//! `pip install "moto[server]"`, once per machine) and one `moto_server` per test process on
//! a free port, killed by a watchdog when the test process exits. Each test makes its own
//! queues (unique names), so tests run in parallel against one server.

use std::path::Path;
use std::sync::OnceLock;

use aws_lambda_events::sqs::SqsEvent;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use relay::localaws;
use serde_json::json;
use taskdeck::transport::sqs::SqsTransport;

/// moto's endpoint, started on first use.
pub fn endpoint() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        localaws::moto_for_this_process(Path::new(env!("CARGO_TARGET_TMPDIR")))
            .expect("moto: RELAY_MOTO_URL, or moto[server] installed into a venv (needs python3 and PyPI) and started")
    })
}

/// An SQS client for moto with explicit dummy credentials and region.
pub fn sqs() -> Client {
    SqsTransport::local_client(endpoint())
}

/// A queue of its own for one test; returns (url, arn).
pub async fn queue(prefix: &str) -> (String, String) {
    let name = format!("{prefix}-{}", uuid::Uuid::now_v7().simple());
    let client = sqs();
    let url = client.create_queue().queue_name(&name).send().await.expect("create queue").queue_url.expect("queue url");
    let attrs = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("queue attributes");
    let arn = attrs.attributes().and_then(|a| a.get(&QueueAttributeName::QueueArn)).cloned().expect("queue arn");
    (url, arn)
}

/// Receive what is visible now (up to 10, waiting up to `wait_secs`), as the SQS event the
/// Lambda service would deliver (the documented record shape).
pub async fn receive_event(url: &str, arn: &str, wait_secs: i32) -> SqsEvent {
    let out = sqs()
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait_secs)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .expect("receive");
    let records: Vec<_> = out
        .messages()
        .iter()
        .map(|m| {
            let attributes: serde_json::Map<String, serde_json::Value> = m
                .attributes()
                .map(|a| a.iter().map(|(k, v)| (k.as_str().to_owned(), json!(v))).collect())
                .unwrap_or_default();
            json!({
                "messageId": m.message_id(),
                "receiptHandle": m.receipt_handle(),
                "body": m.body(),
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": m.md5_of_body(),
                "eventSource": "aws:sqs",
                "eventSourceARN": arn,
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).expect("an SQS event")
}

/// What the Lambda event source mapping does after a partial batch response: delete every
/// record not listed as failed.
pub async fn delete_acknowledged(url: &str, event: &SqsEvent, failed: &[String]) {
    relay::chaos::harness::delete_acknowledged(&sqs(), url, event, failed).await.expect("delete");
}

/// Messages in the queue (visible, in flight and delayed).
pub async fn depth(url: &str) -> usize {
    let attrs = sqs()
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .expect("queue attributes");
    let a = attrs.attributes().cloned().unwrap_or_default();
    a.values().map(|v| v.parse::<usize>().unwrap_or(0)).sum()
}

/// The base SDK configuration a Lambda container would load, pointed at moto with dummy
/// credentials (the executor's own identity).
pub fn sdk_config() -> aws_config::SdkConfig {
    localaws::sdk_config(endpoint())
}

/// moto's recorded state (`GET /moto-api/data.json`): every model instance by service.
pub async fn data() -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = endpoint().trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(host).await.expect("connect to moto");
    let req = format!("GET /moto-api/data.json HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("response");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "moto answered chunked");
    serde_json::from_str(body).expect("moto data is JSON")
}
