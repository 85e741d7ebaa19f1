//! `request` inside a span that becomes an X-Ray subsegment on Lambda (`relay_runtime`'s
//! `xray`): the host, the method, the URL without its query (which may carry a client's token)
//! and the status.

use std::net::SocketAddr;

use hyper::body::Bytes;
use tracing::Instrument;

use super::{Answer, Limits, PostError, Target, exchange};

/// One request to the target at the address chosen by `resolve`: see `exchange`.
pub async fn request(
    target: &Target,
    addr: SocketAddr,
    method: hyper::Method,
    headers: &[(&str, String)],
    body: Bytes,
    limits: Limits,
) -> Result<Answer, PostError> {
    let url = format!("{}://{}{}", target.uri.scheme_str().unwrap_or("http"), target.host, target.uri.path());
    let span = tracing::debug_span!(
        "outbound",
        "xray.namespace" = "remote",
        "xray.name" = target.host.as_str(),
        "http.method" = method.as_str(),
        "http.url" = url.as_str(),
        "http.status" = tracing::field::Empty,
    );
    let answer = exchange(target, addr, method, headers, body, limits).instrument(span.clone()).await;
    if let Ok(a) = &answer {
        span.record("http.status", a.status);
    }
    answer
}
