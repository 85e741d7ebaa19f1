//! Outbound HTTP to addresses a tenant chose: the address guard and one request to an address
//! resolved once. Callbacks (`callbacks::task`) and `http.request` (`destinations::task`) both
//! call out through here.
//!
//! The guard: a URL's host is resolved once (the system resolver, which also reads
//! numeric spellings such as `2130706433`, `0x7f.1` or `0177.0.0.1`, which `check_url` refuses
//! when a URL is set but rows written before may hold), every address it
//! resolves to is checked, and the request connects to the checked address, never resolving
//! again. Loopback, private, shared (CGNAT), link-local (cloud metadata included),
//! unspecified, multicast, reserved and documentation ranges are refused, in IPv4 and IPv6,
//! IPv4 embedded in IPv6 (mapped, compatible, NAT64, 6to4) included: every range of the IANA
//! special-purpose registries that is not globally reachable (`special`). Redirects are not
//! followed: a 3xx is a failed attempt. An operator allow-list (`RELAY_CALLBACK_ALLOW`: CIDRs
//! and host names, comma-separated) lifts the refusal, e.g. for local development.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use hyper::body::Bytes;

mod allow;
pub mod special;
mod traced;
pub use allow::{AllowList, AllowListError};
pub use traced::request;

/// Longest callback URL accepted.
pub const MAX_URL_LEN: usize = 2000;
/// Time limit of one delivery request (connect, send, answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest `Retry-After` honoured; a longer one waits this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(12 * 3600);

/// A callback URL, checked for shape (not for where it points: that is decided at delivery).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub uri: hyper::Uri,
    /// The host as written, without IPv6 brackets.
    pub host: String,
    pub port: u16,
}

/// Why a callback URL is not accepted. The message says what to fix; the API prefixes the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UrlError {
    #[error("at most {MAX_URL_LEN} characters")]
    TooLong,
    #[error("not a URL: {0}")]
    NotAUrl(String),
    #[error("the scheme must be http or https")]
    Scheme,
    #[error("the URL has no host")]
    NoHost,
    #[error("user info is not allowed in a callback URL")]
    UserInfo,
    #[error(
        "not of the shape `http(s)://host[:port][/path][?query]` (URL characters, `%` only as an escape, no fragment)"
    )]
    Shape,
    /// The host is written as an address the guard refuses (`check_url` only).
    #[error("outbound calls may not reach {ip}: {why}")]
    Refused { ip: IpAddr, why: &'static str },
}

/// The shape of a callback URL the API takes when it is set, with a host name (`true`: or an
/// address literal): http(s), an optional port 1 to 65535, path and query of URL characters
/// (`%` only as an escape), no fragment. The OpenAPI document states it without literals, whose
/// acceptance depends on the guard.
pub fn url_pattern(literals: bool) -> String {
    let name = "([A-Za-z0-9-]+\\.)*[A-Za-z][A-Za-z0-9-]*";
    let host = if literals {
        format!("({name}|[0-9]{{1,3}}(\\.[0-9]{{1,3}}){{3}}|\\[[0-9A-Fa-f:.]+\\])")
    } else {
        format!("({name})")
    };
    let port = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})";
    let chars = "([A-Za-z0-9._~!$&'()*+,;=:@/-]|%[0-9A-Fa-f]{2})";
    format!("^https?://{host}(:{port})?(/{chars}*)?(\\?({chars}|\\?)*)?$")
}

static URL_SHAPE: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new(&url_pattern(true)).expect("the callback URL pattern compiles"));

