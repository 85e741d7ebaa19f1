//! `relay dev` as a newcomer runs it: its private database at the same address after a
//! restart, found by the other commands with `DATABASE_URL` unset; the console it serves;
//! Ctrl-C twice stopping at once with a job in flight; its local SES (`--local-ses`) pacing
//! sends at its rate; and an SES bounce fed locally through the ingress handler
//! (`relay ingress send`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use axum::http::Method;
use relay::devinstance::DevInstance;
use relay::pgcluster::{Durability, PrivateCluster};
use serde_json::json;
use taskdeck::client::Client;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::email::{DOMAIN, executor, go_live, message_of, roles, sender, submit};
use crate::support::{World, database_url, moto};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running `relay dev` on its own data dir, its stderr in a file; killed when dropped.
struct DevProcess {
    child: tokio::process::Child,
    log: PathBuf,
    key: String,
}

impl DevProcess {
    async fn start(dir: &Path, api: u16, console: u16, n: usize) -> DevProcess {
        Self::start_with(dir, api, console, n, &[], &[]).await
    }

    /// `start` with more arguments and environment variables.
    async fn start_with(
        dir: &Path,
        api: u16,
        console: u16,
        n: usize,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> DevProcess {
        let log = dir.with_extension(format!("log{n}"));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["dev", "--data-dir"])
            .arg(dir)
            .args(["--addr", &format!("127.0.0.1:{api}"), "--console-addr", &format!("127.0.0.1:{console}")])
            .args(args)
            .envs(envs.iter().copied())
            .env_remove("DATABASE_URL")
            .env("RELAY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn relay dev");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let key = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .unwrap_or_else(|_| {
                panic!("relay dev printed no key: {}", std::fs::read_to_string(&log).unwrap_or_default())
            })
            .unwrap()
            .unwrap_or_else(|| panic!("relay dev ended: {}", std::fs::read_to_string(&log).unwrap_or_default()));
        DevProcess { child, log, key }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn interrupt(&self) {
        let pid = self.child.id().expect("running").to_string();
        assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    }

    /// Wait until stderr contains `text`.
    async fn said(&self, text: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.stderr().contains(text) {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }
}

/// A `relay` command with `DATABASE_URL` unset, run in `dir`'s data dir.
fn relay_here(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env_remove("DATABASE_URL")
        .env("RELAY_LOG", "warn")
        .output()
        .unwrap()
}

async fn http_get(url: &str) -> String {
    http_get_as(url, None).await
}

/// A GET with a bearer token, if any; the whole answer, head and body.
async fn http_get_as(url: &str, token: Option<&str>) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(
        format!("GET {} HTTP/1.0\r\nHost: {host}\r\n{auth}\r\n", if path.is_empty() { "/" } else { path }).as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// A GET answered 200 with JSON: the JSON.
async fn get_json(url: &str, token: &str) -> serde_json::Value {
    let answer = http_get_as(url, Some(token)).await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "GET {url}: {answer}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {url}: {e}: {body}"))
}

#[tokio::test]
async fn relay_dev_keeps_its_database_address_the_cli_finds_it_and_ctrl_c_twice_stops_at_once() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("relay-dev-{}", uuid::Uuid::now_v7().simple()));
    let (api, console) = (free_port(), free_port());
    let dev = DevProcess::start(&dir, api, console, 1).await;
    // Whatever happens below, the cluster stops when this test process exits.
    PrivateCluster::start(&dir, Durability::Full).unwrap().stop_when_process_exits(std::process::id()).unwrap();
    let recorded = DevInstance::read(&dir).expect("relay-dev.json");
    let banner = dev.stderr();
    assert!(banner.contains(&format!("export DATABASE_URL={}", recorded.database_url)), "{banner}");
    assert!(banner.contains(&format!("console on http://127.0.0.1:{console}/")), "{banner}");
    assert!(
        banner.contains("email and callbacks are recorded, not sent") && banner.contains("relay modes set shadow off"),
        "{banner}"
    );
    assert!(!banner.contains("hello-1") && banner.contains("Idempotency-Key: try-"), "{banner}");
    assert!(!banner.contains("already exists"), "no migration notice: {banner}");
    assert!(!banner.contains('\u{1b}'), "no colours in a file: {banner}");

    // An operator command with DATABASE_URL unset finds the database and says so.
    let made = relay_here(&dir, &["status-key", "create", "probe"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    assert!(String::from_utf8_lossy(&made.stdout).trim().starts_with("rs_"));
    assert!(
        String::from_utf8_lossy(&made.stderr).contains("using relay dev's database"),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // No dev instance there and no DATABASE_URL: a clear error.
    let empty = dir.with_extension("empty");
    let none = relay_here(&empty, &["status-key", "create", "x"]);
    assert!(!none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("Start `relay dev`"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );

    // The console watches this instance with the key relay dev made.
    let page = http_get(&format!("http://127.0.0.1:{console}/")).await;
    assert!(page.contains(r#"data-project="relay dev""#), "{page}");
    assert!(!page.contains(r#"data-state="unreachable""#), "the console reads this instance's status: {page}");

    // A job runs 60 s; the first Ctrl-C counts down, the second stops at once.
    let client = Client::new(&format!("http://127.0.0.1:{api}"), &dev.key).unwrap();
    let job = client.submit("long", &json!({"task_type": "sleep", "params": {"seconds": 60}})).await.unwrap();
    let id = job["id"].as_str().unwrap().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.job(id).await.unwrap().unwrap()["status"] != "running" {
        assert!(Instant::now() < deadline, "the sleep job never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dev.interrupt();
    assert!(dev.said("s left for jobs in flight", Duration::from_secs(5)).await, "a countdown: {}", dev.stderr());
    let mut dev = dev;
    assert!(dev.child.try_wait().unwrap().is_none(), "the first Ctrl-C waits for the job");
    let second = Instant::now();
    dev.interrupt();
    let status = tokio::time::timeout(Duration::from_secs(10), dev.child.wait())
        .await
        .expect("the second Ctrl-C stops at once")
        .unwrap();
    assert!(!status.success());
    assert!(second.elapsed() < Duration::from_secs(10));

    // Restarted: the same database address, the job still there (its lease returns it).
    let dev = DevProcess::start(&dir, api, console, 2).await;
    assert_eq!(
        DevInstance::read(&dir).unwrap().database_url,
        recorded.database_url,
        "the same address after a restart"
    );
    let list = relay_here(&dir, &["jobs", "--tenant", "dev", "list"]);
    assert!(
        String::from_utf8_lossy(&list.stdout).contains(&id.to_string()),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    // One Ctrl-C with nothing in flight: a prompt, clean stop, no warning about LISTEN.
    let mut dev = dev;
    dev.interrupt();
    let status = tokio::time::timeout(Duration::from_secs(30), dev.child.wait()).await.expect("a clean stop").unwrap();
    assert!(status.success(), "{}", dev.stderr());
    assert!(!dev.stderr().contains("LISTEN connection lost"), "{}", dev.stderr());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `relay dev --local-ses 5` as a user turns email on: shadow off and SES writes on with the
/// CLI, then 20 sends over the API. They reach the local SES (moto behind the stand-in, which
/// throttles past 5 a second) no faster than its rate, and the status contract shows the
/// account's rate read from it and no throttles. Without the option the sends have no AWS to
/// go to (they fail); without the pacing they would arrive together and be throttled. Started
/// again without the option, it says email would go out and forgets the local SES's rate.
#[tokio::test]
async fn relay_dev_local_ses_paces_sends_at_its_rate_without_throttles() {
    const RATE: u32 = 5;
    const SENDS: usize = 20;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("relay-dev-ses-{}", uuid::Uuid::now_v7().simple()));
    let (api, console) = (free_port(), free_port());
    let moto = tokio::task::spawn_blocking(moto::endpoint).await.unwrap();
    let rate = RATE.to_string();
    let dev = DevProcess::start_with(&dir, api, console, 1, &["--local-ses", &rate], &[("RELAY_MOTO_URL", moto)]).await;
    PrivateCluster::start(&dir, Durability::Full).unwrap().stop_when_process_exits(std::process::id()).unwrap();
    let banner = dev.stderr();
    assert!(
        banner.contains("local SES on (--local-ses 5)")
            && banner.contains("allows 5 sends a second")
            && banner.contains("relay modes set write:ses on"),
        "{banner}"
    );

    for args in [["modes", "set", "shadow", "off"], ["modes", "set", "write:ses", "on"]] {
        let out = relay_here(&dir, &args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let base = format!("http://127.0.0.1:{api}");
    let client = Client::new(&base, &dev.key).unwrap();
    let mut ids = Vec::with_capacity(SENDS);
    for i in 0..SENDS {
        let body = json!({"task_type": "email.send", "params": {
            "from": "Dev <noreply@example.com>", "to": [format!("r{i}@example.com")], "subject": format!("local SES {i}"), "text": "Hi"}});
        let job = client.submit(&format!("local-ses-{i}"), &body).await.unwrap();
        ids.push(job["id"].as_str().unwrap().parse().unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for id in &ids {
        loop {
            let job = client.job(*id).await.unwrap().unwrap();
            match job["status"].as_str() {
                Some("succeeded") => break,
                Some("pending" | "running" | "waiting") => {}
                _ => panic!("{job}\n{}", dev.stderr()),
            }
            assert!(Instant::now() < deadline, "not all sent within 60 s: {job}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let mut sent = Vec::with_capacity(SENDS);
    for id in &ids {
        let list = get_json(&format!("{base}/v1/messages?job_id={id}"), &dev.key).await;
        let m = &list["messages"][0];
        assert_eq!(m["status"], "sent", "{m}");
        assert!(m["provider_message_id"].is_string(), "moto took it: {m}");
        sent.push(m["sent_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap());
    }
    let span = (*sent.iter().max().unwrap() - *sent.iter().min().unwrap()).num_milliseconds() as f64 / 1000.0;
    let least = (SENDS - 1) as f64 / f64::from(RATE) * 0.9;
    assert!(span >= least, "{SENDS} sends in {span} s: faster than {RATE}/s (at least {least} s)");

    let status_key = DevInstance::read(&dir).unwrap().status_key.unwrap();
    let status = get_json(&format!("{base}/v1/status"), &status_key).await;
    let rates = status["send_rates"].as_array().unwrap_or_else(|| panic!("{status}"));
    let account = rates.iter().find(|r| r["scope"] == "account" && r["key"] == "default").expect("the account's rate");
    assert_eq!(account["provider_rate"].as_f64(), Some(f64::from(RATE)), "{account}");
    assert_eq!(account["throttles"], 0, "{account}");

    let mut dev = dev;
    dev.interrupt();
    let status = tokio::time::timeout(Duration::from_secs(30), dev.child.wait()).await.expect("a clean stop").unwrap();
    assert!(status.success(), "{}", dev.stderr());

    // Started again without `--local-ses`: the banner tells the modes left on (email would go
    // out), and the local SES's account rate no longer paces sends meant for real SES.
    let mut again = DevProcess::start_with(&dir, api, console, 2, &[], &[]).await;
    let banner = again.stderr();
    assert!(
        banner.contains("shadow mode is OFF") && banner.contains("email is sent (write:ses on)"),
        "the banner says email goes out: {banner}"
    );
    assert!(!banner.contains("shadow mode is on"), "{banner}");
    assert!(banner.contains("the account rate read from the local SES (--local-ses 5) at the last start is forgotten"));
    let status = get_json(&format!("{base}/v1/status"), &status_key).await;
    let rates = status["send_rates"].as_array().cloned().unwrap_or_default();
    let account = rates.iter().find(|r| r["scope"] == "account" && r["key"] == "default");
    assert!(account.is_none_or(|a| a["provider_rate"].is_null()), "the local rate is gone: {account:?}");
    again.interrupt();
    let status =
        tokio::time::timeout(Duration::from_secs(30), again.child.wait()).await.expect("a clean stop").unwrap();
    assert!(status.success(), "{}", again.stderr());
    let _ = std::fs::remove_dir_all(&dir);
    let _ =
        std::fs::remove_dir_all(dir.with_file_name(format!("{}-secrets", dir.file_name().unwrap().to_string_lossy())));
}

/// The Quickstart's example bounce, fed through the real ingress handler: the message is
/// bounced and its recipient suppressed.
#[tokio::test]
async fn an_ses_bounce_fed_through_relay_ingress_send_bounces_the_message_and_suppresses_its_recipient() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let id = submit(&w, "to-bounce", json!({"task_type": "email.send", "params": {
        "from": format!("noreply@{DOMAIN}"), "to": ["bounce@simulator.amazonses.com"], "subject": format!("bounce {}", w.schema), "text": "x"}})).await;
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(message_of(&w, id).await["status"], "sent");

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/ses-bounce.json");
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["ingress", "send"])
        .arg(&example)
        .args(["--message", &id.to_string(), "--wait", "0"])
        .env("DATABASE_URL", relay::bench::setup::url_with_schema(&database_url(), &w.schema))
        .env("RELAY_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (made["task_type"].as_str(), made["status"].as_str()),
        (Some("provider.event"), Some("pending")),
        "{made}"
    );
    exec.run_dispatched(&[made["id"].as_str().unwrap().parse().unwrap()]).await.unwrap();

    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "bounced", "{m}");
    let (_, list) = w.call(Method::GET, "/v1/suppressions", None, None).await;
    assert_eq!(list["suppressions"][0]["address"], "bounce@simulator.amazonses.com", "{list}");
    assert_eq!(list["suppressions"][0]["reason"], "bounce");
}
