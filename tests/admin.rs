//! The admin function binary (`functions/admin`) under the Runtime API stand-in, on the real
//! Postgres and moto's SQS: operator actions without a direct database connection, each
//! audited, hostile input refused with a code.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::runtime_api::{Function, Invoked};
use crate::support::{World, database_url, moto};

async fn admin(w: &World, work: (&str, &str)) -> Function {
    let base = database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    let env = vec![
        ("DATABASE_URL", format!("{base}{sep}options=-c%20search_path%3D{}", w.schema)),
        ("RELAY_WORK_QUEUE_URL", work.0.to_owned()),
        ("RELAY_WORK_DLQ_URL", work.1.to_owned()),
        ("AWS_ENDPOINT_URL", moto::endpoint().to_owned()),
        ("RELAY_DB_WAIT_SECONDS", "2".to_owned()),
    ];
    Function::start("admin", &env).await
}

async fn call(f: &mut Function, payload: Value) -> Value {
    match f.invoke(&payload, Duration::from_secs(60)).await {
        Invoked::Response(v) => v,
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[tokio::test]
async fn the_admin_function_creates_keys_that_work_migrates_and_audits_every_call() {
    let w = World::new().await;
    let (queue, _) = moto::queue("admin-work").await;
    let (dlq, _) = moto::queue("admin-dlq").await;
    let mut f = admin(&w, (&queue, &dlq)).await;

    let migrated = call(&mut f, json!({"action": "migrate", "actor": "ops@example.com"})).await;
    assert_eq!((&migrated["ok"], &migrated["migrations_applied"]), (&json!(true), &json!([])), "{migrated}");

    let tenant = call(&mut f, json!({"action": "tenant.create", "actor": "ops@example.com", "name": "beta"})).await;
    assert_eq!(tenant["ok"], true, "{tenant}");
    let key = tenant["key"].as_str().unwrap();
    let (status, _) = w.call_as(key, Method::GET, "/v1/jobs", None, None).await;
    assert_eq!(status, StatusCode::OK, "the new tenant's key works");
    let again = call(&mut f, json!({"action": "tenant.create", "actor": "ops@example.com", "name": "beta"})).await;
    assert_eq!((&again["ok"], &again["error"]["code"]), (&json!(false), &json!("name_taken")), "{again}");

    let operator = call(&mut f, json!({"action": "operator.create", "actor": "ops", "name": "alice"})).await;
    assert!(operator["key"].as_str().unwrap().starts_with("ro_"), "{operator}");
    let (status, _) = w.call_as(operator["key"].as_str().unwrap(), Method::GET, "/v1/admin/modes", None, None).await;
    assert_eq!(status, StatusCode::OK, "the operator's key works");
    let status_key = call(&mut f, json!({"action": "status_key.create", "actor": "ops", "name": "console"})).await;
    assert!(status_key["key"].as_str().unwrap().starts_with("rs_"), "{status_key}");

    // Every call has its row; no key is in any of them.
    let rows = w
        .db()
        .await
        .query("SELECT action, actor, ok, detail::text, request_id FROM admin_actions ORDER BY id", &[])
        .await
        .unwrap();
    let seen: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(2))).collect();
    assert_eq!(
        seen,
        [
            ("migrate".into(), true),
            ("tenant.create".into(), true),
            ("tenant.create".into(), false),
            ("operator.create".into(), true),
            ("status_key.create".into(), true)
        ]
    );
    for r in &rows {
        let detail: String = r.get(3);
        assert!(!detail.contains("rk_") && !detail.contains("ro_") && !detail.contains("rs_"), "{detail}");
        assert!(r.get::<_, Option<String>>(4).is_some(), "the Lambda request id joins CloudTrail's record");
    }
}

#[tokio::test]
async fn the_admin_function_refuses_hostile_input_with_a_code_and_audits_it() {
    let w = World::new().await;
    let (queue, _) = moto::queue("admin-hostile").await;
    let (dlq, _) = moto::queue("admin-hostile-dlq").await;
    let mut f = admin(&w, (&queue, &dlq)).await;
    let long = "x".repeat(100_000);
    let cases = [
        (json!({"action": "drop.everything", "actor": "ops"}), "unknown_action"),
        (json!({"action": "tenant.create", "name": "nobody-asked"}), "invalid_field"),
        (json!({"action": "tenant.create", "actor": "ops", "name": "nul\u{0}name"}), "invalid_field"),
        (json!({"action": "tenant.create", "actor": "ops", "name": long}), "invalid_field"),
        (json!({"action": "tenant.create", "actor": "ops\u{0}", "name": "x"}), "invalid_field"),
        (json!({"action": format!("a{long}"), "actor": "ops"}), "unknown_action"),
        (json!({"action": "operator.create", "actor": "ops", "name": "spaces are not allowed"}), "invalid_name"),
        (json!({"action": "dead_letters.redrive", "actor": "ops", "queue": "../etc"}), "invalid_queue"),
        (json!({"action": "dead_letters.redrive", "actor": "ops", "queue": "work", "max": -1}), "invalid_max"),
        (json!({"action": "dead_letters.redrive", "actor": "ops", "queue": "ingress"}), "not_configured"),
        (json!("just a string"), "invalid_field"),
        (json!([1, 2, 3]), "invalid_field"),
    ];
    for (payload, code) in &cases {
        let answer = call(&mut f, payload.clone()).await;
        assert_eq!((&answer["ok"], answer["error"]["code"].as_str()), (&json!(false), Some(*code)), "{answer}");
    }
    // A unicode name is a name.
    let ok = call(&mut f, json!({"action": "tenant.create", "actor": "øps", "name": "ünïcødé ☃"})).await;
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(w.count("SELECT count(*) FROM tenants WHERE name = 'ünïcødé ☃'", &[]).await, 1);
    let audited = w.count("SELECT count(*) FROM admin_actions", &[]).await;
    assert_eq!(audited as usize, cases.len() + 1, "every call audited, refused ones too");
    assert_eq!(w.count("SELECT count(*) FROM admin_actions WHERE NOT ok", &[]).await as usize, cases.len());
}

#[tokio::test]
async fn a_redrive_moves_dead_letters_back_to_their_queue_and_no_more_than_asked() {
    let w = World::new().await;
    let (queue, _) = moto::queue("admin-redrive").await;
    let (dlq, _) = moto::queue("admin-redrive-dlq").await;
    for i in 0..3 {
        moto::sqs().send_message().queue_url(&dlq).message_body(format!("{{\"n\": {i}}}")).send().await.unwrap();
    }
    let mut f = admin(&w, (&queue, &dlq)).await;
    let first =
        call(&mut f, json!({"action": "dead_letters.redrive", "actor": "ops", "queue": "work", "max": 2})).await;
    assert_eq!((&first["ok"], &first["moved"]), (&json!(true), &json!(2)), "{first}");
    // It receives no more than it may move, so the third is there for the next call.
    let rest = call(&mut f, json!({"action": "dead_letters.redrive", "actor": "ops", "queue": "work"})).await;
    assert_eq!(rest["moved"], 1, "{rest}");
    assert_eq!((moto::depth(&queue).await, moto::depth(&dlq).await), (3, 0), "nothing lost, nothing doubled");
    let audited = w.count("SELECT count(*) FROM admin_actions WHERE action = 'dead_letters.redrive' AND ok", &[]).await;
    assert_eq!(audited, 2);
}
