//! Email against moto's SES: one send per message key, shadow mode, 1,000 sends through a
//! fault-injecting stand-in, a crash between intent and send, SES events through ingress
//! (duplicated, reordered, settling an unknown send), suppression, identities and templates.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::credentials::{RoleSpec, TaskCredentials, TaskRoles};
use taskdeck::executor::Executor;
use taskdeck::job::JobId;
use taskdeck::lambda::ingress::Ingress;
use taskdeck::store::{modes, operators, sending_identities};
use uuid::Uuid;

use crate::support::runtime_api::{Function, Invoked};
use crate::support::{World, moto};
use relay::ses_standin::{self, Counts, Faults};

const SEND_ROLE: &str = "arn:aws:iam::123456789012:role/relay-task-email-send";
pub(crate) const DOMAIN: &str = "acme.example";

pub(crate) fn roles() -> TaskRoles {
    TaskRoles::default().map_task("email.send", RoleSpec { role_arn: SEND_ROLE.into(), external_id: None }).unwrap()
}

/// An executor whose AWS calls go to `endpoint` (moto, or the fault stand-in before it).
pub(crate) fn executor(w: &World, endpoint: &str, roles: TaskRoles) -> Executor {
    let base = moto::sdk_config().to_builder().endpoint_url(endpoint).build();
    w.platform.clone().with_credentials(Arc::new(TaskCredentials::new(roles, &base))).executor()
}

/// Shadow off and SES writes on: email really leaves (for moto).
pub(crate) async fn go_live(w: &World) {
    let mut db = w.db().await;
    modes::set(&mut db, "shadow", false, "test", Some("email tests")).await.unwrap();
    modes::set(&mut db, "write:ses", true, "test", Some("email tests")).await.unwrap();
}

/// The tenant may send from the domain, and moto has it verified.
pub(crate) async fn sender(w: &World) {
    sending_identities::set(&mut w.db().await, w.tenant.id, &[DOMAIN.into()]).await.unwrap();
    let ses = aws_sdk_sesv2::Client::new(&moto::sdk_config());
    let _ = ses.create_email_identity().email_identity(DOMAIN).send().await;
}

/// Verify the domain in the account of `role_arn`, as its tenant would (moto keeps SES per account).
async fn verify_in_account(role_arn: &str) {
    let sts = aws_sdk_sts::Client::new(&moto::sdk_config());
    let c = sts.assume_role().role_arn(role_arn).role_session_name("setup").send().await.unwrap();
    let c = c.credentials().unwrap();
    let creds = aws_sdk_sesv2::config::Credentials::new(
        c.access_key_id(),
        c.secret_access_key(),
        Some(c.session_token().to_owned()),
        None,
        "test",
    );
    let theirs = moto::sdk_config()
        .to_builder()
        .credentials_provider(aws_sdk_sesv2::config::SharedCredentialsProvider::new(creds))
        .build();
    aws_sdk_sesv2::Client::new(&theirs).create_email_identity().email_identity(DOMAIN).send().await.unwrap();
}

/// How many messages moto's SES holds with this subject.
async fn in_moto(subject: &str) -> usize {
    moto_subjects().await.iter().filter(|s| s.as_str() == subject).count()
}

async fn moto_subjects() -> Vec<String> {
    moto_raw().await.iter().filter_map(|m| ses_standin::header(m, "Subject")).collect()
}

/// Every raw message moto's SES holds (every send is raw MIME).
pub(crate) async fn moto_raw() -> Vec<String> {
    let data = moto::data().await;
    data["ses"]["RawMessage"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|m| m["raw_data"].as_str().map(str::to_owned))
        .collect()
}

fn email(subject: &str, to: &str) -> Value {
    json!({"task_type": "email.send", "params": {
        "from": format!("Acme <noreply@{DOMAIN}>"), "to": [to], "subject": subject, "text": "Hello"}})
}

pub(crate) async fn submit(w: &World, key: &str, body: Value) -> JobId {
    let (status, job) = w.submit(key, body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    job["id"].as_str().unwrap().parse().unwrap()
}

async fn job(w: &World, id: JobId) -> Value {
    w.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await.1
}

pub(crate) async fn message_of(w: &World, id: JobId) -> Value {
    let (status, list) = w.call(Method::GET, &format!("/v1/messages?job_id={id}"), None, None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let mid = list["messages"][0]["id"].as_str().unwrap_or_else(|| panic!("job {id} has a message: {list}")).to_owned();
    w.call(Method::GET, &format!("/v1/messages/{mid}"), None, None).await.1
}

#[tokio::test]
async fn a_live_send_reaches_ses_once_and_its_message_says_so() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("welcome {}", w.schema);
    let body = json!({"task_type": "email.send", "correlation_id": "order-42", "params": {
        "from": format!("noreply@{DOMAIN}"), "to": ["bo@example.com"], "subject": subject, "text": "Hi", "html": "<p>Hi</p>",
        "headers": {"X-Campaign": "spring"}, "tags": {"campaign": "spring"}, "message_key": "welcome-bo"}});
    let id = submit(&w, "k1", body.clone()).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.succeeded, 1, "{}", job(&w, id).await);
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "sent", "{m}");
    assert!(m["preview"].is_null(), "a message really sent keeps no preview: {m}");
    assert_eq!(m["correlation_id"], "order-42");
    assert!(m["provider_message_id"].as_str().is_some_and(|p| !p.is_empty()));
    assert_eq!(job(&w, id).await["result"]["provider_message_id"], m["provider_message_id"]);
    assert_eq!(in_moto(&subject).await, 1);

    // The same job dispatched again, and another job with the same message key: no second email.
    exec.run_dispatched(&[id]).await.unwrap();
    let again = submit(&w, "k2", body).await;
    let (report, _) = exec.run_dispatched(&[again]).await.unwrap();
    assert_eq!(report.succeeded, 1);
    let j = job(&w, again).await;
    assert_eq!(j["result"]["duplicate_of_job"], id.to_string(), "{j}");
    assert_eq!(in_moto(&subject).await, 1, "one message key, one email");
    let (_, sessions) = w.call(Method::GET, &format!("/v1/jobs/{id}/sessions"), None, None).await;
    assert_eq!(sessions["sessions"][0]["role_arn"], SEND_ROLE, "sent under the task's own role");
}

