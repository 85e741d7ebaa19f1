//! `http.request` end to end: a raw HTTP receiver on 127.0.0.1 (allow-listed) that answers from
//! a script (or cuts its answer, or hangs), the secret in moto's Secrets Manager read under the
//! task's own role, shadow mode, the write switches, the rate across workers, two tenants.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::credentials::{RoleSpec, TaskCredentials, TaskRoles};
use taskdeck::executor::Executor;
use taskdeck::job::JobId;
use taskdeck::outbound::AllowList;
use taskdeck::store::modes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{World, moto, test_settings};

pub const ROLE: &str = "arn:aws:iam::123456789012:role/relay-task-http-request";

/// How the receiver answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Status, extra headers, body.
    Status(u16, Vec<(&'static str, &'static str)>, &'static str),
    /// A 200 whose body breaks off: headers promise 100 bytes, 7 come, the connection closes.
    Cut,
    /// Wait this long before answering 200 (a timeout after the request was sent).
    Hang(Duration),
    /// Answer this status with the request's head as the body: as a JSON string when `true`,
    /// else as text (an error page quoting what it was sent).
    Echo(u16, bool),
}

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub at: Instant,
    /// The request line and headers as they arrived.
    pub head: String,
}

pub type SeenLog = Arc<Mutex<Vec<Seen>>>;