/// Parse a callback URL: `http` or `https`, a host, no user info, at most `MAX_URL_LEN`.
pub fn parse_url(url: &str) -> Result<Target, UrlError> {
    if url.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let uri: hyper::Uri = url.parse().map_err(|e: hyper::http::uri::InvalidUri| UrlError::NotAUrl(e.to_string()))?;
    let port = match uri.scheme_str() {
        Some("https") => 443,
        Some("http") => 80,
        _ => return Err(UrlError::Scheme),
    };
    let authority = uri.authority().ok_or(UrlError::NoHost)?;
    if authority.as_str().contains('@') {
        return Err(UrlError::UserInfo);
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    Ok(Target { port: authority.port_u16().unwrap_or(port), host, uri })
}

/// The check the API applies to a callback URL when it is set: its shape, and a host written
/// as an address the guard refuses (a name is resolved only at delivery, where the guard runs
/// again on every address it resolves to).
pub fn check_url(url: &str, allow: &AllowList) -> Result<(), UrlError> {
    let target = parse_url(url)?;
    if !URL_SHAPE.is_match(url) {
        return Err(UrlError::Shape);
    }
    match IpAddr::from_str(&target.host) {
        Ok(ip) if !allow.allows_ip(ip) => match refused(ip) {
            Some(why) => Err(UrlError::Refused { ip, why }),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Why callbacks may not reach this address, or `None` when they may.
pub fn refused(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    special::refused(IpAddr::V4(ip))
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    // IPv4 inside IPv6: judged as the IPv4 address it carries.
    let embedded = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    match s {
        // NAT64 (64:ff9b::/96) reaches the IPv4 address it carries.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => return refused_v4(embedded(hi, lo)),
        // 6to4 (2002::/16) carries an IPv4 address in bits 16..48.
        [0x2002, hi, lo, ..] => return refused_v4(embedded(hi, lo)),
        _ => {}
    }
    if let Some(why) = special::refused(IpAddr::V6(ip)) {
        return Some(why);
    }
    match s {
        // Deprecated IPv4-compatible addresses (::a.b.c.d).
        [0, 0, 0, 0, 0, 0, hi, lo] => refused_v4(embedded(hi, lo)).or(Some("IPv4-compatible address (::/96)")),
        // IPv4-translated (::ffff:0:a.b.c.d, SIIT) reaches the IPv4 address it carries.
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => {
            refused_v4(embedded(hi, lo)).or(Some("IPv4-translated address (::ffff:0:0/96)"))
        }
        _ => None,
    }
}

/// Why a delivery was not attempted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The host resolves to an address callbacks may not reach (not worth retrying).
    #[error("refused: {host} resolves to {ip}, {why}")]
    Address { host: String, ip: IpAddr, why: &'static str },
    /// The host did not resolve (may be temporary).
    #[error("could not resolve {host}: {error}")]
    Resolve { host: String, error: String },
}

/// Resolve the target's host once and choose the address to connect to. Every address the
/// name resolves to must pass (a name with one private answer among public ones is refused),
/// unless the host or the address is allow-listed.
pub async fn resolve(target: &Target, allow: &AllowList) -> Result<SocketAddr, Refusal> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| Refusal::Resolve { host: target.host.clone(), error: e.to_string() })?
        .collect();
    let first =
        *addrs.first().ok_or_else(|| Refusal::Resolve { host: target.host.clone(), error: "no addresses".into() })?;
    if allow.allows_host(&target.host) {
        return Ok(first);
    }
    for a in &addrs {
        if let Some(why) = refused(a.ip()).filter(|_| !allow.allows_ip(a.ip())) {
            return Err(Refusal::Address { host: target.host.clone(), ip: a.ip(), why });
        }
    }
    Ok(first)
}

/// The body's type on every request Relay sends out (set by `request` alone; a token
/// request's form is the one other, `destinations::oauth`).
pub const CONTENT_TYPE: &str = "application/json";

/// The answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    /// `Retry-After`, in seconds or as an HTTP date, capped at `MAX_RETRY_AFTER`.
    pub retry_after: Option<Duration>,
    pub headers: hyper::HeaderMap,
    /// The body as read: at most `Limits::body` bytes, none when `Limits::read_body` said no.
    pub body: Vec<u8>,
    /// The body was longer than the limit; the rest was not read.
    pub truncated: bool,
    /// The body ended before its end: the connection closed, or the time ran out, mid-body.
    pub cut: bool,
}

/// Why a request got no answer. `Connect` sent nothing; `NoAnswer` came after the request
/// started to leave, so the other side may have acted on it.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("no TLS root certificates: {0}")]
    TlsRoots(std::io::Error),
    #[error("{0}")]
    Request(hyper::http::Error),
    /// No connection (refused, TLS, or the time ran out connecting): nothing was sent. The
    /// message carries the whole cause chain.
    #[error("no connection: {0}")]
    Connect(String),
    /// The connection failed, or the time ran out, after the request started to leave and
    /// before the answer's status arrived.
    #[error("no answer after the request was sent: {0}")]
    NoAnswer(String),
}

