//! Scenario 9, tenant isolation. Tenant A owns real rows of every tenant-scoped kind: pending
//! jobs, sent (shadow) messages, a paged campaign waiting for its pages, templates and
//! suppressions. Tenant B then calls every tenant route that takes an id, a name, an address
//! or a filter with A's real identifiers, and each answer must equal B's answer for an
//! identifier that exists nowhere (normalised: the identifier itself and timestamps aside). B's
//! cancels, deletes, puts and page uploads must leave every row A owns exactly as it was; B's
//! submissions under A's idempotency keys make B's own jobs. Then both tenants hammer the API
//! through a two-connection pool while a share of requests is aborted mid-flight: no answer
//! may carry the other tenant's rows.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde_json::{Value, json};

use super::harness::{self, Http};
use super::{Env, Report};
use taskdeck::platform::Settings;
use taskdeck::store::tenants;
use taskdeck::store::tooling::readouts;

/// An answer with the probed identifier replaced and timestamps dropped, so B's answer for
/// A's identifier compares with its answer for a missing one. A change feed's resume cursor
/// that names no job (the nil id) is only a time: it is dropped too; one naming a job stays.
fn normalise(v: &Value, ident: &str) -> Value {
    let timeless = |k: &str, x: &Value| {
        k.ends_with("_at")
            || (k == "resume_cursor"
                && x.as_str().and_then(taskdeck::api::cursor::decode).is_some_and(|(_, id)| id.is_nil()))
    };
    match v {
        Value::String(s) => Value::String(s.replace(ident, "<ident>")),
        Value::Array(xs) => Value::Array(xs.iter().map(|x| normalise(x, ident)).collect()),
        Value::Object(m) => Value::Object(
            m.iter().filter(|(k, x)| !timeless(k, x)).map(|(k, x)| (k.clone(), normalise(x, ident))).collect(),
        ),
        v => v.clone(),
    }
}

/// One probe: a route template with `{}` for the identifier, and a body.
struct Probe {
    method: &'static str,
    route: &'static str,
    body: Option<Value>,
}

