//! X-Ray subsegments for the outside calls, sent to the X-Ray daemon Lambda runs beside each
//! function (`AWS_XRAY_DAEMON_ADDRESS`, UDP) as independent subsegment documents whose parent is
//! the function's segment (`Parent` of the invocation's trace header, `_X_AMZN_TRACE_ID`, which
//! lambda_runtime sets per invocation). Only sampled invocations (`Sampled=1`) send any.
//!
//! Which spans become subsegments:
//! - every AWS SDK operation (the SDK's own span carries `rpc.system = "aws-api"`,
//!   `rpc.service`, `rpc.method`): namespace `aws`, name the service (`SQS`, `SESv2`, `STS`,
//!   `Secrets Manager`, ...), `aws.operation`;
//! - a span with an `xray.namespace` field (Relay's own, around Postgres statements and outbound
//!   HTTP): namespace `remote`, name `xray.name`, with `http.method`, `http.url` and
//!   `http.status` (a 4xx is `error`, a 5xx `fault`) or `sql.operation`.
//!
//! A subsegment inside another (a span inside a span) names it as its parent.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The UDP header every document sent to the daemon starts with.
const HEADER: &str = "{\"format\": \"json\", \"version\": 1}\n";

/// The invocation's trace, from its header (`Root=1-…;Parent=…;Sampled=1`).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceHeader {
    pub root: String,
    pub parent: String,
    pub sampled: bool,
}

impl TraceHeader {
    pub fn parse(header: &str) -> Option<TraceHeader> {
        let mut root = None;
        let mut parent = None;
        let mut sampled = false;
        for part in header.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", v)) => root = Some(v.to_owned()),
                Some(("Parent", v)) => parent = Some(v.to_owned()),
                Some(("Sampled", v)) => sampled = v == "1",
                _ => {}
            }
        }
        Some(TraceHeader { root: root?, parent: parent?, sampled })
    }
}

/// The layer: sends each finished subsegment to the daemon.
pub struct XRay {
    socket: UdpSocket,
    daemon: SocketAddr,
}

impl XRay {
    /// From `AWS_XRAY_DAEMON_ADDRESS` (`host:port`, or `udp:host:port tcp:host:port`); `None`
    /// when it is absent (tracing is not active) or cannot be used.
    pub fn from_env() -> Option<XRay> {
        let var = std::env::var("AWS_XRAY_DAEMON_ADDRESS").ok()?;
        let udp = var
            .split_whitespace()
            .find_map(|p| p.strip_prefix("udp:"))
            .or_else(|| var.split_whitespace().next())?
            .to_owned();
        let daemon = udp.to_socket_addrs().ok()?.next()?;
        let local = if daemon.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        Some(XRay { socket: UdpSocket::bind(local).ok()?, daemon })
    }

    /// Whether a span's callsite can become a subsegment (the layer's filter).
    pub fn wants(meta: &tracing::Metadata<'_>) -> bool {
        meta.is_span()
            && (meta.fields().field("rpc.system").is_some() || meta.fields().field("xray.namespace").is_some())
    }
}

/// A span's recorded fields.
#[derive(Default)]
struct Fields(BTreeMap<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), Value::from(format!("{value:?}")));
    }
}

impl Fields {
    fn str(&self, k: &str) -> Option<&str> {
        self.0.get(k).and_then(Value::as_str)
    }
}

/// A subsegment in progress, kept in its span's extensions.
struct Open {
    id: String,
    parent: String,
    root: String,
    start: f64,
    fields: Fields,
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// 16 hex digits, random enough for a subsegment id (the std's hasher keys are random per process).
fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default());
    format!("{:016x}", h.finish())
}

/// The subsegment document for a finished span.
fn document(open: &Open, end: f64) -> Value {
    let f = &open.fields;
    let mut doc = Map::new();
    doc.insert("type".into(), json!("subsegment"));
    doc.insert("id".into(), json!(open.id));
    doc.insert("trace_id".into(), json!(open.root));
    doc.insert("parent_id".into(), json!(open.parent));
    doc.insert("start_time".into(), json!(open.start));
    doc.insert("end_time".into(), json!(end));
    if f.str("rpc.system") == Some("aws-api") {
        doc.insert("namespace".into(), json!("aws"));
        doc.insert("name".into(), json!(f.str("rpc.service").unwrap_or("AWS")));
        doc.insert("aws".into(), json!({"operation": f.str("rpc.method")}));
        return Value::Object(doc);
    }
    doc.insert("namespace".into(), json!("remote"));
    doc.insert("name".into(), json!(f.str("xray.name").unwrap_or("remote")));
    if let Some(method) = f.str("http.method") {
        let mut http = json!({"request": {"method": method, "url": f.str("http.url")}});
        if let Some(status) = f.0.get("http.status").and_then(Value::as_u64) {
            http["response"] = json!({"status": status});
            doc.insert("error".into(), json!((400..500).contains(&status)));
            doc.insert("fault".into(), json!(status >= 500));
        }
        doc.insert("http".into(), http);
    }
    if let Some(op) = f.str("sql.operation") {
        doc.insert("sql".into(), json!({"database_type": "PostgreSQL", "sanitized_query": op}));
    }
    if f.0.get("error").and_then(Value::as_bool) == Some(true) {
        doc.insert("fault".into(), json!(true));
    }
    Value::Object(doc)
}

impl<S> Layer<S> for XRay
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(header) = std::env::var("_X_AMZN_TRACE_ID").ok().and_then(|h| TraceHeader::parse(&h)) else { return };
        if !header.sampled {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let parent = span
            .scope()
            .skip(1)
            .find_map(|s| s.extensions().get::<Open>().map(|o| o.id.clone()))
            .unwrap_or(header.parent);
        span.extensions_mut().insert(Open { id: new_id(), parent, root: header.root, start: now(), fields });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(open) = span.extensions_mut().get_mut::<Open>()
        {
            values.record(&mut open.fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else { return };
        let text = format!("{HEADER}{}", document(&open, now()));
        // Best effort, as the X-Ray SDKs do: a lost subsegment never fails the call it measured.
        let _ = self.socket.send_to(text.as_bytes(), self.daemon);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lambda_trace_header_is_read() {
        let h =
            TraceHeader::parse("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1").unwrap();
        assert_eq!(
            (h.root.as_str(), h.parent.as_str(), h.sampled),
            ("1-5759e988-bd862e3fe1be46a994272793", "53995c3f42cd8ad8", true)
        );
        assert!(!TraceHeader::parse("Root=1-a-b;Parent=1;Sampled=0").unwrap().sampled);
        assert_eq!(TraceHeader::parse("Root=1-a-b;Sampled=1"), None, "no parent: nothing to attach to");
    }

    #[test]
    fn an_http_5xx_is_a_fault_and_a_4xx_an_error() {
        let mut fields = Fields::default();
        for (k, v) in
            [("xray.namespace", json!("remote")), ("xray.name", json!("example.com")), ("http.method", json!("POST"))]
        {
            fields.0.insert(k.into(), v);
        }
        fields.0.insert("http.status".into(), json!(503));
        let open = Open { id: new_id(), parent: "p".into(), root: "r".into(), start: 1.0, fields };
        let doc = document(&open, 2.0);
        assert_eq!(
            (&doc["fault"], &doc["error"], &doc["http"]["response"]["status"]),
            (&json!(true), &json!(false), &json!(503))
        );
        assert_eq!((&doc["namespace"], &doc["name"]), (&json!("remote"), &json!("example.com")));
    }
}