#[tokio::test]
async fn shadow_mode_records_everything_and_sends_nothing() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("shadowed {}", w.schema);
    let mut body = email(&subject, "bo@example.com");
    let extra = json!({"html": "<p>Hello</p>", "cc": ["cy@example.com"], "reply_to": ["help@acme.example"],
        "headers": {"X-Campaign": "spring"}, "tags": {"campaign": "spring"}});
    body["params"].as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body["correlation_id"] = json!("order-7");
    let id = submit(&w, "s", body).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.succeeded, 1, "{}", job(&w, id).await);
    let m = message_of(&w, id).await;
    assert_eq!((m["status"].as_str(), m["subject"].as_str()), (Some("shadowed"), Some(subject.as_str())), "{m}");
    assert!(m["reason"].as_str().unwrap().contains("shadow mode"));
    assert_eq!(m["recipients"]["to"][0], "bo@example.com");
    // The preview: exactly what the SES request would have carried, Relay's headers and tags too.
    let p = &m["preview"];
    assert_eq!(p["from"], format!("Acme <noreply@{DOMAIN}>"), "{m}");
    assert_eq!(
        (p["to"].clone(), p["cc"].clone(), p["reply_to"].clone()),
        (json!(["bo@example.com"]), json!(["cy@example.com"]), json!(["help@acme.example"]))
    );
    assert_eq!(
        (p["subject"].as_str(), p["text"].as_str(), p["html"].as_str()),
        (Some(subject.as_str()), Some("Hello"), Some("<p>Hello</p>"))
    );
    assert_eq!(p["headers"], json!({"X-Campaign": "spring", "X-Relay-Correlation-Id": "order-7"}));
    assert_eq!(p["tags"]["campaign"], "spring");
    assert_eq!(p["tags"]["relay_message_id"], m["id"]);
    assert_eq!(p["tags"]["relay_job_id"], id.to_string());
    assert_eq!(p["tags"]["relay_correlation_id"], "order-7", "{p}");
    assert_eq!(in_moto(&subject).await, 0);
    assert_eq!(
        w.count("SELECT count(*) FROM attempt_sessions WHERE job_id = $1", &[&id]).await,
        0,
        "no AWS access at all"
    );

    // Shadow off but the SES write switch still off: recorded, not sent, and it says why.
    modes::set(&mut w.db().await, "shadow", false, "test", None).await.unwrap();
    let id = submit(&w, "s2", email(&format!("{subject} 2"), "bo@example.com")).await;
    exec.run_dispatched(&[id]).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "shadowed");
    assert!(m["reason"].as_str().unwrap().contains("write:ses"), "{m}");
}