impl PostError {
    /// Whether the request may have reached the other side.
    pub fn maybe_sent(&self) -> bool {
        matches!(self, PostError::NoAnswer(_))
    }
}

/// The bounds of one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// For the whole exchange: connect, send, answer and body.
    pub timeout: Duration,
    /// The most body bytes read.
    pub body: usize,
    /// Whether to read the body of an answer with this status at all.
    pub read_body: fn(u16) -> bool,
    /// The body's type (`CONTENT_TYPE` but for a token request's form).
    pub content_type: &'static str,
}

/// POST `body` to the target at the address chosen by `resolve` (a callback delivery: 15 s,
/// a bounded answer read and dropped so the connection ends cleanly).
pub async fn post(
    target: &Target,
    addr: SocketAddr,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<Answer, PostError> {
    let limits = Limits { timeout: REQUEST_TIMEOUT, body: 16 * 1024, read_body: |_| true, content_type: CONTENT_TYPE };
    request(target, addr, hyper::Method::POST, headers, body, limits).await
}

/// One request to the target at the address chosen by `resolve` (TLS, when https, is checked
/// against the URL's host name), on a connection of its own. No redirect is followed. The
/// connection is made first, so a failure then is known to have sent nothing (`Connect`);
/// from the moment the request starts to leave, a failure is `NoAnswer`, and a body that
/// breaks off is `Answer::cut`.
pub(crate) async fn exchange(
    target: &Target,
    addr: SocketAddr,
    method: hyper::Method,
    headers: &[(&str, String)],
    body: Bytes,
    limits: Limits,
) -> Result<Answer, PostError> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::connect::HttpConnector;
    use tower::{Service, ServiceExt};

    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut http = HttpConnector::new_with_resolver(Fixed(addr));
    http.enforce_http(false);
    http.set_connect_timeout(Some(limits.timeout.min(Duration::from_secs(5))));
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(PostError::TlsRoots)?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let timed_out = || format!("no answer within {} ms", limits.timeout.as_millis());
    let connect = async {
        let io = https.ready().await?.call(target.uri.clone()).await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(io).await?,
        )
    };
    let (mut sender, conn) = tokio::time::timeout_at(deadline, connect)
        .await
        .map_err(|_| PostError::Connect(timed_out()))?
        .map_err(|e| PostError::Connect(relay_runtime::error_chain(&*e)))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let path = target.uri.path_and_query().map_or("/", |p| p.as_str());
    let host = match (target.host.contains(':'), target.uri.port_u16()) {
        (true, Some(p)) => format!("[{}]:{p}", target.host),
        (true, None) => format!("[{}]", target.host),
        (false, Some(p)) => format!("{}:{p}", target.host),
        (false, None) => target.host.clone(),
    };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", host)
        .header("content-type", limits.content_type);
    for (name, value) in headers {
        req = req.header(*name, value);
    }
    let req = req.body(Full::new(body)).map_err(PostError::Request)?;
    let res = tokio::time::timeout_at(deadline, sender.send_request(req))
        .await
        .map_err(|_| PostError::NoAnswer(timed_out()))?
        .map_err(|e| PostError::NoAnswer(relay_runtime::error_chain(&e)))?;
    let status = res.status().as_u16();
    let retry_after = res.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
    let headers = res.headers().clone();
    let (mut body, mut truncated, mut cut) = (Vec::new(), false, false);
    if (limits.read_body)(status) {
        let mut incoming = res.into_body();
        loop {
            match tokio::time::timeout_at(deadline, incoming.frame()).await {
                Ok(None) => break,
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else { continue };
                    let room = limits.body - body.len();
                    if data.len() > room {
                        body.extend_from_slice(&data[..room]);
                        truncated = true;
                        break;
                    }
                    body.extend_from_slice(&data);
                }
                Ok(Some(Err(_))) | Err(_) => {
                    cut = true;
                    break;
                }
            }
        }
    }
    Ok(Answer { status, retry_after, headers, body, truncated, cut })
}

