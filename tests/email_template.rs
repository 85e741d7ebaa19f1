//! Email templates as tenants write them: `urlencode` in `list_unsubscribe.url`, links in an
//! HTML template keeping their `/`, and inline templates (a message's own subject and bodies
//! rendered with `data`) in a single send and per recipient in a campaign.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::campaign::run_until_done;
use crate::email::{DOMAIN, executor, message_of, roles, sender, submit};
use crate::support::{World, moto};

fn send(params: Value) -> Value {
    let mut p = json!({"from": format!("Acme <noreply@{DOMAIN}>"), "to": ["bo@example.com"]});
    p.as_object_mut().unwrap().extend(params.as_object().unwrap().clone());
    json!({"task_type": "email.send", "params": p})
}

/// email.md tells tenants to percent-encode free text in `list_unsubscribe.url` with
/// `urlencode`: the filter exists, and the header carries the encoded URL.
#[tokio::test]
async fn urlencode_in_the_unsubscribe_url_renders_a_valid_header() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let body = send(json!({"subject": "News", "text": "Hello",
        "data": {"email": "bo+news@example.com", "list": "spring sale"},
        "list_unsubscribe": {"url": "https://acme.example/u?e={{ email|urlencode }}&l={{ list|urlencode }}"}}));
    let id = submit(&w, "u", body).await;
    exec.run_dispatched(&[id]).await.unwrap();
    let m = message_of(&w, id).await;
    assert_eq!(
        m["preview"]["headers"]["List-Unsubscribe"],
        "<https://acme.example/u?e=bo%2Bnews%40example.com&l=spring%20sale>",
        "{m}"
    );
    // Without the filter the space is not a URI: still a 422 at submit, naming the field.
    let raw = send(json!({"subject": "News", "text": "Hello", "data": {"list": "spring sale"},
        "list_unsubscribe": {"url": "https://acme.example/u?l={{ list }}"}}));
    let (status, e) = w.submit("raw", raw).await;
    assert_eq!(
        (status, e["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("params.list_unsubscribe.url")),
        "{e}"
    );
}

/// HTML output escapes what HTML needs (`& < > " '`), not the `/` of a link (minijinja's own
/// escape writes it `&#x2f;`), in a stored template and an inline one, `|e` included.
#[tokio::test]
async fn html_links_keep_their_slashes_and_markup_is_still_escaped() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let html = r#"<a href="{{ link }}">{{ name }}</a> <a href="{{ link|e }}">again</a>"#;
    let (status, t) =
        w.call(Method::PUT, "/v1/templates/links", None, Some(json!({"subject": "Hi", "html": html}))).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let data = json!({"link": "https://acme.example/a/b?x=1&y=2", "name": "<Bo> & \"Al\""});
    let stored = submit(&w, "stored", send(json!({"template": "links", "data": data}))).await;
    let inline = submit(&w, "inline", send(json!({"subject": "Hi", "html": html, "data": data}))).await;
    exec.run_dispatched(&[stored, inline]).await.unwrap();
    let want = r#"<a href="https://acme.example/a/b?x=1&amp;y=2">&lt;Bo&gt; &amp; &quot;Al&quot;</a> <a href="https://acme.example/a/b?x=1&amp;y=2">again</a>"#;
    for id in [stored, inline] {
        let m = message_of(&w, id).await;
        assert_eq!(m["preview"]["html"], want, "{m}");
        assert!(!m["preview"]["html"].as_str().unwrap().contains("&#x2f;"));
    }
}

/// A message's own subject/text/html are a template rendered with `data`, strictly, checked at
/// submit; content without template syntax is sent as given (its last line break too).
#[tokio::test]
async fn an_inline_template_renders_with_the_messages_data() {
    let w = World::new().await;
    sender(&w).await;
    let exec = executor(&w, moto::endpoint(), roles());
    let id = submit(
        &w,
        "inline",
        send(json!({"subject": "Hi {{ name }}", "text": "Hello {{ name }}, order {{ order.id }}\n",
            "html": "<p>{{ name }}</p>", "data": {"name": "<Bo>", "order": {"id": 42}}})),
    )
    .await;
    let plain = submit(&w, "plain", send(json!({"subject": "Plain", "text": "Hello\n"}))).await;
    exec.run_dispatched(&[id, plain]).await.unwrap();
    let p = &message_of(&w, id).await["preview"];
    assert_eq!(
        (p["subject"].as_str(), p["text"].as_str(), p["html"].as_str()),
        (Some("Hi <Bo>"), Some("Hello <Bo>, order 42\n"), Some("<p>&lt;Bo&gt;</p>")),
        "{p}"
    );
    assert_eq!(message_of(&w, plain).await["preview"]["text"], "Hello\n");

    // Strict, at submit, naming the part: a missing variable, a syntax error, a subject that
    // renders to two lines.
    let cases = [
        (json!({"subject": "Hi {{ name }}", "text": "x"}), "params.subject"),
        (json!({"subject": "Hi", "text": "{{ name", "data": {"name": "Bo"}}), "params.text"),
        (json!({"subject": "Hi", "html": "{{ missing }}", "data": {"name": "Bo"}}), "params.html"),
        (json!({"subject": "{{ name }}", "text": "x", "data": {"name": "a\nBcc: x@example.com"}}), "params.subject"),
    ];
    for (i, (params, field)) in cases.into_iter().enumerate() {
        let (status, e) = w.submit(&format!("bad{i}"), send(params)).await;
        assert_eq!((status, e["error"]["field"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some(field)), "{e}");
    }
}

/// A campaign whose message is an inline template: each child renders with its recipient's
/// data over the message's.
#[tokio::test]
async fn a_campaign_renders_an_inline_template_per_recipient() {
    let w = World::new().await;
    sender(&w).await;
    let body = json!({"task_type": "email.campaign", "correlation_id": "inline-campaign", "params": {
        "message": {"from": format!("News <news@{DOMAIN}>"), "subject": "{{ greeting }}, {{ name }}",
            "text": "Your code: {{ code }}", "data": {"greeting": "Hello"}},
        "recipients": [
            {"to": "a@example.com", "data": {"name": "Ann", "code": "A1"}},
            {"to": "b@example.com", "data": {"name": "Bo", "code": "B2", "greeting": "Hi"}}]}});
    let (status, parent) = w.submit("campaign", body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{parent}");
    let done = run_until_done(&w, parent["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    let (_, list) = w.call(Method::GET, "/v1/messages?correlation_id=inline-campaign", None, None).await;
    let mut got: Vec<(String, String)> = Vec::new();
    for m in list["messages"].as_array().unwrap() {
        let (_, m) = w.call(Method::GET, &format!("/v1/messages/{}", m["id"].as_str().unwrap()), None, None).await;
        got.push((m["preview"]["subject"].as_str().unwrap().into(), m["preview"]["text"].as_str().unwrap().into()));
    }
    got.sort();
    assert_eq!(
        got,
        [("Hello, Ann".to_owned(), "Your code: A1".to_owned()), ("Hi, Bo".to_owned(), "Your code: B2".to_owned())]
    );
}
