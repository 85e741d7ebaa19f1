//! The one call path of `http.request` and `webhook.send` (`super::task`, `super::webhook`):
//! a call to a destination the tenant registered (`crate::destinations`), under the outbound
//! address guard (`crate::outbound`), carrying the job's idempotency key (`Idempotency-Key`)
//! and correlation id.
//!
//! One attempt: an earlier attempt's call with no recorded outcome makes this one ambiguous
//! (it may have gone); shadow mode records what would be sent and sends nothing; `write:http`,
//! the operators' switch for the destination or the tenant's own off defers the job
//! (`TaskError::Defer`, no attempt used);
//! then the secret (under the task's own role), the guard, a rate slot and a place among the
//! destination's calls in flight (`max_in_flight`; deferred when there is none), the call
//! recorded as `sending` under the job's fence, and the call itself. Each step takes a pooled
//! connection for its statements and gives it back: none is held across Secrets Manager, STS,
//! DNS or the call, so a destination that never answers holds no connection anyone else needs.
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx, whole | success; status, recorded headers and body (truncated) are the result |
//! | 408, 429, 5xx | retryable, not before `Retry-After`; the body is not read |
//! | no connection | retryable (nothing was sent) |
//! | cut off after the request left (no status, a 2xx body broken off, a timeout) | ambiguous: one exception, never retried |
//! | 3xx (not followed), other 4xx | fatal, the body kept |
//!
//! Every failure the destination causes (its answers, its address, its name, its missing
//! secret, a call cut off) is the tenant's own (`TaskError::tenants`): counted per tenant, no
//! operator exception; an ambiguous call is the tenant's to decide, and the error says so.
//! What Relay causes (no role mapped, Secrets Manager or the database failing) is the
//! platform's.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Digest;
use utoipa::ToSchema;

use super::answer::retryable_status;
pub use super::answer::{DECIDE, RECORDED_HEADERS, REDACTED};
use super::oauth::{self, Grant, Mint, Tokens};
use super::success::SuccessRule;
use super::{answer, signature};
use crate::destinations::local::LocalSecrets;
use crate::destinations::{self as rules, Secret, SecretError};
use crate::job::{Fence, TaskError};
use crate::outbound::{self, AllowList, Limits, Refusal};
use crate::plain::NameValue;
use crate::plain::ParamError;
use crate::store::destinations::{self, Destination};
use crate::store::http_calls::{self, NewCall, Sending, Settled};
use crate::store::rate_slots::{self, Limit, Slot};
use crate::store::{StoreError, jobs, modes};
use crate::task::TaskContext;

/// The HTTP method of a call.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    pub(crate) fn hyper(self) -> hyper::Method {
        match self {
            Method::Get => hyper::Method::GET,
            Method::Post => hyper::Method::POST,
            Method::Put => hyper::Method::PUT,
            Method::Patch => hyper::Method::PATCH,
            Method::Delete => hyper::Method::DELETE,
        }
    }
}