/// A raw HTTP/1.1 receiver answering from `script` (then 200 `{"ok":true}`), one request per
/// connection, recording every request.
pub async fn receiver(script: Vec<Reply>) -> (SocketAddr, SeenLog) {
    let seen: SeenLog = Arc::default();
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (log, script) = (log.clone(), script.clone());
            tokio::spawn(async move {
                let Some(req) = read_request(&mut sock).await else { return };
                let head = req.head.clone();
                log.lock().unwrap().push(req);
                let reply = script.lock().unwrap().pop_front().unwrap_or(Reply::Status(200, vec![], "{\"ok\":true}"));
                let out = match reply {
                    Reply::Status(code, headers, body) => {
                        let extra: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
                        format!(
                            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                    Reply::Cut => {
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":"
                            .into()
                    }
                    Reply::Echo(code, as_json) => {
                        // The auth header comes back in a recorded answer header too.
                        let auth = head.split("\r\n").find_map(|l| l.strip_prefix("authorization: "));
                        let auth = auth.unwrap_or("none").to_owned();
                        let body = if as_json { json!({"you_sent": head}).to_string() } else { head };
                        format!(
                            "HTTP/1.1 {code} X\r\nx-request-id: {auth}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                    Reply::Hang(d) => {
                        tokio::time::sleep(d).await;
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".into()
                    }
                };
                let _ = sock.write_all(out.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    (addr, seen)
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':').map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned())))
        .collect();
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(Seen { method, path, headers, body: buf[head_end..].to_vec(), at: Instant::now(), head })
}

/// A world whose outbound calls may reach 127.0.0.1, shadow off and `write:http` on, the
/// task's role mapped (moto's STS) and secrets written to moto's Secrets Manager.
pub async fn world() -> World {
    world_for("http.request", ROLE).await
}

/// A world whose calls may reach 127.0.0.1, shadow off and `write:http` on, `task`'s role
/// mapped (moto's STS) and secrets written to moto's Secrets Manager.
pub async fn world_for(task: &str, role: &str) -> World {
    world_with(test_settings(), task, role).await
}

/// `world_for` on these settings.
pub async fn world_with(mut s: taskdeck::platform::Settings, task: &str, role: &str) -> World {
    s.callback_allow = AllowList::parse("127.0.0.1/32").unwrap();
    let w = World::with_settings(s).await;
    let mut db = w.db().await;
    modes::set(&mut db, "shadow", false, "test", None).await.unwrap();
    modes::set(&mut db, "write:http", true, "test", None).await.unwrap();
    let roles = TaskRoles::default().map_task(task, RoleSpec { role_arn: role.into(), external_id: None }).unwrap();
    let platform = w
        .platform
        .clone()
        .with_credentials(Arc::new(TaskCredentials::new(roles, &moto::sdk_config())))
        .with_secrets(&moto::sdk_config());
    World {
        router: taskdeck::api::router(platform.app_state()),
        platform,
        tenant: w.tenant,
        key: w.key,
        schema: w.schema,
    }
}

fn exec(w: &World) -> Executor {
    w.platform.executor()
}

/// Register destination `name` at the receiver for this world's tenant.
pub async fn destination(w: &World, key: &str, name: &str, addr: SocketAddr, extra: Value) -> Value {
    let mut body = json!({"base_url": format!("http://{addr}/api"), "rate_per_second": 100});
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let (s, d) = w
        .call_as(key, Method::PUT, &format!("/v1/destinations/{name}"), None, Some(body.to_string().into_bytes()))
        .await;
    assert_eq!(s, StatusCode::OK, "{d}");
    d
}

async fn submit(w: &World, key: &str, params: Value) -> JobId {
    let (s, job) =
        w.submit(key, json!({"task_type": "http.request", "params": params, "correlation_id": "order-7"})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    job["id"].as_str().unwrap().parse().unwrap()
}

pub async fn job(w: &World, id: JobId) -> Value {
    w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await.1
}

/// The job's HTTP calls as the tenant reads them.
pub async fn calls(w: &World, id: JobId) -> Vec<Value> {
    let (s, body) = w.call(Method::GET, &format!("/v1/jobs/{id}/http-calls"), None, None).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    body["calls"].as_array().unwrap().clone()
}

async fn make_due(w: &World, id: JobId) {
    w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
}

async fn exceptions(w: &World, id: JobId, kind: &str) -> i64 {
    w.count("SELECT count(*) FROM exceptions WHERE job_id = $1 AND kind = $2", &[&id, &kind]).await
}

#[tokio::test]
async fn a_call_carries_the_key_the_correlation_and_the_secret_and_records_the_answer() {
    let w = world().await;
    let (addr, seen) =
        receiver(vec![Reply::Status(201, vec![("x-request-id", "r-1"), ("set-cookie", "s=1")], "{\"id\":42}")]).await;
    let d = destination(&w, &w.key, "crm", addr, json!({"auth_header": "Authorization"})).await;
    assert_eq!(d["writes_enabled"], true);
    assert_eq!(d["secret_set_at"], Value::Null);
    let (s, _) =
        w.call(Method::PUT, "/v1/destinations/crm/secret", None, Some(json!({"value": "Bearer sk-live-123"}))).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let id = submit(
        &w,
        "contact-1",
        json!({"destination": "crm", "method": "POST", "path": "/v1/contacts?src=relay",
        "headers": {"X-Tenant-Ref": "abc"}, "body": {"email": "a@b.example"}}),
    )
    .await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    assert_eq!(j["result"]["status"], 201);
    assert_eq!(j["result"]["body"], json!({"id": 42}));
    assert_eq!(j["result"]["headers"]["x-request-id"], "r-1");
    assert!(j["result"]["headers"].get("set-cookie").is_none(), "only the recorded headers: {j}");

    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/api/v1/contacts?src=relay"));
    assert_eq!(r.headers["idempotency-key"], "contact-1");
    assert_eq!(r.headers["x-relay-correlation-id"], "order-7");
    assert_eq!(r.headers["authorization"], "Bearer sk-live-123");
    assert_eq!(r.headers["x-tenant-ref"], "abc");
    assert_eq!(r.headers["host"], addr.to_string());
    assert_eq!(serde_json::from_slice::<Value>(&r.body).unwrap(), json!({"email": "a@b.example"}));

    let c = calls(&w, id).await;
    assert_eq!(c.len(), 1);
    assert_eq!((c[0]["outcome"].as_str(), c[0]["http_status"].as_i64()), (Some("succeeded"), Some(201)));
    assert_eq!(c[0]["request"]["headers"]["Authorization"], "<redacted>");
    // The secret is in no table and no answer.
    let (_, d) = w.call(Method::GET, "/v1/destinations/crm", None, None).await;
    assert!(d["secret_set_at"].is_string(), "{d}");
    assert_eq!(d["last_call"]["outcome"], "succeeded");
    let dump: i64 = w
        .count(
            "SELECT count(*) FROM http_calls WHERE request::text LIKE '%sk-live%' OR response::text LIKE '%sk-live%'",
            &[],
        )
        .await;
    assert_eq!(dump, 0);
    assert!(!d.to_string().contains("sk-live") && !c[0].to_string().contains("sk-live"));
    assert!(!j.to_string().contains("sk-live"));
}

#[tokio::test]
async fn a_shadowed_call_sends_nothing_and_shows_what_it_would_have_sent() {
    let w = world().await;
    modes::set(&mut w.db().await, "shadow", true, "test", None).await.unwrap();
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({"auth_header": "X-Api-Key"})).await;
    let id = submit(
        &w,
        "shadow-1",
        json!({"destination": "crm", "method": "PUT", "path": "/v1/deals/9", "body": {"stage": "won"}}),
    )
    .await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    assert_eq!(j["result"]["sent"], false);
    let r = &j["result"]["request"];
    assert_eq!(r["method"], "PUT");
    assert_eq!(r["url"], format!("http://{addr}/api/v1/deals/9"));
    assert_eq!(r["headers"]["idempotency-key"], "shadow-1");
    assert_eq!(r["headers"]["X-Api-Key"], "<redacted>");
    assert_eq!(r["body"], json!({"stage": "won"}));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(seen.lock().unwrap().len(), 0, "nothing was sent");
    let c = calls(&w, id).await;
    assert_eq!((c.len(), c[0]["outcome"].as_str()), (1, Some("shadowed")));
    assert_eq!(&c[0]["request"], r, "the call record shows the same request");
}

#[tokio::test]
async fn a_cut_off_answer_is_ambiguous_with_one_exception_and_no_second_call() {
    let w = world().await;
    let (addr, seen) = receiver(vec![Reply::Cut, Reply::Hang(Duration::from_secs(3))]).await;
    destination(&w, &w.key, "crm", addr, json!({"timeout_ms": 500})).await;
    for (key, n) in [("cut-1", 1), ("hang-1", 2)] {
        let id =
            submit(&w, key, json!({"destination": "crm", "method": "POST", "path": "/v1/orders", "body": {}})).await;
        exec(&w).run_dispatched(&[id]).await.unwrap();
        let j = job(&w, id).await;
        assert_eq!(j["status"], "failed", "{j}");
        // The destination is the tenant's: so is deciding whether it acted. No operator exception.
        assert_eq!((exceptions(&w, id, "ambiguous_outcome").await, &j["fault"]), (0, &json!("tenant")), "{j}");
        assert!(j["last_error"].as_str().unwrap().contains("The destination is yours"), "{j}");
        // Nothing runs it again: the sweep and another executor pass find nothing due.
        w.platform.sweeper().pass().await.unwrap();
        make_due(&w, id).await;
        exec(&w).run_dispatched(&[id]).await.unwrap();
        assert_eq!(seen.lock().unwrap().len(), n, "exactly one call for {key}");
        let c = calls(&w, id).await;
        assert_eq!((c.len(), c[0]["outcome"].as_str()), (1, Some("ambiguous")), "{c:?}");
    }
}

#[tokio::test]
async fn a_call_whose_worker_stopped_mid_call_is_ambiguous_on_the_next_attempt() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({})).await;
    let id = submit(&w, "stopped-1", json!({"destination": "crm", "method": "POST", "path": "/x"})).await;
    // What a worker killed between its intent and the answer leaves: a `sending` call of attempt 1.
    let db = w.db().await;
    db.execute("UPDATE jobs SET attempt = 1 WHERE id = $1", &[&id]).await.unwrap();
    db.execute(
        "INSERT INTO http_calls (job_id, tenant_id, destination, attempt, outcome, request)
                VALUES ($1, $2, 'crm', 1, 'sending', '{}')",
        &[&id, &w.tenant.id],
    )
    .await
    .unwrap();
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!((j["status"].as_str(), j["fault"].as_str()), (Some("failed"), Some("tenant")), "{j}");
    assert_eq!(exceptions(&w, id, "ambiguous_outcome").await, 0);
    assert_eq!(seen.lock().unwrap().len(), 0, "no second call");
}

