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
    let old =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("-8000000000000000000|{}", uuid::Uuid::nil()));
    let far = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xffu8; 24]);
    for cursor in [&old, &far] {
        for (path, field) in [
            (format!("/v1/jobs?cursor={cursor}"), "cursor"),
            (format!("/v1/jobs?updated_since={cursor}"), "updated_since"),
        ] {
            let (s, body) = w.call(Method::GET, &path, None, None).await;
            assert_eq!(
                (s, code(&body), body["error"]["field"].as_str()),
                (StatusCode::BAD_REQUEST, "invalid_query", Some(field))
            );
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
    assert_eq!(
        (s, code(&body), body["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, "invalid_query", Some("cursor"))
    );
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
    let content_type =
        head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_owned));
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
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(100), conn.read(&mut buf)).await {
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("the slow client was still connected after 10 s");
    assert!(closed_after < Duration::from_secs(3), "cut off after {closed_after:?}");
    println!("slow-header client cut off after {closed_after:?} (timeout 1 s)");
}

#[tokio::test]
async fn at_the_cap_with_every_connection_busy_the_next_waits_until_one_finishes() {
    let w = World::new().await;
    let (addr, _stop) = serve(&w, Limits { max_connections: 2, ..Limits::default() }).await;
    // Two requests in flight: their handlers wait for bodies that never come.
    let mut busy = Vec::new();
    for i in 0..2 {
        let head = format!(
            "POST /v1/jobs HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {}\r\nidempotency-key: held-{i}\r\n\
             content-type: application/json\r\ncontent-length: 100\r\n\r\n{{",
            w.key
        );
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(head.as_bytes()).await.unwrap();
        busy.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for conn in &mut busy {
        let mut b = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_millis(50), conn.read(&mut b)).await;
        let answered = read.map(|r| String::from_utf8_lossy(&b[..r.unwrap_or(0)]).into_owned());
        assert!(answered.is_err(), "the held request was answered or closed: {answered:?}");
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let early = tokio::time::timeout(Duration::from_millis(500), third.read_to_end(&mut buf)).await;
    assert!(early.is_err() && buf.is_empty(), "served over the cap: {:?}", String::from_utf8_lossy(&buf));
    for conn in &mut busy {
        // Neither busy connection was closed to make room.
        let mut b = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_millis(50), conn.read(&mut b)).await;
        assert!(read.is_err(), "a connection with a request in flight was closed: {read:?}");
    }
    drop(busy);
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut buf)).await.unwrap().unwrap();
    let (s, _, body) = parse(&String::from_utf8_lossy(&buf));
    assert_eq!((s, body["ok"].as_bool()), (200, Some(true)));
}

/// Issue 37: more half-sent request heads than the cap, held open, kept tenants out until the
/// header-read timeout freed room. Now each new connection closes the one that has waited
/// longest for its head: every tenant is answered at once, and the oldest of the crowd go.
#[tokio::test]
async fn half_sent_requests_over_the_cap_give_way_to_tenants() {
    let w = World::new().await;
    let cap = server::MAX_CONNECTIONS;
    let (addr, _stop) = serve(&w, Limits::default()).await;
    let mut crowd = Vec::new();
    for _ in 0..cap + 76 {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        crowd.push(conn);
    }
    let request =
        format!("GET /v1/jobs HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {}\r\nconnection: close\r\n\r\n", w.key);
    let tenant = |request: String| async move {
        let started = Instant::now();
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(1), conn.read_to_end(&mut out)).await;
        let status = read.ok().and_then(|_| String::from_utf8_lossy(&out).get(9..12).map(str::to_owned));
        (status, started.elapsed())
    };
    let answers = futures::future::join_all((0..11).map(|_| tenant(request.clone()))).await;
    println!("tenant GETs behind {} half-sent heads: {answers:?}", crowd.len());
    for (status, took) in &answers {
        assert_eq!(
            status.as_deref(),
            Some("200"),
            "a tenant GET got no answer within 1 s (after {took:?}): {answers:?}"
        );
    }
    // The kills landed: the crowd's oldest connections were closed, the rest are still open.
    let closed = futures::future::join_all(crowd.iter_mut().map(|conn| async move {
        let mut b = [0u8; 64];
        matches!(tokio::time::timeout(Duration::from_millis(500), conn.read(&mut b)).await, Ok(Ok(0) | Err(_)))
    }))
    .await;
    let kills = closed.iter().filter(|c| **c).count();
    println!("{kills} of {} half-sent connections closed", crowd.len());
    assert!((77..=76 + 11).contains(&kills), "{kills} closed: 76 to make room for the crowd, then 1 to 11 for tenants");
    assert!(closed[..kills].iter().all(|c| *c), "the connections closed are the ones that waited longest");
}

/// Whether an error message names a Rust type (`expected f64`, `struct JobRequest`).
fn names_a_rust_type(message: &str) -> bool {
    [
        "f64", "f32", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "usize", "isize", "struct ", "enum ",
        "Option<", "Vec<",
    ]
    .iter()
    .any(|t| message.contains(t))
}

