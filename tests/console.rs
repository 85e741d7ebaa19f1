//! The console against real HTTP servers: older minor versions with missing and unknown
//! fields are shown, unreachable projects are shown as unreachable with their last good data
//! greyed, and a real headless Chromium renders the page (skipped when Chromium is absent).

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use relay_console::{Console, ConsoleConfig, render};
use taskdeck::store::status_keys;
use tokio::task::JoinHandle;

use crate::support::World;

const FIXTURE: &str = include_str!("fixtures/status_v1_0_minimal.json");

/// Serve a router on a free port of 127.0.0.1; returns its base URL and the server task.
async fn serve(router: Router) -> (String, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (base, task)
}

/// A project that serves this fixed document at /v1/status.
async fn fixed(doc: String) -> (String, JoinHandle<()>) {
    serve(Router::new().route(
        "/v1/status",
        get(move || {
            let doc = doc.clone();
            async move { ([("content-type", "application/json")], doc) }
        }),
    ))
    .await
}

fn config(projects: &[(&str, &str, Option<&str>)]) -> ConsoleConfig {
    let list: Vec<serde_json::Value> = projects
        .iter()
        .map(|(name, url, token)| serde_json::json!({"name": name, "status_url": url, "token": token}))
        .collect();
    ConsoleConfig::parse(&serde_json::json!({"projects": list, "timeout_seconds": 1}).to_string(), "test").unwrap()
}

async fn page(console: &Console) -> String {
    let view = render::view(&console.snapshot().await, 15, chrono::Utc::now());
    render::page(&view).unwrap()
}