#[tokio::test]
async fn retries_carry_the_same_key_and_honour_retry_after() {
    let w = world().await;
    let (addr, seen) = receiver(vec![
        Reply::Status(503, vec![], "{\"busy\":true}"),
        Reply::Status(429, vec![("retry-after", "120")], ""),
    ])
    .await;
    destination(&w, &w.key, "crm", addr, json!({})).await;
    let id =
        submit(&w, "retry-1", json!({"destination": "crm", "method": "POST", "path": "/v1/x", "body": {"n": 1}})).await;
    let wait = "SELECT extract(epoch FROM run_at - now())::float8 FROM jobs WHERE id = $1";
    exec(&w).run_dispatched(&[id]).await.unwrap();
    assert_eq!(job(&w, id).await["status"], "pending");
    make_due(&w, id).await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let after: f64 = w.db().await.query_one(wait, &[&id]).await.unwrap().get(0);
    assert!(after > 118.0, "Retry-After 120 honoured, got {after}");
    make_due(&w, id).await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!((j["status"].as_str(), j["attempt"].as_i64()), (Some("succeeded"), Some(3)), "{j}");
    let keys: Vec<String> = seen.lock().unwrap().iter().map(|r| r.headers["idempotency-key"].clone()).collect();
    assert_eq!(keys, ["retry-1", "retry-1", "retry-1"]);
    let outcomes: Vec<String> = calls(&w, id).await.iter().map(|c| c["outcome"].as_str().unwrap().to_owned()).collect();
    assert_eq!(outcomes, ["retryable", "retryable", "succeeded"]);
}

