//! A fault-injecting SES stand-in in front of moto: each SES v2 send is passed through, throttled
//! or rejected (never reaching moto), or taken by moto and then answered with a 500, cut off
//! mid-answer, or held past the client's time limit; or, like SES past an account's maximum
//! send rate, throttled when `max_per_second` sends already passed in the last second.
//! Answers `GetAccount` (which moto lacks) with `account`'s quota, and stands in for SES tenant
//! management (which moto lacks): records each send's `TenantName`, answers a send naming a
//! paused tenant (`Counts::paused_tenants`) with `SendingPausedException`, and serves
//! `CreateTenant` and `CreateTenantResourceAssociation` (recording each call; a second one for
//! the same tenant or association answers `AlreadyExistsException`, as SES does; all refused with
//! `LimitExceededException` while `Counts::refuse_tenant_setup` is set); records each send's
//! `ListManagementOptions` (which moto ignores); and keeps contacts of contact lists itself
//! (`GetContact`, `CreateContact`, `UpdateContact`: moto 5.2.1 has no `UpdateContact`, so one
//! store answers all three), refused with `TooManyRequestsException` while
//! `Counts::refuse_contacts` is set. Every other request (STS) passes through. Counts what it did, and when each send passed (with its subject), so a
//! caller can check Relay's records against the truth. Used by the tests and `relay bench`
//! (its `pace` section); nothing here runs in production.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;

/// The chance of each fault per send; the rest pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub throttle: f64,
    pub reject: f64,
    /// moto takes it, the client gets a 500.
    pub error_after: f64,
    /// moto takes it, the answer is cut off.
    pub drop_after: f64,
    /// moto takes it, the answer comes after the client gave up.
    pub hang_after: f64,
    /// Throttle a send when this many passed in the last second (SES's `MaxSendRate`).
    pub max_per_second: Option<usize>,
    /// `GetAccount`'s `MaxSendRate` and `Max24HourSend` (`SentLast24Hours` counts what passed).
    pub account: Option<(f64, f64)>,
}

#[derive(Debug, Default)]
pub struct Counts {
    pub passed: AtomicU64,
    pub throttled: AtomicU64,
    pub rejected: AtomicU64,
    pub error_after: AtomicU64,
    pub dropped_after: AtomicU64,
    pub hung_after: AtomicU64,
    /// When each send passed, and its subject.
    pub passed_at: std::sync::Mutex<Vec<(std::time::Instant, String)>>,
    /// The `TenantName` each passed send named (SES tenant management), in order; none: "".
    pub tenants: std::sync::Mutex<Vec<String>>,
    /// The `ListManagementOptions` each passed send named, as `<ContactListName>/<TopicName>`,
    /// in order; none: "" (moto takes the field and does nothing with it).
    pub lists: std::sync::Mutex<Vec<String>>,
    /// SES tenants paused now, as SES pauses one: a send naming one is answered
    /// `SendingPausedException` (moto has no tenants: this stands in for SES's own pause).
    pub paused_tenants: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Each `CreateTenant` call, by tenant name, in order (a repeat included).
    pub tenants_created: std::sync::Mutex<Vec<String>>,
    /// Each `CreateTenantResourceAssociation` call: (tenant name, resource ARN), in order.
    pub tenant_associations: std::sync::Mutex<Vec<(String, String)>>,
    /// While set, tenant management calls are refused (`LimitExceededException`).
    pub refuse_tenant_setup: std::sync::atomic::AtomicBool,
    /// Contacts by (contact list, address), as SES keeps them: `{"TopicPreferences":
    /// [{"TopicName", "SubscriptionStatus"}], "UnsubscribeAll", "AttributesData"?}`.
    pub contacts: std::sync::Mutex<std::collections::BTreeMap<(String, String), serde_json::Value>>,
    /// Each contact call answered (`GetContact list address`...), in order.
    pub contact_calls: std::sync::Mutex<Vec<String>>,
    /// While set, contact calls are refused (`TooManyRequestsException`).
    pub refuse_contacts: std::sync::atomic::AtomicBool,
}

