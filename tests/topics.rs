//! Subscription topics: an address opted out of topic "news" is skipped for a "news" campaign
//! and still gets transactional mail; the opt-out and the resubscription reach the tenant's
//! feed as `message.unsubscribed` / `message.resubscribed`; the suppression list still blocks all.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::store::sending_identities;

use crate::campaign::run_until_done;
use crate::support::World;

fn send(to: &str, topic: Option<&str>) -> Value {
    let mut params = json!({"from": "news@acme.example", "to": [to], "subject": "Hi", "text": "Hello"});
    if let Some(t) = topic {
        params["topic"] = json!(t);
    }
    json!({"task_type": "email.send", "params": params})
}

async fn run(w: &World, key: &str, body: Value) -> Value {
    let (s, job) = w.submit(key, body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{job}");
    run_until_done(w, job["id"].as_str().unwrap()).await
}

async fn feed(w: &World) -> Vec<Value> {
    let (s, page) = w.call(Method::GET, "/v1/messages/events", None, None).await;
    assert_eq!(s, StatusCode::OK, "{page}");
    page["events"].as_array().unwrap().clone()
}

#[tokio::test]
async fn an_address_opted_out_of_a_topic_misses_that_topic_only_and_hears_of_both_changes() {
    let w = World::new().await;
    sending_identities::set(&mut w.db().await, w.tenant.id, &["acme.example".into()]).await.unwrap();
    // A news message reaches ann; she opts out through it.
    let first = run(&w, "first", send("ann@example.com", Some("news"))).await;
    assert_eq!(first["result"]["status"], "shadowed", "{first}");
    let message = first["result"]["message_id"].as_str().unwrap().to_owned();
    let (s, e) = w
        .call(Method::PUT, "/v1/topic-opt-outs/ann@example.com/news", None, Some(json!({"message_id": message})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    let (_, list) = w.call(Method::GET, "/v1/topic-opt-outs?address=ann@example.com", None, None).await;
    assert_eq!(list["opt_outs"][0]["topic"], "news", "{list}");
    assert_eq!(list["opt_outs"][0]["source"], "api");

    // A news campaign skips her, and only her (bob's send is shadowed, counted apart); another
    // topic still reaches her.
    let campaign = json!({"task_type": "email.campaign", "params": {
        "message": {"from": "news@acme.example", "subject": "News", "text": "News", "topic": "news"},
        "recipients": [{"to": "ann@example.com"}, {"to": "bob@example.com"}]}});
    let done = run(&w, "campaign", campaign).await;
    assert_eq!(
        done["result"],
        json!({"total": 2, "succeeded": 0, "shadowed": 1, "skipped": 1, "failed": 0, "cancelled": 0}),
        "{done}"
    );
    let skipped = w
        .db()
        .await
        .query_one(
            "SELECT c.result, m.reason FROM jobs c JOIN messages m ON m.job_id = c.id
             WHERE c.parent_id = $1 AND c.result ? 'skipped'",
            &[&done["id"].as_str().unwrap().parse::<uuid::Uuid>().unwrap()],
        )
        .await
        .unwrap();
    let (result, reason): (Value, String) = (skipped.get(0), skipped.get(1));
    assert_eq!(result["skipped"], "unsubscribed", "{result}");
    assert_eq!(reason, "unsubscribed from topic news: ann@example.com");
    let other = run(&w, "offers", send("ann@example.com", Some("offers"))).await;
    assert_eq!(other["result"]["status"], "shadowed", "{other}");
    // Transactional mail (no topic) is not touched.
    let receipt = run(&w, "receipt", send("ann@example.com", None)).await;
    assert_eq!(receipt["result"]["status"], "shadowed", "{receipt}");

    // Resubscribing emits the event; both changes are in the feed, on the message.
    let (s, _) = w.call(Method::DELETE, "/v1/topic-opt-outs/ann@example.com/news", None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = w.call(Method::DELETE, "/v1/topic-opt-outs/ann@example.com/news", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "once");
    let events: Vec<(String, Value)> =
        feed(&w).await.iter().map(|e| (e["type"].as_str().unwrap().to_owned(), e["recipients"].clone())).collect();
    let ann = json!(["ann@example.com"]);
    assert!(events.contains(&("message.unsubscribed".into(), ann.clone())), "{events:?}");
    assert!(events.contains(&("message.resubscribed".into(), ann.clone())), "{events:?}");
    let again = run(&w, "again", send("ann@example.com", Some("news"))).await;
    assert_eq!(again["result"]["status"], "shadowed", "resubscribed: {again}");

    // The suppression list still blocks everything, transactional mail too.
    let (s, _) = w.call(Method::PUT, "/v1/suppressions/ann@example.com", None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    for (key, topic) in [("s1", None), ("s2", Some("news"))] {
        let j = run(&w, key, send("ann@example.com", topic)).await;
        assert_eq!(j["result"]["skipped"], "suppressed", "{j}");
    }
}

#[tokio::test]
async fn hostile_topics_and_addresses_get_a_clear_422() {
    let w = World::new().await;
    for (path, field) in
        [("/v1/topic-opt-outs/ann@example.com/new%20s", "topic"), ("/v1/topic-opt-outs/not-an-address/news", "address")]
    {
        let (s, e) = w.call(Method::PUT, path, None, None).await;
        assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(field)), "{path}: {e}");
    }
    let (s, e) =
        w.call(Method::PUT, "/v1/topic-opt-outs/ann@example.com/news", None, Some(json!({"message_id": 5}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    let (s, e) = w.submit("bad", send("ann@example.com", Some(&"t".repeat(65)))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert_eq!(w.count("SELECT count(*) FROM topic_opt_outs", &[]).await, 0);
}
