//! `http.request`: one call to a destination the tenant registered (`crate::destinations`), at
//! a path under its base URL, made through the call path `webhook.send` shares (`super::call`:
//! the address guard, switches, rate, secrets, records, and the one classification of an
//! answer, whose table is there).

use std::collections::BTreeMap;

use hyper::body::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use std::sync::Arc;

pub use super::call::Method;
use super::call::{
    Call, MAX_BODY, begin, call_timeout, check_timeout, needs_seconds, relay_headers, send, shown_body, shown_request,
};
use super::oauth::Tokens;
use super::success::SuccessRule;
use crate::destinations as rules;
use crate::destinations::local::LocalSecrets;
use crate::job::TaskError;
use crate::outbound::AllowList;
use crate::plain::NameValue;
use crate::plain::ParamError;
use crate::task::{Admission, Named, Stored, Task, TaskContext};

/// Calls tenants' destinations; `allow` is the operator's allow-list (`RELAY_CALLBACK_ALLOW`),
/// the same one callbacks use; `local`, the local secret store when there is no Secrets Manager;
/// `tokens`, the tokens minted by destinations' OAuth grants (shared with `webhook.send`).
#[derive(Debug, Clone, Default)]
pub struct HttpRequest {
    pub allow: AllowList,
    pub local: Option<Arc<LocalSecrets>>,
    pub tokens: Tokens,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestParams {
    /// A destination this tenant registered (`PUT /v1/destinations/{name}`).
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,62}$")]
    pub destination: String,
    pub method: Method,
    /// Under the destination's base URL: one leading `/`, URL characters, an optional query;
    /// no scheme or host, no `.` or `..` segment.
    #[schema(min_length = 1, max_length = 2000, pattern = "^/([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*$")]
    pub path: String,
    /// Headers to add (at most 50). Hop-by-hop headers, `Host`, `Content-Type`,
    /// `Content-Length`, `Idempotency-Key`, `X-Relay-Correlation-Id` and the destination's auth
    /// header are Relay's to set.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The JSON body (sent as `application/json`; at most 1 MiB as compact JSON).
    #[serde(default)]
    pub body: Option<Value>,
    /// This call's time limit, 100 to 900000 ms; default the destination's `timeout_ms`. Longer
    /// than the short lane allows, the job runs on the long-job lane.
    #[serde(default)]
    #[schema(minimum = 100, maximum = 900_000)]
    pub timeout_ms: Option<u32>,
    /// Which answers succeed for this call, in place of the destination's `success` (absent:
    /// the destination's; neither: any 2xx).
    #[serde(default)]
    pub success: Option<SuccessRule>,
}

impl Task for HttpRequest {
    type Params = RequestParams;
    const NAME: &'static str = "http.request";
    const DESCRIPTION: &'static str = "One HTTP call to a destination the tenant registered, with the job's idempotency key; \
         retried on 408, 429 and 5xx, ambiguous when cut off after sending; shadow mode records it without sending.";

    fn check(p: &RequestParams) -> Result<(), ParamError> {
        rules::check_name(&p.destination).map_err(|m| ParamError::new("destination", m))?;
        rules::check_path(&p.path).map_err(|m| ParamError::new("path", m))?;
        if p.headers.len() > rules::MAX_HEADERS {
            return Err(ParamError::new("headers", format!("at most {} headers", rules::MAX_HEADERS)));
        }
        for (name, value) in &p.headers {
            rules::check_header(name, value, None)
                .map_err(|m| ParamError::new(format!("headers.{name}"), m.to_string()))?;
        }
        check_timeout(p.timeout_ms)?;
        if let Some(rule) = &p.success {
            rule.check().map_err(|m| ParamError::new("success", m.to_string()))?;
        }
        let size = p.body.as_ref().map_or(0, |b| serde_json::to_vec(b).map_or(usize::MAX, |b| b.len()));
        if size > MAX_BODY {
            return Err(ParamError::new("body", format!("at most {MAX_BODY} bytes of JSON (this is {size})")));
        }
        Ok(())
    }

    /// Headers as `check_header` takes them (1 to 64 token characters, none of `REFUSED_HEADERS`
    /// in any case; values of visible ASCII, spaces and tabs), at most `MAX_HEADERS`. The
    /// destination's own auth header is refused when the job runs.
    fn document_rules(schema: &mut Value) {
        let refused: Vec<String> = rules::REFUSED_HEADERS.iter().map(|h| crate::pattern::any_case(h)).collect();
        let headers = &mut schema["properties"]["headers"];
        headers["propertyNames"] = json!({"type": "string", "pattern": "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$",
            "not": {"pattern": format!("^({})$", refused.join("|"))}});
        headers["maxProperties"] = json!(rules::MAX_HEADERS);
        let most = rules::MAX_HEADER_VALUE_LEN;
        headers["additionalProperties"] = json!({"type": "string", "pattern": format!("^[\\t -~]{{0,{most}}}$")});
    }

    fn admit(p: &RequestParams) -> Admission {
        let named = Named { kind: Stored::Destination, field: "destination".into(), name: p.destination.clone() };
        Admission { held: false, names: vec![named] }
    }

    fn needs_seconds(p: &RequestParams) -> Option<i32> {
        needs_seconds(p.timeout_ms)
    }

    async fn run(&self, ctx: &TaskContext, p: RequestParams) -> Result<Value, TaskError> {
        call(self, ctx, p).await
    }
}
async fn call(task: &HttpRequest, ctx: &TaskContext, p: RequestParams) -> Result<Value, TaskError> {
    let (db, dest, job) = begin(ctx, &p.destination).await?;
    drop(db);
    for (name, value) in &p.headers {
        rules::check_header(name, value, dest.auth_header.as_deref())
            .map_err(|m| TaskError::Fatal(format!("headers.{name}: {m}")).tenants())?;
    }
    let url = rules::join(&dest.base_url, &p.path);
    let mut headers: Vec<NameValue> = p.headers.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    headers.extend(relay_headers(&job, ctx, "relay-http/1"));
    let body = p.body.as_ref().map_or_else(Vec::new, |b| b.to_string().into_bytes());
    let shown_body = p.body.as_ref().map(|b| shown_body(&body, || b.clone()));
    let shown = shown_request(p.method, &url, &headers, &dest, shown_body);
    let timeout = call_timeout(p.timeout_ms, &dest, &job);
    let success = p.success.as_ref().or(dest.success.as_ref());
    let body = Bytes::from(body);
    let call = Call { dest: &dest, method: p.method, url, headers, body, shown, timeout, signing: None, success };
    send(&task.allow, task.local.as_ref(), &task.tokens, ctx, call).await
}