impl Counts {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::SeqCst)
    }

    /// When each send passed, and its subject (a copy).
    pub fn passed(&self) -> Vec<(std::time::Instant, String)> {
        self.passed_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A contact's `SubscriptionStatus` for a topic (`OPT_IN`, `OPT_OUT`), if it has one.
    pub fn contact_topic(&self, list: &str, address: &str, topic: &str) -> Option<String> {
        let contacts = self.contacts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let prefs = contacts.get(&(list.to_owned(), address.to_owned()))?["TopicPreferences"].as_array()?.clone();
        let found = prefs.into_iter().find(|p| p["TopicName"] == topic)?;
        found["SubscriptionStatus"].as_str().map(str::to_owned)
    }

    /// Sends moto took whose answer never reached the client intact.
    pub fn ambiguous(&self) -> u64 {
        Self::get(&self.error_after) + Self::get(&self.dropped_after) + Self::get(&self.hung_after)
    }
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    faults: Faults,
    counts: Arc<Counts>,
    rng: Arc<Mutex<StdRng>>,
    client: Client<HttpConnector, Body>,
}

pub struct FaultySes {
    pub url: String,
    pub counts: Arc<Counts>,
}

/// Start the stand-in in front of `upstream` (moto's URL). It serves until the process exits.
pub fn start(upstream: &str, faults: Faults, seed: u64) -> std::io::Result<FaultySes> {
    let counts = Arc::new(Counts::default());
    let (upstream, kept) = (upstream.trim_end_matches('/').to_owned(), counts.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr: SocketAddr = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // On a thread and runtime of its own, so the time a send is counted at is when it came,
    // not when the caller's busy runtime got round to it.
    std::thread::spawn(move || {
        rt.block_on(async move {
            let proxy = Proxy {
                upstream,
                faults,
                counts: kept,
                rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
                client: Client::builder(TokioExecutor::new()).build_http(),
            };
            let app = axum::Router::new().fallback(handle).with_state(proxy);
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => axum::serve(listener, app).await.ok(),
                Err(_) => None,
            }
        })
    });
    Ok(FaultySes { url: format!("http://{addr}"), counts })
}

enum Fault {
    Pass,
    Throttle,
    Reject,
    ErrorAfter,
    DropAfter,
    HangAfter,
}

async fn handle(State(p): State<Proxy>, req: Request) -> Response {
    // A send counts from when its request came (as SES counts it), before its body is read.
    let came = std::time::Instant::now();
    let is_send = req.uri().path().starts_with("/v2/email/outbound-emails");
    if req.uri().path() == "/v2/email/account"
        && let Some((rate, max)) = p.faults.account
    {
        let sent = Counts::get(&p.counts.passed) as f64;
        let body = serde_json::json!({"SendQuota": {"MaxSendRate": rate, "Max24HourSend": max, "SentLast24Hours": sent},
            "SendingEnabled": true, "ProductionAccessEnabled": true});
        let mut r = Response::new(Body::from(body.to_string()));
        r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        return r;
    }
    let req = match tenant_management(&p.counts, req).await {
        Ok(answer) => return answer,
        Err(req) => req,
    };
    let req = match contacts(&p.counts, req).await {
        Ok(answer) => return answer,
        Err(req) => req,
    };
    let (req, subject, tenant, list) =
        if is_send { with_subject(req).await } else { (req, String::new(), String::new(), String::new()) };
    let mut fault = if is_send { p.choose().await } else { Fault::Pass };
    let c = &p.counts;
    if is_send && c.paused_tenants.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&tenant) {
        return error(StatusCode::BAD_REQUEST, "SendingPausedException", "Sending is paused for this tenant.");
    }
    if is_send && let Some(max) = p.faults.max_per_second {
        // Take a place in the last second's sends, or be throttled.
        let now = came;
        let mut passed = c.passed_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Sends in the second up to `now` (a request read more slowly may sit after one that came later).
        let recent = passed
            .iter()
            .rev()
            .take_while(|(at, _)| now.saturating_duration_since(*at) < Duration::from_secs(2))
            .filter(|(at, _)| *at <= now && now.duration_since(*at) < Duration::from_secs(1))
            .count();
        if recent >= max {
            fault = Fault::Throttle;
        } else if matches!(fault, Fault::Pass) {
            passed.push((now, subject.clone()));
        }
    } else if is_send && matches!(fault, Fault::Pass) {
        c.passed_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((came, subject.clone()));
    }
    match fault {
        Fault::Throttle => {
            c.throttled.fetch_add(1, Ordering::SeqCst);
            return error(StatusCode::TOO_MANY_REQUESTS, "TooManyRequestsException", "Maximum sending rate exceeded.");
        }
        Fault::Reject => {
            c.rejected.fetch_add(1, Ordering::SeqCst);
            return error(StatusCode::BAD_REQUEST, "MessageRejected", "Email address is not verified.");
        }
        _ => {}
    }
    let answer = p.forward(req).await;
    match fault {
        Fault::ErrorAfter => {
            c.error_after.fetch_add(1, Ordering::SeqCst);
            error(StatusCode::INTERNAL_SERVER_ERROR, "InternalFailure", "injected failure after the send")
        }
        Fault::DropAfter => {
            c.dropped_after.fetch_add(1, Ordering::SeqCst);
            // Headers go out, then the body fails: the connection is cut mid-answer.
            let cut = futures::stream::once(async { Err::<Bytes, std::io::Error>(std::io::Error::other("cut")) });
            let mut r = Response::new(Body::from_stream(cut));
            r.headers_mut().insert("content-length", HeaderValue::from_static("64"));
            r
        }
        Fault::HangAfter => {
            c.hung_after.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(taskdeck::email::ses::SEND_TIMEOUT + Duration::from_secs(2)).await;
            answer
        }
        _ => {
            if is_send {
                c.passed.fetch_add(1, Ordering::SeqCst);
                c.tenants.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(tenant);
                c.lists.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(list);
            }
            answer
        }
    }
}