#[tokio::test]
async fn a_4xx_is_fatal_with_the_body_kept() {
    let w = world().await;
    let (addr, seen) = receiver(vec![Reply::Status(422, vec![], "{\"error\":\"email is not valid\"}")]).await;
    destination(&w, &w.key, "crm", addr, json!({})).await;
    let id = submit(&w, "bad-1", json!({"destination": "crm", "method": "POST", "path": "/v1/contacts"})).await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(j["status"], "failed");
    assert!(j["last_error"].as_str().unwrap().contains("email is not valid"), "{j}");
    let c = calls(&w, id).await;
    assert_eq!(c[0]["outcome"], "fatal");
    assert_eq!(c[0]["response"]["body"], json!({"error": "email is not valid"}));
    assert_eq!(seen.lock().unwrap().len(), 1);
    // The destination's answer is the tenant's fault: counted for it, no operator exception.
    assert_eq!((exceptions(&w, id, "fatal_error").await, &j["fault"]), (0, &json!("tenant")), "{j}");
    let counted =
        "SELECT count FROM tenant_faults WHERE tenant_id = $1 AND task_type = 'http.request' AND kind = 'fatal_error'";
    assert_eq!(w.count(counted, &[&w.tenant.id]).await, 1);
}

#[tokio::test]
async fn switched_off_writes_hold_the_job_and_send_nothing() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({})).await;
    let (s, d) = w
        .call(
            Method::PUT,
            "/v1/destinations/crm/writes",
            None,
            Some(json!({"enabled": false, "reason": "CRM maintenance"})),
        )
        .await;
    assert_eq!((s, &d["writes_enabled"]), (StatusCode::OK, &json!(false)), "{d}");
    // The switch is the destination's (with the tenant's reason), not a global mode.
    assert_eq!(d["writes_reason"], "CRM maintenance", "{d}");
    assert_eq!(w.count("SELECT count(*) FROM operating_modes WHERE name LIKE 'write:http:%:%'", &[]).await, 0);
    // The status contract (and so the console) shows the switch.
    let (_, status_key) = taskdeck::store::status_keys::create(&w.db().await, "console").await.unwrap();
    let (_, doc) = w.call_as(&status_key, Method::GET, "/v1/status", None, None).await;
    let listed = doc["destinations"].as_array().unwrap();
    assert_eq!(
        (listed.len(), &listed[0]["name"], &listed[0]["writes_enabled"], &listed[0]["tenant"]),
        (1, &json!("crm"), &json!(false), &json!("acme")),
        "{doc}"
    );
    let id = submit(&w, "held-1", json!({"destination": "crm", "method": "POST", "path": "/x"})).await;
    for _ in 0..3 {
        make_due(&w, id).await;
        exec(&w).run_dispatched(&[id]).await.unwrap();
    }
    let j = job(&w, id).await;
    assert_eq!(j["status"], "pending", "held, not failed: {j}");
    assert_eq!(j["max_attempts"].as_i64().unwrap() - j["attempt"].as_i64().unwrap(), 5, "no attempt used: {j}");
    assert_eq!(seen.lock().unwrap().len(), 0);
    // The operators' switch for every destination holds it too.
    w.call(Method::PUT, "/v1/destinations/crm/writes", None, Some(json!({"enabled": true}))).await;
    modes::set(&mut w.db().await, "write:http", false, "test", None).await.unwrap();
    make_due(&w, id).await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    assert_eq!((job(&w, id).await["status"].as_str(), seen.lock().unwrap().len()), (Some("pending"), 0));
    modes::set(&mut w.db().await, "write:http", true, "test", None).await.unwrap();
    make_due(&w, id).await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    assert_eq!((job(&w, id).await["status"].as_str(), seen.lock().unwrap().len()), (Some("succeeded"), 1));
}