fn probe(method: &'static str, route: &'static str, body: Option<Value>) -> Probe {
    Probe { method, route, body }
}

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("isolation", env.scale);
    let scratch = env.scratch(Settings::default()).await?;
    let a_tenant = scratch.tenant.id;
    let (b_tenant, b_key) = tenants::create(&scratch.platform.pool.get().await?, "other").await?;
    taskdeck::store::sending_identities::set(
        &mut scratch.platform.pool.get().await?,
        a_tenant,
        &["chaos.example".into()],
    )
    .await?;
    let a_key = scratch.key.clone();
    let (_server, http) =
        harness::serve(&env.relay, &scratch.url, &[("RELAY_POOL_SIZE", "2".into())], &env.log("isolation-serve"))
            .await?;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let workers = scratch.platform.spawn_workers(1, &stop);

    // A's rows. Pending jobs (due in an hour: B could try to cancel them).
    let n = env.n(50, 5);
    let mut a_ids = Vec::new();
    let mut a_corrs = Vec::new();
    for i in 0..n {
        let body = json!({"task_type": "noop", "correlation_id": format!("a-corr-{i}"), "delay_seconds": 3600});
        a_ids.push(submit(&http, &a_key, &format!("a-{i}"), &body).await?);
        a_corrs.push(format!("a-corr-{i}"));
    }
    // Sent messages (shadow mode records each one).
    let m = env.n(20, 3);
    let mut mail_jobs = Vec::new();
    for i in 0..m {
        let body = json!({"task_type": "email.send", "correlation_id": format!("a-mail-{i}"),
            "params": {"from": "noreply@chaos.example", "to": [format!("a-rcpt-{i}@victim.example")], "subject": format!("A's mail {i}"), "text": "secret"}});
        mail_jobs.push(submit(&http, &a_key, &format!("a-mail-{i}"), &body).await?);
        a_corrs.push(format!("a-mail-{i}"));
    }
    // A paged campaign, held until its pages arrive.
    let campaign = submit(
        &http,
        &a_key,
        "a-campaign",
        &json!({"task_type": "email.campaign",
        "params": {"message": {"from": "noreply@chaos.example", "subject": "A's campaign", "text": "x"}, "pages": 2}}),
    )
    .await?;
    let mut templates = Vec::new();
    let mut addresses = Vec::new();
    for i in 0..env.n(10, 3) {
        let name = format!("a-tpl-{i}");
        let (status, body) = http
            .call(
                "PUT",
                &format!("/v1/templates/{name}"),
                Some(&a_key),
                None,
                Some(&json!({"subject": format!("A's subject {i}"), "text": "A's text"})),
            )
            .await?;
        anyhow::ensure!(status == 200, "A's template answered {status}: {body}");
        templates.push(name);
        let address = format!("a-sup-{i}@victim.example");
        let (status, body) = http.call("PUT", &format!("/v1/suppressions/{address}"), Some(&a_key), None, None).await?;
        anyhow::ensure!(status == 204, "A's suppression answered {status}: {body}");
        addresses.push(address);
    }
    let pool = scratch.platform.pool.clone();
    let sent = harness::wait_until(Duration::from_secs(60), || async {
        let Ok(db) = pool.get().await else { return false };
        readouts::count_messages(&db, a_tenant).await.is_ok_and(|sent| sent == m as i64)
    })
    .await;
    anyhow::ensure!(sent, "A's {m} email jobs did not record their messages");
    let _ = stop_tx.send(true);
    futures::future::join_all(workers).await;
    let mut messages = Vec::new();
    for job in &mail_jobs {
        let (_, list) = http.call("GET", &format!("/v1/messages?job_id={job}"), Some(&a_key), None, None).await?;
        messages.extend(
            list["messages"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str().map(str::to_owned)),
        );
    }
    anyhow::ensure!(messages.len() == m, "A sees {} of its {m} messages", messages.len());
    let db = scratch.platform.pool.get().await?;
    let before = readouts::tenant_rows(&db, a_tenant).await?;

    // The matrix, as B: A's identifier against one that exists nowhere, kind by kind, in order
    // (a template: read, delete, put B's own, read it, delete it).
    let page = json!({"recipients": [{"to": "b@example.com"}]});
    let by_job = [
        probe("GET", "/v1/jobs/{}", None),
        probe("GET", "/v1/jobs/{}/events", None),
        probe("GET", "/v1/jobs/{}/sessions", None),
        probe("GET", "/v1/jobs/{}/callbacks", None),
        probe("POST", "/v1/jobs/{}/cancel", None),
        probe("PUT", "/v1/jobs/{}/recipients/0", Some(page)),
        probe("GET", "/v1/messages?job_id={}", None),
    ];
    let by_corr =
        [probe("GET", "/v1/jobs?correlation_id={}", None), probe("GET", "/v1/messages?correlation_id={}", None)];
    let by_message = [probe("GET", "/v1/messages/{}", None)];
    let b_template = json!({"subject": "B's subject", "text": "B's text"});
    let by_template = [
        probe("GET", "/v1/templates/{}", None),
        probe("DELETE", "/v1/templates/{}", None),
        probe("PUT", "/v1/templates/{}", Some(b_template)),
        probe("GET", "/v1/templates/{}", None),
        probe("DELETE", "/v1/templates/{}", None),
    ];
    let by_address = [
        probe("DELETE", "/v1/suppressions/{}", None),
        probe("PUT", "/v1/suppressions/{}", None),
        probe("DELETE", "/v1/suppressions/{}", None),
    ];
    let all_jobs: Vec<String> = a_ids.iter().chain(&mail_jobs).chain([&campaign]).cloned().collect();
    let uuid = || uuid::Uuid::now_v7().to_string();
    /// What a kind of id is called, the probes that take it, the ids of the victim, a stranger's.
    type Kind<'a> = (&'a str, &'a [Probe], &'a [String], Box<dyn Fn() -> String>);
    let kinds: Vec<Kind> = vec![
        ("job id", &by_job, &all_jobs, Box::new(uuid)),
        ("correlation id", &by_corr, &a_corrs, Box::new(|| format!("zz-corr-{}", uuid::Uuid::now_v7().simple()))),
        ("message id", &by_message, &messages, Box::new(uuid)),
        ("template name", &by_template, &templates, Box::new(|| format!("zz-tpl-{}", uuid::Uuid::now_v7().simple()))),
        (
            "address",
            &by_address,
            &addresses,
            Box::new(|| format!("zz-{}@missing.example", uuid::Uuid::now_v7().simple())),
        ),
    ];
    let mut cells = 0;
    let mut distinguishable = Vec::new();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for (kind, probes, idents, missing) in &kinds {
        for ident in idents.iter() {
            let other = missing();
            for p in probes.iter() {
                let theirs =
                    http.call(p.method, &p.route.replace("{}", ident), Some(&b_key), None, p.body.as_ref()).await?;
                let nowhere =
                    http.call(p.method, &p.route.replace("{}", &other), Some(&b_key), None, p.body.as_ref()).await?;
                cells += 1;
                *by_status.entry(format!("{} {}", p.method, theirs.0)).or_default() += 1;
                if (theirs.0, normalise(&theirs.1, ident)) != (nowhere.0, normalise(&nowhere.1, &other)) {
                    distinguishable.push(format!(
                        "{kind}: {} {}: {} {} vs {} {}",
                        p.method, p.route, theirs.0, theirs.1, nowhere.0, nowhere.1
                    ));
                }
            }
        }
    }
    // B's own lists after the matrix: B deleted what it put, so nothing of A's may show.
    let (_, b_templates) = http.call("GET", "/v1/templates", Some(&b_key), None, None).await?;
    let (_, b_sups) = http.call("GET", "/v1/suppressions?limit=500", Some(&b_key), None, None).await?;
    let in_b_lists = templates
        .iter()
        .chain(&addresses)
        .filter(|x| b_templates.to_string().contains(x.as_str()) || b_sups.to_string().contains(x.as_str()))
        .count();
    let after = readouts::tenant_rows(&db, a_tenant).await?;
    let changed: Vec<String> = before
        .iter()
        .map(|(table, rows)| {
            let now = after.get(table).cloned().unwrap_or_default();
            let gone = rows.iter().filter(|r| !now.contains(r)).count();
            let new = now.iter().filter(|r| !rows.contains(r)).count();
            (table, gone, new)
        })
        .filter(|(_, gone, new)| gone + new > 0)
        .map(|(t, g, n)| format!("{t}: {g} rows changed or gone, {n} new"))
        .collect();
    // A's campaign still takes its first page as new.
    let (a_page, a_receipt) = http
        .call(
            "PUT",
            &format!("/v1/jobs/{campaign}/recipients/0"),
            Some(&a_key),
            None,
            Some(&json!({"recipients": [{"to": "a@example.com"}]})),
        )
        .await?;
    let page_intact = a_page == 201 && a_receipt["pages_received"] == 1;

    // A's idempotency keys, as B: B's own new jobs, never A's.
    let mut b_ids = HashSet::new();
    let mut key_leaks = 0;
    for i in 0..n {
        let body = json!({"task_type": "noop", "correlation_id": format!("a-corr-{i}"), "delay_seconds": 3600});
        let (status, job) = http.call("POST", "/v1/jobs", Some(&b_key), Some(&format!("a-{i}")), Some(&body)).await?;
        let id = job["id"].as_str().unwrap_or_default().to_owned();
        if status != 202 || all_jobs.contains(&id) {
            key_leaks += 1;
        }
        b_ids.insert(id);
    }
    let batch: Vec<Value> = (0..n.min(500))
        .map(|i| json!({"idempotency_key": format!("a-b{i}"), "task_type": "noop", "delay_seconds": 3600}))
        .collect();
    let (_, a_batch) = http.call("POST", "/v1/jobs:batch", Some(&a_key), None, Some(&json!({"jobs": batch}))).await?;
    let a_batch_ids: HashSet<String> = a_batch["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["job"]["id"].as_str().map(str::to_owned))
        .collect();
    let (_, b_batch) = http.call("POST", "/v1/jobs:batch", Some(&b_key), None, Some(&json!({"jobs": batch}))).await?;
    for r in b_batch["results"].as_array().into_iter().flatten() {
        let id = r["job"]["id"].as_str().unwrap_or_default().to_owned();
        if r["status"] != 202 || a_batch_ids.contains(&id) {
            key_leaks += 1;
        }
        b_ids.insert(id);
    }
    let (_, a_feed) = http.call("GET", "/v1/jobs?limit=500", Some(&a_key), None, None).await?;
    let a_all: HashSet<String> =
        a_feed["jobs"].as_array().into_iter().flatten().filter_map(|j| j["id"].as_str().map(str::to_owned)).collect();

    // Aborted requests through a two-connection pool, both tenants at once.
    let requests = env.n(4000, 300);
    let (leaks, aborted, answered) = hammer(&http, &a_key, &b_key, &a_all, &b_ids, &a_ids, requests).await?;

    let b_rows = readouts::jobs(&db).await?.iter().filter(|j| j.tenant_id == b_tenant.id).count() as i64;
    let cross = readouts::keys_across_tenants(&db).await?;
    let a_owned: usize = before.values().map(Vec::len).sum();
    report.fig(
        "A's rows (jobs, keys, messages, templates, suppressions, pages)",
        before.iter().map(|(t, r)| format!("{t} {}", r.len())).collect::<Vec<_>>().join(", "),
    );
    report.fig("matrix cells (route × A's identifier, as B)", cells);
    report.fig("B's answers to A's identifiers by method and status", &by_status);
    report.fig("cells distinguishable from not-found", distinguishable.len());
    report.fig("A's rows changed by B's calls", changed.len());
    report.fig("A's names and addresses in B's lists", in_b_lists);
    report.fig(
        "A's first campaign page after B's upload (status, pages received)",
        format!("{a_page}, {}", a_receipt["pages_received"]),
    );
    report.fig("A's idempotency keys reused by B: leaks", key_leaks);
    report.fig("requests under abort / aborted / answered", format!("{requests} / {aborted} / {answered}"));
    report.fig("answers carrying the other tenant's rows", leaks);
    report.fig("cross-tenant rows (keys ↔ jobs)", cross);
    for d in distinguishable.iter().take(5) {
        report.check(false, format!("distinguishable: {d}"));
    }
    report.check(distinguishable.is_empty(), format!("{} cells distinguishable from not-found", distinguishable.len()));
    report.check(changed.is_empty(), format!("B's calls changed A's rows ({a_owned} before): {}", changed.join("; ")));
    report.check(in_b_lists == 0, format!("{in_b_lists} of A's templates or suppressions showed in B's lists"));
    report.check(page_intact, format!("A's first campaign page answered {a_page} {a_receipt}: B's upload landed"));
    report.check(key_leaks == 0, format!("{key_leaks} submissions under A's keys did not make B's own job"));
    report.check(leaks == 0, format!("{leaks} answers carried the other tenant's rows"));
    report.check(cross == 0, format!("{cross} cross-tenant rows"));
    report.check(b_rows == b_ids.len() as i64, format!("B has {b_rows} rows but was answered {} ids", b_ids.len()));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// A's submission; its job id.
async fn submit(http: &Http, key: &str, idem: &str, body: &Value) -> anyhow::Result<String> {
    let (status, job) = http.call("POST", "/v1/jobs", Some(key), Some(idem), Some(body)).await?;
    anyhow::ensure!(status == 202, "A's submit answered {status}: {job}");
    Ok(job["id"].as_str().unwrap_or_default().to_owned())
}

/// Mixed reads by both tenants, a third of them cut off after a random 0–5 ms. Returns
/// (answers with the other tenant's ids, aborted, answered).
async fn hammer(
    http: &Http,
    a_key: &str,
    b_key: &str,
    a_all: &HashSet<String>,
    b_ids: &HashSet<String>,
    a_ids: &[String],
    requests: usize,
) -> anyhow::Result<(usize, usize, usize)> {
    let a_all = Arc::new(a_all.clone());
    let b_ids = Arc::new(b_ids.clone());
    let b_list: Vec<String> = b_ids.iter().cloned().collect();
    let mut leaks = 0;
    let mut aborted = 0;
    let mut answered = 0;
    for chunk in (0..requests).collect::<Vec<_>>().chunks(32) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| {
                let as_a = i % 2 == 0;
                let (key, own_ids) = if as_a { (a_key.to_owned(), a_ids) } else { (b_key.to_owned(), &b_list[..]) };
                let own = if own_ids.is_empty() { String::new() } else { own_ids[i % own_ids.len()].clone() };
                let path = match i % 3 {
                    0 => "/v1/jobs?limit=500".to_owned(),
                    1 => format!("/v1/jobs/{own}"),
                    _ => format!("/v1/jobs/{own}/events"),
                };
                let cut = rand::rng()
                    .random_bool(1.0 / 3.0)
                    .then(|| Duration::from_micros(rand::rng().random_range(0..5000)));
                let (http, a_all, b_ids) = (http.clone(), a_all.clone(), b_ids.clone());
                tokio::spawn(async move {
                    let call = http.call("GET", &path, Some(&key), None, None);
                    let answer = match cut {
                        Some(d) => match tokio::time::timeout(d, call).await {
                            Ok(a) => a?,
                            Err(_) => return anyhow::Ok((0, 1, 0)),
                        },
                        None => call.await?,
                    };
                    let other: &HashSet<String> = if as_a { &b_ids } else { &a_all };
                    let text = answer.1.to_string();
                    let leaked = other.iter().any(|id| text.contains(id.as_str()));
                    anyhow::Ok((usize::from(leaked), 0, 1))
                })
            })
            .collect();
        for t in tasks {
            let (l, a, n) = t.await??;
            leaks += l;
            aborted += a;
            answered += n;
        }
    }
    Ok((leaks, aborted, answered))
}