/// An answer to SES tenant management (`CreateTenant`, `CreateTenantResourceAssociation`),
/// recorded in `counts`; any other request is handed back.
async fn tenant_management(counts: &Counts, req: Request) -> Result<Response, Request> {
    let association = match (req.method(), req.uri().path()) {
        (&axum::http::Method::POST, "/v2/email/tenants") => false,
        (&axum::http::Method::POST, "/v2/email/tenants/resources") => true,
        _ => return Err(req),
    };
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let name = v["TenantName"].as_str().unwrap_or_default().to_owned();
    if counts.refuse_tenant_setup.load(Ordering::SeqCst) {
        return Ok(error(StatusCode::BAD_REQUEST, "LimitExceededException", "Too many tenants."));
    }
    let repeated = if association {
        let pair = (name.clone(), v["ResourceArn"].as_str().unwrap_or_default().to_owned());
        let mut all = counts.tenant_associations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let repeated = all.contains(&pair);
        all.push(pair);
        repeated
    } else {
        let mut all = counts.tenants_created.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let repeated = all.contains(&name);
        all.push(name.clone());
        repeated
    };
    if repeated {
        return Ok(error(StatusCode::BAD_REQUEST, "AlreadyExistsException", "The resource already exists."));
    }
    let body = if association {
        serde_json::json!({})
    } else {
        serde_json::json!({"TenantName": name, "TenantId": format!("id-{name}"),
            "TenantArn": format!("arn:aws:ses:us-east-1:123456789012:tenant/{name}")})
    };
    let mut r = Response::new(Body::from(body.to_string()));
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    Ok(r)
}

/// An answer to SES contact calls (`GetContact`, `CreateContact`, `UpdateContact`) from the
/// contacts kept in `counts`; any other request is handed back.
async fn contacts(counts: &Counts, req: Request) -> Result<Response, Request> {
    use axum::http::Method;
    let path = req.uri().path().to_owned();
    let Some(rest) = path.strip_prefix("/v2/email/contact-lists/") else { return Err(req) };
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    let (list, address) = match rest.split('/').collect::<Vec<_>>()[..] {
        [list, "contacts"] => (decode(list), None),
        [list, "contacts", address] => (decode(list), Some(decode(address))),
        _ => return Err(req),
    };
    let call = match (req.method(), &address) {
        (&Method::GET, Some(_)) => "GetContact",
        (&Method::PUT, Some(_)) => "UpdateContact",
        (&Method::POST, None) => "CreateContact",
        _ => return Err(req),
    };
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let address = address.or_else(|| v["EmailAddress"].as_str().map(str::to_owned)).unwrap_or_default();
    counts
        .contact_calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{call} {list} {address}"));
    if counts.refuse_contacts.load(Ordering::SeqCst) {
        return Ok(error(StatusCode::TOO_MANY_REQUESTS, "TooManyRequestsException", "Too many requests."));
    }
    let mut all = counts.contacts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (list.clone(), address.clone());
    let kept = serde_json::json!({"TopicPreferences": v.get("TopicPreferences").cloned().unwrap_or_else(|| serde_json::json!([])),
        "UnsubscribeAll": v["UnsubscribeAll"].as_bool().unwrap_or(false), "AttributesData": v.get("AttributesData")});
    let body = match (call, all.get(&key)) {
        ("GetContact", Some(c)) => {
            let mut c = c.clone();
            c["ContactListName"] = list.into();
            c["EmailAddress"] = address.into();
            c
        }
        ("CreateContact", None) | ("UpdateContact", Some(_)) => {
            all.insert(key, kept);
            serde_json::json!({})
        }
        ("CreateContact", Some(_)) => {
            return Ok(error(StatusCode::BAD_REQUEST, "AlreadyExistsException", "The contact already exists."));
        }
        _ => return Ok(error(StatusCode::NOT_FOUND, "NotFoundException", "The contact does not exist.")),
    };
    let mut r = Response::new(Body::from(body.to_string()));
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    Ok(r)
}

