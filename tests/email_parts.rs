//! `email.send` with MIME parts and attachments against moto's SES: an invitation (a
//! `text/calendar; method=REQUEST` part and a PDF) reaches the stand-in as MIME that Python's
//! own parser (`email`, the standard library's) reads back intact; hostile parts and
//! attachments are 4xx at submit with nothing queued; a shadowed message's preview shows them.

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::email::{DOMAIN, executor, go_live, message_of, moto_raw, roles, sender, submit};
use crate::support::{World, moto};

const CALENDAR: &str = "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//Acme//Events//EN\r\nMETHOD:REQUEST\r\n\
BEGIN:VEVENT\r\nUID:evt-42@acme.example\r\nDTSTAMP:20261203T120000Z\r\nDTSTART:20261210T170000Z\r\n\
DTEND:20261210T180000Z\r\nSUMMARY:Rust meetup – Zürich\r\nORGANIZER:mailto:events@acme.example\r\n\
ATTENDEE;RSVP=TRUE:mailto:bo@example.com\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n";

/// A PDF's worth of bytes, every byte value in it (so no encoding may touch it).
fn pdf() -> Vec<u8> {
    let mut b = b"%PDF-1.4\n".to_vec();
    b.extend((0..=255u8).cycle().take(70_000));
    b
}

fn invitation(subject: &str) -> Value {
    json!({"task_type": "email.send", "params": {
        "from": format!("Acme Events <events@{DOMAIN}>"), "to": ["Bo <bo@example.com>"], "bcc": ["audit@example.com"],
        "subject": subject, "text": "You are invited.", "html": "<p>You are invited.</p>",
        "parts": [{"content_type": "text/calendar; method=REQUEST", "content": CALENDAR}],
        "attachments": [{"filename": "agenda.pdf", "content_type": "application/pdf", "content_base64": STANDARD.encode(pdf())}]}})
}