/// The most body bytes of an answer recorded (the rest is not read).
pub const MAX_RESPONSE_BODY: usize = 16 * 1024;
/// The largest body a call may carry, as compact JSON: 1 MiB (`http.request`'s `body`,
/// `webhook.send`'s `data`). Held once, in the job's parameters.
pub const MAX_BODY: usize = 1024 * 1024;
/// A body up to this size is shown whole in the call's record; a larger one by its size and
/// digest (the body itself is in the job's parameters).
pub const SHOWN_BODY: usize = 16 * 1024;
/// The longest call a job may ask (`timeout_ms`): 900 s (a deployment whose longest attempt is
/// shorter allows what fits: 890 s on the standard AWS one, 900 s long lane less its 5 s reserve).
pub const MAX_TIMEOUT_MS: u32 = 900_000;
/// The time an attempt keeps beyond its call, to record the outcome.
pub const RECORD_MARGIN_SECONDS: i32 = 5;
/// How long a job for a destination whose writes are off waits before it looks again.
pub const HOLD: Duration = Duration::from_secs(60);
/// What every call starts with: an earlier attempt's call with no recorded outcome makes this
/// one ambiguous; then the destination (gone: the tenant's fault) and the job.
pub(crate) async fn begin(
    ctx: &TaskContext,
    destination: &str,
) -> Result<(deadpool_postgres::Client, Destination, jobs::Job), TaskError> {
    let db = ctx.db.get().await.map_err(TaskError::retryable)?;
    if let Some(c) = http_calls::unsettled(&db, ctx.job_id, ctx.attempt).await.map_err(TaskError::retryable)? {
        return Err(TaskError::Ambiguous(format!(
            "attempt {}'s call to {} has no recorded outcome (its worker stopped mid-call): it may have reached the destination; not calling again. {DECIDE}",
            c.attempt, c.destination
        ))
        .tenants());
    }
    let Some(dest) = destinations::get(&db, ctx.tenant_id, destination).await.map_err(TaskError::retryable)? else {
        return Err(TaskError::Fatal(format!("destination {destination:?} no longer exists")).tenants());
    };
    let job = jobs::get(&db, ctx.tenant_id, ctx.job_id)
        .await
        .map_err(TaskError::retryable)?
        .ok_or_else(|| TaskError::retryable("the job vanished"))?;
    Ok((db, dest, job))
}

/// The headers Relay adds to every call: the job's idempotency key, its correlation id, and
/// who calls.
pub(crate) fn relay_headers(job: &jobs::Job, ctx: &TaskContext, agent: &str) -> [NameValue; 3] {
    [
        ("idempotency-key".into(), job.idempotency_key.clone()),
        (crate::email::content::CORRELATION_HEADER.to_owned(), ctx.correlation_id.clone()),
        ("user-agent".into(), agent.to_owned()),
    ]
}

/// One call as `http.request` and `webhook.send` make it, before its secrets are read.
pub(crate) struct Call<'a> {
    pub dest: &'a Destination,
    pub method: Method,
    pub url: String,
    /// Without the auth header (added from the destination's secret just before sending).
    pub headers: Vec<NameValue>,
    pub body: Bytes,
    /// What the call's record shows of it (`shown_request`).
    pub shown: Value,
    pub timeout: Duration,
    /// Sign the body with the destination's signing secret (`webhook.send`).
    pub signing: Option<Signing>,
    /// Which answers succeed (the job's rule, else the destination's; none: any 2xx).
    pub success: Option<&'a SuccessRule>,
}

/// The delivery's id and timestamp; the signature (`signature`) is over them and the body.
pub(crate) struct Signing {
    pub msg_id: String,
    pub timestamp: i64,
}

