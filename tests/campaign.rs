//! `email.campaign`: 10,000 recipients in shadow mode with the creating run killed midway,
//! honest progress, correlation on every child and message, and paged recipient lists.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::job::JobId;
use taskdeck::store::{jobs, sending_identities};

use crate::support::World;

async fn sender(w: &World) {
    sending_identities::set(&mut w.db().await, w.tenant.id, &["acme.example".into()]).await.unwrap();
}

fn campaign(recipients: Value, extra: Value) -> Value {
    let mut params = json!({
        "message": {"from": "News <news@acme.example>", "template": "news", "data": {"name": "friend"}},
        "recipients": recipients,
    });
    params.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    json!({"task_type": "email.campaign", "correlation_id": "spring-campaign", "params": params})
}

async fn template(w: &World) {
    let (status, _) = w
        .call(
            Method::PUT,
            "/v1/templates/news",
            None,
            Some(json!({"subject": "News for {{ name }}", "text": "Hi {{ name }}"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

/// The parent's count progress: (total, done) where done counts terminal children.
fn progress(job: &Value) -> Option<(i64, i64)> {
    let p = &job["progress"];
    (p["kind"] == "count").then(|| {
        let n = |k: &str| p[k].as_i64().unwrap_or(0);
        (n("total"), n("succeeded") + n("shadowed") + n("skipped") + n("failed") + n("cancelled"))
    })
}

#[tokio::test]
async fn ten_thousand_recipients_in_shadow_mode_complete_exactly_though_the_creating_run_is_killed() {
    const N: usize = 10_000;
    let w = World::new().await;
    sender(&w).await;
    template(&w).await;
    let recipients: Vec<Value> =
        (0..N).map(|i| json!({"to": format!("r{i}@example.com"), "data": {"name": format!("r{i}")}})).collect();
    let (status, parent) = w
        .submit("spring", campaign(json!(recipients), json!({"children_per_run": 2000, "concurrency_limit": 200})))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{}", parent["error"]);
    let id: JobId = parent["id"].as_str().unwrap().parse().unwrap();

    // A worker claims the campaign and is killed while it creates children: its run stops at
    // whatever it was awaiting and records nothing.
    let exec = w.platform.executor();
    let claim = jobs::claim_ids(&w.db().await, &[id], 2.0, None).await.unwrap();
    let job = claim.jobs.into_iter().next().expect("claimed");
    let modes = Arc::new(claim.modes);
    let doomed = {
        let exec = exec.clone();
        tokio::spawn(async move { exec.execute(&job, modes).await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.count("SELECT count(*) FROM jobs WHERE parent_id = $1", &[&id]).await == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    doomed.abort();
    let created_before_kill = w.count("SELECT count(*) FROM jobs WHERE parent_id = $1", &[&id]).await;
    assert!(
        created_before_kill > 0 && created_before_kill < N as i64,
        "killed midway ({created_before_kill} children)"
    );

    // Workers and the sweep take over: the lease expires, the campaign resumes where it stopped.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut handles = w.platform.spawn_workers(2, &stop);
    handles.push(w.platform.spawn_sweeper(&stop));
    let mut seen: Vec<(i64, i64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    let last = loop {
        let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
        if let Some(p) = progress(&j) {
            seen.push(p);
        }
        if j["status"] == "succeeded" || j["status"] == "failed" || Instant::now() > deadline {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop_tx.send(true).unwrap();
    for h in handles {
        let _ = h.await;
    }
    assert_eq!(last["status"], "succeeded", "{}", last["last_error"]);
    // Shadow mode: every child shadowed, none counted as sent.
    assert_eq!(
        last["result"],
        json!({"total": N, "succeeded": 0, "shadowed": N, "skipped": 0, "failed": 0, "cancelled": 0})
    );

    // Progress: the declared total from the start, never decreasing, never past the total.
    assert!(seen.len() > 3, "progress was observed while it ran");
    assert!(seen.iter().all(|(t, _)| *t == N as i64), "the total was declared before any child");
    assert!(seen.windows(2).all(|p| p[1].1 >= p[0].1), "progress never decreased");
    assert!(seen.iter().all(|(t, d)| d <= t));

    // Exactly one child and one message per recipient, each carrying the campaign's correlation id.
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE parent_id = $1", &[&id]).await, N as i64);
    assert_eq!(
        w.count("SELECT count(DISTINCT idempotency_key) FROM jobs WHERE parent_id = $1", &[&id]).await,
        N as i64
    );
    assert_eq!(
        w.count("SELECT count(*) FROM jobs WHERE parent_id = $1 AND correlation_id = 'spring-campaign'", &[&id]).await,
        N as i64
    );
    assert_eq!(
        w.count("SELECT count(*) FROM messages WHERE status = 'shadowed' AND correlation_id = 'spring-campaign'", &[])
            .await,
        N as i64
    );
    assert_eq!(w.count("SELECT count(DISTINCT recipients) FROM messages", &[]).await, N as i64, "each recipient once");
    let subject: String = w
        .db()
        .await
        .query_one("SELECT subject FROM messages WHERE recipients->'to'->>0 = 'r42@example.com'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(subject, "News for r42", "recipient data over the message's");
    assert!(
        w.count("SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'continued'", &[&id]).await >= 3,
        "it continued itself across runs"
    );
    assert_eq!(
        w.count("SELECT count(*) FROM job_events WHERE job_id = $1 AND kind = 'lease_expired'", &[&id]).await,
        1,
        "the kill was recovered and recorded"
    );
    let (_, chain) = w.call(Method::GET, "/v1/messages?correlation_id=spring-campaign&limit=5", None, None).await;
    assert_eq!(chain["messages"].as_array().map(Vec::len), Some(5));
}

#[tokio::test]
async fn a_paged_campaign_is_held_until_its_last_page_arrives() {
    let w = World::new().await;
    sender(&w).await;
    template(&w).await;
    let (status, parent) = w.submit("paged", campaign(json!([]), json!({"pages": 2}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parent}");
    let id = parent["id"].as_str().unwrap().to_owned();
    let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(j["waiting_reason"], "not_due", "held: {j}");

    let page = |n: usize| json!({"recipients": (0..3).map(|i| json!({"to": format!("p{n}-{i}@example.com")})).collect::<Vec<_>>()});
    let (status, r) = w.call(Method::PUT, &format!("/v1/jobs/{id}/recipients/0"), None, Some(page(0))).await;
    assert_eq!((status, r["released"].as_bool()), (StatusCode::CREATED, Some(false)), "{r}");
    let (status, _) = w.call(Method::PUT, &format!("/v1/jobs/{id}/recipients/0"), None, Some(page(0))).await;
    assert_eq!(status, StatusCode::OK, "a replayed page");
    let (status, e) = w.call(Method::PUT, &format!("/v1/jobs/{id}/recipients/0"), None, Some(page(9))).await;
    assert_eq!((status, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("page_conflict")));
    let (status, e) = w.call(Method::PUT, &format!("/v1/jobs/{id}/recipients/2"), None, Some(page(2))).await;
    assert_eq!(
        (status, e["error"]["code"].as_str(), e["error"]["field"].as_str()),
        (StatusCode::CONFLICT, Some("page_out_of_range"), Some("page")),
        "a page past the campaign's own count conflicts with the campaign"
    );
    let (status, r) = w.call(Method::PUT, &format!("/v1/jobs/{id}/recipients/1"), None, Some(page(1))).await;
    assert_eq!((status, r["released"].as_bool()), (StatusCode::CREATED, Some(true)), "{r}");

    let exec = w.platform.executor();
    let pid: JobId = id.parse().unwrap();
    let (report, _) = exec.run_dispatched(&[pid]).await.unwrap();
    assert_eq!(report.waiting, 1, "all six children exist; the campaign waits");
    let kids: Vec<JobId> = w
        .db()
        .await
        .query("SELECT id FROM jobs WHERE parent_id = $1", &[&pid])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(kids.len(), 6);
    let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!((j["status"].as_str(), j["waiting_reason"].as_str()), (Some("waiting"), Some("waiting_for_children")));
    exec.run_dispatched(&kids).await.unwrap();
    w.platform.sweeper().pass().await.unwrap();
    let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
    assert_eq!(
        j["result"],
        json!({"total": 6, "succeeded": 0, "shadowed": 6, "skipped": 0, "failed": 0, "cancelled": 0}),
        "{j}"
    );

    // Pages only for a paged campaign of the caller's.
    let (_, other_key) = w.other_tenant("globex").await;
    let (status, _) = w
        .call_as(
            &other_key,
            Method::PUT,
            &format!("/v1/jobs/{id}/recipients/0"),
            None,
            Some(serde_json::to_vec(&page(0)).unwrap()),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, plain) = w.submit("plain", json!({"task_type": "noop"})).await;
    let (status, e) = w
        .call(Method::PUT, &format!("/v1/jobs/{}/recipients/0", plain["id"].as_str().unwrap()), None, Some(page(0)))
        .await;
    assert_eq!((status, e["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("not_a_paged_campaign")));
}

#[tokio::test]
async fn campaign_requests_are_checked_at_submit() {
    let w = World::new().await;
    let cases = [
        (campaign(json!([]), json!({})), "params.recipients"),
        (campaign(json!([{"to": "ok@example.com"}, {"to": "nope"}]), json!({})), "params.recipients[1].to"),
        (campaign(json!([{"to": "ok@example.com"}]), json!({"pages": 3})), "params.pages"),
        (campaign(json!([{"to": "ok@example.com"}]), json!({"concurrency_limit": 0})), "params.concurrency_limit"),
    ];
    for (i, (body, field)) in cases.into_iter().enumerate() {
        let (status, e) = w.submit(&format!("bad{i}"), body).await;
        assert_eq!((status, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(field)), "{e}");
    }

    // The children are checked as a single email.send is: inline content a recipient's data
    // does not render (`name` undefined) is one 422 naming that recipient, not thousands of
    // failed children.
    let literal = json!({"from": "News <news@acme.example>", "subject": "News", "text": "Hello {{ name }}"});
    let mut recipients: Vec<Value> =
        (0..5).map(|i| json!({"to": format!("r{i}@example.com"), "data": {"name": format!("r{i}")}})).collect();
    recipients[3]["data"] = json!({"nom": "Bo"});
    let body = json!({"task_type": "email.campaign", "params": {"message": literal, "recipients": recipients}});
    let (status, e) = w.submit("literal-data", body).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.recipients[3].data")),
        "{e}"
    );
    let single = json!({"task_type": "email.send", "params": {"from": "news@acme.example", "to": ["r3@example.com"],
        "subject": "News", "text": "Hello {{ name }}", "data": {"nom": "Bo"}}});
    let (status, e) = w.submit("single-data", single).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.text")),
        "a single send, the same rule: {e}"
    );

    // A template the tenant has not stored: one 409, for a campaign as for a single send.
    let (status, e) = w.submit("no-template", campaign(json!([{"to": "a@example.com"}]), json!({}))).await;
    assert_eq!(
        (status, e["error"]["code"].as_str(), e["error"]["field"].as_str()),
        (StatusCode::CONFLICT, Some("unknown_template"), Some("params.message.template")),
        "{e}"
    );
    let single = json!({"task_type": "email.send", "params": {"from": "news@acme.example", "to": ["a@example.com"], "template": "news"}});
    let (status, e) = w.submit("single-no-template", single.clone()).await;
    assert_eq!((status, e["error"]["field"].as_str()), (StatusCode::CONFLICT, Some("params.template")), "{e}");
    let (_, batch) = w
        .call(
            Method::POST,
            "/v1/jobs:batch",
            None,
            Some(json!({"jobs": [
        {"idempotency_key": "b0", "task_type": "noop"},
        {"idempotency_key": "b1", "task_type": "email.send", "params": single["params"]}]})),
        )
        .await;
    assert_eq!(batch["results"][0]["status"], 202, "{batch}");
    assert_eq!(
        (batch["results"][1]["status"].as_u64(), batch["results"][1]["error"]["field"].as_str()),
        (Some(409), Some("jobs[1].params.template")),
        "{batch}"
    );
    template(&w).await;
    let (status, e) =
        w.submit("with-template", campaign(json!([{"to": "a@example.com", "data": {"name": "A"}}]), json!({}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{e}");

    // Pages uploaded later are checked the same way, each naming its recipient.
    let (status, paged) = w
        .submit("paged-literal", json!({"task_type": "email.campaign", "params": {"message": literal, "pages": 1}}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paged}");
    let page = json!({"recipients": [{"to": "a@example.com", "data": {"name": "A"}}, {"to": "b@example.com", "data": {"x": 1}}]});
    let (status, e) = w
        .call(Method::PUT, &format!("/v1/jobs/{}/recipients/0", paged["id"].as_str().unwrap()), None, Some(page))
        .await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("recipients[1].data")),
        "{e}"
    );
}

/// Run workers (no sweeper: a parent must close as its last child ends) until the job is
/// terminal; returns its resource.
pub(crate) async fn run_until_done(w: &World, id: &str) -> Value {
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let handles = w.platform.spawn_workers(1, &stop);
    let deadline = Instant::now() + Duration::from_secs(60);
    let last = loop {
        let (_, j) = w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
        if ["succeeded", "failed", "cancelled"].contains(&j["status"].as_str().unwrap_or(""))
            || Instant::now() > deadline
        {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop_tx.send(true).unwrap();
    for h in handles {
        let _ = h.await;
    }
    last
}

/// Seconds between the last child's end and its parent's.
async fn closing_lag(w: &World, id: JobId) -> f64 {
    w.db()
        .await
        .query_one(
            "SELECT extract(epoch FROM p.finished_at - max(c.finished_at))::float8 FROM jobs p JOIN jobs c ON c.parent_id = p.id
             WHERE p.id = $1 GROUP BY p.finished_at",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn children_failing_for_one_cause_fail_their_campaign_once_and_at_once() {
    let w = World::new().await;
    template(&w).await;
    // No sending identity: every child is refused for the same reason.
    let recipients: Vec<Value> = (0..30).map(|i| json!({"to": format!("r{i}@example.com")})).collect();
    let (status, parent) = w.submit("unsendable", campaign(json!(recipients), json!({}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parent}");
    let id_text = parent["id"].as_str().unwrap().to_owned();
    let id: JobId = id_text.parse().unwrap();
    let j = run_until_done(&w, &id_text).await;
    assert_eq!(j["status"], "failed", "not succeeded when its children failed: {j}");
    let error = j["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("30 of 30 children failed; 30 with: "), "{error}");
    assert!(error.contains("is not one of this tenant's sending identities"), "the shared cause: {error}");
    assert!(!error.contains("other causes"), "one cause: {error}");
    assert_eq!(j["progress"]["failed"], 30, "{j}");
    // The sender is the tenant's: every child failed for a reason of its own, and so did the
    // campaign. No operator exception; one tenant fault, the parent's, with the cause.
    assert_eq!((w.count("SELECT count(*) FROM exceptions", &[]).await, j["fault"].as_str()), (0, Some("tenant")));
    let (kind, last): (String, String) = {
        let sql = "SELECT kind, last_error FROM tenant_faults WHERE last_job_id = $1";
        let r = w.db().await.query_one(sql, &[&id]).await.unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((kind.as_str(), last.as_str()), ("children_failed", error));
    // Closed by the last child's end, not by a sweep (none ran).
    let lag = closing_lag(&w, id).await;
    assert!((0.0..1.0).contains(&lag), "the parent closed {lag:.3} s after its last child");
}

#[tokio::test]
async fn a_campaign_with_some_failed_children_says_how_many_and_why() {
    let w = World::new().await;
    sender(&w).await;
    let (status, _) = w
        .call(
            Method::PUT,
            "/v1/templates/news",
            None,
            Some(json!({"subject": "News for {{ name }}", "text": "Your code: {{ code }}"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Four of ten recipients lack the `code` the template needs.
    let recipients: Vec<Value> = (0..10)
        .map(|i| {
            if i % 3 == 0 {
                json!({"to": format!("r{i}@example.com")})
            } else {
                json!({"to": format!("r{i}@example.com"), "data": {"code": i}})
            }
        })
        .collect();
    let (status, parent) = w.submit("mixed", campaign(json!(recipients), json!({}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parent}");
    let id_text = parent["id"].as_str().unwrap().to_owned();
    let j = run_until_done(&w, &id_text).await;
    assert_eq!(j["status"], "failed", "{j}");
    let error = j["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("4 of 10 children failed; 4 with: "), "{error}");
    assert!(error.contains("undefined"), "{error}");
    assert_eq!((j["progress"]["shadowed"].as_i64(), j["progress"]["failed"].as_i64()), (Some(6), Some(4)), "{j}");
    assert_eq!(j["progress"]["succeeded"], 0, "shadowed, not sent: {j}");
    // The template data is the tenant's: its fault, counted, no operator exception.
    assert_eq!(j["fault"], "tenant", "{j}");
    assert_eq!(w.count("SELECT count(*) FROM tenant_faults WHERE kind = 'children_failed'", &[]).await, 1);
    assert_eq!(w.count("SELECT count(*) FROM exceptions", &[]).await, 0, "no exception, per child or parent");
    let lag = closing_lag(&w, id_text.parse().unwrap()).await;
    assert!((0.0..1.0).contains(&lag), "the parent closed {lag:.3} s after its last child");
}

/// Suppressed recipients are skipped, with the reason, counted apart, and do not fail the
/// campaign; the same addresses on another tenant's list skip nothing here.
#[tokio::test]
async fn a_campaign_with_suppressed_recipients_succeeds_and_counts_them_skipped() {
    const N: usize = 1_000;
    let w = World::new().await;
    sender(&w).await;
    template(&w).await;
    let suppressed: Vec<String> = (0..N).step_by(100).map(|i| format!("r{i}@example.com")).collect();
    for a in &suppressed {
        let (status, e) = w.call(Method::PUT, &format!("/v1/suppressions/{a}"), None, None).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{e}");
    }
    // Another tenant suppressing other recipients of this list changes nothing here.
    let (_, other_key) = w.other_tenant("other").await;
    let (status, e) = w.call_as(&other_key, Method::PUT, "/v1/suppressions/r1@example.com", None, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{e}");

    let recipients: Vec<Value> = (0..N).map(|i| json!({"to": format!("r{i}@example.com")})).collect();
    let (status, parent) =
        w.submit("with-suppressed", campaign(json!(recipients), json!({"concurrency_limit": 200}))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parent}");
    let id_text = parent["id"].as_str().unwrap().to_owned();
    let id: JobId = id_text.parse().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let handles = w.platform.spawn_workers(2, &stop);
    let j = w
        .wait_for(&id_text, Duration::from_secs(300), |j| {
            j["status"] != "pending" && j["status"] != "running" && j["status"] != "waiting"
        })
        .await;
    stop_tx.send(true).unwrap();
    for h in handles {
        let _ = h.await;
    }
    assert_eq!(j["status"], "succeeded", "{j}");
    let s = suppressed.len();
    assert_eq!(
        j["result"],
        json!({"total": N, "succeeded": 0, "shadowed": N - s, "skipped": s, "failed": 0, "cancelled": 0}),
        "{j}"
    );
    assert_eq!(
        j["progress"],
        json!({"kind": "count", "total": N, "succeeded": 0, "shadowed": N - s, "skipped": s, "failed": 0,
               "cancelled": 0, "pending": 0})
    );
    assert_eq!(w.count("SELECT count(*) FROM exceptions", &[]).await, 0, "a skip is no one's to fix");
    // Each skipped child says why; its message is `skipped`, never sent, never previewed.
    let db = w.db().await;
    let rows = db
        .query(
            "SELECT c.result, m.status, m.reason, m.recipients->'to'->>0, m.preview IS NULL
             FROM jobs c JOIN messages m ON m.job_id = c.id WHERE c.parent_id = $1 AND c.result ? 'skipped'",
            &[&id],
        )
        .await
        .unwrap();
    let mut skipped_to: Vec<String> = rows.iter().map(|r| r.get(3)).collect();
    skipped_to.sort();
    let mut expected = suppressed.clone();
    expected.sort();
    assert_eq!(skipped_to, expected);
    for r in &rows {
        let (result, status, reason): (Value, String, String) = (r.get(0), r.get(1), r.get(2));
        assert_eq!((result["skipped"].as_str(), result["status"].as_str()), (Some("suppressed"), Some("skipped")));
        assert_eq!(status, "skipped");
        assert!(reason.starts_with("suppressed recipients: r") && reason.ends_with("(manual)"), "{reason}");
        assert!(r.get::<_, bool>(4), "a skipped message carries no preview");
    }
    assert_eq!(
        w.count("SELECT count(*) FROM messages m JOIN jobs c ON c.id = m.job_id WHERE c.parent_id = $1 AND m.status = 'shadowed'", &[&id])
            .await,
        (N - s) as i64
    );
}

fn unsubscribe_campaign(recipients: Value, list_unsubscribe: Value) -> Value {
    let mut body = campaign(recipients, json!({}));
    body["params"]["message"]["list_unsubscribe"] = list_unsubscribe;
    body
}

/// Every child's message carries its own recipient's `List-Unsubscribe` (and RFC 8058's
/// one-click header); a bad template or hostile data is a 422 at submit naming the field.
#[tokio::test]
async fn each_recipient_gets_its_own_list_unsubscribe_and_bad_templates_are_refused_at_submit() {
    let w = World::new().await;
    sender(&w).await;
    template(&w).await;
    let url =
        json!({"url": "https://acme.example/u/{{ token }}?list=news", "mailto": "unsub+{{ token }}@acme.example"});
    let recipients: Vec<Value> =
        (0..20).map(|i| json!({"to": format!("r{i}@example.com"), "data": {"token": format!("t{i}")}})).collect();
    let (status, parent) = w.submit("unsub", unsubscribe_campaign(json!(recipients), url.clone())).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parent}");
    let id_text = parent["id"].as_str().unwrap().to_owned();
    let j = run_until_done(&w, &id_text).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    let id: JobId = id_text.parse().unwrap();
    let rows = w
        .db()
        .await
        .query(
            "SELECT m.recipients->'to'->>0, m.preview->'headers' FROM messages m JOIN jobs c ON c.id = m.job_id
             WHERE c.parent_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 20);
    for r in &rows {
        let (to, headers): (String, Value) = (r.get(0), r.get(1));
        let i = to.trim_start_matches('r').trim_end_matches("@example.com");
        assert_eq!(
            headers["List-Unsubscribe"],
            format!("<https://acme.example/u/t{i}?list=news>, <mailto:unsub+t{i}@acme.example>"),
            "{to}: {headers}"
        );
        assert_eq!(headers["List-Unsubscribe-Post"], "List-Unsubscribe=One-Click", "{headers}");
    }

    // Refused at submit, each naming its field; nothing is created.
    let ok = |i: usize| json!({"to": format!("r{i}@example.com"), "data": {"token": "t"}});
    let with_token = |token: Value| json!([ok(0), {"to": "r1@example.com", "data": {"token": token}}]);
    let cases = [
        (
            unsubscribe_campaign(json!([ok(0)]), json!({"url": "https://acme.example/u/{{ token"})),
            "params.message.list_unsubscribe.url",
        ),
        (
            unsubscribe_campaign(json!([ok(0)]), json!({"url": "http://acme.example/u/{{ token }}"})),
            "params.message.list_unsubscribe.url",
        ),
        (
            unsubscribe_campaign(json!([ok(0)]), json!({"url": "https://acme.example/u/\u{7}{{ token }}"})),
            "params.message.list_unsubscribe.url",
        ),
        (
            unsubscribe_campaign(
                json!([ok(0)]),
                json!({"url": "https://acme.example/u/{{ token }}", "mailto": "{{ token }}"}),
            ),
            "params.recipients[0].data",
        ),
        (unsubscribe_campaign(json!([ok(0), {"to": "r1@example.com"}]), url.clone()), "params.recipients[1].data"),
        (
            unsubscribe_campaign(with_token(json!("x\r\nBcc: evil@example.com")), url.clone()),
            "params.recipients[1].data",
        ),
        (
            unsubscribe_campaign(with_token(json!("x>, <https://evil.example/")), url.clone()),
            "params.recipients[1].data",
        ),
        (unsubscribe_campaign(with_token(json!("x".repeat(100_000))), url.clone()), "params.recipients[1].data"),
        (unsubscribe_campaign(with_token(json!("ü")), url.clone()), "params.recipients[1].data"),
    ];
    for (i, (body, field)) in cases.into_iter().enumerate() {
        let (status, e) = w.submit(&format!("bad-unsub-{i}"), body).await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "case {i}: {e}"
        );
    }
    // NUL is refused before any task sees it (400 `nul_character`, naming the field).
    let nul = unsubscribe_campaign(json!([ok(0)]), json!({"url": "https://acme.example/u/\u{0}{{ token }}"}));
    let (status, e) = w.submit("bad-unsub-nul", nul).await;
    assert_eq!(
        (status, e["error"]["code"].as_str(), e["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("nul_character"), Some("params.message.list_unsubscribe.url")),
        "{e}"
    );
    let mut both = unsubscribe_campaign(json!([ok(0)]), url.clone());
    both["params"]["message"]["headers"] = json!({"list-unsubscribe": "<https://elsewhere.example/>"});
    let (status, e) = w.submit("bad-unsub-both", both).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.message.headers.list-unsubscribe")),
        "{e}"
    );
    // A single send renders its own data at submit, the same way.
    let single = json!({"task_type": "email.send", "params": {"from": "news@acme.example", "to": ["a@example.com"],
        "subject": "News", "text": "Hello", "data": {"token": "a\nb"}, "list_unsubscribe": url}});
    let (status, e) = w.submit("bad-unsub-single", single).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.list_unsubscribe.url")),
        "{e}"
    );
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 21, "the refused requests created nothing");
}
