//! Sending at a set rate: a `relay worker` child sends through the SES stand-in
//! (`ses_standin`, in front of moto), which throttles above N sends a second and answers
//! `GetAccount` with N as the account's `MaxSendRate` (read as the sweep does). First one
//! campaign long enough for 30 s at N (`--quick`: 10 s): the achieved rate from its first send to
//! its last against N, its busiest 1-second window, throttles. Then two tenants' campaigns of half
//! that each, side by side, and a stream of single sends (one every 500 ms, the tenants in
//! turn): each tenant's share of the sends while both campaigns ran, and the single sends' wait
//! from submission to their arrival at SES. Every time is the stand-in's clock in this process.

use std::path::Path;
use std::time::{Duration, Instant};

use hyper::Method;
use serde::Serialize;
use serde_json::{Value, json};

use super::intake::{Server, percentile};
use crate::ses_standin::{self, Faults, FaultySes, max_in_any_second};
use taskdeck::email::{pace, ses};
use taskdeck::store::{modes, sending_identities, tenants};

/// The campaigns' `concurrency_limit`: above the default 10 so that the children waiting for a
/// slot (at most `pace::BULK_HORIZON` ahead) can fill every slot at 20/s.
pub const CAMPAIGN_LIMIT: i32 = 20;
const TENANTS: [(&str, &str); 2] = [("acme", "acme.example"), ("globex", "globex.example")];
/// Between two single sends.
pub const SINGLE_EVERY: Duration = Duration::from_millis(500);

/// One run of the section.
#[derive(Debug, Clone, Serialize)]
pub struct PaceRun {
    /// N: the account's rate and the stand-in's throttling threshold, sends per second.
    pub rate: u32,
    pub headroom: f64,
    pub one: OneCampaign,
    pub shared: Shared,
}

/// One campaign alone at the account's rate.
#[derive(Debug, Clone, Serialize)]
pub struct OneCampaign {
    pub sends: usize,
    /// From its first send's arrival at SES to its last.
    pub seconds: f64,
    /// `(sends - 1) / seconds`: the rate over the run.
    pub achieved_per_sec: f64,
    /// `sends` over submission to the last arrival (start-up included).
    pub end_to_end_per_sec: f64,
    pub busiest_second: usize,
    /// The shortest time N + 1 consecutive sends took: at least 1 s keeps every second ≤ N.
    pub shortest_span_ms: Option<f64>,
    pub throttled: u64,
}

/// Two tenants' campaigns and single sends sharing the account's rate.
#[derive(Debug, Clone, Serialize)]
pub struct Shared {
    pub sends: usize,
    pub busiest_second: usize,
    pub shortest_span_ms: Option<f64>,
    /// From the first campaign send to the last send of the campaign that finished first.
    pub both_ran_seconds: f64,
    pub rate_while_both: f64,
    /// Shares of every send while both campaigns ran: acme's campaign, globex's, single sends.
    pub shares: [f64; 3],
    pub singles: usize,
    pub single_wait_p50_ms: f64,
    pub single_wait_p99_ms: f64,
    pub single_wait_max_ms: f64,
    pub throttled: u64,
}