/// `Retry-After`: delay-seconds or an HTTP date; capped at `MAX_RETRY_AFTER`.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    let d = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO)
        }
    };
    Some(d.min(MAX_RETRY_AFTER))
}

/// A resolver that answers every name with the one address already checked.
#[derive(Clone)]
struct Fixed(SocketAddr);

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for Fixed {
    type Response = std::iter::Once<SocketAddr>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        std::future::ready(Ok(std::iter::once(self.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_refuses_private_addresses_in_every_spelling() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00:ec2::254",
            "ff02::1",
            "::ffff:169.254.169.254",
            "::ffff:a9fe:a9fe",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
            "::ffff:0:7f00:1",
            "::ffff:0:a9fe:a9fe",
            "64:ff9b:1::808:808",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(refused(ip.parse().unwrap()).is_some(), "{ip} must be refused");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert_eq!(refused(ip.parse().unwrap()), None, "{ip} is public");
        }
    }

    fn last_v4(e: &special::Entry<Ipv4Addr>) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(e.net) | (u32::MAX.checked_shr(u32::from(e.bits)).unwrap_or(0)))
    }

    fn last_v6(e: &special::Entry<Ipv6Addr>) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(e.net) | (u128::MAX.checked_shr(u32::from(e.bits)).unwrap_or(0)))
    }

    /// Every entry of both registries: one not globally reachable is refused at its first and
    /// last address (in every IPv6 spelling of an IPv4 one); a globally reachable one is let
    /// through unless an entry that is not holds it.
    #[test]
    fn the_guard_refuses_every_special_purpose_range_not_globally_reachable() {
        use special::Reach;
        let v4_held = |ip: Ipv4Addr| {
            special::IPV4.iter().any(|o| {
                let shift = 32 - u32::from(o.bits);
                o.reach != Reach::Global && u32::from(o.net).checked_shr(shift) == u32::from(ip).checked_shr(shift)
            })
        };
        for e in special::IPV4.iter().chain(special::OTHER_V4) {
            for ip in [e.net, last_v4(e)] {
                if e.reach == Reach::Global && !v4_held(ip) {
                    for spelled in [IpAddr::V4(ip), IpAddr::V6(ip.to_ipv6_mapped())] {
                        assert_eq!(refused(spelled), None, "{spelled} ({}) is globally reachable", e.name);
                    }
                } else if e.reach != Reach::Global {
                    let s = ip.octets();
                    let (hi, lo) = (u16::from_be_bytes([s[0], s[1]]), u16::from_be_bytes([s[2], s[3]]));
                    for spelled in [
                        IpAddr::V4(ip),
                        IpAddr::V6(ip.to_ipv6_mapped()),
                        IpAddr::V6(ip.to_ipv6_compatible()),
                        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo)),
                        IpAddr::V6(Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1)),
                    ] {
                        assert!(refused(spelled).is_some(), "{spelled} ({}) must be refused", e.name);
                    }
                }
            }
        }
        let v6_held = |ip: Ipv6Addr| {
            special::IPV6.iter().any(|o| {
                let shift = 128 - u32::from(o.bits);
                o.reach != Reach::Global && u128::from(o.net).checked_shr(shift) == u128::from(ip).checked_shr(shift)
            })
        };
        for e in special::IPV6.iter().chain(special::OTHER_V6) {
            for ip in [e.net, last_v6(e)] {
                let got = refused(IpAddr::V6(ip));
                match e.reach {
                    // The prefixes that carry an IPv4 address are judged by it: 6to4's first
                    // address carries 0.0.0.0, NAT64's last 255.255.255.255.
                    _ if [0x2002, 0x64].contains(&ip.segments()[0]) && e.bits != 48 => {
                        let s = ip.segments();
                        let (hi, lo) = if s[0] == 0x2002 { (s[1], s[2]) } else { (s[6], s[7]) };
                        let carried = Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
                        assert_eq!(got.is_some(), refused(IpAddr::V4(carried)).is_some(), "{ip} carries {carried}");
                    }
                    Reach::Global if !v6_held(ip) => assert_eq!(got, None, "{ip} ({}) is globally reachable", e.name),
                    Reach::Global => assert!(got.is_some(), "{ip} ({}) lies in a range that is not", e.name),
                    _ => assert!(got.is_some(), "{ip} ({}) must be refused", e.name),
                }
            }
        }
        // Public addresses carried by NAT64 and 6to4 are let through; private ones are not.
        for ip in ["64:ff9b::808:808", "2002:808:808::1", "2001:4860:4860::8888", "2a00:1450:4001::1"] {
            assert_eq!(refused(ip.parse().unwrap()), None, "{ip}");
        }
        for ip in ["64:ff9b::a00:1", "2002:c0a8:101::1", "3fff:fff::1", "2001:2:0:ffff::1", "192.88.99.1", "5f00::1"] {
            assert!(refused(ip.parse().unwrap()).is_some(), "{ip}");
        }
    }

    #[test]
    fn allow_lists_take_cidrs_and_hosts() {
        let a = AllowList::parse("127.0.0.1/32, 10.0.0.0/8,::1, callbacks.internal").unwrap();
        assert!(a.allows_ip("127.0.0.1".parse().unwrap()));
        assert!(a.allows_ip("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!a.allows_ip("127.0.0.2".parse().unwrap()));
        assert!(a.allows_ip("10.200.3.4".parse().unwrap()));
        assert!(a.allows_ip("::1".parse().unwrap()));
        assert!(a.allows_host("Callbacks.Internal"));
        assert!(AllowList::parse("10.0.0.0/33").is_err());
        assert!(AllowList::parse("nonsense/8").is_err());
    }

    #[test]
    fn a_literal_address_the_guard_refuses_is_refused_when_set() {
        let none = AllowList::default();
        for url in
            ["http://127.0.0.1/", "http://169.254.169.254/latest", "https://[::1]:8443/", "http://[::ffff:0:7f00:1]/"]
        {
            assert!(check_url(url, &none).unwrap_err().to_string().contains("may not reach"), "{url}");
        }
        assert!(check_url("https://93.184.216.34/hook", &none).is_ok());
        assert!(check_url("https://localhost/hook", &none).is_ok(), "a name is judged at delivery, where it resolves");
        assert!(check_url("http://127.0.0.1:9000/", &AllowList::parse("127.0.0.1").unwrap()).is_ok());
    }

    #[test]
    fn urls_are_checked_for_shape() {
        assert_eq!(parse_url("https://example.com/hook").unwrap().port, 443);
        assert_eq!(parse_url("http://[::1]:8080/x").unwrap().host, "::1");
        assert!(parse_url("ftp://example.com/").is_err());
        assert!(parse_url("https://user:pw@example.com/").is_err());
        assert!(parse_url("/relative").is_err());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_capped() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("99999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
    }
}
