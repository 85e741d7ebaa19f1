//! `webhook.send`: one signed POST to a URL given at run time, which one of the destination's
//! `url_patterns` must allow (`patterns`: checked at submit and again at every call), signed
//! in the Standard Webhooks form with the destination's signing secret (`whsec_…`, written by
//! the tenant, never returned), or in the destination's own HMAC scheme (`signature`). The
//! call itself is `http.request`'s (`call::send`): the same address guard on every call (on
//! every address the host resolves to), switches, rate slot, shadow mode, retry and ambiguity
//! rules, success rule, minted token, and the same tenant-fault classification.
//!
//! What goes out: `{"type": <event_type>, "timestamp": <this attempt's time>, "data": <data>}`
//! with `webhook-id` (`wh_<job id>`, the same on every attempt, so a receiver drops repeats),
//! `webhook-timestamp` and `webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`),
//! the job's `Idempotency-Key` and correlation id. `data` is at most `MAX_BODY` of JSON, held
//! once, in the job's parameters: each call's record shows its size and digest, not the body.
//!
//! Time: a call may take `timeout_ms` (up to `MAX_TIMEOUT_MS`; default the destination's), and
//! intake gives the job attempts that long and `RECORD_MARGIN_SECONDS` more
//! (`Task::needs_seconds`); a job longer than the short lane's bound runs on the long-job lane.

use std::sync::Arc;

use hyper::body::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::call::Method;
use super::call::{self as http, Call, Signing};
use super::local::LocalSecrets;
use super::oauth::Tokens;
use super::patterns;
use crate::job::TaskError;
use crate::outbound::AllowList;
use crate::plain::ParamError;
use crate::task::{Admission, Named, Stored, Task, TaskContext};

pub use super::call::{MAX_BODY, MAX_TIMEOUT_MS, RECORD_MARGIN_SECONDS};
use crate::plain::NameValue;

/// Sends webhooks; the same allow-list, local store and tokens as `http.request`.
#[derive(Debug, Clone, Default)]
pub struct WebhookSend {
    pub allow: AllowList,
    pub local: Option<Arc<LocalSecrets>>,
    pub tokens: Tokens,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookParams {
    /// A destination of this tenant's whose `url_patterns` allow `url`, with a signing secret
    /// (`PUT /v1/destinations/{name}/signing-secret`).
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub destination: String,
    /// Where to POST: `https://…` (http only for an allow-listed host), matching one of the
    /// destination's `url_patterns`; the address guard applies on every call.
    #[schema(min_length = 1, max_length = 2000)]
    pub url: String,
    /// The event's type (the envelope's `type`): 1 to 100 letters, digits, `.`, `_`, `:`, `-`.
    #[schema(min_length = 1, max_length = 100, pattern = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")]
    pub event_type: String,
    /// The event's data (the envelope's `data`): any JSON, at most 1 MiB as compact JSON.
    pub data: Value,
    /// The call's time limit, 100 to 900000 ms; default the destination's `timeout_ms`. Longer
    /// than the short lane allows, the job runs on the long-job lane.
    #[serde(default)]
    #[schema(minimum = 100, maximum = 900_000)]
    pub timeout_ms: Option<u32>,
}

fn event_type_ok(t: &str) -> bool {
    (1..=100).contains(&t.len())
        && t.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b))
}

