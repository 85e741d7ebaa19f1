//! CloudWatch Embedded Metric Format: each Lambda invocation prints one JSON line on stdout
//! that CloudWatch Logs turns into metrics, with no API call and no agent. Named the Lambda
//! Powertools way: namespace `POWERTOOLS_METRICS_NAMESPACE` (the template sets
//! `Relay/<stack>`), one dimension `service` (`POWERTOOLS_SERVICE_NAME`, the function's part:
//! intake, executor, ...). The metrics that mean an outage (`AGGREGATED`) are also published
//! without a dimension, summed over every function, which is what the outage alarms read, and
//! under `service` and `function_version` (`AWS_LAMBDA_FUNCTION_VERSION`), which is what a
//! deployment's rollback alarms read: the new version's own, not the old one's.
//! A container's first line also prints Powertools' `ColdStart` (1, dimensions `service` and
//! `function_name`). Off outside Lambda (`AWS_LAMBDA_FUNCTION_NAME` unset), so `relay
//! dev` and the tests' in-process handlers print nothing.
//!
//! The metrics and what an alarm reads from them are listed in `shared/docs/deploy.md`.

use std::io::Write;
use std::sync::OnceLock;

use serde_json::{Map, Value, json};

struct Target {
    namespace: String,
    service: String,
    function: String,
    version: String,
}

/// Whether this container has printed its `ColdStart` yet.
static COLD_START_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn target() -> Option<&'static Target> {
    static TARGET: OnceLock<Option<Target>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok()?;
            Some(Target {
                namespace: std::env::var("POWERTOOLS_METRICS_NAMESPACE").unwrap_or_else(|_| "Relay".into()),
                service: std::env::var("POWERTOOLS_SERVICE_NAME").unwrap_or_else(|_| function.clone()),
                function,
                version: std::env::var("AWS_LAMBDA_FUNCTION_VERSION").unwrap_or_else(|_| "$LATEST".into()),
            })
        })
        .as_ref()
}

/// Metrics also published with no dimension (every function's summed): the outage alarms'.
pub const AGGREGATED: [&str; 3] = ["DatabaseErrors", "BatchItemFailures", "Errors5xx"];

/// The EMF document for these counts (`Count` units) at `timestamp_ms`, of this function
/// `version`.
pub fn document(namespace: &str, service: &str, version: &str, counts: &[(&str, f64)], timestamp_ms: i64) -> Value {
    let metric = |n: &&str| json!({"Name": n, "Unit": "Count"});
    let names: Vec<Value> = counts.iter().map(|(n, _)| n).map(metric).collect();
    let mut directives = vec![json!({"Namespace": namespace, "Dimensions": [["service"]], "Metrics": names})];
    let summed: Vec<Value> = counts.iter().map(|(n, _)| n).filter(|n| AGGREGATED.contains(n)).map(metric).collect();
    if !summed.is_empty() {
        directives.push(
            json!({"Namespace": namespace, "Dimensions": [[], ["service", "function_version"]], "Metrics": summed}),
        );
    }
    let mut doc = Map::new();
    doc.insert("_aws".into(), json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": directives}));
    doc.insert("service".into(), json!(service));
    doc.insert("function_version".into(), json!(version));
    for (name, value) in counts {
        doc.insert((*name).to_owned(), json!(value));
    }
    Value::Object(doc)
}

/// Powertools' `ColdStart` metric: 1, under the dimensions `service` and `function_name`.
pub fn cold_start_document(namespace: &str, service: &str, function: &str, timestamp_ms: i64) -> Value {
    json!({
        "_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [{
            "Namespace": namespace, "Dimensions": [["service", "function_name"]],
            "Metrics": [{"Name": "ColdStart", "Unit": "Count"}],
        }]},
        "service": service,
        "function_name": function,
        "ColdStart": 1,
    })
}

/// Print one EMF line with these counts (on Lambda only; nothing when `counts` is empty),
/// after the container's `ColdStart` line the first time.
pub fn record(counts: &[(&str, f64)]) {
    let Some(t) = target() else { return };
    if counts.is_empty() {
        return;
    }
    let now = chrono::Utc::now().timestamp_millis();
    let mut out = std::io::stdout().lock();
    if !COLD_START_PRINTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let _ = writeln!(out, "{}", cold_start_document(&t.namespace, &t.service, &t.function, now));
    }
    let _ = writeln!(out, "{}", document(&t.namespace, &t.service, &t.version, counts, now));
    let _ = out.flush();
}

/// Database errors counted since the last call (`super::DATABASE_ERRORS`, taken).
pub fn database_errors() -> f64 {
    super::DATABASE_ERRORS.take() as f64
}

/// Intake's per-request metrics, as a router layer: `Accepted` (202, a job or batch
/// accepted), `Refused4xx`, `Errors5xx`, and `DatabaseErrors` the request met; and one log
/// line per request (`relay.intake.request`: method, route path, status, milliseconds).
pub async fn http(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    let started = std::time::Instant::now();
    let res = next.run(req).await;
    let status = res.status().as_u16();
    tracing::info!(
        event = "relay.intake.request",
        method,
        path,
        status,
        ms = started.elapsed().as_millis() as u64,
        "request answered"
    );
    let flag = |hit: bool| if hit { 1.0 } else { 0.0 };
    record(&[
        ("Accepted", flag(status == 202)),
        ("Refused4xx", flag((400..500).contains(&status))),
        ("Errors5xx", flag(status >= 500)),
        ("DatabaseErrors", database_errors()),
    ]);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_names_each_metric_once_under_the_service_dimension() {
        let d =
            document("Relay/prod", "executor", "7", &[("Claimed", 3.0), ("DatabaseErrors", 0.0)], 1_700_000_000_000);
        let m = &d["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(m["Namespace"], "Relay/prod");
        assert_eq!(m["Dimensions"], json!([["service"]]));
        assert_eq!(
            m["Metrics"],
            json!([{"Name": "Claimed", "Unit": "Count"}, {"Name": "DatabaseErrors", "Unit": "Count"}])
        );
        assert_eq!(
            (&d["service"], &d["Claimed"], &d["DatabaseErrors"]),
            (&json!("executor"), &json!(3.0), &json!(0.0))
        );
        assert_eq!(d["_aws"]["Timestamp"], 1_700_000_000_000_i64);
        let total = &d["_aws"]["CloudWatchMetrics"][1];
        assert_eq!(
            (&total["Dimensions"], &total["Metrics"]),
            (&json!([[], ["service", "function_version"]]), &json!([{"Name": "DatabaseErrors", "Unit": "Count"}]))
        );
        assert_eq!(d["function_version"], "7", "the new version's own, for its rollback alarms");
        let cold = cold_start_document("Relay/prod", "intake", "prod-intake", 5);
        assert_eq!(cold["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["service", "function_name"]]));
        assert_eq!(cold["_aws"]["CloudWatchMetrics"][0]["Metrics"], json!([{"Name": "ColdStart", "Unit": "Count"}]));
        assert_eq!((&cold["ColdStart"], &cold["function_name"]), (&json!(1), &json!("prod-intake")));
        let quiet = document("Relay", "sweeper", "7", &[("Redispatched", 1.0)], 0);
        assert_eq!(quiet["_aws"]["CloudWatchMetrics"].as_array().map(Vec::len), Some(1), "nothing summed to publish");
    }
}