#[tokio::test]
async fn wrong_typed_fields_are_named_in_json_terms_on_every_route() {
    let w = World::new().await;
    let (_, operator_key) = taskdeck::store::operators::create(&w.db().await, "ops").await.unwrap();
    let job = uuid::Uuid::now_v7();
    let exception = uuid::Uuid::now_v7();
    let tenant = w.tenant.id;
    let noop = |extra: Value| {
        let mut body = serde_json::json!({"task_type": "noop"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let batch = |item: Value| serde_json::json!({"jobs": [item]});
    let mut item = noop(serde_json::json!({"delay_seconds": "soon"}));
    item["idempotency_key"] = "b-1".into();
    use serde_json::json;
    // (operator?, method, path, body, the field at fault, what the message must say)
    let cases: Vec<(bool, Method, String, Value, &str, &str)> = vec![
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            noop(json!({"delay_seconds": "soon"})),
            "delay_seconds",
            "whole number between 0 and 4294967295",
        ),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"delay_seconds": -5})), "delay_seconds", "whole number"),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"delay_seconds": 1.5})), "delay_seconds", "whole number"),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"max_attempts": "3"})), "max_attempts", "whole number"),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"max_attempts": 3.5})), "max_attempts", "whole number"),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"max_attempts": 1e20})), "max_attempts", "whole number"),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            noop(json!({"timeout_seconds": true})),
            "timeout_seconds",
            "whole number",
        ),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            noop(json!({"concurrency_limit": [1]})),
            "concurrency_limit",
            "not a list",
        ),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            noop(json!({"correlation_id": 7})),
            "correlation_id",
            "must be a string",
        ),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"run_at": 5})), "run_at", ""),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"run_at": "next tuesday"})), "run_at", ""),
        (false, Method::POST, "/v1/jobs".into(), noop(json!({"colour": "red"})), "colour", "unknown field colour"),
        (false, Method::POST, "/v1/jobs".into(), json!({"params": {}}), "task_type", "missing field task_type"),
        (false, Method::POST, "/v1/jobs".into(), json!([1, 2]), ".", "must be an object"),
        (false, Method::POST, "/v1/jobs".into(), json!("noop"), ".", "must be an object"),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            json!({"task_type": "sleep", "params": {"seconds": "long"}}),
            "params.seconds",
            "",
        ),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            json!({"task_type": "test.whoami", "params": {"calls": 5_000_000_000u64}}),
            "params.calls",
            "",
        ),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            json!({"task_type": "test.fail", "params": {"times": 1, "kind": 4}}),
            "params.kind",
            "",
        ),
        (
            false,
            Method::POST,
            "/v1/jobs".into(),
            json!({"task_type": "email.send", "params": {"from": 5, "to": ["a@example.com"], "subject": "s", "text": "t"}}),
            "params.from",
            "",
        ),
        (false, Method::POST, "/v1/jobs:batch".into(), batch(item.clone()), "jobs[0].delay_seconds", "whole number"),
        (
            false,
            Method::POST,
            "/v1/jobs:batch".into(),
            batch(json!({"idempotency_key": "b-2", "task_type": 5})),
            "jobs[0].task_type",
            "must be a string",
        ),
        (
            false,
            Method::POST,
            "/v1/jobs:batch".into(),
            batch(json!({"idempotency_key": "b-3"})),
            "jobs[0].task_type",
            "missing field",
        ),
        (false, Method::POST, "/v1/jobs:batch".into(), json!({"jobs": "all of them"}), "jobs", "must be a list"),
        (false, Method::PUT, "/v1/callbacks".into(), json!({"url": 5}), "url", "must be a string"),
        (
            false,
            Method::POST,
            "/v1/callbacks/rotate".into(),
            json!({"overlap_seconds": "a day"}),
            "overlap_seconds",
            "whole number",
        ),
        (
            false,
            Method::POST,
            "/v1/callbacks/rotate".into(),
            json!({"overlap_seconds": -1}),
            "overlap_seconds",
            "whole number",
        ),
        (false, Method::PUT, "/v1/templates/welcome".into(), json!({"subject": 5}), "subject", "must be a string"),
        (
            false,
            Method::PUT,
            format!("/v1/jobs/{job}/recipients/0"),
            json!({"recipients": [{"to": 5}]}),
            "recipients[0].to",
            "must be a string",
        ),
        (false, Method::PUT, "/v1/sending-role".into(), json!({"role_arn": {"arn": "x"}}), "role_arn", "not an object"),
        (
            true,
            Method::POST,
            "/v1/admin/schedules".into(),
            json!({"name": 5, "task_type": "noop", "cron": "* * * * *"}),
            "name",
            "must be a string",
        ),
        (
            true,
            Method::POST,
            "/v1/admin/schedules".into(),
            json!({"name": "n", "task_type": "noop", "cron": "* * * * *", "enabled": "yes"}),
            "enabled",
            "true or false",
        ),
        (
            true,
            Method::PATCH,
            "/v1/admin/schedules/nightly".into(),
            json!({"catch_up": 1}),
            "catch_up",
            "true or false",
        ),
        (
            true,
            Method::POST,
            "/v1/admin/exceptions:bulk".into(),
            json!({"action": "explode"}),
            "action",
            "must be one of: retry, cancel, finish, ignore",
        ),
        (true, Method::POST, "/v1/admin/exceptions:bulk".into(), json!({"action": 1}), "action", ""),
        (
            true,
            Method::POST,
            "/v1/admin/exceptions:bulk".into(),
            json!({"action": "retry", "filter": []}),
            "filter",
            "",
        ),
        (true, Method::POST, format!("/v1/admin/exceptions/{exception}/retry"), json!({"run_at": true}), "run_at", ""),
        (
            true,
            Method::POST,
            format!("/v1/admin/exceptions/{exception}/finish"),
            json!({"reason": 5}),
            "reason",
            "must be a string",
        ),
        (
            true,
            Method::PUT,
            "/v1/admin/modes".into(),
            json!({"name": "shadow", "enabled": "on"}),
            "enabled",
            "true or false",
        ),
        (
            true,
            Method::PUT,
            format!("/v1/admin/tenants/{tenant}/sending-identities"),
            json!({"identities": "a.example"}),
            "identities",
            "must be a list",
        ),
    ];
    let mut wrong = Vec::new();
    for (operator, method, path, body, field, says) in &cases {
        let key = if *operator { operator_key.as_str() } else { w.key.as_str() };
        let (mut s, mut answer) =
            w.call_as(key, method.clone(), path, Some("wt-1"), Some(body.to_string().into_bytes())).await;
        if s == StatusCode::OK && path.ends_with(":batch") {
            s = StatusCode::from_u16(answer["results"][0]["status"].as_u64().unwrap_or(200) as u16).unwrap();
            answer = json!({"error": answer["results"][0]["error"]});
        }
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        let ok = s.is_client_error()
            && answer["error"]["code"].is_string()
            && answer["error"]["field"].as_str() == Some(*field)
            && message.contains(says)
            && !names_a_rust_type(message);
        if !ok {
            wrong.push(format!("{method} {path} {body} → {s} {answer}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {} answers wrong:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
    // A query parameter given twice is named, in words.
    for path in ["/v1/jobs?limit=1&limit=2", "/v1/messages?limit=1&limit=2", "/v1/suppressions?limit=1&limit=2"] {
        let (s, body) = w.call(Method::GET, path, None, None).await;
        assert_eq!(
            (s, code(&body), body["error"]["field"].as_str()),
            (StatusCode::BAD_REQUEST, "invalid_query", Some("limit")),
            "{path}"
        );
        assert!(!names_a_rust_type(body["error"]["message"].as_str().unwrap()), "{body}");
    }
}

/// Read one answer (head and a JSON body of its `content-length`) within `within`, the
/// connection left open by this side; `None` when it does not come in time.
async fn answer_within(conn: &mut TcpStream, within: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ")?.parse().ok());
            if body.len() >= len.unwrap_or(usize::MAX) {
                return Some(text);
            }
        }
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

/// Issue 51, 6: a body declared over the route's limit is refused at once, before it is read
/// (it was read until the client stalled, then answered 503 after 15 s).
#[tokio::test]
async fn a_body_declared_over_the_routes_limit_is_a_413_at_once() {
    let w = World::new().await;
    let (addr, _stop) = serve(&w, Limits::default()).await;
    for (path, method, declared) in [
        ("/v1/jobs", "POST", 104_857_600usize),
        ("/v1/jobs", "POST", taskdeck::api::MAX_JOB_BODY_BYTES + 1),
        ("/v1/jobs:batch", "POST", taskdeck::api::MAX_JOB_BODY_BYTES + 1),
        ("/v1/templates/welcome", "PUT", taskdeck::api::MAX_BODY_BYTES + 1),
    ] {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {}\r\nidempotency-key: big-1\r\n\
             content-type: application/json\r\ncontent-length: {declared}\r\n\r\n",
            w.key
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        // Part of the body, then silence: the client neither finishes nor closes.
        conn.write_all(&vec![b' '; 64 * 1024]).await.unwrap();
        let started = Instant::now();
        let answer = answer_within(&mut conn, Duration::from_secs(3))
            .await
            .unwrap_or_else(|| panic!("{method} {path} declaring {declared} bytes: no answer in 3 s"));
        let (s, _, body) = parse(&answer);
        assert_eq!((s, code(&body)), (413, "body_too_large"), "{method} {path} declaring {declared}: {answer}");
        println!("{method} {path} declaring {declared} bytes: 413 in {:?}", started.elapsed());
    }
    // A declared length within the limit is read as before.
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let body = br#"{"task_type": "noop"}"#;
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {}\r\nidempotency-key: small-1\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        w.key,
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body).await.unwrap();
    let answer = answer_within(&mut conn, Duration::from_secs(5)).await.expect("an answer");
    assert_eq!(parse(&answer).0, 202, "{answer}");
}