impl Task for WebhookSend {
    type Params = WebhookParams;
    const NAME: &'static str = "webhook.send";
    const DESCRIPTION: &'static str = "One signed (Standard Webhooks, or the destination's own HMAC scheme) POST to a run-time URL that the destination's \
         url_patterns allow; http.request's guard, switches, retry and ambiguity rules; up to 1 MiB of data.";

    fn check(p: &WebhookParams) -> Result<(), ParamError> {
        super::check_name(&p.destination).map_err(|m| ParamError::new("destination", m))?;
        crate::outbound::parse_url(&p.url).map_err(|e| ParamError::new("url", e.to_string()))?;
        if !event_type_ok(&p.event_type) {
            return Err(ParamError::new("event_type", "1 to 100 letters, digits, '.', '_', ':' or '-'"));
        }
        http::check_timeout(p.timeout_ms)?;
        let size = serde_json::to_vec(&p.data).map_or(usize::MAX, |b| b.len());
        if size > MAX_BODY {
            return Err(ParamError::new("data", format!("at most {MAX_BODY} bytes of JSON (this is {size})")));
        }
        Ok(())
    }

    /// A run-time URL of the callback URL's shape (with a host name: an address literal's
    /// acceptance depends on the guard); which URLs a destination allows is its state.
    fn document_rules(schema: &mut Value) {
        schema["properties"]["url"]["pattern"] = json!(crate::outbound::url_pattern(false));
    }

    fn admit(p: &WebhookParams) -> Admission {
        let dest = Named { kind: Stored::Destination, field: "destination".into(), name: p.destination.clone() };
        let url = Named {
            kind: Stored::UrlOf { destination: p.destination.clone() },
            field: "url".into(),
            name: p.url.clone(),
        };
        Admission { held: false, names: vec![dest, url] }
    }

    fn needs_seconds(p: &WebhookParams) -> Option<i32> {
        http::needs_seconds(p.timeout_ms)
    }

    async fn run(&self, ctx: &TaskContext, p: WebhookParams) -> Result<Value, TaskError> {
        let (db, dest, job) = http::begin(ctx, &p.destination).await?;
        let now = chrono::Utc::now();
        let body = serde_json::to_vec(&json!({"type": p.event_type, "timestamp": now, "data": p.data}))
            .map_err(|e| TaskError::Fatal(e.to_string()))?;
        let msg_id = format!("wh_{}", ctx.job_id);
        let headers: Vec<NameValue> = http::relay_headers(&job, ctx, "relay-webhooks/1").into();
        // The record shows the body's size and digest: the body is held once, in the params.
        let mut shown = http::shown_request(Method::Post, &p.url, &headers, &dest, Some(http::digest(&body)));
        let id_header = dest.signature.as_ref().map_or(Some("webhook-id"), |s| s.id_header.as_deref());
        if let Some(h) = id_header {
            shown["headers"][h] = json!(msg_id);
        }
        shown["event_type"] = json!(p.event_type);
        // The patterns may have changed since submit: the URL must still match one.
        if let Err(why) = patterns::check_url(&p.url, &dest.url_patterns, &self.allow) {
            http::record_call(&db, ctx, &dest.name, &shown, "refused", Some(why.to_string())).await?;
            return Err(TaskError::Fatal(format!("url {:?}: {why}", p.url)).tenants());
        }
        drop(db);
        let call = Call {
            dest: &dest,
            method: Method::Post,
            url: p.url.clone(),
            headers,
            body: Bytes::from(body),
            shown,
            timeout: http::call_timeout(p.timeout_ms, &dest, &job),
            signing: Some(Signing { msg_id, timestamp: now.timestamp() }),
            success: dest.success.as_ref(),
        };
        http::send(&self.allow, self.local.as_ref(), &self.tokens, ctx, call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_and_time_needs() {
        for t in ["user.registered", "a", "x:y-z_1"] {
            assert!(event_type_ok(t), "{t}");
        }
        for t in ["", ".a", "a b", "a/b", &"x".repeat(101), "é"] {
            assert!(!event_type_ok(t), "{t}");
        }
        let p = |timeout_ms| WebhookParams {
            destination: "d".into(),
            url: "https://a.example.com/".into(),
            event_type: "t".into(),
            data: json!({}),
            timeout_ms,
        };
        assert_eq!(WebhookSend::needs_seconds(&p(None)), None);
        assert_eq!(WebhookSend::needs_seconds(&p(Some(600_001))), Some(606));
        assert!(WebhookSend::check(&p(Some(900_001))).is_err());
    }
}
