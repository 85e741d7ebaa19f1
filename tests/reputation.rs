//! One tenant's bounces never stop another tenant's mail (issue 50): through the SES stand-in,
//! tenant X's campaign to a list that bounces 12 % for good pauses X alone (its reputation
//! guard, default thresholds) before 1,000 of its sends, its held sends say why and go out once
//! each after an operator resumes; tenant Y's single sends keep their latency (printed beside Y
//! alone, same run). Bounce events are written from the AWS formats (`email::ses_event`) and
//! handed to ingress, as SNS would: neither moto nor the stand-in emits them.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::SqsEvent;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::lambda::ingress::Ingress;
use taskdeck::store::operators;

use crate::email::{executor, go_live, roles, ses_event, sns_record};
use crate::pace::{OTHER_DOMAIN, senders, single, stop, submit_as, workers};
use crate::support::{World, moto};
use relay::ses_standin::{self, Faults, FaultySes};

const X_SENDS: usize = 1000;
/// The account's maximum send rate (SES's `MaxSendRate`; 14/s is its default for an account out of the sandbox).
const ACCOUNT_RATE: f64 = 14.0;

/// X's campaign: every recipient whose number ends in 00..11 of each hundred bounces (12 %).
fn bouncing_campaign(n: usize) -> Value {
    let recipients: Vec<Value> = (0..n)
        .map(|i| {
            let to = if i % 100 < 12 { format!("bounce{i}@example.com") } else { format!("ok{i}@example.com") };
            json!({"to": to})
        })
        .collect();
    json!({"task_type": "email.campaign", "params": {
        "message": {"from": format!("News <news@{}>", crate::email::DOMAIN), "subject": "x campaign", "text": "Hi"},
        "recipients": recipients, "concurrency_limit": 8}})
}

