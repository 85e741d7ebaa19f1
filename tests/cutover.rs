//! Email cut over in stages (issue 50), against moto's SES: an operator puts a tenant's
//! campaigns in a 10 % share (audited); a campaign sends about 10 % of its recipients live and
//! shadows the rest, its progress counting them apart, and a rerun to the same list sends to
//! the same addresses. A bounce spike during the stage halts it back to shadow by itself, at
//! the first bounce that takes the rate over the stage's threshold, and says so (audit row,
//! the status contract's `cutovers`, the console). Bounce events are written from the AWS
//! formats and handed to ingress, as SNS would: moto emits none.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::email::cutover::in_share;
use taskdeck::store::{operators, status_keys};

use crate::email::{DOMAIN, executor, go_live, roles, sender, ses_event, sns_record, through_ingress};
use crate::pace::{stop, submit_as, workers};
use crate::support::{World, moto};

const N: usize = 300;

fn staged_campaign() -> Value {
    let recipients: Vec<Value> = (0..N).map(|i| json!({"to": format!("r{i}@example.com")})).collect();
    json!({"task_type": "email.campaign", "params": {
        "message": {"from": format!("News <news@{DOMAIN}>"), "subject": "staged", "text": "Hi"},
        "recipients": recipients, "concurrency_limit": 50}})
}

/// Run a campaign to its end (workers, then the sweep finishes the parent); returns the job.
async fn run_campaign(w: &World, exec: &taskdeck::executor::Executor, idem: &str) -> Value {
    let id = submit_as(w, &w.key, idem, staged_campaign()).await;
    let (stop_tx, handles) = workers(exec, 2);
    let parent: taskdeck::job::JobId = id.parse().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let done = w
            .count(
                "SELECT count(*) FROM jobs WHERE parent_id = $1 AND status IN ('succeeded', 'failed', 'cancelled')",
                &[&parent],
            )
            .await;
        if done == N as i64 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{done} of {N} children ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(stop_tx, handles).await;
    w.platform.sweeper().pass().await.unwrap();
    let (_, job) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    job
}

