//! Hostile input at the HTTP edge (issue 17): text Postgres cannot take, cursors out of its
//! range, requests hyper refuses before routing, slow and piled-up connections. Every answer is
//! a JSON 4xx with a stable code; none is a 500 and none hangs.

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use base64::Engine;
use serde_json::Value;
use taskdeck::api::server::{self, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::World;

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("not a JSON error: {body}"))
}

#[tokio::test]
async fn a_nul_in_a_path_or_query_parameter_is_a_400_not_a_500() {
    let w = World::new().await;
    for (method, path) in [
        (Method::GET, "/v1/templates/a%00b"),
        (Method::DELETE, "/v1/templates/a%00b"),
        (Method::DELETE, "/v1/suppressions/a%00b@example.com"),
        (Method::PUT, "/v1/suppressions/a%00b@example.com"),
    ] {
        let (s, body) = w.call(method.clone(), path, None, None).await;
        assert_eq!((s, code(&body)), (StatusCode::BAD_REQUEST, "nul_character"), "{method} {path}");
    }
    for path in ["/v1/jobs?task_type=a%00", "/v1/suppressions?after=a%00", "/v1/messages?correlation_id=%00"] {
        let (s, body) = w.call(Method::GET, path, None, None).await;
        assert_eq!((s, code(&body)), (StatusCode::BAD_REQUEST, "invalid_query"), "{path}");
    }
}

#[tokio::test]
async fn a_non_utf8_path_segment_answers_json() {
    let w = World::new().await;
    for path in ["/v1/jobs/%FF", "/v1/templates/%C3%28", "/v1/jobs/%FF/callbacks"] {
        let (s, body) = w.call(Method::GET, path, None, None).await;
        assert_eq!((s, code(&body)), (StatusCode::BAD_REQUEST, "invalid_path"), "{path}");
    }
}

#[tokio::test]
async fn cursors_outside_postgres_range_are_a_400_not_a_500() {
    let w = World::new().await;
    // The old text cursor of a time Postgres cannot hold, and a 24-byte one whose time field is
    // at or past 2^58 (first character not `A`).
    let old = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("-8000000000000000000|{}", uuid::Uuid::nil()));
    let far = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xffu8; 24]);
    for cursor in [&old, &far] {
        for (path, field) in [
            (format!("/v1/jobs?cursor={cursor}"), "cursor"),
            (format!("/v1/jobs?updated_since={cursor}"), "updated_since"),
        ] {
            let (s, body) = w.call(Method::GET, &path, None, None).await;
            assert_eq!((s, code(&body), body["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, "invalid_query", Some(field)));
        }
    }
    // Every cursor of the documented shape is a position: the smallest and the largest.
    for cursor in ["A".repeat(32), format!("A{}", "_".repeat(31))] {
        let (s, body) = w.call(Method::GET, &format!("/v1/jobs?cursor={cursor}"), None, None).await;
        assert_eq!(s, StatusCode::OK, "{body}");
    }
    let cursor = far;
    let (_, operator_key) = taskdeck::store::operators::create(&w.db().await, "ops").await.unwrap();
    let path = format!("/v1/admin/exceptions?cursor={cursor}");
    let (s, body) = w.call_as(&operator_key, Method::GET, &path, None, None).await;
    assert_eq!((s, code(&body), body["error"]["field"].as_str()), (StatusCode::BAD_REQUEST, "invalid_query", Some("cursor")));
}

/// `relay serve`'s server on a free port, serving this world's router.
async fn serve(w: &World, limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(listener, w.router.clone(), limits, async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// Send raw bytes and read the answer until the server closes (or 5 s pass).
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status and JSON body of a raw HTTP/1.1 answer.
fn parse(answer: &str) -> (u16, String, Value) {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no answer: {answer:?}"));
    let status = head[9..12].parse().unwrap();
    let content_type = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_owned));
    let body = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer:?}"));
    (status, content_type.unwrap_or_default(), body)
}

#[tokio::test]
async fn uri_too_long_headers_too_large_and_malformed_requests_answer_json() {
    let w = World::new().await;
    let (addr, _stop) = serve(&w, Limits::default()).await;
    let long_uri = format!("GET /v1/jobs?x={} HTTP/1.1\r\nhost: t\r\n\r\n", "a".repeat(70_000));
    let many_headers: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let big_header = format!("x-big: {}\r\n", "b".repeat(500_000));
    for (request, status, want) in [
        (long_uri, 414, "uri_too_long"),
        (format!("GET /healthz HTTP/1.1\r\nhost: t\r\n{many_headers}\r\n"), 431, "headers_too_large"),
        (format!("GET /healthz HTTP/1.1\r\nhost: t\r\n{big_header}\r\n"), 431, "headers_too_large"),
        ("GET /healthz HTTP/1.1\r\nbad header\r\n\r\n".to_owned(), 400, "malformed_request"),
    ] {
        let (s, content_type, body) = parse(&raw(addr, request.as_bytes()).await);
        assert_eq!((s, content_type.as_str(), code(&body)), (status, "application/json", want));
    }
    // A well-formed request on the same server is untouched.
    let (s, _, body) = parse(&raw(addr, b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await);
    assert_eq!((s, body["ok"].as_bool()), (200, Some(true)));
}

#[tokio::test]
async fn a_client_that_sends_its_headers_slowly_is_cut_off() {
    let w = World::new().await;
    let limits = Limits { header_read_timeout: Duration::from_secs(1), ..Limits::default() };
    let (addr, _stop) = serve(&w, limits).await;
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let started = Instant::now();
    // One header byte every 100 ms, for up to 10 s: the server must close first.
    let mut closed_after = None;
    for _ in 0..100 {
        if conn.write_all(b"x").await.is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), conn.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => {
                closed_after = Some(started.elapsed());
                break;
            }
            _ => {}
        }
    }
    let closed_after = closed_after.expect("the slow client was still connected after 10 s");
    assert!(closed_after < Duration::from_secs(3), "cut off after {closed_after:?}");
    println!("slow-header client cut off after {closed_after:?} (timeout 1 s)");
}

#[tokio::test]
async fn connections_over_the_cap_wait_until_one_closes() {
    let w = World::new().await;
    let (addr, _stop) = serve(&w, Limits { max_connections: 2, ..Limits::default() }).await;
    let idle = [TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let early = tokio::time::timeout(Duration::from_millis(500), third.read_to_end(&mut buf)).await;
    assert!(early.is_err() && buf.is_empty(), "served over the cap: {:?}", String::from_utf8_lossy(&buf));
    drop(idle);
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut buf)).await.unwrap().unwrap();
    let (s, _, body) = parse(&String::from_utf8_lossy(&buf));
    assert_eq!((s, body["ok"].as_bool()), (200, Some(true)));
}