#[tokio::test]
async fn the_rate_per_destination_holds_across_workers() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({"rate_per_second": 4})).await;
    let ids: Vec<JobId> = futures::future::join_all((0..10).map(|i| {
        submit(
            &w,
            Box::leak(format!("rate-{i}").into_boxed_str()),
            json!({"destination": "crm", "method": "POST", "path": "/x"}),
        )
    }))
    .await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let workers = w.platform.spawn_workers(4, &stop);
    let done = "SELECT count(*) FROM jobs WHERE task_type = 'http.request' AND status = 'succeeded'";
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.count(done, &[]).await < 10 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_tx.send(true).unwrap();
    futures::future::join_all(workers).await;
    assert_eq!(w.count(done, &[]).await, 10);
    let mut at: Vec<Instant> = seen.lock().unwrap().iter().map(|r| r.at).collect();
    at.sort();
    assert_eq!(at.len(), 10, "one call per job");
    let gaps: Vec<f64> = at.windows(2).map(|p| (p[1] - p[0]).as_secs_f64()).collect();
    let span = (at[9] - at[0]).as_secs_f64();
    println!("10 calls at 4/s over {span:.2}s; smallest gap {:.3}s", gaps.iter().cloned().fold(f64::MAX, f64::min));
    assert!(span >= 9.0 * 0.25 - 0.1, "10 calls at 4/s take at least 2.25 s, took {span:.2}");
    for second in 0..=(span as usize) {
        let from = at[0] + Duration::from_secs(second as u64);
        let n = at.iter().filter(|t| **t >= from && **t < from + Duration::from_secs(1)).count();
        assert!(n <= 5, "{n} calls in one second at 4/s");
    }
    let jobs_left: i64 =
        w.count("SELECT count(*) FROM jobs WHERE id = ANY($1) AND attempt > max_attempts - 4", &[&ids]).await;
    assert_eq!(jobs_left, 0, "waiting for a slot used no attempt");
}