/// The recipients this tenant's messages with this subject were really sent to.
async fn sent_to(w: &World, job: &Value) -> BTreeSet<String> {
    let parent: taskdeck::job::JobId = job["id"].as_str().unwrap().parse().unwrap();
    let rows = w
        .db()
        .await
        .query(
            "SELECT m.recipients->'to'->>0 FROM messages m JOIN jobs c ON c.id = m.job_id
             WHERE c.parent_id = $1 AND m.status = 'sent'",
            &[&parent],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ten_percent_stage_sends_the_same_tenth_live_and_a_bounce_spike_halts_it_back_to_shadow() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let op = operators::create(&w.db().await, "ops").await.unwrap().1;
    let path = format!("/v1/admin/tenants/{}/cutover/email.campaign", w.tenant.id);
    let put = |body: Value| {
        let (op, path, w) = (op.clone(), path.clone(), &w);
        async move { w.call_as(&op, Method::PUT, &path, None, Some(body.to_string().into_bytes())).await }
    };
    for bad in [
        json!({"stage": "share", "reason": "no share"}),
        json!({"stage": "share", "share": 1.5, "reason": "too much"}),
        json!({"stage": "live", "share": 0.1, "reason": "share without the share stage"}),
        json!({"stage": "half", "reason": "no such stage"}),
        json!({"stage": "share", "share": 0.1}),
    ] {
        let (s, e) = put(bad.clone()).await;
        assert!(s.is_client_error() && s != StatusCode::NOT_FOUND, "{bad} -> {s} {e}");
    }
    let (s, stage) =
        put(json!({"stage": "share", "share": 0.1, "halt_bounce": 0.1, "reason": "first tenth of the list"})).await;
    assert_eq!(s, StatusCode::OK, "{stage}");
    assert_eq!((stage["stage"].as_str(), stage["share"].as_f64()), (Some("share"), Some(0.1)));
    let audited =
        w.count("SELECT count(*) FROM admin_actions WHERE action = 'cutover.set' AND actor = 'ops'", &[]).await;
    assert_eq!(audited, 1, "the operator's change is audited");

    // About a tenth live, exactly the addresses the hash puts in the share; the rest shadowed.
    let first = run_campaign(&w, &exec, "staged-1").await;
    assert_eq!(first["status"], "succeeded", "{first}");
    let live = sent_to(&w, &first).await;
    let expected: BTreeSet<String> = (0..N).map(|i| format!("r{i}@example.com")).filter(|a| in_share(a, 0.1)).collect();
    assert_eq!(live, expected, "the live recipients are the share's");
    assert!((15..=45).contains(&live.len()), "about 10 % of {N} live: {}", live.len());
    let p = &first["progress"];
    assert_eq!(
        (p["succeeded"].as_i64(), p["shadowed"].as_i64(), p["skipped"].as_i64(), p["failed"].as_i64()),
        (Some(live.len() as i64), Some((N - live.len()) as i64), Some(0), Some(0)),
        "sent and shadowed counted apart: {p}"
    );
    let reason: String = w
        .db()
        .await
        .query_one("SELECT reason FROM messages WHERE status = 'shadowed' LIMIT 1", &[])
        .await
        .unwrap()
        .get(0);
    assert!(reason.contains("outside the share"), "{reason}");

    // A rerun to the same list: the same addresses live (a new stage start, not a new draw).
    let second = run_campaign(&w, &exec, "staged-2").await;
    assert_eq!(sent_to(&w, &second).await, live, "the same recipients are live on a rerun");

    // Bounces of the live sends, one at a time: the stage halts at the first that takes the
    // rate since the stage started to its 10 % threshold, and not before.
    let sends = 2 * live.len();
    let halt_at = sends.div_ceil(10);
    let db = w.db().await;
    let messages = db
        .query(
            "SELECT id::text, provider_message_id, correlation_id FROM messages
             WHERE tenant_id = $1 AND status = 'sent' ORDER BY id",
            &[&w.tenant.id],
        )
        .await
        .unwrap();
    assert_eq!(messages.len(), sends);
    let mut halted_after = None;
    for (i, r) in messages.iter().enumerate() {
        let m = json!({"id": r.get::<_, String>(0), "provider_message_id": r.get::<_, Option<String>>(1),
            "correlation_id": r.get::<_, String>(2)});
        let bounce = ses_event(
            "Bounce",
            &m,
            json!({"bounce": {"bounceType": "Permanent", "bounceSubType": "General",
                "bouncedRecipients": [], "timestamp": "2026-11-30T10:00:06.000Z"}}),
        );
        let out = through_ingress(&w, &exec, vec![sns_record(&format!("stage-b-{i}"), &bounce)]).await;
        if out[0]["cutover_halted"].as_array().is_some_and(|h| !h.is_empty()) {
            halted_after = Some(i + 1);
            break;
        }
    }
    assert_eq!(halted_after, Some(halt_at), "halted at the first bounce over 10 % of {sends} sends");
    let (_, stages) =
        w.call_as(&op, Method::GET, &format!("/v1/admin/tenants/{}/cutover", w.tenant.id), None, None).await;
    let s = &stages["stages"][0];
    assert_eq!(s["stage"], "shadow", "{stages}");
    assert!(s["halted_reason"].as_str().unwrap_or_default().contains("permanent bounces"), "{stages}");
    let (_, own) = w.call(Method::GET, "/v1/cutover", None, None).await;
    assert_eq!(own["stages"][0]["stage"], "shadow", "the tenant sees it: {own}");
    let told =
        w.count("SELECT count(*) FROM admin_actions WHERE action = 'cutover.halted' AND actor = 'system'", &[]).await;
    assert_eq!(told, 1, "the operator is told once");
    let (_, key) = status_keys::create(&w.db().await, "console").await.unwrap();
    let (_, doc) = w.call_as(&key, Method::GET, "/v1/status", None, None).await;
    let c = &doc["cutovers"][0];
    assert_eq!((c["stage"].as_str(), c["task_type"].as_str()), (Some("shadow"), Some("email.campaign")), "{doc}");
    assert!(c["halted_reason"].is_string(), "{doc}");
    crate::status::assert_valid(&doc);

    // Halted: a third run sends nothing live, an in-share recipient included.
    let third = run_campaign(&w, &exec, "staged-3").await;
    assert!(sent_to(&w, &third).await.is_empty(), "nothing live after the halt");
    assert_eq!(third["progress"]["shadowed"], N, "{third}");
}