/// Make one call: shadow mode records what would be sent and sends nothing; `write:http`, the
/// operators' switch for the destination or the tenant's own off defers the job (no attempt
/// used); then the secrets (under the task's own role) or the minted token (`oauth`), the
/// guard, a rate slot and a place among the destination's calls in flight (deferred when
/// there is none), the call recorded as `sending` under the job's fence, the call itself, and
/// its one classification (the module's table, with the success rule). A minted token the
/// destination refuses (401) is dropped and the call made once more with a new one (a second
/// record). No pooled connection is held across anything that leaves the machine (Secrets
/// Manager, STS, DNS, the token endpoint, the call): each step takes one for its statements
/// and gives it back, so a destination that never answers holds no connection the API, claims
/// or liveness need.
pub(crate) async fn send(
    allow: &AllowList,
    local: Option<&Arc<LocalSecrets>>,
    tokens: &Tokens,
    ctx: &TaskContext,
    c: Call<'_>,
) -> Result<Value, TaskError> {
    let Call { dest, method, url, headers, body, shown, timeout, signing, success } = c;
    let target = {
        let db = connection(ctx).await?;
        if ctx.modes.shadow() {
            record_call(&db, ctx, &dest.name, &shown, "shadowed", Some("shadow mode: recorded, not sent".into()))
                .await?;
            return Ok(json!({"sent": false, "shadowed": true, "request": shown}));
        }
        // Three switches, each able to hold the call: the operators' for every destination, the
        // operators' for this one, and the tenant's own (on the destination).
        let held = if !ctx.modes.writes_enabled("http") {
            Some("by the operators, for every destination (write:http)")
        } else if modes::operator_holds(&db, ctx.tenant_id, &dest.name).await.map_err(TaskError::retryable)? {
            Some("by the operators, for this destination")
        } else if !dest.writes_enabled {
            Some("by your own switch (PUT /v1/destinations/{name}/writes)")
        } else {
            None
        };
        if let Some(by) = held {
            return Err(TaskError::Defer(
                format!("writes to destination {:?} are switched off {by}: held", dest.name),
                HOLD,
            ));
        }
        match outbound::parse_url(&url) {
            Ok(t) => t,
            Err(why) => {
                record_call(&db, ctx, &dest.name, &shown, "refused", Some(format!("invalid URL: {why}"))).await?;
                return Err(TaskError::Fatal(format!("invalid URL {url:?}: {why}")).tenants());
            }
        }
    };
    // The secrets before the intent: a missing one, an STS failure or a token endpoint's
    // refusal leaves no `sending` row.
    let reach = Reach { allow, local, tokens };
    let mut auth = Auth::read(&reach, ctx, dest, None).await?;
    let signed = match &signing {
        Some(s) => {
            let key = read_secret(local, ctx, dest, Secret::Signing).await?;
            signature::headers(dest.signature.as_ref(), &key, &s.msg_id, s.timestamp, &body)
        }
        None => Vec::new(),
    };
    let addr = match outbound::resolve(&target, allow).await {
        Ok(a) => a,
        Err(refusal @ Refusal::Address { .. }) => {
            let db = connection(ctx).await?;
            record_call(&db, ctx, &dest.name, &shown, "refused", Some(refusal.to_string())).await?;
            return Err(TaskError::Fatal(refusal.to_string()).tenants());
        }
        Err(refusal @ Refusal::Resolve { .. }) => return Err(TaskError::retryable(refusal).tenants()),
    };
    let what = format!("{} {url}", method.hyper());
    let mut refreshed = false;
    loop {
        let call_id = intend(ctx, dest, &shown).await?;
        let mut sent: Vec<(&str, String)> = headers.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        if let Some(a) = &auth {
            sent.push((a.header.as_str(), a.value.clone()));
        }
        sent.extend(signed.iter().map(|(n, v)| (n.as_str(), v.clone())));
        let limits = Limits {
            timeout,
            body: MAX_RESPONSE_BODY,
            read_body: |s| !retryable_status(s),
            content_type: outbound::CONTENT_TYPE,
        };
        let started = std::time::Instant::now();
        let answer = outbound::request(&target, addr, method.hyper(), &sent, body.clone(), limits)
            .await
            .map(|a| answer::redact(a, &auth.as_ref().map(Auth::secrets).unwrap_or_default()));
        let duration_ms = Some(i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX));
        let minted = auth.as_ref().and_then(|a| a.token.clone());
        let refused = !refreshed && minted.is_some() && matches!(&answer, Ok(a) if a.status == 401);
        let (settled, outcome) = if refused {
            let error = format!("{what}: answered 401, refusing the minted token: minting another, calling again");
            let response = answer.as_ref().ok().map(answer::response_json);
            let settled =
                Settled { outcome: "retryable", http_status: Some(401), response, error: Some(error), duration_ms };
            (settled, Ok(Value::Null))
        } else {
            answer::classify(&what, answer, duration_ms, success)
        };
        let settle = async { http_calls::settle(&ctx.db.get().await?, call_id, &settled).await };
        settle.await.map_err(|e: StoreError| {
            // The call happened; its record could not be settled. Say so rather than retry.
            TaskError::Ambiguous(format!("{what}: the call was made but its outcome could not be recorded: {e}"))
        })?;
        if !refused {
            return outcome;
        }
        refreshed = true;
        auth = Auth::read(&reach, ctx, dest, minted.as_deref()).await?;
    }
}