/// 1,000 live sends, each at risk of every fault; checks every record against what the
/// stand-in really did.
#[tokio::test]
async fn a_thousand_sends_through_faults_never_send_twice() {
    const N: usize = 1000;
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let faults = Faults {
        throttle: 0.12,
        reject: 0.03,
        error_after: 0.02,
        drop_after: 0.02,
        hang_after: 0.004,
        ..Faults::default()
    };
    let ses = ses_standin::start(moto::endpoint(), faults, 7).expect("the SES stand-in");
    let mut exec = executor(&w, &ses.url, roles());
    exec.retry.base = Duration::from_millis(20);
    exec.retry.max = Duration::from_millis(200);
    exec.config.concurrency = 32;

    let tag = Uuid::now_v7().simple().to_string();
    let mut ids = Vec::new();
    for chunk in (0..N).collect::<Vec<_>>().chunks(500) {
        let jobs: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let mut j = email(&format!("fault {tag} {i}"), &format!("r{i}@example.com"));
                j["idempotency_key"] = json!(format!("f{i}"));
                j["max_attempts"] = json!(12);
                j
            })
            .collect();
        let (status, body) = w.call(Method::POST, "/v1/jobs:batch", None, Some(json!({ "jobs": jobs }))).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body["results"].as_array().unwrap().iter().all(|r| r["status"] == 202));
        ids.extend(
            body["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["job"]["id"].as_str().unwrap().parse::<JobId>().unwrap()),
        );
    }
    assert_eq!(ids.len(), N);

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let wake = Arc::new(tokio::sync::Notify::new());
    let workers: Vec<_> = (0..2)
        .map(|_| tokio::spawn(taskdeck::executor::worker::run(exec.clone(), wake.clone(), stop.clone())))
        .collect();
    let terminal = "SELECT count(*) FROM jobs WHERE task_type = 'email.send' AND status IN ('succeeded', 'failed')";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let mut done = 0;
    while done < N as i64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        done = w.count(terminal, &[]).await;
    }
    stop_tx.send(true).unwrap();
    for h in workers {
        let _ = h.await;
    }
    assert_eq!(done, N as i64, "every job ended");

    let by_status = "SELECT count(*) FROM messages WHERE status = $1";
    let sent = w.count(by_status, &[&"sent"]).await as u64;
    let unknown = w.count(by_status, &[&"unknown"]).await as u64;
    let rejected = w.count(by_status, &[&"rejected"]).await as u64;
    let c = &ses.counts;
    eprintln!(
        "faults: passed {} throttled {} rejected {} 500-after {} cut-after {} hung-after {}; messages: sent {sent} unknown {unknown} rejected {rejected}",
        Counts::get(&c.passed),
        Counts::get(&c.throttled),
        Counts::get(&c.rejected),
        Counts::get(&c.error_after),
        Counts::get(&c.dropped_after),
        Counts::get(&c.hung_after),
    );
    assert!(
        Counts::get(&c.throttled) > 50 && c.ambiguous() > 10 && Counts::get(&c.rejected) > 10,
        "the faults happened"
    );
    assert_eq!(sent + unknown + rejected, N as u64, "every message settled: none left throttled or sending");
    assert_eq!(sent, Counts::get(&c.passed), "every send SES answered is recorded sent");
    assert_eq!(unknown, c.ambiguous(), "every ambiguous send is unknown");
    assert_eq!(rejected, Counts::get(&c.rejected), "every rejection is recorded");

    // Zero duplicates: moto holds each of these messages at most once, and exactly the ones
    // that reached it.
    let subjects: Vec<String> =
        moto_subjects().await.into_iter().filter(|s| s.starts_with(&format!("fault {tag} "))).collect();
    let mut unique = subjects.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), subjects.len(), "no email was sent twice");
    assert_eq!(subjects.len() as u64, sent + unknown, "what reached SES: the sent and the unknown");

    // One exception per unknown send, none per retry; throttled sends were retried, not failed.
    let ambiguous =
        w.count("SELECT count(*) FROM exceptions WHERE kind = 'ambiguous_outcome' AND status = 'open'", &[]).await;
    assert_eq!(ambiguous as u64, unknown);
    let per_job = w
        .count("SELECT count(*) FROM (SELECT job_id FROM exceptions GROUP BY job_id HAVING count(*) > 1) x", &[])
        .await;
    assert_eq!(per_job, 0, "one exception per job");
    let exhausted = w.count("SELECT count(*) FROM exceptions WHERE kind = 'attempts_exhausted'", &[]).await;
    assert_eq!(exhausted, 0, "every throttled send was eventually sent");
    let retried_then_sent = w
        .count(
            "SELECT count(*) FROM jobs j JOIN messages m ON m.job_id = j.id WHERE m.status = 'sent' AND j.attempt > 1",
            &[],
        )
        .await;
    assert!(retried_then_sent > 0, "some sends succeeded after a throttle");
    let succeeded =
        w.count("SELECT count(*) FROM jobs WHERE task_type = 'email.send' AND status = 'succeeded'", &[]).await;
    assert_eq!(succeeded as u64, sent);
}

#[tokio::test]
async fn a_crash_between_intent_and_send_never_sends_a_second_time() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("crashed {}", w.schema);
    let id = submit(&w, "c", email(&subject, "bo@example.com")).await;
    // What a worker that died after recording its intent leaves behind: attempt 1 claimed,
    // its intent `sending`, no outcome.
    let db = w.db().await;
    db.execute("UPDATE jobs SET attempt = 1 WHERE id = $1", &[&id]).await.unwrap();
    db.execute(
        "INSERT INTO messages (id, tenant_id, message_key, job_id, attempt, correlation_id, status, from_address, recipients, subject)
         VALUES ($1, $2, $3, $3::text::uuid, 1, 'c', 'sending', 'noreply@acme.example', '{}', $4)",
        &[&Uuid::now_v7(), &w.tenant.id, &id.to_string(), &subject],
    )
    .await
    .unwrap();
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.failed, 1, "{}", job(&w, id).await);
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "unknown", "{m}");
    assert!(m["reason"].as_str().unwrap().contains("attempt 1"), "{m}");
    let open = w
        .count(
            "SELECT count(*) FROM exceptions WHERE job_id = $1 AND kind = 'ambiguous_outcome' AND status = 'open'",
            &[&id],
        )
        .await;
    assert_eq!(open, 1);
    assert_eq!(in_moto(&subject).await, 0, "the new attempt did not send");
    // An operator retry still cannot send it: the message key is spent until the truth is known.
    db.execute("UPDATE jobs SET status = 'pending', finished_at = NULL, run_at = now() WHERE id = $1", &[&id])
        .await
        .unwrap();
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(in_moto(&subject).await, 0);
    assert_eq!(message_of(&w, id).await["status"], "unknown");
}