#[tokio::test]
async fn older_minor_versions_with_missing_and_unknown_fields_are_shown() {
    let (v10, _a) = fixed(FIXTURE.to_owned()).await;
    let exceptions = r#""exceptions": [{"id": "0193aaaa-0000-7000-8000-00000000beef", "job_id": "j", "tenant": "acme",
        "task_type": "email.send", "kind": "ambiguous_outcome", "cause": "timed out <b>", "opened_at": "2026-11-30T10:00:00Z"}],
        "destinations": [{"tenant": "acme", "name": "crm", "writes_enabled": false, "rate_per_second": 5, "last_outcome": "ambiguous",
        "last_http_status": 200, "last_call_at": "2026-11-30T10:00:00Z"}],
        "send_rates": [{"scope": "account", "key": "default", "effective_rate": 7, "configured_rate": null,
        "provider_rate": 14, "factor": 0.5, "throttles": 3, "last_throttle_at": "2026-11-30T10:00:00Z",
        "max_24h": 50000, "quota_left": 1200}],
        "reputation": [{"scope": "tenant", "key": "acme", "state": "paused", "state_reason": "paused: 48 permanent bounces",
        "window_hours": 24, "sends": 1000, "permanent_bounces": 48, "complaints": 0, "bounce_rate": 0.048,
        "complaint_rate": 0, "judged": true}, {"scope": "configuration_set", "key": "relay-events", "state": null,
        "window_hours": 24, "sends": 10, "permanent_bounces": 0, "complaints": 1, "bounce_rate": 0, "complaint_rate": 0.1,
        "judged": false}],
        "cutovers": [{"tenant": "acme", "task_type": "email.campaign", "stage": "shadow", "share": 0.1,
        "started_at": "2026-11-30T10:00:00Z", "halted_at": "2026-11-30T10:00:00Z", "halted_reason": "7 permanent bounces"},
        {"tenant": "globex", "task_type": "email.send", "stage": "share", "share": 0.25, "started_at": "2026-11-30T10:00:00Z"}],"#;
    let newer = FIXTURE
        .replace("\"1.0\"", "\"1.6\"")
        .replace("\"project\"", &format!("\"added_in_1_5\": {{\"x\": 1}}, {exceptions} \"project\""))
        .replace("\"open_exceptions\":", "\"dead_letters_24h\": 3, \"open_exceptions\":")
        .replace("\"project\"", "\"completions\": {\"open\": 4, \"overdue\": 1}, \"project\"");
    let (v14, _b) = fixed(newer).await;
    let console = Console::new(config(&[
        ("billing", &format!("{v10}/v1/status"), None),
        ("billing-next", &format!("{v14}/v1/status"), None),
    ]))
    .unwrap();
    console.refresh().await;
    let states = console.snapshot().await;
    assert!(states.iter().all(|s| s.reachable()), "{states:?}");
    let (doc, _) = states[0].last_good.as_ref().unwrap();
    assert_eq!((doc.version.as_str(), doc.queues[0].depth, doc.activity.is_none()), ("1.0", 7, true));
    assert_eq!(states[1].last_good.as_ref().unwrap().0.version, "1.6");

    let html = page(&console).await;
    assert!(html.contains(r#"data-project="billing" data-state="ok""#));
    assert!(html.contains(r#"data-project="billing-next" data-state="ok""#));
    assert!(html.contains("30 of 120"), "children progress is shown");
    assert!(html.contains("nightly-invoices"), "schedules are shown");
    assert!(html.contains("no activity series"), "a missing optional field is said, not an error");
    assert!(
        html.contains(r#"<td class="warn">ambiguous_outcome</td><td class="cause">timed out &lt;b&gt;</td>"#),
        "open exceptions are listed, each with its cause"
    );
    assert!(html.contains("…0000beef"));
    assert!(
        html.contains(
            r#"<td>acme</td><td>crm</td><td class="warn">off</td><td class="num">5</td><td>ambiguous (200)</td>"#
        ),
        "destinations are listed with their write switch, rate and last call (1.4)"
    );
    assert!(
        html.contains(
            r#"<td>account</td><td>default</td><td class="num warn">7</td><td>SES: 14 × 0.50</td><td class="num">3</td>"#
        ) && html.contains("<td>1200 of 50000 left</td>"),
        "send rates are listed with what makes them and their throttles (1.5): {}",
        html.split("Email send rates").nth(1).unwrap_or("none").chars().take(700).collect::<String>()
    );
    assert!(
        html.contains(r#"<td>tenant</td><td>acme</td><td class="warn">paused</td><td>48 (4.80 %)</td>"#)
            && html.contains("<td>configuration_set</td><td>relay-events</td><td>—</td>")
            && html.contains("10 in 24 h, too few to judge"),
        "reputation per tenant (its guard) and per configuration set (1.6)"
    );
    assert!(
        html.contains(r#"<td class="warn">shadow</td><td class="warn">halted back to shadow"#)
            && html.contains("7 permanent bounces")
            && html.contains("<td>share: 25.0 % of recipients live</td>"),
        "cut-over stages, a halted one saying why (1.6)"
    );
    assert!(
        html.contains(r#"<div class="dead-letters warn">3 dead letters in 24 h</div>"#),
        "dead letters are shown (1.3)"
    );
    assert_eq!(html.matches("dead letters in 24 h").count(), 1, "not for a 1.0 project, which does not report them");
    assert!(
        html.contains(r#"<div class="completions warn">4 waiting for a completion, 1 overdue</div>"#),
        "open and overdue waits are counted (1.4)"
    );
    assert_eq!(
        html.matches("waiting for a completion").count(),
        1,
        "not for a 1.0 project, which does not report them"
    );
    assert!(!html.contains("<script>alert"), "every value is escaped");
    assert!(html.contains("&lt;script&gt;alert"));
}

#[tokio::test]
async fn an_unreachable_project_is_shown_unreachable_with_its_last_good_data_greyed() {
    let (up, server) = fixed(FIXTURE.to_owned()).await;
    let (wrong_major, _w) = fixed(FIXTURE.replace("\"1.0\"", "\"2.0\"")).await;
    let (refusing, _r) = serve(Router::new().route(
        "/v1/status",
        get(|| async { (axum::http::StatusCode::UNAUTHORIZED, "{\"error\": {\"code\": \"unauthorized\"}}") }),
    ))
    .await;
    // Accepts connections and never answers.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_url = format!("http://{}/v1/status", hung.local_addr().unwrap());
    let console = Console::new(config(&[
        ("billing", &format!("{up}/v1/status"), None),
        ("never", "http://127.0.0.1:1/v1/status", None),
        ("v2", &format!("{wrong_major}/v1/status"), None),
        ("locked", &format!("{refusing}/v1/status"), Some("wrong")),
        ("hung", &hung_url, None),
    ]))
    .unwrap();

    console.refresh().await;
    let s = console.snapshot().await;
    assert!(s[0].reachable());
    for (i, why) in [(1, "unreachable"), (2, "version \"2.0\""), (3, "HTTP 401"), (4, "no answer within 1 s")] {
        assert!(!s[i].reachable() && s[i].unreachable_since.is_some(), "{:?}", s[i]);
        assert!(s[i].last_error.as_deref().unwrap().contains(why), "{:?}", s[i].last_error);
    }

    // The healthy project dies: unreachable since this poll, its last good data kept.
    server.abort();
    let _ = server.await;
    let started = tokio::time::Instant::now();
    console.refresh().await;
    assert!(started.elapsed() < Duration::from_secs(3), "polls run at once, each bounded by the timeout");
    let s = console.snapshot().await;
    let since = s[0].unreachable_since.expect("unreachable now");
    assert!(s[0].last_good.is_some());
    console.refresh().await;
    assert_eq!(console.snapshot().await[0].unreachable_since, Some(since), "since the first failed poll");

    let html = page(&console).await;
    assert!(
        html.contains(r#"<tr class="project-row stale" data-project="billing" data-state="unreachable">"#),
        "{html}"
    );
    assert!(html.contains("showing last good data from"));
    assert!(html.contains(r#"data-project="never" data-state="unreachable""#));
    drop(hung);
}

/// Where Debian's Chromium is, if installed (`RELAY_CHROMIUM` overrides).
fn chromium() -> Option<String> {
    let candidates = [
        std::env::var("RELAY_CHROMIUM").unwrap_or_default(),
        "/usr/bin/chromium".into(),
        "/usr/bin/chromium-browser".into(),
    ];
    candidates.into_iter().find(|p| !p.is_empty() && std::path::Path::new(p).exists())
}

/// The flags this machine needs (root, no GPU, closed network).
pub fn chromium_flags(profile: &std::path::Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect()
}

#[tokio::test]
async fn headless_chromium_shows_a_healthy_and_an_unreachable_project() {
    let Some(chromium) = chromium() else {
        eprintln!(
            "SKIPPED headless_chromium_shows_a_healthy_and_an_unreachable_project: chromium is not installed \
                   (apt-get install -y chromium, or set RELAY_CHROMIUM)"
        );
        return;
    };
    // Relay's API on a real port, with a status key and a live worker and sweeper.
    let w = World::new().await;
    crate::status::populate(&w).await;
    w.platform.liveness(taskdeck::liveness::Kind::Worker).beat().await.unwrap();
    w.platform.liveness(taskdeck::liveness::Kind::Sweeper).beat().await.unwrap();
    // A worker of an earlier start, last seen two hours ago: replaced, not missing.
    let old = chrono::Utc::now() - chrono::Duration::hours(3);
    taskdeck::store::workers::beat(&w.db().await, "worker", "worker:old:1:a", "old", Some(1), old).await.unwrap();
    w.db()
        .await
        .execute(
            "UPDATE workers SET last_seen_at = now() - interval '2 hours' WHERE instance_id = 'worker:old:1:a'",
            &[],
        )
        .await
        .unwrap();
    let (_, key) = status_keys::create(&w.db().await, "console").await.unwrap();
    let (api, _api) = serve(w.router.clone()).await;
    // A client project with a stuck run and a schedule whose slot is due but not yet fired.
    let now = chrono::Utc::now();
    let other = serde_json::json!({"contract": "relay.status/v1", "version": "1.3", "project": "other", "generated_at": now,
        "schedules": [{"name": "hourly-report", "next_run_at": now - chrono::Duration::seconds(10)}],
        "recent_runs": [{"id": "0193aaaa-0000-7000-8000-00000000dead", "task_type": "export", "status": "running",
            "started_at": now - chrono::Duration::minutes(4),
            "progress": {"kind": "elapsed", "elapsed_s": 240.0, "baseline_p95_s": 30.0, "stuck": true}}],
        "failures": {"last_hour": 0, "last_24h": 0, "open_exceptions": 0}});
    let (other_url, _other) = fixed(other.to_string()).await;
    let console = Console::new(config(&[
        ("relay", &format!("{api}/v1/status"), Some(&key)),
        ("gone", "http://127.0.0.1:1/v1/status", None),
        ("other", &format!("{other_url}/v1/status"), None),
    ]))
    .unwrap();
    let (site, _site) = serve(relay_console::router(console)).await;

    let profile = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chromium-{}", uuid::Uuid::now_v7()));
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(&chromium)
            .args(chromium_flags(&profile))
            .args(["--dump-dom", &format!("{site}/")])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium finishes within 90 s")
    .expect("chromium runs");
    // RELAY_CONSOLE_SCREENSHOT=path.png: also keep a picture of the page (for a report).
    if let Ok(png) = std::env::var("RELAY_CONSOLE_SCREENSHOT") {
        let _ = tokio::process::Command::new(&chromium)
            .args(chromium_flags(&profile))
            .args([format!("--screenshot={png}"), "--window-size=1400,1500".into(), format!("{site}/")])
            .kill_on_drop(true)
            .output()
            .await;
    }
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && dom.contains("Relay console"), "{}\n{}", String::from_utf8_lossy(&out.stderr), dom);
    assert!(dom.contains(r#"data-project="relay" data-state="ok""#), "{dom}");
    assert!(dom.contains(r#"data-project="gone" data-state="unreachable""#), "{dom}");
    assert!(dom.contains("2 live of 2"), "liveness of the worker and the sweeper, not the earlier start's: {dom}");
    assert!(dom.contains("(an earlier start)"), "{dom}");
    assert!(dom.contains("2 of 3, 1 failed"), "the fan-out's progress: {dom}");
    assert!(dom.contains("(1 child failed)"), "failed children shown on the parent, in good English: {dom}");
    assert!(dom.contains(r#"class="bad" style="width: 33.3%""#), "the failed share of the bar, in red: {dom}");
    assert!(dom.contains(r#"data-status="failed" data-outcome="failed""#), "a failed run is coloured as failed: {dom}");
    assert!(dom.contains(r#"<div class="muted run-error">bust</div>"#), "with its error beside it: {dom}");
    assert!(dom.contains(r#"data-status="succeeded" data-outcome="ok""#), "{dom}");
    assert!(dom.contains(r#"<td class="cause">bust</td>"#), "each open exception with its cause: {dom}");
    assert!(dom.contains("<svg"), "the activity chart is inline SVG");
    assert!(
        dom.contains(r#"class="axis y-axis""#) && dom.contains(r#"class="axis x-axis""#),
        "the chart has axes: {dom}"
    );
    assert!(
        dom.contains("2 runs (blue), 1 failed (red), one scale: 0 to 2 per 5 min"),
        "runs and failures on one basis: {dom}"
    );
    assert!(
        dom.contains(r#"data-stuck="true""#) && dom.contains("running 4 min — stuck (usually under 30 s)"),
        "a stuck run is marked: {dom}"
    );
    assert!(
        dom.contains("<td>hourly-report</td><td>—</td><td>—</td><td>due now</td>"),
        "a due schedule is due, not in the past: {dom}"
    );
    assert!(dom.contains("unreachable since"), "{dom}");
}