/// A place among the destination's calls in flight, a rate slot, and the call recorded as
/// `sending` under the job's fence: its record's id. Deferred when there is no place or slot.
async fn intend(ctx: &TaskContext, dest: &Destination, shown: &Value) -> Result<i64, TaskError> {
    let mut db = connection(ctx).await?;
    // No place among the calls in flight: defer before taking a rate slot or writing.
    let flying = http_calls::in_flight(&db, ctx.tenant_id, &dest.name).await.map_err(TaskError::retryable)?;
    if flying >= i64::from(dest.max_in_flight) {
        return Err(in_flight_full(dest, flying, ctx.attempt));
    }
    let limit = Limit {
        key: rate_slots::destination_key(ctx.tenant_id, &dest.name),
        rate_per_second: dest.rate_per_second,
        cap: None,
    };
    if let Slot::Wait(wait) = rate_slots::take(&db, &[limit], Duration::ZERO).await.map_err(TaskError::retryable)? {
        return Err(TaskError::RateLimited {
            rate: format!("destination:{}", dest.name),
            note: format!(
                "destination {:?} is at its rate of {}/s: waiting for a slot",
                dest.name, dest.rate_per_second
            ),
            wait,
        });
    }
    let fence = Fence { job: ctx.job_id, attempt: ctx.attempt };
    let new = NewCall {
        fence,
        tenant_id: ctx.tenant_id,
        destination: &dest.name,
        outcome: "sending",
        request: shown,
        error: None,
    };
    match http_calls::record_sending(&mut db, &new, dest.max_in_flight).await.map_err(TaskError::retryable)? {
        Sending::Recorded(id) => Ok(id),
        Sending::Fenced => Err(TaskError::retryable("this attempt no longer holds the job; it may not call")),
        Sending::Full { in_flight } => Err(in_flight_full(dest, in_flight, ctx.attempt)),
    }
}

/// Where a call's secrets come from: the allow-list (a token endpoint is under the guard too),
/// the local secret store, the process's tokens.
struct Reach<'a> {
    allow: &'a AllowList,
    local: Option<&'a Arc<LocalSecrets>>,
    tokens: &'a Tokens,
}

/// A call's auth header: the destination's secret as it is, or `Bearer` and a minted token.
struct Auth {
    header: String,
    value: String,
    token: Option<String>,
}

impl Auth {
    /// What an answer must not show.
    fn secrets(&self) -> Vec<&str> {
        std::iter::once(self.value.as_str()).chain(self.token.as_deref()).collect()
    }

    /// The header and its value (none without an `auth_header`); `stale`, a token the
    /// destination refused, is not used again.
    async fn read(
        reach: &Reach<'_>,
        ctx: &TaskContext,
        dest: &Destination,
        stale: Option<&str>,
    ) -> Result<Option<Auth>, TaskError> {
        let Some(header) = dest.auth_header.clone() else { return Ok(None) };
        let Some(grant) = &dest.oauth else {
            let value = read_secret(reach.local, ctx, dest, Secret::Auth).await?;
            return Ok(Some(Auth { header, value, token: None }));
        };
        let key = oauth::Key::of(ctx.tenant_id, dest, grant);
        let mint = || async {
            let client_secret = match grant.needs_client_secret(dest) {
                true => Some(read_secret(reach.local, ctx, dest, Secret::ClientSecret).await?),
                false => None,
            };
            if grant.grant != Grant::RefreshToken {
                return Mint { oauth: grant, client_secret, refresh_token: None, allow: reach.allow }.mint().await;
            }
            let sent = read_secret(reach.local, ctx, dest, Secret::RefreshToken).await?;
            let mint = |refresh_token: &String| {
                let m = Mint {
                    oauth: grant,
                    client_secret: client_secret.clone(),
                    refresh_token: Some(refresh_token.clone()),
                    allow: reach.allow,
                };
                async move { m.mint().await }
            };
            let minted = match mint(&sent).await {
                Ok(m) => m,
                // Refused: another process may have rotated the token since it was read.
                Err(refused) => match read_secret(reach.local, ctx, dest, Secret::RefreshToken).await {
                    Ok(now) if now != sent => mint(&now).await?,
                    _ => return Err(refused),
                },
            };
            if let Some(rotated) = &minted.rotated {
                store_rotated(reach.local, ctx, dest, rotated).await;
            }
            Ok(minted)
        };
        let token = reach.tokens.get(&key, stale, mint).await?;
        Ok(Some(Auth { header, value: format!("Bearer {token}"), token: Some(token) }))
    }
}