/// An SNS notification as SQS delivers it to the ingress function.
pub(crate) fn sns_record(sns_id: &str, event: &Value) -> Value {
    json!({
        "messageId": Uuid::now_v7().to_string(),
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:relay-ingress",
        "body": json!({
            "Type": "Notification", "MessageId": sns_id,
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:relay-ses-events",
            "Message": event.to_string(), "Timestamp": "2026-11-30T10:00:00.000Z",
        }).to_string(),
    })
}

pub(crate) fn ses_event(kind: &str, m: &Value, extra: Value) -> Value {
    let mut e = json!({
        "eventType": kind,
        "mail": {"timestamp": "2026-11-30T10:00:00.000Z", "messageId": m["provider_message_id"].as_str().unwrap_or("ses-unknown"),
                 "source": "noreply@acme.example", "destination": ["bo@example.com"],
                 "tags": {"relay_message_id": [m["id"]], "relay_correlation_id": [m["correlation_id"]]}},
    });
    e.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    e
}

/// Hand SNS records to ingress and run the jobs it made; returns their results.
pub(crate) async fn through_ingress(w: &World, exec: &Executor, records: Vec<Value>) -> Vec<Value> {
    let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let ingress = Ingress::new(&w.platform, "platform");
    let response = ingress.handle(event).await;
    assert!(response.batch_item_failures.is_empty());
    let ids: Vec<JobId> = w
        .db()
        .await
        .query("SELECT id FROM jobs WHERE task_type = 'provider.event' AND status = 'pending' ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    exec.run_dispatched(&ids).await.unwrap();
    let db = w.db().await;
    let mut out = Vec::new();
    for id in ids {
        out.push(
            db.query_one("SELECT result FROM jobs WHERE id = $1", &[&id])
                .await
                .unwrap()
                .get::<_, Option<Value>>(0)
                .unwrap_or(Value::Null),
        );
    }
    out
}

#[tokio::test]
async fn ses_events_apply_once_in_any_order_and_bounces_suppress() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let id = submit(&w, "e", json!({"task_type": "email.send", "correlation_id": "corr-7", "params": {
        "from": format!("noreply@{DOMAIN}"), "to": ["bo@example.com"], "subject": format!("events {}", w.schema), "text": "x"}})).await;
    exec.run_dispatched(&[id]).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "sent");

    // Delivery before Send, the Delivery duplicated (same SNS id) in one batch and again later.
    let delivery = ses_event(
        "Delivery",
        &m,
        json!({"delivery": {"timestamp": "2026-11-30T10:00:05.000Z", "recipients": ["bo@example.com"]}}),
    );
    let send = ses_event("Send", &m, json!({"send": {}}));
    through_ingress(&w, &exec, vec![sns_record("sns-d", &delivery), sns_record("sns-d", &delivery)]).await;
    through_ingress(&w, &exec, vec![sns_record("sns-s", &send), sns_record("sns-d", &delivery)]).await;
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "delivered", "{m}");
    let kinds: Vec<&str> = m["events"].as_array().unwrap().iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["delivery", "send"], "each event once, in arrival order");
    let corr = w
        .count("SELECT count(*) FROM jobs WHERE task_type = 'provider.event' AND correlation_id = 'corr-7'", &[])
        .await;
    assert_eq!(corr, 2, "the event jobs carry the message's correlation id");

    // Opens count, and a hard bounce suppresses the address.
    let open =
        ses_event("Open", &m, json!({"open": {"timestamp": "2026-11-30T11:00:00.000Z", "ipAddress": "192.0.2.1"}}));
    let bounce = ses_event(
        "Bounce",
        &m,
        json!({"bounce": {"bounceType": "Permanent", "bounceSubType": "General",
        "bouncedRecipients": [{"emailAddress": "Bo@Example.com"}], "timestamp": "2026-11-30T10:00:06.000Z"}}),
    );
    let results = through_ingress(&w, &exec, vec![sns_record("sns-o", &open), sns_record("sns-b", &bounce)]).await;
    assert_eq!(results[1]["suppressed"], 1, "{results:?}");
    let m = message_of(&w, id).await;
    assert_eq!((m["status"].as_str(), m["opens"].as_i64()), (Some("bounced"), Some(1)), "{m}");
    let (_, list) = w.call(Method::GET, "/v1/suppressions", None, None).await;
    assert_eq!(list["suppressions"][0]["address"], "bo@example.com");
    assert_eq!(list["suppressions"][0]["reason"], "bounce");

    // A send to a suppressed address is skipped with the reason (the job succeeds, no
    // exception: nothing for anyone to fix), then sent once the address is removed.
    let subject = format!("after bounce {}", w.schema);
    let skipped = submit(&w, "r1", email(&subject, "bo@example.com")).await;
    let (report, _) = exec.run_dispatched(&[skipped]).await.unwrap();
    assert_eq!(report.succeeded, 1);
    let j = job(&w, skipped).await;
    assert_eq!(j["result"]["skipped"], "suppressed", "{j}");
    assert!(j["result"]["reason"].as_str().unwrap().contains("suppressed recipients: bo@example.com (bounce)"), "{j}");
    assert_eq!(message_of(&w, skipped).await["status"], "skipped");
    assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = $1", &[&skipped]).await, 0);
    assert_eq!(in_moto(&subject).await, 0);
    let (status, _) = w.call(Method::DELETE, "/v1/suppressions/bo@example.com", None, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let ok = submit(&w, "r2", email(&format!("{subject} again"), "bo@example.com")).await;
    assert_eq!(exec.run_dispatched(&[ok]).await.unwrap().0.succeeded, 1);

    // Not an SES event at all, and an event for nobody's message: kept, with the reason.
    let results = through_ingress(
        &w,
        &exec,
        vec![
            sns_record("sns-x", &json!({"hello": "world"})),
            sns_record("sns-y", &json!({"eventType": "Send", "mail": {"messageId": "someone-elses"}})),
        ],
    )
    .await;
    assert!(results[0]["reason"].as_str().unwrap().contains("not an SES event"), "{results:?}");
    assert_eq!(results[1]["applied"], false);
    let kept = w
        .count("SELECT count(*) FROM message_events WHERE message_id IS NULL AND note LIKE 'no message matches%'", &[])
        .await;
    assert_eq!(kept, 1);
}