/// The MIME message as Python's standard library parses it (`email.policy.default`): its
/// headers, defects, and every leaf part's type, parameters, disposition and decoded bytes.
fn parse_with_python(raw: &str) -> Value {
    const SCRIPT: &str = r#"
import base64, email, email.policy, json, sys
m = email.message_from_bytes(sys.stdin.buffer.read(), policy=email.policy.default)
parts = []
for p in m.walk():
    parts.append({"content_type": p.get_content_type(), "params": {k: v for k, v in (p.get_params() or [])[1:]},
        "filename": p.get_filename(), "disposition": p.get_content_disposition(),
        "defects": [str(d) for d in p.defects],
        "bytes": None if p.is_multipart() else base64.b64encode(p.get_payload(decode=True)).decode()})
print(json.dumps({"subject": m["Subject"], "to": m["To"], "bcc": m["Bcc"], "from": m["From"],
    "defects": [str(d) for d in m.defects], "parts": parts}))
"#;
    use std::io::Write as _;
    let mut child = std::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(raw.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python's email parser failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn leaf<'a>(parsed: &'a Value, content_type: &str) -> &'a Value {
    parsed["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["content_type"] == content_type)
        .unwrap_or_else(|| panic!("no {content_type} part: {parsed}"))
}

fn bytes_of(part: &Value) -> Vec<u8> {
    STANDARD.decode(part["bytes"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn an_invitation_with_a_calendar_part_and_a_pdf_reaches_ses_as_valid_mime() {
    let w = World::new().await;
    go_live(&w).await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("invitation {}", w.schema);
    let id = submit(&w, "invite", invitation(&subject)).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.succeeded, 1, "{}", message_of(&w, id).await);
    assert_eq!(message_of(&w, id).await["status"], "sent");

    let raw: Vec<String> = moto_raw().await.into_iter().filter(|m| m.contains(&subject)).collect();
    assert_eq!(raw.len(), 1, "one message reached the stand-in");
    let parsed = parse_with_python(&raw[0]);
    assert_eq!(parsed["subject"], subject.as_str(), "{parsed}");
    assert_eq!(parsed["from"], format!("Acme Events <events@{DOMAIN}>"));
    assert_eq!(parsed["to"], "Bo <bo@example.com>");
    assert!(parsed["bcc"].is_null(), "bcc travels in the envelope only: {parsed}");
    let kinds: Vec<&str> =
        parsed["parts"].as_array().unwrap().iter().map(|p| p["content_type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["multipart/mixed", "multipart/alternative", "text/plain", "text/html", "text/calendar", "application/pdf"],
        "{parsed}"
    );
    for p in parsed["parts"].as_array().unwrap().iter().chain([&parsed]) {
        assert_eq!(p["defects"], json!([]), "the parser found no defect: {parsed}");
    }
    let calendar = leaf(&parsed, "text/calendar");
    assert_eq!(calendar["params"]["method"], "REQUEST", "{calendar}");
    assert_eq!(calendar["params"]["charset"], "utf-8", "{calendar}");
    assert_eq!(calendar["disposition"], Value::Null, "inline alternative, not a file");
    assert_eq!(String::from_utf8(bytes_of(calendar)).unwrap(), CALENDAR, "the calendar arrives as given");
    let attachment = leaf(&parsed, "application/pdf");
    assert_eq!(
        (attachment["filename"].as_str(), attachment["disposition"].as_str()),
        (Some("agenda.pdf"), Some("attachment"))
    );
    assert!(bytes_of(attachment) == pdf(), "the PDF's bytes arrive unchanged");
    // The envelope carries every recipient, bcc too.
    let data = moto::data().await;
    let sent = data["ses"]["RawMessage"].as_array().unwrap().iter().find(|m| m["raw_data"] == raw[0].as_str()).unwrap();
    let to: Vec<&str> = sent["destinations"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(to.contains(&"audit@example.com") && to.iter().any(|d| d.contains("bo@example.com")), "{sent}");
}

#[tokio::test]
async fn hostile_parts_and_attachments_are_refused_at_submit_and_nothing_is_queued() {
    let w = World::new().await;
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut body = invitation("hostile");
        edit(&mut body["params"]);
        body
    };
    let calendar = |ct: &str, content: &str| json!([{"content_type": ct, "content": content}]);
    let file = |name: &str, ct: &str, b64: &str| json!([{"filename": name, "content_type": ct, "content_base64": b64}]);
    let big = STANDARD.encode(vec![7u8; 600 * 1024]);
    let cases: Vec<(Value, &str)> = vec![
        (
            with(&|p| p["attachments"] = file("big.pdf", "application/pdf", &big)),
            "params.attachments[0].content_base64",
        ),
        (
            with(&|p| {
                p["parts"] = json!(
                    (0..11).map(|i| json!({"content_type": format!("text/x-{i}"), "content": "x"})).collect::<Vec<_>>()
                )
            }),
            "params.parts",
        ),
        (
            with(&|p| {
                p["attachments"] = json!((0..11).map(|i| json!({"filename": format!("{i}.txt"), "content_type": "text/plain", "content_base64": "eA=="})).collect::<Vec<_>>())
            }),
            "params.attachments",
        ),
        (
            with(&|p| p["attachments"] = file("agenda\r\nBcc: x@evil.example.pdf", "application/pdf", "eA==")),
            "params.attachments[0].filename",
        ),
        (
            with(&|p| p["attachments"] = file("agenda.pdf", "application/pdf", "not base64!")),
            "params.attachments[0].content_base64",
        ),
        (
            with(&|p| p["attachments"] = file("agenda.pdf", "application/pdf", "eA")),
            "params.attachments[0].content_base64",
        ),
        (
            with(&|p| p["attachments"] = file("setup.EXE", "application/octet-stream", "eA==")),
            "params.attachments[0].filename",
        ),
        (with(&|p| p["attachments"] = file("run.bat", "text/plain", "eA==")), "params.attachments[0].filename"),
        (
            with(&|p| p["attachments"] = file("a.pdf", "application/pdf\r\nBcc: x@evil.example", "eA==")),
            "params.attachments[0].content_type",
        ),
        (with(&|p| p["attachments"] = file("a.eml", "multipart/mixed", "eA==")), "params.attachments[0].content_type"),
        (with(&|p| p["attachments"] = file("a.pdf", "pdf", "eA==")), "params.attachments[0].content_type"),
        (
            with(
                &|p| p["attachments"] = json!([{"filename": "logo.png", "content_type": "image/png", "content_base64": "eA==", "disposition": "inline"}]),
            ),
            "params.attachments[0].content_id",
        ),
        (with(&|p| p["parts"] = calendar("text/calendar", CALENDAR)), "params.parts[0].content_type"),
        (with(&|p| p["parts"] = calendar("text/calendar; method=INVITE", CALENDAR)), "params.parts[0].content_type"),
        (with(&|p| p["parts"] = calendar("text/calendar; method=CANCEL", CALENDAR)), "params.parts[0].content"),
        (with(&|p| p["parts"] = calendar("text/calendar; method=REQUEST", "hello")), "params.parts[0].content"),
        (with(&|p| p["parts"] = calendar("text/html", "<p>x</p>")), "params.parts[0].content_type"),
        (
            with(&|p| p["parts"] = calendar("text/calendar; method=REQUEST\r\nBcc: x@evil.example", CALENDAR)),
            "params.parts[0].content_type",
        ),
        (
            with(&|p| p["parts"] = calendar("text/calendar; method=REQUEST; charset=latin1", CALENDAR)),
            "params.parts[0].content_type",
        ),
    ];
    for (i, (body, field)) in cases.into_iter().enumerate() {
        let (status, e) = w.submit(&format!("bad{i}"), body).await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "case {i}: {e}"
        );
    }
    // A NUL is refused before anything reads it, as everywhere.
    let (status, e) =
        w.submit("nul", with(&|p| p["attachments"] = file("a\u{0}.pdf", "application/pdf", "eA=="))).await;
    assert_eq!((status, e["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("nul_character")), "{e}");
    // A campaign's message carries neither: every child would hold a copy.
    let campaign = json!({"task_type": "email.campaign", "params": {"message": {
        "from": format!("noreply@{DOMAIN}"), "subject": "News", "text": "Hi",
        "parts": [{"content_type": "text/calendar; method=PUBLISH", "content": CALENDAR.replace("REQUEST", "PUBLISH")}]},
        "recipients": [{"to": "bo@example.com"}]}});
    let (status, e) = w.submit("campaign", campaign).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.message.parts")),
        "{e}"
    );
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 0, "nothing queued");
}

#[tokio::test]
async fn a_shadowed_invitation_previews_its_parts_and_attachments() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let subject = format!("shadowed invitation {}", w.schema);
    let mut body = invitation(&subject);
    body["params"]["attachments"]
        .as_array_mut()
        .unwrap()
        .push(json!({"filename": "logo.png", "content_type": "image/png",
        "content_base64": "iVBORw0KGgo=", "disposition": "inline", "content_id": "logo@acme.example"}));
    let id = submit(&w, "shadow-invite", body).await;
    let (report, _) = exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(report.succeeded, 1);
    let m = message_of(&w, id).await;
    assert_eq!(m["status"], "shadowed", "{m}");
    let p = &m["preview"];
    assert_eq!(
        p["parts"],
        json!([{"content_type": "text/calendar; method=REQUEST", "size": CALENDAR.len(), "content": CALENDAR}]),
        "{p}"
    );
    assert_eq!(
        p["attachments"],
        json!([
            {"filename": "agenda.pdf", "content_type": "application/pdf", "disposition": "attachment", "size": pdf().len()},
            {"filename": "logo.png", "content_type": "image/png", "disposition": "inline", "content_id": "logo@acme.example", "size": 8},
        ]),
        "{p}"
    );
    assert!(moto_raw().await.iter().all(|r| !r.contains(&subject)), "nothing sent");
}

/// Issue 51, 2: a tenant header that would shape the message (its MIME structure, or what SES
/// reads from a raw message's headers) is refused by name at submit; a plain one is taken.
#[tokio::test]
async fn headers_relay_or_ses_set_are_refused_by_name() {
    let w = World::new().await;
    taskdeck::store::sending_identities::set(&mut w.db().await, w.tenant.id, &[DOMAIN.into()]).await.unwrap();
    let send = |name: &str, value: &str| {
        json!({"task_type": "email.send", "params": {"from": format!("hi@{DOMAIN}"), "to": ["bo@example.com"],
            "subject": "Hi", "text": "Hi", "headers": {name: value}}})
    };
    for (name, value) in [
        ("Content-Type", "multipart/mixed; boundary=evil"),
        ("content-type", "text/html"),
        ("MIME-Version", "2.0"),
        ("Content-Transfer-Encoding", "quoted-printable"),
        ("Content-Disposition", "attachment; filename=a.exe"),
        ("Content-ID", "<x@evil.example>"),
        ("X-SES-CONFIGURATION-SET", "someone-elses"),
        ("X-SES-MESSAGE-TAGS", "relay_job_id=00000000-0000-0000-0000-000000000000"),
        ("X-SES-SOURCE-ARN", "arn:aws:ses:eu-west-1:123456789012:identity/other.example"),
        ("DKIM-Signature", "v=1; a=rsa-sha256; d=other.example"),
    ] {
        let (status, e) = w.submit(&format!("h-{name}"), send(name, value)).await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(format!("params.headers.{name}").as_str())),
            "{name}: {e}"
        );
    }
    let campaign = json!({"task_type": "email.campaign", "params": {"message": {
        "from": format!("noreply@{DOMAIN}"), "subject": "News", "text": "Hi", "headers": {"Content-Type": "text/html"}},
        "recipients": [{"to": "bo@example.com"}]}});
    let (status, e) = w.submit("campaign", campaign).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.message.headers.Content-Type")),
        "{e}"
    );
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 0, "nothing queued");
    let (status, e) = w.submit("plain", send("X-Order", "42")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{e}");
}

/// Issue 51, 5: the size limit is inclusive (512 KiB decoded is taken, one byte more is not),
/// and a file name in RFC 2047 encoded words is checked as a mail client shows it.
#[tokio::test]
async fn the_size_limit_is_inclusive_and_encoded_file_names_are_decoded_before_the_check() {
    let w = World::new().await;
    taskdeck::store::sending_identities::set(&mut w.db().await, w.tenant.id, &[DOMAIN.into()]).await.unwrap();
    let with = |name: &str, bytes: usize| {
        let mut body = invitation("limits");
        body["params"]["parts"] = json!([]);
        body["params"]["attachments"] = json!([{"filename": name, "content_type": "application/octet-stream", "content_base64": STANDARD.encode(vec![7u8; bytes])}]);
        body
    };
    let max = taskdeck::email::mime::MAX_CONTENT_BYTES;
    for (i, bytes) in [max - 1, max].into_iter().enumerate() {
        let (status, e) = w.submit(&format!("fits-{i}"), with("data.bin", bytes)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{bytes} bytes: {e}");
    }
    let (status, e) = w.submit("over", with("data.bin", max + 1)).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.attachments[0].content_base64")),
        "{e}"
    );
    for (i, name) in [
        "=?utf-8?b?YS5leGU=?=",
        "=?UTF-8?B?YS5leGU=?=",
        "=?utf-8?q?a=2Eexe?=",
        "=?iso-8859-1?Q?report_2026=2Ebat?=",
        "=?utf-8?b?cmVwb3J0?= =?utf-8?b?LmV4ZQ==?=",
        "=?utf-8?q?a=0Ab.pdf?=",
        "=?utf-8?b?Li4vZXRjL3Bhc3N3ZA==?=",
        "=?x-unknown?b?YS5leGU=?=",
    ]
    .into_iter()
    .enumerate()
    {
        let (status, e) = w.submit(&format!("enc-{i}"), with(name, 3)).await;
        assert_eq!(
            (status, e["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("params.attachments[0].filename")),
            "{name}: {e}"
        );
    }
    // An encoded name of an allowed file is taken.
    let (status, e) = w.submit("enc-ok", with("=?utf-8?q?Z=C3=BCrich.pdf?=", 3)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{e}");
}
