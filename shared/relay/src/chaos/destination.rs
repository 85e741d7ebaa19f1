//! Scenario `destination`: `http.request` against a destination that misbehaves. A raw HTTP
//! receiver on 127.0.0.1 answers by the job's `Idempotency-Key`: `slow-*` only after the
//! destination's timeout, `cut-*` with a 200 whose body breaks off, `flaky-*` 503 the first
//! time and 200 after, `ok-*` 200. Four worker loops and the sweep run them in this process.
//!
//! What a fault would break: a slow or cut answer called twice (each must be one call, then
//! an ambiguous failure with one exception); a retry under another key (each flaky job's two
//! calls carry its own key; no call carries a key that is not a job's); a job lost or stuck.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use taskdeck::outbound::AllowList;
use taskdeck::platform::Settings;
use taskdeck::store::{destinations, modes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Env, Report, harness};

const KINDS: [&str; 4] = ["slow", "cut", "flaky", "ok"];
/// The destination's timeout; a `slow-*` answer comes after three times this. Long enough that
/// a receiver on a busy machine (the whole test suite beside it) reads and answers in time: at
/// 400 ms an `ok-*` call and a `cut-*` request timed out under that load.
const TIMEOUT_MS: i32 = 1_500;

/// Calls received, by idempotency key.
type Calls = Arc<Mutex<BTreeMap<String, usize>>>;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("destination", env.scale);
    let per_kind = env.n(50, 3);
    let settings = Settings {
        callback_allow: AllowList::parse("127.0.0.1/32")?,
        sweep_interval: Duration::from_millis(500),
        ..Settings::default()
    };
    let scratch = env.scratch(settings).await?;
    let pool = scratch.platform.pool.clone();
    let (addr, calls) = receiver().await?;
    {
        let mut db = pool.get().await?;
        modes::set(&mut db, "shadow", false, "chaos", None).await?;
        modes::set(&mut db, "write:http", true, "chaos", None).await?;
        let base_url = format!("http://{addr}/api");
        let d = destinations::NewDestination {
            name: "faulty",
            base_url: &base_url,
            auth_header: None,
            timeout_ms: TIMEOUT_MS,
            rate_per_second: 1000.0,
            max_in_flight: 1000,
            url_patterns: &[],
            oauth: None,
            signature: None,
            success: None,
        };
        destinations::put(&db, scratch.tenant.id, &d).await?;
    }
    let admits = taskdeck::api::submit::Admission {
        callback_allow: scratch.platform.settings.callback_allow.clone(),
        max_timeout_seconds: scratch.platform.settings.max_timeout_seconds,
    };
    let mut jobs = Vec::new();
    for kind in KINDS {
        for i in 0..per_kind {
            let req: taskdeck::api::submit::JobRequest = serde_json::from_value(json!({"task_type": "http.request",
                "params": {"destination": "faulty", "method": "POST", "path": "/v1/orders", "body": {"n": i}}}))?;
            let key = taskdeck::job::terms::IdempotencyKey::parse(&format!("{kind}-{i}"))?;
            let new = req
                .into_new_job(key, &scratch.platform.catalogue, &admits, chrono::Utc::now())
                .map_err(|e| anyhow::anyhow!(e.message))?;
            jobs.push((kind, format!("{kind}-{i}"), new.id));
            scratch.platform.intake.enqueue(scratch.tenant.id, vec![new]).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut loops = scratch.platform.spawn_workers(4, &stop);
    loops.push(scratch.platform.spawn_sweeper(&stop));
    let done = harness::wait_until(Duration::from_secs(60), || harness::all_terminal(&pool)).await;
    let _ = stop_tx.send(true);
    futures::future::join_all(loops).await;

    let db = pool.get().await?;
    let mut by_kind: BTreeMap<&str, (usize, usize, i64)> = BTreeMap::new();
    for (kind, key, id) in &jobs {
        // An ambiguous call to the tenant's own destination is the tenant's to decide: the job
        // fails as the tenant's fault and opens no operator exception.
        let row = db
            .query_one(
                "SELECT status, (status = 'failed' AND fault = 'tenant')::int::int8,
                        (SELECT count(*) FROM exceptions x WHERE x.job_id = j.id)
                 FROM jobs j WHERE id = $1",
                &[id],
            )
            .await?;
        let (status, ambiguous, exceptions): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
        report.check(exceptions == 0, format!("{key}: {exceptions} operator exceptions, expected none"));
        let e = by_kind.entry(kind).or_default();
        e.0 += calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).copied().unwrap_or(0);
        e.1 += usize::from(status == "succeeded");
        e.2 += ambiguous;
        let n = calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).copied().unwrap_or(0);
        let (want_calls, want_status, want_ambiguous) = match *kind {
            "slow" | "cut" => (1, "failed", 1),
            "flaky" => (2, "succeeded", 0),
            _ => (1, "succeeded", 0),
        };
        report.check(n == want_calls, format!("{key}: {n} calls, expected {want_calls}"));
        report.check(status == want_status, format!("{key}: {status}, expected {want_status}"));
        report.check(
            ambiguous == want_ambiguous,
            format!("{key}: {ambiguous} failures left to the tenant, expected {want_ambiguous}"),
        );
    }
    let known: Vec<&String> = jobs.iter().map(|j| &j.1).collect();
    let strangers =
        calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys().filter(|k| !known.contains(k)).count();
    for (kind, (n, succeeded, ambiguous)) in &by_kind {
        report.fig(
            &format!("{kind}: jobs / calls received / succeeded / ambiguous, left to the tenant"),
            format!("{per_kind} / {n} / {succeeded} / {ambiguous}"),
        );
    }
    report.fig("faults injected: slow answers (after the timeout)", by_kind.get("slow").map_or(0, |k| k.0));
    report.fig("faults injected: answers cut mid-body", by_kind.get("cut").map_or(0, |k| k.0));
    report.fig("faults injected: 503 answers", per_kind);
    report.fig("calls under a key no job has", strangers);
    report.check(done, "not every job reached a terminal state within 60 s");
    report.check(strangers == 0, format!("{strangers} calls carried a key no job has"));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// The faulty destination: one request per connection, answered by the key's prefix.
async fn receiver() -> anyhow::Result<(std::net::SocketAddr, Calls)> {
    let calls: Calls = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = calls.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Some(key) = read_key(&mut sock).await else { return };
                let n = {
                    let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let n = seen.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\nconnection: close\r\n\r\n{\"ok\":true}";
                let answer = match key.split('-').next().unwrap_or_default() {
                    "slow" => {
                        tokio::time::sleep(Duration::from_millis(3 * TIMEOUT_MS as u64)).await;
                        ok
                    }
                    "cut" => "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":",
                    "flaky" if n == 1 => {
                        "HTTP/1.1 503 Busy\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    }
                    _ => ok,
                };
                let _ = sock.write_all(answer.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok((addr, calls))
}

/// Read a request's head and return its `Idempotency-Key` (the body is not needed).
async fn read_key(sock: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&buf).lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("idempotency-key").then(|| value.trim().to_owned())
    })
}