#[tokio::test]
async fn a_tenant_can_neither_call_nor_read_nor_overwrite_another_tenants_destination() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({"auth_header": "Authorization"})).await;
    w.call(Method::PUT, "/v1/destinations/crm/secret", None, Some(json!({"value": "Bearer acme-secret"}))).await;
    let (globex, other) = w.other_tenant("globex").await;
    let params = json!({"task_type": "http.request", "params": {"destination": "crm", "method": "POST", "path": "/x"}});
    let (s, e) =
        w.call_as(&other, Method::POST, "/v1/jobs", Some("steal-1"), Some(params.to_string().into_bytes())).await;
    assert_eq!((s, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("unknown_destination")), "{e}");
    for (m, path) in [(Method::GET, "/v1/destinations/crm"), (Method::DELETE, "/v1/destinations/crm")] {
        let (s, _) = w.call_as(&other, m, path, None, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _) = w
        .call_as(&other, Method::PUT, "/v1/destinations/crm/writes", None, Some(b"{\"enabled\":false}".to_vec()))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) =
        w.call_as(&other, Method::PUT, "/v1/destinations/crm/secret", None, Some(b"{\"value\":\"x\"}".to_vec())).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, list) = w.call_as(&other, Method::GET, "/v1/destinations", None, None).await;
    assert_eq!(list["destinations"], json!([]));
    // Its own destination of the same name is its own, with its own secret.
    destination(&w, &other, "crm", addr, json!({"auth_header": "Authorization", "base_url": "http://127.0.0.1:9/"}))
        .await;
    let (s, _) = w
        .call_as(
            &other,
            Method::PUT,
            "/v1/destinations/crm/secret",
            None,
            Some(b"{\"value\":\"Bearer globex\"}".to_vec()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, mine) = w.call(Method::GET, "/v1/destinations/crm", None, None).await;
    assert_eq!(mine["base_url"], format!("http://{addr}/api"), "unchanged: {mine}");
    let sm = aws_sdk_secretsmanager::Client::new(&moto::sdk_config());
    let read = |t: taskdeck::job::TenantId| {
        let sm = sm.clone();
        async move {
            sm.get_secret_value()
                .secret_id(taskdeck::destinations::secret_id(t, "crm"))
                .send()
                .await
                .unwrap()
                .secret_string()
                .unwrap()
                .to_owned()
        }
    };
    assert_eq!(read(w.tenant.id).await, "Bearer acme-secret");
    assert_eq!(read(globex.id).await, "Bearer globex");
    // The job is the first tenant's; its calls are not the other's to read.
    let id = submit(&w, "mine-1", json!({"destination": "crm", "method": "GET", "path": "/x"})).await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    assert_eq!(seen.lock().unwrap()[0].headers["authorization"], "Bearer acme-secret");
    let (s, _) = w.call_as(&other, Method::GET, &format!("/v1/jobs/{id}/http-calls"), None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn hostile_bytes_in_names_paths_and_headers_get_json_4xx() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "crm", addr, json!({"auth_header": "Authorization"})).await;
    let ok = json!({"base_url": "https://api.example/"});
    let bad_names = ["CRM", "a%20b", "..", "%2e%2e", "a%3Ab", "a%0Ab", "%C3%A9", &"x".repeat(64)];
    for name in bad_names {
        let (s, e) = w.call(Method::PUT, &format!("/v1/destinations/{name}"), None, Some(ok.clone())).await;
        assert!(s.is_client_error() && e["error"]["code"].is_string(), "{name}: {s} {e}");
    }
    let bad_bodies = [
        json!({"base_url": "http://169.254.169.254/latest"}),
        json!({"base_url": "https://[::1]/"}),
        json!({"base_url": "ftp://api.example/"}),
        json!({"base_url": "https://user:pw@api.example/"}),
        json!({"base_url": "https://api.example/?q=1"}),
        json!({"base_url": "http://api.example/"}),
        json!({"base_url": "https://api.example/\u{0}"}),
        json!({"base_url": "https://api.example/", "auth_header": "Host"}),
        json!({"base_url": "https://api.example/", "auth_header": "Bad Header"}),
        json!({"base_url": "https://api.example/", "timeout_ms": 0}),
        json!({"base_url": "https://api.example/", "rate_per_second": 0}),
        json!({"base_url": "https://api.example/", "rate_per_second": 1e9}),
        json!({"base_url": "https://api.example/", "surprise": 1}),
    ];
    for body in bad_bodies {
        let (s, e) = w.call(Method::PUT, "/v1/destinations/fine", None, Some(body.clone())).await;
        assert!(s.is_client_error() && e["error"]["code"].is_string(), "{body}: {s} {e}");
    }
    let (s, e) =
        w.call(Method::PUT, "/v1/destinations/crm/secret", None, Some(json!({"value": "a\r\nX-Evil: 1"}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    let bad_params = [
        json!({"destination": "crm", "method": "POST", "path": "/../admin"}),
        json!({"destination": "crm", "method": "POST", "path": "//evil.example/x"}),
        json!({"destination": "crm", "method": "POST", "path": "/a%2f..%2fb"}),
        json!({"destination": "crm", "method": "POST", "path": "/a\r\nHost: evil"}),
        json!({"destination": "crm", "method": "POST", "path": "https://evil.example/"}),
        json!({"destination": "crm", "method": "TRACE", "path": "/x"}),
        json!({"destination": "crm", "method": "POST", "path": "/x", "headers": {"Host": "evil"}}),
        json!({"destination": "crm", "method": "POST", "path": "/x", "headers": {"Transfer-Encoding": "chunked"}}),
        json!({"destination": "crm", "method": "POST", "path": "/x", "headers": {"X-A": "1\r\nX-B: 2"}}),
        json!({"destination": "crm", "method": "POST", "path": "/x", "headers": {"Bad Name": "1"}}),
        json!({"destination": "../crm", "method": "POST", "path": "/x"}),
    ];
    for (i, params) in bad_params.iter().enumerate() {
        let (s, e) = w.submit(&format!("bad-{i}"), json!({"task_type": "http.request", "params": params})).await;
        assert!(s.is_client_error() && e["error"]["code"].is_string(), "{params}: {s} {e}");
    }
    // The destination's auth header is its own to set: a job naming it fails, and sends nothing.
    let id = submit(
        &w,
        "auth-1",
        json!({"destination": "crm", "method": "POST", "path": "/x", "headers": {"authorization": "Bearer mine"}}),
    )
    .await;
    exec(&w).run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(j["status"], "failed");
    assert!(j["last_error"].as_str().unwrap().contains("auth header"), "{j}");
    assert_eq!(seen.lock().unwrap().len(), 0);
}

#[tokio::test]
async fn a_long_call_with_a_large_body_gets_a_long_attempt_and_is_recorded_by_its_digest() {
    let w = world().await;
    let (addr, seen) = receiver(vec![]).await;
    destination(&w, &w.key, "lists", addr, json!({})).await;
    // 600 KiB of members: past the old 256 KiB bound, under the 1 MiB one.
    let members: Vec<Value> =
        (0..14_000).map(|i| json!({"email": format!("member-{i:05}@lists.example"), "n": i})).collect();
    let body = json!({"members": members});
    let size = serde_json::to_vec(&body).unwrap().len();
    assert!(size > 600 * 1024 && size < taskdeck::destinations::call::MAX_BODY, "{size}");
    let params =
        json!({"destination": "lists", "method": "POST", "path": "/upsert", "body": body, "timeout_ms": 400_000});
    let id = submit(&w, "upsert-1", params).await;
    // The job was given attempts as long as its call and the margin to record it (past the
    // short lane's 120 s, so on AWS it runs on the long-job lane; the default is 300 s).
    assert_eq!(job(&w, id).await["timeout_seconds"], 405);
    exec(&w).run_dispatched(&[id]).await.unwrap();
    assert_eq!(job(&w, id).await["status"], "succeeded");
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(serde_json::from_slice::<Value>(&got[0].body).unwrap(), body, "delivered intact");
    // The call's record holds the body's size and digest, not a second copy of it.
    let c = calls(&w, id).await;
    assert_eq!(c[0]["request"]["body"]["bytes"].as_u64(), Some(got[0].body.len() as u64), "{}", c[0]["request"]);
    assert_eq!(c[0]["request"]["body"]["sha256"].as_str().map(str::len), Some(64));
    // Past the bounds: 422 naming the field, nothing queued.
    let over = json!({"destination": "lists", "method": "POST", "path": "/upsert",
        "body": "x".repeat(taskdeck::destinations::call::MAX_BODY)});
    let too_quick = json!({"destination": "lists", "method": "GET", "path": "/x", "timeout_ms": 99});
    for (key, params, field) in [("over", over, "params.body"), ("quick", too_quick, "params.timeout_ms")] {
        let (s, e) = w.submit(key, json!({"task_type": "http.request", "params": params, "correlation_id": "c"})).await;
        assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(field)), "{key}: {e}");
    }
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE task_type = 'http.request'", &[]).await, 1);
}