/// A pooled connection for one step of a call (never held across what leaves the machine).
async fn connection(ctx: &TaskContext) -> Result<deadpool_postgres::Client, TaskError> {
    ctx.db.get().await.map_err(TaskError::retryable)
}

/// The deferral of a job whose destination has `max_in_flight` calls in flight.
fn in_flight_full(dest: &Destination, in_flight: i64, attempt: i32) -> TaskError {
    TaskError::RateLimited {
        rate: format!("destination_in_flight:{}", dest.name),
        note: format!(
            "destination {:?} has {in_flight} calls in flight, its max_in_flight: waiting for one to end",
            dest.name
        ),
        wait: in_flight_wait(dest, attempt),
    }
}

/// How long a job waits when its destination's calls in flight are at `max_in_flight`: about
/// as long as a call can take shared among the places (a destination that never answers frees
/// one every `timeout / max_in_flight`), at least 250 ms and at most 5 s, longer with each
/// wait of the job's (its attempt grows with each), so a long stall costs few claims; then
/// spread.
fn in_flight_wait(dest: &Destination, attempt: i32) -> Duration {
    let share = u64::try_from(dest.timeout_ms / dest.max_in_flight.max(1)).unwrap_or(0);
    let grown = share.saturating_mul(1 + u64::try_from(attempt.clamp(1, 10) - 1).unwrap_or(0) / 2);
    // Spread by up to half again, so jobs deferred together do not all come back together.
    let wait = grown.clamp(250, 5_000);
    Duration::from_millis(wait + rand::random_range(0..=wait / 2))
}

/// Record a call under this attempt's fence; an attempt that no longer holds the job may not call.
pub(crate) async fn record_call(
    db: &deadpool_postgres::Client,
    ctx: &TaskContext,
    destination: &str,
    request: &Value,
    outcome: &'static str,
    error: Option<String>,
) -> Result<i64, TaskError> {
    let fence = Fence { job: ctx.job_id, attempt: ctx.attempt };
    let c = NewCall { fence, tenant_id: ctx.tenant_id, destination, outcome, request, error: error.as_deref() };
    http_calls::record(db, &c)
        .await
        .map_err(TaskError::retryable)?
        .ok_or_else(|| TaskError::retryable("this attempt no longer holds the job; it may not call"))
}

/// A call's own `timeout_ms`, checked: 100 to `MAX_TIMEOUT_MS`.
pub(crate) fn check_timeout(timeout_ms: Option<u32>) -> Result<(), ParamError> {
    match timeout_ms {
        Some(t) if !(100..=MAX_TIMEOUT_MS).contains(&t) => {
            Err(ParamError::new("timeout_ms", format!("100 to {MAX_TIMEOUT_MS}")))
        }
        _ => Ok(()),
    }
}

/// The attempt a call of `timeout_ms` needs (`Task::needs_seconds`): the call and the margin.
pub(crate) fn needs_seconds(timeout_ms: Option<u32>) -> Option<i32> {
    timeout_ms.map(|ms| i32::try_from(ms.div_ceil(1000)).unwrap_or(i32::MAX) + RECORD_MARGIN_SECONDS)
}

