//! Subscription topics: an address opted out of topic "news" is skipped for a "news" campaign
//! and still gets transactional mail; the opt-out and the resubscription reach the tenant's
//! feed as `message.unsubscribed` / `message.resubscribed`; the suppression list still blocks all.
//! A topic mapped onto an SES contact list and topic sends with SES's list management options;
//! SES's Subscription events opt out and back in (an opt-in heard only as resubscribed); the
//! tenant's own changes reach the SES contact through the sweep, and SES's own are not echoed.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::store::sending_identities;

use crate::campaign::run_until_done;
use crate::email::{executor, go_live, roles};
use crate::support::{World, moto};
use relay::ses_standin::{self, Faults};

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

/// An SES `Subscription` event (as SNS delivers it to the ingress) on message `m`, to `to`:
/// the contact's new status for SES topic `weekly` of `list`.
fn subscription(sns: &str, m: &Value, list: &str, status: &str, to: &str) -> Value {
    let prefs = json!({"unsubscribeAll": false,
        "topicSubscriptionStatus": [{"topicName": "weekly", "subscriptionStatus": status}]});
    let mut e = crate::email::ses_event(
        "Subscription",
        m,
        json!({"subscription": {"contactList": list,
        "timestamp": "2026-11-30T10:00:05.000Z", "source": "UnsubscribeHeader", "newTopicPreferences": prefs}}),
    );
    e["mail"]["destination"] = json!([to]);
    crate::email::sns_record(sns, &e)
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
    // A body of JSON `null`, as the document allows, is an opt-out without a message.
    let (s, e) = w.call(Method::PUT, "/v1/topic-opt-outs/ann@example.com/news", None, Some(Value::Null)).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    assert_eq!(w.count("SELECT count(*) FROM topic_opt_outs", &[]).await, 1);
}

