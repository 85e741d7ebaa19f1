//! The Lambda Powertools log fields on every JSON line: `service` (`POWERTOOLS_SERVICE_NAME`,
//! else the function's name), `function_name`, `function_version`, `function_memory_size`,
//! `cold_start` (true until the container's first invocation is done: the first request id
//! seen), and, inside an invocation, `function_request_id` and `xray_trace_id` (copied from the
//! runtime's span, which also stays as it was).

use std::fmt;
use std::sync::Mutex;

use serde_json::{Map, Value};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

pub struct Powertools<F> {
    inner: F,
    fixed: Map<String, Value>,
    /// The first request id this container served.
    first_request: Mutex<Option<String>>,
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
        Self { inner, fixed, first_request: Mutex::new(None) }
    }

    /// Add the fields to one formatted line (a JSON object); anything else is left as it is.
    fn decorate(&self, line: &str) -> Option<String> {
        let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(line) else { return None };
        for (k, v) in &self.fixed {
            m.entry(k.clone()).or_insert_with(|| v.clone());
        }
        let span = m.get("span").cloned().unwrap_or(Value::Null);
        let request = span.get("requestId").and_then(Value::as_str).map(str::to_owned);
        if let Some(trace) = span.get("xrayTraceId") {
            m.insert("xray_trace_id".into(), trace.clone());
        }
        let cold = match &request {
            None => self.first_request.lock().map(|f| f.is_none()).unwrap_or(false),
            Some(id) => {
                let mut first = self.first_request.lock().ok()?;
                first.get_or_insert_with(|| id.clone()) == id
            }
        };
        if let Some(id) = request {
            m.insert("function_request_id".into(), Value::String(id));
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
    fn lines_get_the_fields_and_cold_start_holds_for_the_first_request_only() {
        let mut p = Powertools::from_env(());
        p.fixed = serde_json::from_str(r#"{"service": "executor", "function_name": "relay-executor"}"#).expect("JSON");
        let line = |req: &str| {
            let raw = format!(
                r#"{{"level":"INFO","fields":{{"event":"x"}},"span":{{"requestId":"{req}","xrayTraceId":"Root=1"}}}}"#
            );
            serde_json::from_str::<Value>(&p.decorate(&raw).expect("decorated")).expect("JSON")
        };
        let init = serde_json::from_str::<Value>(&p.decorate(r#"{"level":"INFO"}"#).expect("decorated")).expect("JSON");
        assert_eq!(init["cold_start"], true, "before any invocation");
        let first = line("a");
        assert_eq!((&first["cold_start"], &first["function_request_id"]), (&Value::Bool(true), &Value::from("a")));
        assert_eq!((&first["service"], &first["xray_trace_id"]), (&Value::from("executor"), &Value::from("Root=1")));
        assert_eq!(line("a")["cold_start"], true, "the whole first invocation");
        assert_eq!(line("b")["cold_start"], false);
        assert_eq!(line("a")["fields"]["event"], "x", "the line is otherwise kept");
        assert!(p.decorate("not json").is_none());
    }
}