/// Where one batch of Y's sends spent its time: each phase's p50 and p99, from the job's
/// submission (the test's clock) to its claim (`started_at`), to its message's intent
/// (`messages.created_at`), to SES (the stand-in's clock), to its outcome recorded (`sent_at`).
async fn phases(w: &World, tag: &str, sent: &[(String, Instant, chrono::DateTime<chrono::Utc>, Instant)]) {
    let ids: Vec<uuid::Uuid> = sent.iter().map(|(id, ..)| id.parse().unwrap()).collect();
    let rows = w
        .db()
        .await
        .query(
            "SELECT j.id, j.started_at, m.created_at, m.sent_at FROM jobs j
             JOIN messages m ON m.job_id = j.id WHERE j.id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap();
    let mut columns: [Vec<Duration>; 4] = Default::default();
    for r in rows {
        let id: uuid::Uuid = r.get(0);
        let (_, submitted, submitted_wall, at_ses) = sent.iter().find(|(j, ..)| *j == id.to_string()).unwrap();
        let wall = |t: chrono::DateTime<chrono::Utc>| (t - *submitted_wall).to_std().unwrap_or_default();
        let claimed: chrono::DateTime<chrono::Utc> = r.get(1);
        let intent: chrono::DateTime<chrono::Utc> = r.get(2);
        let recorded: Option<chrono::DateTime<chrono::Utc>> = r.get(3);
        let ses = at_ses.duration_since(*submitted);
        let (claimed, intent) = (wall(claimed), wall(intent));
        columns[0].push(claimed);
        columns[1].push(intent.saturating_sub(claimed));
        columns[2].push(ses.saturating_sub(intent));
        columns[3].push(recorded.map(wall).unwrap_or_default().saturating_sub(ses));
    }
    let names = ["submit→claim", "claim→intent", "intent→SES", "SES→recorded"];
    let said: Vec<String> = names
        .iter()
        .zip(columns.iter_mut())
        .map(|(n, c)| {
            c.sort();
            format!("{n} p50 {:?} p99 {:?}", p(c, 0.5), p(c, 0.99))
        })
        .collect();
    eprintln!("Y {tag} phases: {}", said.join("; "));
}

/// Y's single sends, one every `gap`: each one's latency from submission to SES (sorted), and
/// where the time went (`phases`, printed).
async fn y_latencies(w: &World, key: &str, ses: &FaultySes, tag: &str, n: usize, gap: Duration) -> Vec<Duration> {
    let mut submitted = Vec::new();
    for i in 0..n {
        let subject = format!("y {tag} {i}");
        let (at, wall) = (Instant::now(), chrono::Utc::now());
        let id = submit_as(w, key, &format!("y-{tag}-{i}"), single(OTHER_DOMAIN, &subject)).await;
        submitted.push((subject, at, wall, id));
        tokio::time::sleep(gap).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let arrived = ses.counts.passed_at.lock().unwrap().clone();
        let got: Vec<Option<Instant>> =
            submitted.iter().map(|(s, ..)| arrived.iter().find(|(_, subj)| subj == s).map(|(t, _)| *t)).collect();
        if got.iter().all(Option::is_some) {
            let sent: Vec<_> = submitted
                .iter()
                .zip(got)
                .map(|((_, at, wall, id), ses)| (id.clone(), *at, *wall, ses.unwrap()))
                .collect();
            // Give the outcomes a moment to be recorded before reading the phases.
            tokio::time::sleep(Duration::from_millis(300)).await;
            phases(w, tag, &sent).await;
            let mut all: Vec<Duration> = sent.iter().map(|(_, at, _, ses)| ses.duration_since(*at)).collect();
            all.sort();
            return all;
        }
        if Instant::now() > deadline {
            let rows = w
                .db()
                .await
                .query("SELECT status, last_error, result::text FROM jobs ORDER BY id DESC LIMIT 3", &[])
                .await
                .unwrap();
            let seen: Vec<(String, Option<String>, Option<String>)> =
                rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
            panic!("Y's sends reached SES ({tag}): {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hand a permanent bounce for each of X's sent messages to a bouncing address to ingress, once.
async fn feed_bounces(w: &World, ingress: &Ingress, fed: &mut HashSet<String>) -> usize {
    let rows = w
        .db()
        .await
        .query(
            "SELECT id::text, provider_message_id, correlation_id, recipients->'to'->>0 FROM messages
             WHERE tenant_id = $1 AND status = 'sent' AND recipients->'to'->>0 LIKE 'bounce%'",
            &[&w.tenant.id],
        )
        .await
        .unwrap();
    let mut records = Vec::new();
    for r in rows {
        let id: String = r.get(0);
        if !fed.insert(id.clone()) {
            continue;
        }
        let m = json!({"id": id, "provider_message_id": r.get::<_, Option<String>>(1), "correlation_id": r.get::<_, String>(2)});
        let to: String = r.get(3);
        let bounce = ses_event(
            "Bounce",
            &m,
            json!({"bounce": {"bounceType": "Permanent", "bounceSubType": "General",
            "bouncedRecipients": [{"emailAddress": to}], "timestamp": "2026-11-30T10:00:06.000Z"}}),
        );
        records.push(sns_record(&format!("rep-{id}"), &bounce));
    }
    let n = records.len();
    if n > 0 {
        let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
        assert!(ingress.handle(event).await.batch_item_failures.is_empty());
    }
    n
}

/// While `on`, how long moto (the SES and STS behind the stand-in, one process) takes to answer
/// an STS `GetCallerIdentity`, every 50 ms: printed as p50/p99 under `tag` when it stops. Every
/// send makes two calls there (its run's `AssumeRole`, then `SendEmail`).
async fn moto_probe(on: std::sync::Arc<std::sync::atomic::AtomicBool>, tag: &'static str) {
    let sts = aws_sdk_sts::Client::new(&moto::sdk_config());
    let mut took = Vec::new();
    while on.load(std::sync::atomic::Ordering::Relaxed) {
        let t = Instant::now();
        let _ = sts.get_caller_identity().send().await;
        took.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    took.sort();
    if !took.is_empty() {
        eprintln!("moto's answer {tag}: p50 {:?} p99 {:?} ({} calls)", p(&took, 0.5), p(&took, 0.99), took.len());
    }
}

fn p(v: &[Duration], q: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_bounces_pause_it_alone_and_its_held_sends_go_out_once_after_resume() {
    let w = World::new().await;
    let (globex, y_key) = w.other_tenant("globex").await;
    go_live(&w).await;
    senders(&w, globex.id).await;
    // SES answers `GetAccount` with the account's maximum send rate, as SES does for every
    // account, and Relay paces the two tenants' sends under it, sharing it while both wait.
    // Unpaced, X's burst went as fast as two cores allow and slowed all of Y's (moto's answers
    // ×6, every phase of Y's sends ×3–6), not the guard's count (a few ms).
    let account = Faults { account: Some((ACCOUNT_RATE, 1_000_000.0)), ..Faults::default() };
    let ses = ses_standin::start(moto::endpoint(), account, 1).expect("the SES stand-in");
    crate::pace::read_account(&w, &ses).await;
    let mut exec = executor(&w, &ses.url, roles());
    exec.config.concurrency = 16;
    let (stop_tx, handles) = workers(&exec, 2);
    let ingress = Ingress::new(&w.platform, "platform");

    // Y alone.
    let probing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let probe = tokio::spawn(moto_probe(probing.clone(), "with Y alone"));
    let solo = y_latencies(&w, &y_key, &ses, "solo", 20, Duration::from_millis(150)).await;
    probing.store(false, std::sync::atomic::Ordering::Relaxed);
    probe.await.unwrap();
    let probing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));

    // X's campaign, with bounces fed back as X's sends reach SES, while Y sends again.
    let x_job = submit_as(&w, &w.key, "x-campaign", bouncing_campaign(X_SENDS)).await;
    let x_sent = || ses.counts.passed_at.lock().unwrap().iter().filter(|(_, s)| s == "x campaign").count();
    let feeder = {
        let w2 = &w;
        let ingress = &ingress;
        async move {
            let mut fed = HashSet::new();
            let deadline = Instant::now() + Duration::from_secs(180);
            let began = Instant::now();
            loop {
                feed_bounces(w2, ingress, &mut fed).await;
                let state: String = w2
                    .db()
                    .await
                    .query_opt("SELECT state FROM tenant_reputation WHERE tenant_id = $1", &[&w2.tenant.id])
                    .await
                    .unwrap()
                    .map_or("ok".into(), |r| r.get(0));
                if state == "paused" {
                    eprintln!("paused {:?} after the feeder began", began.elapsed());
                    return fed.len();
                }
                assert!(Instant::now() < deadline, "X was never paused");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Y beside X: starts once X's sends flow.
    while x_sent() < 20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let probe = tokio::spawn(moto_probe(probing.clone(), "with Y beside X"));
    let (beside, bounced) =
        tokio::join!(y_latencies(&w, &y_key, &ses, "beside", 20, Duration::from_millis(150)), feeder);
    probing.store(false, std::sync::atomic::Ordering::Relaxed);
    probe.await.unwrap();
    let sent_at_pause = x_sent();
    eprintln!("X paused after {sent_at_pause} sends reached SES ({bounced} permanent bounces fed back)");
    eprintln!(
        "Y latency to SES: alone p50 {:?} p99 {:?}; beside X p50 {:?} p99 {:?}",
        p(&solo, 0.5),
        p(&solo, 0.99),
        p(&beside, 0.5),
        p(&beside, 0.99)
    );
    // What the guard's count costs over X's window now (it runs on every bounce and complaint).
    let db = w.db().await;
    let counted = Instant::now();
    let c = taskdeck::store::reputation::counts(&db, w.tenant.id, 24).await.unwrap();
    eprintln!("the guard's count over X's window ({c:?}) took {:?}", counted.elapsed());
    drop(db);
    // Let sends already past the guard finish, then nothing more of X's leaves.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_at = x_sent();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(x_sent(), held_at, "no X send leaves while X is paused");
    assert!(held_at < X_SENDS, "X paused before 1,000 sends: {held_at}");
    eprintln!("X held at {held_at} of {X_SENDS} sends");
    // Y keeps its latency beside X's burst: its p99 within twice its p99 alone, measured in
    // this run, plus an allowance for this noisy machine (the chaos suite's: a phase's p99 is
    // its slowest send, and one stall of a loaded CPU is not the neighbour's doing).
    let allowance = Duration::from_millis(250);
    let bound = p(&solo, 0.99) * 2 + allowance;
    eprintln!("Y beside X p99 {:?}, bound {:?} (2 × alone p99 + {:?})", p(&beside, 0.99), bound, allowance);
    assert!(p(&beside, 0.99) <= bound, "Y's p99 beside X {:?} over {:?}", p(&beside, 0.99), bound);
    // Y still sends while X is paused.
    let after = y_latencies(&w, &y_key, &ses, "after", 5, Duration::from_millis(100)).await;
    eprintln!("Y latency while X is paused: p50 {:?}", p(&after, 0.5));

    // X's held sends: pending, none failed, saying why.
    let failed = w.count("SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status = 'failed'", &[&w.tenant.id]).await;
    assert_eq!(failed, 0, "held, not failed");
    let held: String = w
        .db()
        .await
        .query_one(
            "SELECT j.id::text FROM jobs j JOIN job_rate_waits r ON r.job_id = j.id
             WHERE j.tenant_id = $1 AND j.status = 'pending' LIMIT 1",
            &[&w.tenant.id],
        )
        .await
        .unwrap()
        .get(0);
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{held}"), None, None).await;
    assert_eq!(job["waiting_reason"], "reputation_paused", "{job}");
    assert_eq!(job["waiting_rate"], format!("reputation:tenant:{}", w.tenant.id), "{job}");
    // The tenant sees its own state; Y is untouched.
    let (_, mine) = w.call(Method::GET, "/v1/reputation", None, None).await;
    assert_eq!(mine["state"], "paused", "{mine}");
    assert!(mine["bounce_rate"].as_f64().unwrap() >= 0.04, "{mine}");
    let (_, theirs) = w.call_as(&y_key, Method::GET, "/v1/reputation", None, None).await;
    assert_eq!(theirs["state"], "ok", "{theirs}");
    let paused_events = w
        .count(
            "SELECT count(*) FROM message_events WHERE tenant_id = $1 AND event_type = 'reputation_paused'",
            &[&w.tenant.id],
        )
        .await;
    assert_eq!(paused_events, 1, "the tenant hears of its pause once");
    let audited = w.count("SELECT count(*) FROM admin_actions WHERE action = 'reputation.paused'", &[]).await;
    assert_eq!(audited, 1, "the operator sees it");

    // An operator resumes X (audited): its held sends go out, each once.
    let op = operators::create(&w.db().await, "ops").await.unwrap().1;
    let path = format!("/v1/admin/tenants/{}/reputation/resume", w.tenant.id);
    let (s, bad) = w.call_as(&op, Method::POST, &path, None, Some(b"{}".to_vec())).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "a resume needs a reason: {bad}");
    let body = json!({"reason": "list cleaned"}).to_string().into_bytes();
    let (s, resumed) = w.call_as(&op, Method::POST, &path, None, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["state"], "ok");
    assert!(resumed["released"].as_u64().unwrap() > 0, "{resumed}");
    let deadline = Instant::now() + Duration::from_secs(240);
    while x_sent() < X_SENDS && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop(stop_tx, handles).await;
    assert_eq!(x_sent(), X_SENDS, "every X send went out once after the resume, none twice");
    let keys = w
        .count(
            "SELECT count(DISTINCT message_key) FROM messages WHERE tenant_id = $1 AND status IN ('sent', 'bounced')",
            &[&w.tenant.id],
        )
        .await;
    assert_eq!(keys, X_SENDS as i64, "each recipient's message recorded sent (or bounced) once");
    let resumes = w.count("SELECT count(*) FROM admin_actions WHERE action = 'reputation.resume' AND ok", &[]).await;
    assert_eq!(resumes, 1, "the resume is audited");
    let (_, done) = w.call(Method::GET, &format!("/v1/jobs/{x_job}"), None, None).await;
    eprintln!("X campaign after resume: {}", done["progress"]);
}

/// A complaint crosses the warning level an operator set (audited; bad thresholds a clear
/// 422): the tenant gets a `message.reputation_warning` event in its feed, the operator an
/// audit row, and its sends still go (a warning holds nothing).
#[tokio::test]
async fn a_complaint_over_the_warning_level_tells_the_tenant_and_the_operator_and_holds_nothing() {
    let w = World::new().await;
    go_live(&w).await;
    crate::email::sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let op = operators::create(&w.db().await, "ops").await.unwrap().1;
    let path = format!("/v1/admin/tenants/{}/reputation", w.tenant.id);
    let put = |body: Value| {
        let (op, path, w) = (op.clone(), path.clone(), &w);
        async move { w.call_as(&op, Method::PUT, &path, None, Some(body.to_string().into_bytes())).await }
    };
    for bad in [
        json!({"warn_bounce": 0}),
        json!({"pause_bounce": 1.5}),
        json!({"min_sends": 0}),
        json!({"window_hours": 0}),
        json!({"exempt_tags": ["no-equals"]}),
        json!({"surprise": 1}),
    ] {
        let (s, e) = put(bad.clone()).await;
        assert!(s.is_client_error() && s != StatusCode::NOT_FOUND, "{bad} -> {s} {e}");
    }
    let (s, set) = put(json!({"warn_complaint": 0.01, "pause_complaint": 0.5, "min_sends": 1, "reason": "test"})).await;
    assert_eq!(s, StatusCode::OK, "{set}");
    assert_eq!(set["thresholds"]["warn_complaint"], 0.01);
    let audited =
        w.count("SELECT count(*) FROM admin_actions WHERE action = 'reputation.set' AND actor = 'ops'", &[]).await;
    assert_eq!(audited, 1);

    let id = crate::email::submit(&w, "c-1", json!({"task_type": "email.send", "params": {
        "from": format!("noreply@{}", crate::email::DOMAIN), "to": ["c@example.com"], "subject": "complain", "text": "x"}}))
    .await;
    // Three sends, one complaint: 33 %, over the warning level, under the pause level.
    let mut ids = vec![id];
    for i in 0..2 {
        ids.push(
            crate::email::submit(
                &w,
                &format!("c-ok-{i}"),
                json!({"task_type": "email.send", "params": {
                "from": format!("noreply@{}", crate::email::DOMAIN), "to": [format!("ok{i}@example.com")],
                "subject": "fine", "text": "x"}}),
            )
            .await,
        );
    }
    exec.run_dispatched(&ids).await.unwrap();
    let m = crate::email::message_of(&w, id).await;
    assert_eq!(m["status"], "sent", "{m}");
    let complaint = ses_event(
        "Complaint",
        &m,
        json!({"complaint": {"complaintFeedbackType": "abuse",
        "complainedRecipients": [{"emailAddress": "c@example.com"}]}}),
    );
    let out = crate::email::through_ingress(&w, &exec, vec![sns_record("rep-c", &complaint)]).await;
    assert_eq!(out[0]["reputation"], "warning", "{out:?}");
    let (_, mine) = w.call(Method::GET, "/v1/reputation", None, None).await;
    assert_eq!(mine["state"], "warning", "{mine}");
    assert_eq!(mine["complaints"], 1);
    let (_, feed) = w.call(Method::GET, "/v1/messages/events", None, None).await;
    let types: Vec<&str> = feed["events"].as_array().unwrap().iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.contains(&"message.reputation_warning"), "{feed}");
    let seen = w
        .count("SELECT count(*) FROM admin_actions WHERE action = 'reputation.warning' AND actor = 'system'", &[])
        .await;
    assert_eq!(seen, 1, "the operator sees the warning");
    // The status contract shows the tenant's guard, and each configuration set's rates.
    w.db()
        .await
        .execute("UPDATE messages SET configuration_set = 'relay-events' WHERE tenant_id = $1", &[&w.tenant.id])
        .await
        .unwrap();
    let (_, key) = taskdeck::store::status_keys::create(&w.db().await, "console").await.unwrap();
    let (_, doc) = w.call_as(&key, Method::GET, "/v1/status", None, None).await;
    crate::status::assert_valid(&doc);
    let rep = doc["reputation"].as_array().unwrap();
    let tenant = rep.iter().find(|r| r["scope"] == "tenant" && r["key"] == "acme").expect("the tenant's row");
    assert_eq!((tenant["state"].as_str(), tenant["complaints"].as_i64()), (Some("warning"), Some(1)), "{doc}");
    let set = rep.iter().find(|r| r["scope"] == "configuration_set").expect("the set's row");
    assert_eq!(
        (set["key"].as_str(), set["sends"].as_i64(), set["complaints"].as_i64(), set["state"].is_null()),
        (Some("relay-events"), Some(3), Some(1), true),
        "{doc}"
    );
    // A warning holds nothing.
    let id = crate::email::submit(&w, "c-2", json!({"task_type": "email.send", "params": {
        "from": format!("noreply@{}", crate::email::DOMAIN), "to": ["d@example.com"], "subject": "after", "text": "x"}}))
    .await;
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(crate::email::message_of(&w, id).await["status"], "sent");
}

/// SES tenants (`write:ses_tenants`): before the tenant's first send under the mode Relay
/// creates its SES tenant and associates its sending identities (and the send's configuration
/// set) once (a refusal holds the send, saying why); each send names it (`TenantName`); when SES
/// pauses that tenant, the send is held (not retried blindly, not failed): the tenant's guard
/// pauses (audited, the tenant told) until an operator resumes. moto has no SES tenants: the SES
/// stand-in serves `CreateTenant` and `CreateTenantResourceAssociation` (recording each call),
/// records each send's `TenantName` and answers a send naming a paused tenant with
/// `SendingPausedException`, as SES does.
#[tokio::test]
async fn with_ses_tenants_sends_name_the_tenant_and_an_ses_pause_holds_them() {
    let w = World::new().await;
    go_live(&w).await;
    crate::email::sender(&w).await;
    let ses = ses_standin::start(moto::endpoint(), Faults::default(), 1).expect("the SES stand-in");
    let exec = executor(&w, &ses.url, roles());
    let send = |key: &str, subject: &str| {
        let body = json!({"task_type": "email.send", "params": {
            "from": format!("noreply@{}", crate::email::DOMAIN), "to": ["t@example.com"], "subject": subject, "text": "x"}});
        let (w, key) = (&w, key.to_owned());
        async move { crate::email::submit(w, &key, body).await }
    };
    // Off (the default): no TenantName.
    let id = send("t-0", "no tenant").await;
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(ses.counts.tenants.lock().unwrap().clone(), [""], "off: sends name no SES tenant");

    taskdeck::store::modes::set(&mut w.db().await, "write:ses_tenants", true, "ops", Some("SES tenants"))
        .await
        .unwrap();
    let name = taskdeck::email::ses::tenant_name(w.tenant.id);
    // Relay sets up the tenant's SES tenant before its first send under the mode. Refused at
    // first: the send is held, saying why, and nothing is sent.
    ses.counts.refuse_tenant_setup.store(true, std::sync::atomic::Ordering::SeqCst);
    let id = send("t-1", "named").await;
    exec.run_dispatched(&[id]).await.unwrap();
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(
        (job["status"].as_str(), job["waiting_reason"].as_str(), job["waiting_rate"].as_str()),
        (Some("pending"), Some("ses_tenant_pending"), Some(format!("ses_tenant:{}", w.tenant.id).as_str())),
        "{job}"
    );
    let (_, events) = w.call(Method::GET, &format!("/v1/jobs/{id}/events"), None, None).await;
    assert!(
        events.to_string().contains("is not set up yet") && events.to_string().contains("LimitExceeded"),
        "{events}"
    );
    assert_eq!(ses.counts.tenants.lock().unwrap().len(), 1, "held: nothing sent");
    // SES takes it now: the held send (due again) creates the SES tenant and associates the
    // tenant's identity (and the send's configuration set, when it names one), once each.
    ses.counts.refuse_tenant_setup.store(false, std::sync::atomic::Ordering::SeqCst);
    w.db().await.execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&id]).await.unwrap();
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(ses.counts.tenants.lock().unwrap().last(), Some(&name), "on: the send names the tenant's SES tenant");
    assert_eq!(
        ses.counts.tenants_created.lock().unwrap().clone(),
        std::slice::from_ref(&name),
        "the SES tenant created once"
    );
    let associated = |kind: &str| -> Vec<String> {
        let all = ses.counts.tenant_associations.lock().unwrap().clone();
        all.into_iter().filter(|(t, arn)| t == &name && arn.contains(kind)).map(|(_, arn)| arn).collect()
    };
    let identities = associated(":identity/");
    assert_eq!(identities.len(), 1, "{identities:?}");
    assert!(
        identities[0].starts_with("arn:aws:ses:")
            && identities[0].ends_with(&format!(":identity/{}", crate::email::DOMAIN))
    );
    let calls =
        || (ses.counts.tenants_created.lock().unwrap().len(), ses.counts.tenant_associations.lock().unwrap().len());
    let kept = w.count("SELECT count(*) FROM ses_tenant_resources WHERE tenant_id = $1", &[&w.tenant.id]).await;
    assert_eq!(kept as usize, calls().0 + calls().1, "each part kept as set up");
    // A second send makes no call; an identity added later is associated by the next send alone.
    let before = calls();
    let id = send("t-1b", "named again").await;
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(calls(), before, "set up once: the next send makes no call");
    assert_eq!(ses.counts.tenants.lock().unwrap().last(), Some(&name));
    taskdeck::store::sending_identities::add(&w.db().await, w.tenant.id, "news.example").await.unwrap();
    let id = send("t-1c", "after a new identity").await;
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(calls(), (before.0, before.1 + 1), "only the new identity is associated");
    assert!(associated(":identity/news.example").len() == 1);

    // SES pauses the tenant: the next send is held, its message back to throttled, nothing failed.
    ses.counts.paused_tenants.lock().unwrap().insert(name.clone());
    let held = send("t-2", "held").await;
    exec.run_dispatched(&[held]).await.unwrap();
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{held}"), None, None).await;
    assert_eq!(
        (job["status"].as_str(), job["waiting_reason"].as_str()),
        (Some("pending"), Some("reputation_paused")),
        "{job}"
    );
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE status = 'failed'", &[]).await, 0, "held, not failed");
    assert_eq!(crate::email::message_of(&w, held).await["status"], "throttled");
    let (_, mine) = w.call(Method::GET, "/v1/reputation", None, None).await;
    assert_eq!(mine["state"], "paused", "{mine}");
    assert!(mine["state_reason"].as_str().unwrap_or_default().contains("SES paused"), "{mine}");
    let audited = w.count("SELECT count(*) FROM admin_actions WHERE action = 'reputation.paused'", &[]).await;
    assert_eq!(audited, 1);
    // Another send of the tenant is held by Relay's own guard now, never reaching SES.
    let passed = ses.counts.tenants.lock().unwrap().len();
    let next = send("t-3", "held too").await;
    exec.run_dispatched(&[next]).await.unwrap();
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{next}"), None, None).await;
    assert_eq!(job["waiting_reason"], "reputation_paused", "{job}");
    assert_eq!(ses.counts.tenants.lock().unwrap().len(), passed, "nothing reached SES");
}