#[tokio::test]
async fn an_ses_event_settles_an_unknown_send_and_its_exception() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let ses = ses_standin::start(moto::endpoint(), Faults { error_after: 1.0, ..Faults::default() }, 1)
        .expect("the SES stand-in");
    let exec = executor(&w, &ses.url, roles());
    let id = submit(&w, "u", email(&format!("unknown {}", w.schema), "bo@example.com")).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.failed, 1);
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "unknown", "{m}");
    assert!(
        m["reason"].as_str().unwrap().contains("500") || m["reason"].as_str().unwrap().contains("InternalFailure"),
        "{m}"
    );

    let send = ses_event("Send", &m, json!({"send": {}}));
    let results = through_ingress(&w, &exec, vec![sns_record("sns-settle", &send)]).await;
    assert_eq!(results[0]["exceptions_resolved"].as_array().map(Vec::len), Some(1), "{results:?}");
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "sent");
    let j = job(&w, id).await;
    assert_eq!(j["status"], "succeeded", "{j}");
    assert_eq!(j["result"]["by"], "system");
    let (closed_by, status): (String, String) = {
        let r =
            w.db().await.query_one("SELECT closed_by, status FROM exceptions WHERE job_id = $1", &[&id]).await.unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((closed_by.as_str(), status.as_str()), ("system", "resolved"));
    assert_eq!(
        w.count("SELECT count(*) FROM exception_actions WHERE job_id = $1 AND actor = 'system'", &[&id]).await,
        1,
        "audited"
    );
}

