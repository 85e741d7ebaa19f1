//! The Lambda Powertools log shape on every JSON line: flat, with `timestamp`, `level` and
//! `message` (tracing-subscriber's, the event flattened), `service` (`POWERTOOLS_SERVICE_NAME`,
//! else the function's name), `function_name`, `function_version`, `function_memory_size`,
//! `cold_start` (true until the container's first invocation is done: the first request id
//! seen), `function_request_id` and `xray_trace_id` (from the runtime's invocation span), and
//! every field of the spans the line is inside (`correlation_id`, `job_id`, ...) at the top
//! level, the innermost span winning and the event's own fields over any span's.
//!
//! A line from a task the invocation spawned outside the runtime's span still names the
//! invocation: the container serves one invocation at a time, so the last request id seen is
//! the current one.

use std::fmt;
use std::sync::Mutex;

use serde_json::{Map, Value};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

#[derive(Default)]
struct Invocations {
    /// The first request id this container served.
    first: Option<String>,
    /// The latest one (the invocation in progress, or the last one).
    current: Option<String>,
}

pub struct Powertools<F> {
    inner: F,
    fixed: Map<String, Value>,
    seen: Mutex<Invocations>,
}

impl<F> Powertools<F> {
    pub fn from_env(inner: F) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let function = var("AWS_LAMBDA_FUNCTION_NAME");
        let mut fixed = Map::new();
        if let Some(service) = var("POWERTOOLS_SERVICE_NAME").or_else(|| function.clone()) {
            fixed.insert("service".into(), Value::String(service));
        }
        for (key, var_name) in [
            ("function_name", "AWS_LAMBDA_FUNCTION_NAME"),
            ("function_version", "AWS_LAMBDA_FUNCTION_VERSION"),
            ("function_memory_size", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"),
        ] {
            if let Some(v) = var(var_name) {
                fixed.insert(key.into(), Value::String(v));
            }
        }
        Self { inner, fixed, seen: Mutex::new(Invocations::default()) }
    }

    /// One formatted line (a JSON object) in the Powertools shape; anything else is left as it is.
    fn decorate(&self, line: &str) -> Option<String> {
        let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(line) else { return None };
        // The spans' fields, outermost first so the innermost wins.
        let mut from_spans = Map::new();
        if let Some(Value::Array(spans)) = m.remove("spans") {
            for span in spans {
                let Value::Object(fields) = span else { continue };
                for (k, v) in fields.into_iter().filter(|(k, _)| k != "name") {
                    let key = match k.as_str() {
                        "requestId" => "function_request_id".to_owned(),
                        "xrayTraceId" => "xray_trace_id".to_owned(),
                        _ => k,
                    };
                    from_spans.insert(key, v);
                }
            }
        }
        let in_span = from_spans.get("function_request_id").and_then(Value::as_str).map(str::to_owned);
        let (request, cold) = {
            let mut seen = self.seen.lock().ok()?;
            if let Some(id) = &in_span {
                seen.first.get_or_insert_with(|| id.clone());
                seen.current = Some(id.clone());
            }
            let cold = seen.first.is_none() || seen.first == seen.current;
            (seen.current.clone(), cold)
        };
        for (k, v) in from_spans.into_iter().chain(self.fixed.clone()) {
            m.entry(k).or_insert(v);
        }
        if let Some(id) = request {
            m.entry("function_request_id").or_insert(Value::String(id));
        }
        m.insert("cold_start".into(), Value::Bool(cold));
        Some(Value::Object(m).to_string())
    }
}

impl<S, N, F> FormatEvent<S, N> for Powertools<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
    FormattedFields<N>: Send + Sync,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        match self.decorate(line.trim_end()) {
            Some(decorated) => writeln!(writer, "{decorated}"),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_flat_and_cold_start_holds_for_the_first_request_only() {
        let mut p = Powertools::from_env(());
        p.fixed = serde_json::from_str(r#"{"service": "executor", "function_name": "relay-executor"}"#).expect("JSON");
        let line = |req: &str| {
            let raw = format!(
                r#"{{"timestamp":"2026-01-01T00:00:00Z","level":"INFO","message":"m","event":"x","spans":[
                    {{"name":"Lambda runtime invoke","requestId":"{req}","xrayTraceId":"Root=1"}},
                    {{"name":"job","job_id":"j1","correlation_id":"outer"}},
                    {{"name":"inner","correlation_id":"c1"}}]}}"#
            );
            serde_json::from_str::<Value>(&p.decorate(&raw).expect("decorated")).expect("JSON")
        };
        let init = serde_json::from_str::<Value>(&p.decorate(r#"{"level":"INFO"}"#).expect("decorated")).expect("JSON");
        assert_eq!(init["cold_start"], true, "before any invocation");
        assert!(init.get("function_request_id").is_none(), "no invocation yet");
        let first = line("a");
        assert_eq!((&first["cold_start"], &first["function_request_id"]), (&Value::Bool(true), &Value::from("a")));
        assert_eq!((&first["service"], &first["xray_trace_id"]), (&Value::from("executor"), &Value::from("Root=1")));
        assert_eq!(
            (&first["correlation_id"], &first["job_id"]),
            (&Value::from("c1"), &Value::from("j1")),
            "innermost wins"
        );
        assert_eq!((&first["message"], &first["event"]), (&Value::from("m"), &Value::from("x")));
        assert!(first.get("spans").is_none() && first.get("requestId").is_none(), "{first}");
        assert_eq!(line("a")["cold_start"], true, "the whole first invocation");
        assert_eq!(line("b")["cold_start"], false);
        let spawned =
            serde_json::from_str::<Value>(&p.decorate(r#"{"level":"WARN"}"#).expect("decorated")).expect("JSON");
        assert_eq!((&spawned["function_request_id"], &spawned["cold_start"]), (&Value::from("b"), &Value::Bool(false)));
        let own = serde_json::from_str::<Value>(
            &p.decorate(r#"{"correlation_id":"event","spans":[{"name":"s","correlation_id":"span"}]}"#)
                .expect("decorated"),
        )
        .expect("JSON");
        assert_eq!(own["correlation_id"], "event", "the event's own field wins");
        assert!(p.decorate("not json").is_none());
    }
}