/// A live send naming a topic the tenant mapped onto an SES contact list carries SESv2
/// `ListManagementOptions {ContactListName, TopicName}`, so SES's own unsubscribe link and header
/// apply; a send naming an unmapped topic, or none, carries none. moto takes the field and
/// ignores it (it does not check that the list exists): the SES stand-in before it records it.
#[tokio::test]
async fn a_topic_mapped_onto_an_ses_contact_list_sends_with_its_list_management_options() {
    let w = World::new().await;
    go_live(&w).await;
    crate::email::sender(&w).await;
    let ses = ses_standin::start(moto::endpoint(), Faults::default(), 1).expect("the SES stand-in");
    let exec = executor(&w, &ses.url, roles());
    let body = json!({"contact_list": "acme-members", "ses_topic": "weekly-news"});
    let (s, t) = w.call(Method::PUT, "/v1/topics/news/ses", None, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{t}");
    assert_eq!((t["topic"].as_str(), t["contact_list"].as_str()), (Some("news"), Some("acme-members")), "{t}");
    let (_, list) = w.call(Method::GET, "/v1/topics/ses", None, None).await;
    assert_eq!(list["topics"].as_array().map(Vec::len), Some(1), "{list}");

    let from = format!("noreply@{}", crate::email::DOMAIN);
    for (key, topic) in [("news", Some("news")), ("offers", Some("offers")), ("receipt", None)] {
        let mut params = json!({"from": from, "to": ["ann@example.com"], "subject": key, "text": "x"});
        if let Some(t) = topic {
            params["topic"] = json!(t);
        }
        let id = crate::email::submit(&w, key, json!({"task_type": "email.send", "params": params})).await;
        exec.run_dispatched(&[id]).await.unwrap();
    }
    let sent: Vec<(String, String)> =
        ses.counts.passed().into_iter().map(|(_, s)| s).zip(ses.counts.lists.lock().unwrap().clone()).collect();
    let expected = [("news", "acme-members/weekly-news"), ("offers", ""), ("receipt", "")];
    assert_eq!(sent, expected.map(|(a, b)| (a.to_owned(), b.to_owned())));

    // Unmapped: the next news send carries none.
    let (s, _) = w.call(Method::DELETE, "/v1/topics/news/ses", None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = w.call(Method::DELETE, "/v1/topics/news/ses", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let params = json!({"from": from, "to": ["ann@example.com"], "subject": "news-2", "text": "x", "topic": "news"});
    let id = crate::email::submit(&w, "news-2", json!({"task_type": "email.send", "params": params})).await;
    exec.run_dispatched(&[id]).await.unwrap();
    assert_eq!(ses.counts.lists.lock().unwrap().last().map(String::as_str), Some(""));

    // Names SES would not take are refused where they are set.
    for (body, field) in [
        (json!({"contact_list": "a list", "ses_topic": "t"}), "contact_list"),
        (json!({"contact_list": "l", "ses_topic": "t".repeat(65)}), "ses_topic"),
    ] {
        let (s, e) = w.call(Method::PUT, "/v1/topics/news/ses", None, Some(body)).await;
        assert_eq!((s, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(field)), "{e}");
    }
    let (s, e) = w.call(Method::PUT, "/v1/topics/news/ses", None, Some(json!({"contact_list": "l"}))).await;
    assert!(s.is_client_error(), "{s} {e}");
}

/// SES's `Subscription` event (a contact used SES's unsubscribe link or header) on a message of
/// a topic mapped onto that contact list becomes Relay's opt-out of the topic (source
/// `provider`, on the message, heard as `message.unsubscribed`), and SES reporting the contact
/// opted in again resubscribes it (`message.resubscribed`). An event of another list changes
/// nothing. The events are fed to ingress as SNS delivers them (no SES is involved).
#[tokio::test]
async fn an_ses_subscription_event_opts_the_address_out_of_the_mapped_topic_and_back_in() {
    let w = World::new().await;
    sending_identities::set(&mut w.db().await, w.tenant.id, &["acme.example".into()]).await.unwrap();
    let body = json!({"contact_list": "members", "ses_topic": "weekly"});
    let (s, t) = w.call(Method::PUT, "/v1/topics/news/ses", None, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{t}");
    let sent = run(&w, "news-1", send("ann@example.com", Some("news"))).await;
    let id = sent["result"]["message_id"].as_str().unwrap().to_owned();
    let m = json!({"id": id, "provider_message_id": "ses-sub-1", "correlation_id": "c"});
    let event = |sns: &str, list: &str, status: &str| subscription(sns, &m, list, status, "ann@example.com");
    let opt_outs = || async {
        let (_, list) = w.call(Method::GET, "/v1/topic-opt-outs", None, None).await;
        list["opt_outs"].as_array().unwrap().clone()
    };
    let exec = w.platform.executor();

    // Another contact list: nothing changes.
    crate::email::through_ingress(&w, &exec, vec![event("sub-0", "other-list", "OptOut")]).await;
    assert_eq!(opt_outs().await, Vec::<Value>::new());

    crate::email::through_ingress(&w, &exec, vec![event("sub-1", "members", "OptOut")]).await;
    let list = opt_outs().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!((list[0]["address"].as_str(), list[0]["topic"].as_str()), (Some("ann@example.com"), Some("news")));
    assert_eq!((list[0]["source"].as_str(), list[0]["message_id"].as_str()), (Some("provider"), Some(id.as_str())));
    // The next news send skips her.
    let next = run(&w, "news-2", send("ann@example.com", Some("news"))).await;
    assert_eq!(next["result"]["skipped"], "unsubscribed", "{next}");

    crate::email::through_ingress(&w, &exec, vec![event("sub-2", "members", "OptIn")]).await;
    assert_eq!(opt_outs().await, Vec::<Value>::new());
    // The opt-out is heard once as unsubscribed, the opt-in only as resubscribed (the other
    // list's event opted nothing out in Relay, but SES reported an unsubscription: heard too).
    let types: Vec<String> = feed(&w).await.iter().map(|e| e["type"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(types, ["message.unsubscribed", "message.unsubscribed", "message.resubscribed"], "{types:?}");
}

/// The tenant's own opt-out and resubscribe through the API, of a topic mapped onto an SES
/// contact list, reach the SES contact's preference for the mapped SES topic through the sweep
/// (`ses_contacts`), not from the API: `OPT_OUT` (a new contact created; an existing one keeps
/// its other topics), then `OPT_IN`. A refused write leaves the change pending with why, and a
/// later pass writes it. An opt-out SES itself reported (a Subscription event) is not written
/// back. moto 5.2.1 has no `UpdateContact`: the SES stand-in keeps the contacts itself.
#[tokio::test]
async fn the_tenants_own_topic_changes_reach_the_ses_contact_and_ses_own_are_not_echoed() {
    let w = World::new().await;
    sending_identities::set(&mut w.db().await, w.tenant.id, &["acme.example".into()]).await.unwrap();
    let ses = ses_standin::start(moto::endpoint(), Faults::default(), 1).expect("the SES stand-in");
    let mut sweeper = w.platform.sweeper();
    sweeper.config.ses_account = Some(moto::sdk_config().to_builder().endpoint_url(&ses.url).build());
    let body = json!({"contact_list": "members", "ses_topic": "weekly"});
    let (s, t) = w.call(Method::PUT, "/v1/topics/news/ses", None, Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{t}");
    // bob is a contact of the list already, opted in to another SES topic.
    let bob = ("members".to_owned(), "bob@example.com".to_owned());
    let offers =
        json!({"TopicPreferences": [{"TopicName": "offers", "SubscriptionStatus": "OPT_IN"}], "UnsubscribeAll": false});
    ses.counts.contacts.lock().unwrap().insert(bob, offers);
    let status = |address: &str, topic: &str| ses.counts.contact_topic("members", address, topic);
    let calls = || ses.counts.contact_calls.lock().unwrap().len();
    let pending = || w.count("SELECT count(*) FROM topic_ses_changes WHERE applied_at IS NULL", &[]);

    for address in ["ann@example.com", "bob@example.com"] {
        let (s, e) = w.call(Method::PUT, &format!("/v1/topic-opt-outs/{address}/news"), None, None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{e}");
    }
    // An unmapped topic's opt-out is Relay's only.
    let (s, _) = w.call(Method::PUT, "/v1/topic-opt-outs/ann@example.com/offers", None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!((calls(), pending().await), (0, 2), "the API kept the changes and called nobody");

    let report = sweeper.pass().await.unwrap();
    assert_eq!((report.ses_contacts_written, report.ses_contacts_failed), (2, 0), "{report:?}");
    assert_eq!(status("ann@example.com", "weekly").as_deref(), Some("OPT_OUT"), "ann's contact created");
    assert_eq!(status("bob@example.com", "weekly").as_deref(), Some("OPT_OUT"));
    assert_eq!(status("bob@example.com", "offers").as_deref(), Some("OPT_IN"), "bob's other topic kept");
    assert_eq!(status("ann@example.com", "offers"), None, "no SES topic for an unmapped one");
    assert_eq!(pending().await, 0);
    assert_eq!(sweeper.pass().await.unwrap().ses_contacts_written, 0, "written once");

    // The resubscribe, refused by SES at first: pending, with why; a later pass writes it.
    ses.counts.refuse_contacts.store(true, std::sync::atomic::Ordering::SeqCst);
    let (s, _) = w.call(Method::DELETE, "/v1/topic-opt-outs/ann@example.com/news", None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let report = sweeper.pass().await.unwrap();
    assert_eq!((report.ses_contacts_written, report.ses_contacts_failed), (0, 1), "{report:?}");
    assert_eq!(status("ann@example.com", "weekly").as_deref(), Some("OPT_OUT"), "not written yet");
    let why = "SELECT count(*) FROM topic_ses_changes WHERE applied_at IS NULL AND last_error LIKE '%TooManyRequests%'";
    assert_eq!(w.count(why, &[]).await, 1, "pending, with SES's refusal");
    ses.counts.refuse_contacts.store(false, std::sync::atomic::Ordering::SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while sweeper.pass().await.unwrap().ses_contacts_written == 0 {
        assert!(std::time::Instant::now() < deadline, "the refused change was never written");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(status("ann@example.com", "weekly").as_deref(), Some("OPT_IN"));
    assert_eq!(pending().await, 0);

    // carl unsubscribes through SES's own link: Relay opts him out (source provider) and writes
    // nothing back to SES.
    let sent = run(&w, "news-1", send("carl@example.com", Some("news"))).await;
    let id = sent["result"]["message_id"].as_str().unwrap().to_owned();
    let m = json!({"id": id, "provider_message_id": "ses-sub-carl", "correlation_id": "c"});
    let before = calls();
    let exec = w.platform.executor();
    crate::email::through_ingress(&w, &exec, vec![subscription("sub-c", &m, "members", "OptOut", "carl@example.com")])
        .await;
    let (_, list) = w.call(Method::GET, "/v1/topic-opt-outs?address=carl@example.com", None, None).await;
    assert_eq!(list["opt_outs"][0]["source"], "provider", "{list}");
    assert_eq!(pending().await, 0, "no change kept for SES's own");
    assert_eq!(sweeper.pass().await.unwrap().ses_contacts_written, 0);
    assert_eq!(calls(), before, "no call to SES for it");
}