#[tokio::test]
async fn the_sender_must_be_the_tenants_and_templates_render_strictly() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    // Someone else's domain: refused, recorded, the tenant's own fault (no operator exception).
    let id = submit(
        &w,
        "x",
        json!({"task_type": "email.send", "params": {
        "from": "ceo@globex.example", "to": ["bo@example.com"], "subject": "hi", "text": "x"}}),
    )
    .await;
    exec.run_dispatched(&[id]).await.unwrap();
    let j = job(&w, id).await;
    assert_eq!(j["status"], "failed");
    assert!(j["last_error"].as_str().unwrap().contains("not one of this tenant's sending identities"), "{j}");
    assert_eq!(j["fault"], "tenant", "{j}");
    assert_eq!(w.count("SELECT count(*) FROM exceptions WHERE job_id = $1", &[&id]).await, 0);

    // Templates: a syntax error is a 422 naming the part; rendering is strict and escapes HTML.
    let (status, err) =
        w.call(Method::PUT, "/v1/templates/welcome", None, Some(json!({"subject": "Hi {{ name", "text": "x"}))).await;
    assert_eq!(
        (status, err["error"]["code"].as_str(), err["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("template_syntax"), Some("subject"))
    );
    let (status, t) = w
        .call(
            Method::PUT,
            "/v1/templates/welcome",
            None,
            Some(json!({"subject": "Hi {{ name }}", "html": "<b>{{ name }}</b>"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let send = |_key: &str, data: Value| {
        json!({"task_type": "email.send", "params": {
            "from": format!("noreply@{DOMAIN}"), "to": ["bo@example.com"], "template": "welcome", "data": data}})
    };
    let ok = submit(&w, "t1", send("t1", json!({"name": "<Bo>"}))).await;
    let missing = submit(&w, "t2", send("t2", json!({}))).await;
    exec.run_dispatched(&[ok, missing]).await.unwrap();
    assert_eq!(message_of(&w, ok).await["subject"], "Hi <Bo>");
    let j = job(&w, missing).await;
    assert_eq!(j["status"], "failed");
    assert!(j["last_error"].as_str().unwrap().contains("undefined"), "{j}");
    assert_eq!(j["fault"], "tenant", "the template data is the tenant's: {j}");
    let (status, err) = w.submit("t3", json!({"task_type": "email.send", "params": {"from": "noreply@acme.example", "to": ["bad"], "subject": "x", "text": "y"}})).await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.to[0]")),
        "{err}"
    );
    let (_, list) = w.call(Method::GET, "/v1/templates", None, None).await;
    assert_eq!(list["templates"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn messages_are_listed_by_correlation_and_invisible_to_other_tenants() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut body = email(&format!("corr {i}"), "bo@example.com");
        body["correlation_id"] = json!(if i < 2 { "chain-1" } else { "chain-2" });
        ids.push(submit(&w, &format!("c{i}"), body).await);
    }
    exec.run_dispatched(&ids).await.unwrap();
    let (status, list) = w.call(Method::GET, "/v1/messages?correlation_id=chain-1", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["messages"].as_array().unwrap().len(), 2);
    let mid = list["messages"][0]["id"].as_str().unwrap().to_owned();
    let (_, other_key) = w.other_tenant("globex").await;
    let (status, _) = w.call_as(&other_key, Method::GET, &format!("/v1/messages/{mid}"), None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, theirs) = w.call_as(&other_key, Method::GET, "/v1/messages?correlation_id=chain-1", None, None).await;
    assert_eq!(theirs["messages"].as_array().unwrap().len(), 0);
    let (status, recent) = w.call(Method::GET, "/v1/messages?limit=3", None, None).await;
    assert_eq!(status, StatusCode::OK, "no filter: the most recent messages");
    let recent = recent["messages"].as_array().unwrap();
    assert_eq!(recent.len(), 3);
    assert!(recent.windows(2).all(|p| p[0]["created_at"].as_str() >= p[1]["created_at"].as_str()), "newest first");
    let (_, theirs) = w.call_as(&other_key, Method::GET, "/v1/messages", None, None).await;
    assert_eq!(theirs["messages"].as_array().unwrap().len(), 0, "only the caller's");
}

#[tokio::test]
async fn operators_manage_sending_identities_and_a_tenant_role_sends() {
    let w = World::new().await;
    let key = operators::create(&w.db().await, "ops").await.unwrap().1;
    let path = format!("/v1/admin/tenants/{}/sending-identities", w.tenant.id);
    let (status, body) = w
        .call_as(
            &key,
            Method::PUT,
            &path,
            None,
            Some(serde_json::to_vec(&json!({"identities": ["Acme.Example", "ops@globex.example"]})).unwrap()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["identities"], json!(["acme.example", "ops@globex.example"]));
    let (status, _) = w
        .call_as(
            &key,
            Method::PUT,
            &path,
            None,
            Some(serde_json::to_vec(&json!({"identities": ["not a domain"]})).unwrap()),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = w.call(Method::GET, &path, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a tenant key is not an operator key");
    let (status, _) = w
        .call_as(&key, Method::GET, &format!("/v1/admin/tenants/{}/sending-identities", Uuid::now_v7()), None, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The tenant's own sending role (in its account, with an external id) is what sends.
    go_live(&w).await;
    let tenant_role = RoleSpec {
        role_arn: "arn:aws:iam::210987654321:role/acme-sender".into(),
        external_id: Some("relay-acme".into()),
    };
    verify_in_account(&tenant_role.role_arn).await;
    let exec = executor(&w, moto::endpoint(), roles().map_tenant_task(w.tenant.id, "email.send", tenant_role).unwrap());
    let subject = format!("tenant role {}", w.schema);
    let id = submit(&w, "tr", email(&subject, "bo@example.com")).await;
    assert_eq!(exec.run_dispatched(&[id]).await.unwrap().0.succeeded, 1, "{}", job(&w, id).await);
    let (_, sessions) = w.call(Method::GET, &format!("/v1/jobs/{id}/sessions"), None, None).await;
    assert_eq!(sessions["sessions"][0]["role_arn"], "arn:aws:iam::210987654321:role/acme-sender");
    assert_eq!(sessions["sessions"][0]["external_id"], true);
    assert_eq!(in_moto(&subject).await, 1);
}

#[tokio::test]
async fn a_new_exception_sends_one_alert_email_and_an_alert_never_alerts() {
    let mut settings = crate::support::test_settings();
    settings.sweep.alerts = Some(taskdeck::alerts::AlertConfig {
        to: vec!["oncall@acme.example".into()],
        from: "relay-alerts@acme.example".into(),
        tenant: "platform".into(),
    });
    let w = World::with_settings(settings).await;
    let exec = w.platform.executor();
    let (_, failing) =
        w.submit("boom", json!({"task_type": "test.fail", "params": {"times": 9, "kind": "fatal"}})).await;
    let failing: JobId = failing["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(exec.run_dispatched(&[failing]).await.unwrap().0.failed, 1);

    let sweeper = w.platform.sweeper();
    assert_eq!(sweeper.pass().await.unwrap().alerts_queued, 1);
    assert_eq!(sweeper.pass().await.unwrap().alerts_queued, 0, "one alert per exception");
    let alert: JobId = w
        .db()
        .await
        .query_one("SELECT id FROM jobs WHERE task_type = 'email.send' AND correlation_id LIKE 'relay-alert:%'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(exec.run_dispatched(&[alert]).await.unwrap().0.succeeded, 1);
    let m = w
        .db()
        .await
        .query_one("SELECT status, subject, recipients FROM messages WHERE job_id = $1", &[&alert])
        .await
        .unwrap();
    assert_eq!(m.get::<_, String>(0), "shadowed", "shadow mode applies to alerts too");
    assert_eq!(m.get::<_, String>(1), "[Relay] fatal_error in test.fail (tenant acme)");
    assert_eq!(m.get::<_, Value>(2)["to"], json!(["oncall@acme.example"]));

    // An alert job that fails opens an exception of its own, which does not alert again.
    let (_, second) =
        w.submit("boom2", json!({"task_type": "test.fail", "params": {"times": 9, "kind": "fatal"}})).await;
    let second: JobId = second["id"].as_str().unwrap().parse().unwrap();
    exec.run_dispatched(&[second]).await.unwrap();
    assert_eq!(sweeper.pass().await.unwrap().alerts_queued, 1);
    w.db().await.execute("DELETE FROM sending_identities", &[]).await.unwrap();
    let alert2: JobId = w
        .db()
        .await
        .query_one("SELECT id FROM jobs WHERE task_type = 'email.send' AND status = 'pending'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(exec.run_dispatched(&[alert2]).await.unwrap().0.failed, 1);
    assert_eq!(sweeper.pass().await.unwrap().alerts_queued, 0, "no alert about an alert");
}

#[tokio::test]
async fn a_worker_whose_lease_was_taken_over_cannot_send() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("zombie {}", w.schema);
    let id = submit(&w, "z", email(&subject, "bo@example.com")).await;
    // Attempt 1's lease expired and attempt 2 holds the job now; attempt 1 wakes up and runs.
    w.db()
        .await
        .execute("UPDATE jobs SET status = 'running', attempt = 2, started_at = now(), lease_until = now() + interval '1 minute' WHERE id = $1", &[&id])
        .await
        .unwrap();
    let j = job(&w, id).await;
    let zombie = taskdeck::job::ClaimedJob {
        id,
        tenant_id: w.tenant.id,
        task_type: "email.send".into(),
        params: j["params"].clone(),
        correlation_id: j["correlation_id"].as_str().unwrap().into(),
        attempt: 1,
        max_attempts: 5,
        timeout_seconds: 60,
        concurrency_key: None,
        run_at: chrono::Utc::now(),
    };
    let modes = Arc::new(taskdeck::store::modes::load(&w.db().await).await.unwrap());
    let outcome = exec.execute(&zombie, modes).await;
    assert!(
        matches!(&outcome, taskdeck::job::Outcome::Retry { error, .. } if error.contains("no longer holds the job")),
        "{outcome:?}"
    );
    assert_eq!(w.count("SELECT count(*) FROM messages", &[]).await, 0, "no intent recorded");
    assert_eq!(in_moto(&subject).await, 0, "nothing sent");
}

#[tokio::test]
async fn a_tenant_names_its_own_sending_role_and_relay_assumes_it_with_relays_external_id() {
    let w = World::new().await;
    go_live(&w).await;
    let (status, role) = w.call(Method::GET, "/v1/sending-role", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let external = format!("relay-{}", w.tenant.id);
    assert_eq!((role["role_arn"].clone(), role["external_id"].as_str()), (Value::Null, Some(external.as_str())));
    let (status, e) =
        w.call(Method::PUT, "/v1/sending-role", None, Some(json!({"role_arn": "arn:aws:iam::1:user/x"}))).await;
    assert_eq!((status, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("role_arn")));
    let arn = "arn:aws:iam::333333333333:role/acme-mail";
    let (status, _) = w.call(Method::PUT, "/v1/sending-role", None, Some(json!({"role_arn": arn}))).await;
    assert_eq!(status, StatusCode::OK);

    sending_identities::set(&mut w.db().await, w.tenant.id, &[DOMAIN.into()]).await.unwrap();
    verify_in_account(arn).await;

    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("own role {}", w.schema);
    let id = submit(&w, "own", email(&subject, "bo@example.com")).await;
    assert_eq!(exec.run_dispatched(&[id]).await.unwrap().0.succeeded, 1, "{}", job(&w, id).await);
    let (_, sessions) = w.call(Method::GET, &format!("/v1/jobs/{id}/sessions"), None, None).await;
    assert_eq!(
        (sessions["sessions"][0]["role_arn"].as_str(), sessions["sessions"][0]["external_id"].as_bool()),
        (Some(arn), Some(true))
    );
    let name = format!("relay-{id}-1");
    let assumed = moto::data().await["sts"]["AssumedRole"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["session_name"] == name.as_str())
        .cloned()
        .unwrap();
    assert_eq!(
        assumed["external_id"].as_str(),
        Some(external.as_str()),
        "Relay's external id, not one the tenant chose"
    );
    assert_eq!(in_moto(&subject).await, 1);

    // Cleared: the platform's own sending role again.
    let (status, _) = w.call(Method::PUT, "/v1/sending-role", None, Some(json!({"role_arn": null}))).await;
    assert_eq!(status, StatusCode::OK);
    let (_, role) = w.call(Method::GET, "/v1/sending-role", None, None).await;
    assert_eq!(role["role_arn"], Value::Null);
}

#[tokio::test]
async fn a_tenant_cannot_forge_provider_events_against_another_tenants_messages() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let id = submit(&w, "victim", json!({"task_type": "email.send", "params": {
        "from": format!("noreply@{DOMAIN}"), "to": ["ceo@victim.example"], "subject": format!("forged {}", w.schema), "text": "x"}})).await;
    exec.run_dispatched(&[id]).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "sent");

    // The attacker posts the forged bounce, naming the victim's message by its id.
    let (_, attacker) = w.other_tenant("attacker").await;
    let forged = json!({"task_type": "provider.event", "params": {"source": "s", "envelope": "sns", "message_id": "f1",
        "message": {"eventType": "Bounce", "mail": {"messageId": "x", "tags": {"relay_message_id": [m["id"]]}},
            "bounce": {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": "ceo@victim.example"},
                {"emailAddress": "never@victim.example"}]}}}});
    let (s, e) =
        w.call_as(&attacker, Method::POST, "/v1/jobs", Some("forge"), Some(forged.to_string().into_bytes())).await;
    assert_eq!((s, e["error"]["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("unknown_task_type")), "{e}");
    assert!(!e["error"]["available"].as_array().unwrap().contains(&json!("provider.event")), "{e}");
    let batch =
        json!({"jobs": [{"idempotency_key": "forge-b", "task_type": "provider.event", "params": forged["params"]}]});
    let (_, b) = w.call_as(&attacker, Method::POST, "/v1/jobs:batch", None, Some(batch.to_string().into_bytes())).await;
    assert_eq!(b["results"][0]["error"]["code"], "unknown_task_type", "{b}");
    let (_, tasks) = w.call_as(&attacker, Method::GET, "/v1/tasks", None, None).await;
    let names: Vec<&str> = tasks["tasks"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"provider.event") && names.contains(&"email.send"), "{names:?}");
    assert_eq!(w.count("SELECT count(*) FROM jobs WHERE task_type = 'provider.event'", &[]).await, 0);

    // Through the real ingress path, an event tagged with the victim's message but carrying
    // another SES id does not apply to it; the real one applies and suppresses only the
    // message's own recipient, not an address the event adds.
    let bounce = |ses_id: &str| {
        json!({"eventType": "Bounce",
        "mail": {"messageId": ses_id, "tags": {"relay_message_id": [m["id"]]}},
        "bounce": {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": "ceo@victim.example"},
            {"emailAddress": "never@victim.example"}]}})
    };
    let results = through_ingress(&w, &exec, vec![sns_record("sns-forged", &bounce("not-the-ses-id"))]).await;
    assert_eq!(results[0]["applied"], false, "{results:?}");
    assert_eq!(message_of(&w, id).await["status"], "sent");
    let real = m["provider_message_id"].as_str().unwrap();
    let results = through_ingress(&w, &exec, vec![sns_record("sns-real", &bounce(real))]).await;
    assert_eq!(
        (results[0]["applied"].as_bool(), results[0]["suppressed"].as_i64()),
        (Some(true), Some(1)),
        "{results:?}"
    );
    let (_, list) = w.call(Method::GET, "/v1/suppressions", None, None).await;
    let listed: Vec<&str> =
        list["suppressions"].as_array().unwrap().iter().filter_map(|s| s["address"].as_str()).collect();
    assert_eq!(listed, ["ceo@victim.example"], "only the message's own recipient");
}

/// The real wiring after a deploy: an SES event published to an SNS topic whose subscription
/// delivers into the ingress queue (moto), the ingress binary under the Runtime API stand-in,
/// then the job it made: the message is updated.
#[tokio::test]
async fn an_ses_event_through_an_sns_topic_reaches_the_ingress_binary_and_updates_its_message() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let id = submit(&w, "sns-e2e", json!({"task_type": "email.send", "params": {
        "from": format!("noreply@{DOMAIN}"), "to": ["bo@example.com"], "subject": format!("sns {}", w.schema), "text": "x"}})).await;
    exec.run_dispatched(&[id]).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "sent");

    let (ingress_url, ingress_arn) = moto::queue("ingress-e2e").await;
    let (work_url, _) = moto::queue("work-e2e").await;
    let sns = aws_sdk_sns::Client::new(&moto::sdk_config());
    let topic = sns.create_topic().name(format!("relay-ses-events-{}", w.schema)).send().await.unwrap();
    let topic = topic.topic_arn().expect("a topic ARN");
    sns.subscribe().topic_arn(topic).protocol("sqs").endpoint(&ingress_arn).send().await.unwrap();
    let delivery = ses_event(
        "Delivery",
        &m,
        json!({"delivery": {"timestamp": "2026-11-30T10:00:05.000Z", "recipients": ["bo@example.com"]}}),
    );
    sns.publish().topic_arn(topic).message(delivery.to_string()).send().await.unwrap();

    let base = crate::support::database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let env = [
        ("DATABASE_URL", format!("{base}{sep}options=-c%20search_path%3D{}", w.schema)),
        ("RELAY_WORK_QUEUE_URL", work_url),
        ("AWS_ENDPOINT_URL", moto::endpoint().to_owned()),
        ("RELAY_DB_WAIT_SECONDS", "2".to_owned()),
    ];
    let mut ingress = Function::start("ingress", &env).await;
    let event = moto::receive_event(&ingress_url, &ingress_arn, 5).await;
    assert_eq!(event.records.len(), 1, "the subscription delivered the notification");
    match ingress.invoke(&serde_json::to_value(&event).unwrap(), Duration::from_secs(30)).await {
        Invoked::Response(r) => assert_eq!(r["batchItemFailures"], json!([]), "{r}"),
        other => panic!("the ingress binary answered {other:?}"),
    }
    let made: Vec<JobId> = w
        .db()
        .await
        .query("SELECT id FROM jobs WHERE task_type = 'provider.event'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(made.len(), 1, "one provider.event job, made by the binary");
    exec.run_dispatched(&made).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "delivered", "{m}");
    assert_eq!(m["events"][0]["event_type"], "delivery", "{m}");
}
