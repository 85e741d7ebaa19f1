//! The HTTP server of `relay serve`/`relay dev` (and the console): hyper's HTTP/1 connection
//! with what `axum::serve` cannot set — a header-read timeout (a client that sends its headers
//! slowly, or sits idle between requests, is cut off), a cap on open connections (at the cap a
//! new connection takes the place of the one that has waited longest for a request head; when
//! every one has a request in flight the server stops accepting and the kernel's backlog holds
//! the rest: see `connections`) — and JSON answers for the requests hyper refuses before any
//! handler sees them (400, 414, 431: see `JsonRefusals`).

mod connections;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tower::ServiceExt;

use self::connections::{Connections, Tracked};
use super::error::ApiError;

/// How long a client has to send a request's headers (and how long an idle connection stays).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at most; at the cap a new one takes the place of the one that has waited
/// longest for a request head, or waits for room when every one has a request in flight.
pub const MAX_CONNECTIONS: usize = 1024;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { header_read_timeout: HEADER_READ_TIMEOUT, max_connections: MAX_CONNECTIONS }
    }
}

/// Serve `router` on `listener` until `stop` resolves, then finish the requests in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let open = Connections::new(limits.max_connections);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(stop);
    'serve: loop {
        // Below the cap, or a connection to evict; else wait for one to close or finish a request.
        while !open.has_room() {
            tokio::select! {
                () = open.room_changed() => {}
                () = &mut stop => break 'serve,
            }
        }
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin or stop serving.
                    tracing::warn!(event = "relay.api.accept_failed", error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // The evictable one may have begun a request meanwhile: then this one waits for room.
        let connection = loop {
            if let Some(c) = open.admit() {
                break c;
            }
            tokio::select! {
                () = open.room_changed() => {}
                () = &mut stop => break 'serve,
            }
        };
        let _ = stream.set_nodelay(true);
        let tracker = connection.tracker();
        let router = router.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let in_flight = tracker.begin();
            let router = router.clone();
            async move {
                let Some(in_flight) = in_flight else {
                    // Evicted as this request's head arrived: the connection is closing.
                    return Ok::<_, Infallible>(
                        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the server is busy")
                            .into_response(),
                    );
                };
                let response = router.oneshot(req.map(Body::new)).await?;
                Ok(response.map(|body| Body::new(Tracked::new(body, in_flight))))
            }
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(JsonRefusals::new(stream)), service));
        tokio::spawn(async move {
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(event = "relay.api.connection_closed", error = %e, "connection ended with an error");
                },
                () = connection.evicted() => {}
            }
            drop(connection);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A connection whose writes pass through unchanged, except hyper's own answers to a request it
/// could not parse (400 malformed, 414 URI too long, 431 headers too large). hyper writes those
/// with an empty body and offers no hook to change them; they are recognised here — an empty
/// 400/414/431 written as one head, which no handler's `ApiError` ever is — and replaced with
/// the same status and a JSON error body, after which hyper closes the connection.
pub struct JsonRefusals<S> {
    inner: S,
    /// A replacement answer still to be written, and how much of it is out.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> JsonRefusals<S> {
    pub fn new(inner: S) -> Self {
        JsonRefusals { inner, pending: None }
    }
}

/// The JSON answer that replaces hyper's empty one, if `head` is one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let head = std::str::from_utf8(head).ok()?;
    let rest = head.strip_prefix("HTTP/1.1 ")?;
    let status: u16 = rest.get(..3)?.parse().ok()?;
    let empty = head.ends_with("\r\n\r\n") && head.to_ascii_lowercase().contains("\r\ncontent-length: 0\r\n");
    let (code, message) = match status {
        400 => ("malformed_request", "the request could not be parsed as HTTP/1.1"),
        414 => ("uri_too_long", "the request's URI is too long"),
        431 => ("headers_too_large", "the request's headers are too large or too many"),
        _ => return None,
    };
    if !empty {
        return None;
    }
    let status = StatusCode::from_u16(status).ok()?;
    let body = serde_json::to_vec(&ApiError::new(status, code, message).body()).ok()?;
    let mut out = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

impl<S: AsyncWrite + Unpin> JsonRefusals<S> {
    /// Write out what remains of a replacement answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, sent)) = self.pending.as_mut() {
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
            if *sent == bytes.len() {
                self.pending = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonRefusals<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonRefusals<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_pending(cx))?;
        if let Some(bytes) = replacement(buf) {
            self.pending = Some((bytes, 0));
            // hyper's bytes count as written: the replacement goes out in their place.
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then writes each head as one buffer, which `replacement` reads whole.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_empty_refusals_are_replaced() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(replacement(hyper_431).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"));
        assert!(out.ends_with(
            r#"{"error":{"code":"headers_too_large","message":"the request's headers are too large or too many"}}"#
        ));
        let handler_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 52\r\n\r\n";
        assert_eq!(replacement(handler_400), None, "a handler's JSON 400 has a body");
        assert_eq!(replacement(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"), None);
        assert_eq!(replacement(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"), None);
    }
}