/// The request, whole again, its subject (SES v2 `SendEmail`'s raw MIME content) and the SES
/// tenant it names (`TenantName`, "" when none), and its list management options
/// (`<ContactListName>/<TopicName>`, "" when none).
async fn with_subject(req: Request) -> (Request, String, String, String) {
    use base64::Engine as _;
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let raw = v["Content"]["Raw"]["Data"].as_str().unwrap_or_default();
    let raw = base64::engine::general_purpose::STANDARD.decode(raw).unwrap_or_default();
    let subject = header(&String::from_utf8_lossy(&raw), "Subject").unwrap_or_default();
    let tenant = v["TenantName"].as_str().unwrap_or_default().to_owned();
    let list = &v["ListManagementOptions"];
    let list = match (list["ContactListName"].as_str(), list["TopicName"].as_str()) {
        (Some(l), Some(t)) => format!("{l}/{t}"),
        (Some(l), None) => l.to_owned(),
        _ => String::new(),
    };
    (Request::from_parts(parts, Body::from(bytes)), subject, tenant, list)
}

/// A top-level header of a MIME message, unfolded (ASCII values; the tests' subjects are).
pub fn header(message: &str, name: &str) -> Option<String> {
    let head = message.split("\r\n\r\n").next().unwrap_or_default().replace("\r\n ", " ").replace("\r\n\t", "\t");
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// The most sends in any one-second window of these times.
pub fn max_in_any_second(times: &[std::time::Instant]) -> usize {
    let mut t = times.to_vec();
    t.sort();
    let mut best = 0;
    let mut start = 0;
    for end in 0..t.len() {
        while t[end].duration_since(t[start]) >= Duration::from_secs(1) {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

impl Proxy {
    async fn choose(&self) -> Fault {
        let x: f64 = self.rng.lock().await.random();
        let f = self.faults;
        let mut edge = 0.0;
        for (p, fault) in [
            (f.throttle, Fault::Throttle),
            (f.reject, Fault::Reject),
            (f.error_after, Fault::ErrorAfter),
            (f.drop_after, Fault::DropAfter),
            (f.hang_after, Fault::HangAfter),
        ] {
            edge += p;
            if x < edge {
                return fault;
            }
        }
        Fault::Pass
    }

    async fn forward(&self, req: Request) -> Response {
        let (mut parts, body) = req.into_parts();
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = match format!("{}{path}", self.upstream).parse() {
            Ok(uri) => uri,
            Err(e) => return error(StatusCode::BAD_GATEWAY, "ProxyError", &format!("the upstream's URL: {e}")),
        };
        parts.headers.remove("host");
        let upstream = hyper::Request::from_parts(parts, Body::from(bytes));
        match self.client.request(upstream).await {
            Ok(res) => {
                let (parts, body) = res.into_parts();
                let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                Response::from_parts(parts, Body::from(bytes))
            }
            Err(e) => error(StatusCode::BAD_GATEWAY, "ProxyError", &e.to_string()),
        }
    }
}

fn error(status: StatusCode, kind: &'static str, message: &str) -> Response {
    let mut r = Response::new(Body::from(serde_json::json!({ "message": message }).to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert("x-amzn-errortype", HeaderValue::from_static(kind));
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    r
}