/// One run: a scratch schema with two tenants, `relay serve` and a `relay worker` child, a
/// stand-in of its own (its counts are this run's).
pub async fn run(base_url: &str, rate: u32, quick: bool) -> anyhow::Result<PaceRun> {
    let secs = if quick { 10 } else { 30 };
    let moto =
        tokio::task::spawn_blocking(|| crate::localaws::moto_for_this_process(Path::new("target/tmp"))).await??;
    let faults = Faults { max_per_second: Some(rate as usize), account: Some((rate.into(), 1e7)), ..Faults::default() };
    let standin = ses_standin::start(&moto, faults, 1)?;
    let server = Server::start(base_url).await?;
    let keys = setup(&server, &moto, &standin).await?;
    let roles = json!({ "email.send": crate::localaws::EMAIL_SEND_ROLE }).to_string();
    let mut worker = super::campaign::worker_with(
        &server.scratch,
        &[
            ("AWS_ENDPOINT_URL", standin.url.as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("RELAY_TASK_ROLES", roles.as_str()),
        ],
    )?;
    let result = measure(&server, &standin, &keys, rate, secs).await;
    let _ = worker.start_kill();
    let _ = worker.wait().await;
    server.stop(base_url).await?;
    result
}

/// Shadow off and SES writes on; a second tenant; both tenants' domains allowed and verified in
/// moto; the account's rate read from the stand-in. Returns both tenants' API keys.
async fn setup(server: &Server, moto: &str, standin: &FaultySes) -> anyhow::Result<[String; 2]> {
    let pool = &server.scratch.platform.pool;
    let mut db = pool.get().await?;
    modes::set(&mut db, "shadow", false, "bench", Some("pace: sends go to the SES stand-in")).await?;
    modes::set(&mut db, "write:ses", true, "bench", Some("pace: sends go to the SES stand-in")).await?;
    let (globex, globex_key) = tenants::create(&db, TENANTS[1].0).await?;
    let ids = [server.scratch.tenant.id, globex.id];
    let moto_ses = ses::client(&crate::localaws::sdk_config(moto));
    for (id, (_, domain)) in ids.into_iter().zip(TENANTS) {
        sending_identities::set(&mut db, id, &[domain.into()]).await?;
        // Already there from an earlier run: fine.
        let _ = moto_ses.create_email_identity().email_identity(domain).send().await;
    }
    drop(db);
    pace::refresh_account(pool, &crate::localaws::sdk_config(&standin.url)).await?;
    Ok([server.scratch.key.clone(), globex_key])
}

async fn measure(
    server: &Server,
    standin: &FaultySes,
    keys: &[String; 2],
    rate: u32,
    secs: u32,
) -> anyhow::Result<PaceRun> {
    let n = rate as usize;
    let limit = Duration::from_secs(3 * u64::from(secs) + 60);

    // One campaign alone.
    let sends = n * secs as usize;
    let submitted = Instant::now();
    submit(server, &keys[0], "solo", campaign(TENANTS[0].1, "solo campaign", sends)).await?;
    let solo = arrivals(standin, "solo campaign", sends, limit).await?;
    let throttled = ses_standin::Counts::get(&standin.counts.throttled);
    let seconds = solo.last().zip(solo.first()).map_or(0.0, |(l, f)| l.duration_since(*f).as_secs_f64());
    let one = OneCampaign {
        sends,
        seconds,
        achieved_per_sec: (sends - 1) as f64 / seconds,
        end_to_end_per_sec: sends as f64 / solo.last().map_or(f64::NAN, |l| l.duration_since(submitted).as_secs_f64()),
        busiest_second: max_in_any_second(&solo),
        shortest_span_ms: shortest_span(&solo, n + 1),
        throttled,
    };

    // Two tenants' campaigns and a stream of single sends.
    let each = sends / 2;
    for (i, (tenant, domain)) in TENANTS.into_iter().enumerate() {
        let subject = format!("{tenant} campaign");
        submit(server, &keys[i], &format!("{tenant}-campaign"), campaign(domain, &subject, each)).await?;
    }
    let singles = (secs as usize * 1000) / SINGLE_EVERY.as_millis() as usize;
    let mut single_submitted = Vec::with_capacity(singles);
    for i in 0..singles {
        tokio::time::sleep(SINGLE_EVERY).await;
        let (tenant, domain) = TENANTS[i % 2];
        let subject = format!("single {i}");
        single_submitted.push((subject.clone(), Instant::now()));
        let body = json!({"task_type": "email.send", "params": {
            "from": format!("{tenant} <noreply@{domain}>"), "to": ["one@example.com"], "subject": subject, "text": "Hi"}});
        submit(server, &keys[i % 2], &format!("single-{i}"), body).await?;
    }
    let campaigns = [
        arrivals(standin, "acme campaign", each, limit).await?,
        arrivals(standin, "globex campaign", each, limit).await?,
    ];
    let singles_at = arrivals(standin, "single ", singles, limit).await?;
    let passed = standin.counts.passed();
    let mut waits: Vec<f64> = single_submitted
        .iter()
        .filter_map(|(subject, at)| {
            let arrived = passed.iter().find(|(_, s)| s == subject)?.0;
            Some(arrived.duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let mut all: Vec<Instant> = campaigns.iter().flatten().chain(&singles_at).copied().collect();
    all.sort();
    // While both campaigns ran: from the first campaign send to the last of the one that ended first.
    let start = campaigns.iter().filter_map(|c| c.first()).min().copied();
    let end = campaigns.iter().filter_map(|c| c.last()).min().copied();
    let (both_ran_seconds, rate_while_both, shares) = match (start, end) {
        (Some(start), Some(end)) if end > start => {
            let within = |xs: &[Instant]| xs.iter().filter(|t| **t >= start && **t <= end).count() as f64;
            let counts = [within(&campaigns[0]), within(&campaigns[1]), within(&singles_at)];
            let total: f64 = counts.iter().sum();
            let secs = end.duration_since(start).as_secs_f64();
            (secs, (total - 1.0) / secs, counts.map(|c| c / total))
        }
        _ => (0.0, f64::NAN, [f64::NAN; 3]),
    };
    let shared = Shared {
        sends: all.len(),
        busiest_second: max_in_any_second(&all),
        shortest_span_ms: shortest_span(&all, n + 1),
        both_ran_seconds,
        rate_while_both,
        shares,
        singles,
        single_wait_p50_ms: percentile(&waits, 0.5),
        single_wait_p99_ms: percentile(&waits, 0.99),
        single_wait_max_ms: waits.last().copied().unwrap_or(f64::NAN),
        throttled: ses_standin::Counts::get(&standin.counts.throttled) - throttled,
    };
    Ok(PaceRun { rate, headroom: pace::HEADROOM, one, shared })
}

fn campaign(domain: &str, subject: &str, n: usize) -> Value {
    let recipients: Vec<Value> = (0..n).map(|i| json!({"to": format!("r{i}@example.com")})).collect();
    json!({"task_type": "email.campaign", "params": {
        "message": {"from": format!("News <news@{domain}>"), "subject": subject, "text": "Hi"},
        "recipients": recipients, "concurrency_limit": CAMPAIGN_LIMIT}})
}

async fn submit(server: &Server, api_key: &str, idempotency_key: &str, body: Value) -> anyhow::Result<()> {
    let (status, answer) =
        server.request_as(api_key, Method::POST, "/v1/jobs", Some(idempotency_key), Some(&body)).await?;
    anyhow::ensure!(status == 202, "{idempotency_key} answered {status}: {answer}");
    Ok(())
}

/// When the `n` sends whose subject starts with `prefix` reached SES, in order (waits for them).
async fn arrivals(standin: &FaultySes, prefix: &str, n: usize, limit: Duration) -> anyhow::Result<Vec<Instant>> {
    let start = Instant::now();
    loop {
        let mut at: Vec<Instant> =
            standin.counts.passed().into_iter().filter(|(_, s)| s.starts_with(prefix)).map(|(t, _)| t).collect();
        if at.len() >= n {
            at.sort();
            return Ok(at);
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "{} of {n} sends \"{prefix}…\" reached the SES stand-in in {} s ({} throttled)",
            at.len(),
            limit.as_secs(),
            ses_standin::Counts::get(&standin.counts.throttled)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The shortest time `k` consecutive sends took, in ms (`sorted` in order).
fn shortest_span(sorted: &[Instant], k: usize) -> Option<f64> {
    sorted.windows(k).map(|w| w[k - 1].duration_since(w[0]).as_secs_f64() * 1000.0).min_by(f64::total_cmp)
}