/// A call's time limit: the one asked, else the destination's, within the attempt's own time
/// less the margin to record it.
pub(crate) fn call_timeout(timeout_ms: Option<u32>, dest: &Destination, job: &jobs::Job) -> Duration {
    let room = u64::try_from(job.timeout_seconds - RECORD_MARGIN_SECONDS).unwrap_or(0).max(1) * 1000;
    let asked = timeout_ms.map_or(u64::try_from(dest.timeout_ms).unwrap_or(10_000), u64::from);
    Duration::from_millis(asked.min(room))
}

/// A body as its call's record shows it: whole up to `SHOWN_BODY`, else `digest`.
pub(crate) fn shown_body(body: &[u8], value: impl FnOnce() -> Value) -> Value {
    if body.len() <= SHOWN_BODY { value() } else { digest(body) }
}

/// A body's size and SHA-256, for a record that does not hold the body.
pub(crate) fn digest(body: &[u8]) -> Value {
    json!({"bytes": body.len(), "sha256": hex::encode(sha2::Sha256::digest(body))})
}

/// What was (or would be) sent, the secret redacted (`content-type` is `outbound::request`'s);
/// `body` as the call's record shows it.
pub(crate) fn shown_request(
    method: Method,
    url: &str,
    headers: &[NameValue],
    dest: &Destination,
    body: Option<Value>,
) -> Value {
    let mut shown: serde_json::Map<String, Value> = headers.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
    shown.insert("content-type".into(), json!(outbound::CONTENT_TYPE));
    if let Some(h) = &dest.auth_header {
        shown.insert(h.clone(), json!(REDACTED));
    }
    json!({"method": method, "url": url, "headers": shown, "body": body})
}

/// Keep the refresh token the endpoint rotated to in place of the old one (write-only, as the
/// tenant's: Secrets Manager under the task's role, allowed to put that one secret, or the
/// local store). Not noted as written by the tenant (`refresh_token_set_at`), so the token
/// just minted stays cached. A failed write is logged (never the token): the job goes on with
/// its token, and the next refresh, sent with the old one, may be refused until the tenant
/// writes a new one.
async fn store_rotated(local: Option<&Arc<LocalSecrets>>, ctx: &TaskContext, dest: &Destination, value: &str) {
    let written = match local {
        Some(store) => Ok(rules::SecretWriter::Local(store.clone())),
        None => ctx.aws().await.map(|sdk| rules::SecretWriter::new(&sdk)).map_err(|e| e.to_string()),
    };
    let written = match written {
        Ok(writer) => {
            writer.replace(ctx.tenant_id, &dest.name, Secret::RefreshToken, value).await.map_err(|e| e.to_string())
        }
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        tracing::warn!(event = "relay.destinations.refresh_token_rotate_failed", destination = %dest.name, error = %e,
            "could not keep the refresh token the token endpoint rotated to");
    }
}

/// One of the destination's secrets: from the local store when there is one, else from
/// Secrets Manager under the task's own role.
async fn read_secret(
    local: Option<&Arc<LocalSecrets>>,
    ctx: &TaskContext,
    dest: &Destination,
    which: Secret,
) -> Result<String, TaskError> {
    let read = match local {
        Some(store) => {
            let (store, tenant, name) = (store.clone(), ctx.tenant_id, dest.name.clone());
            tokio::task::spawn_blocking(move || store.read(tenant, &name, which)).await.map_err(TaskError::retryable)?
        }
        None => rules::read_secret(&ctx.aws().await?, ctx.tenant_id, &dest.name, which).await,
    };
    let checked = |v: &str| match which {
        Secret::Signing => signature::check_secret(dest.signature.as_ref(), v),
        _ if v.is_empty() => Err(rules::HeaderError::Empty),
        _ => rules::check_value(v),
    };
    match read {
        Ok(v) => {
            checked(&v).map(|()| v).map_err(|m| TaskError::Fatal(format!("the destination's secret: {m}")).tenants())
        }
        Err(e @ (SecretError::Missing(_) | SecretError::NotAString(_))) => {
            Err(TaskError::Fatal(e.to_string()).tenants())
        }
        Err(e @ SecretError::Service(_)) => Err(TaskError::retryable(e)),
    }
}
