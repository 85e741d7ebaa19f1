//! Scenario 7, poison messages: malformed bodies, ids of jobs that do not exist and huge
//! bodies, mixed with healthy records, in the work queue (executor function) and the ingress
//! queue (ingress function), both on moto. Every poison record must be kept in `dead_letters`
//! exactly once, under its own queue and with the reason its kind of poison should get (not
//! JSON, not a work message, no such job, not an SNS notification); nothing else may be kept;
//! the batches' healthy records must run once each and both queues must end empty.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::harness;
use super::{Env, Report};
use taskdeck::job::JobStatus;
use taskdeck::job::terms::{IdempotencyKey, Limits};
use taskdeck::lambda::ingress::Ingress;
use taskdeck::platform::Settings;
use taskdeck::store::effects;
use taskdeck::store::jobs::Job;
use taskdeck::store::jobs::NewJob;
use taskdeck::store::tooling::readouts;
use taskdeck::transport::sqs::WorkMessage;

/// Just under SQS's 256 KiB message limit.
const HUGE: usize = 250 * 1024;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("poison", env.scale);
    let rounds = env.n(20, 2);
    let scratch = env.scratch(Settings::default()).await?;
    let client = harness::sqs_client(&env.moto().await?);
    let work = harness::new_queue(&client, "chaos-work").await?;
    let ingress_q = harness::new_queue(&client, "chaos-ingress").await?;
    let platform = &scratch.platform;

    // Healthy jobs whose messages share batches with the poison.
    let mut healthy = Vec::new();
    // (body, the reason it should be kept with), per queue.
    let mut poison_bodies: Vec<(String, String)> = Vec::new();
    for r in 0..rounds {
        let key = IdempotencyKey::parse(&format!("poison-{r}")).expect("a valid key");
        let job = NewJob { limits: Limits::fixed(3, 60), ..NewJob::new("test.effect", json!({}), key) };
        healthy.push(job.id);
        // Inserted straight through intake with the Postgres transport: nobody listens, so
        // only the SQS message below runs it.
        platform.intake.enqueue(scratch.tenant.id, vec![job]).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let good = serde_json::to_string(&WorkMessage {
            job_id: *healthy.last().unwrap_or(&taskdeck::job::JobId::from_uuid(uuid::Uuid::nil())),
            run_at: chrono::Utc::now(),
        })?;
        let nobody = taskdeck::job::JobId::new();
        let not_work = "not a work message".to_owned();
        let bad = [
            (format!("not json {r}"), not_work.clone()),
            (format!("{{\"job_id\": {r}}}"), not_work.clone()),
            (
                serde_json::to_string(&WorkMessage { job_id: nobody, run_at: chrono::Utc::now() })?,
                format!("no job {nobody} exists"),
            ),
            (format!("{r}{}", "x".repeat(HUGE)), not_work),
        ];
        for body in std::iter::once(&good).chain(bad.iter().map(|(b, _)| b)) {
            client
                .send_message()
                .queue_url(&work)
                .message_body(body)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
        }
        poison_bodies.extend(bad);
    }
    let exec = platform.executor();
    let mut received = 0;
    for _ in 0..1000 {
        let event = harness::receive_event(&client, &work, 0).await?;
        if event.records.is_empty() {
            break;
        }
        received += event.records.len();
        let response = taskdeck::lambda::executor::handle(&exec, event.clone(), None).await;
        let failed: Vec<String> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
        report.check(failed.is_empty(), format!("the executor returned {} records to the queue", failed.len()));
        harness::delete_acknowledged(&client, &work, &event, &failed).await?;
    }

    // Ingress: SNS notifications (healthy), bodies that are not JSON, SNS messages of the wrong
    // type, huge junk.
    let ingress = Ingress::new(platform, "platform");
    let mut ingress_poison: Vec<(String, String)> = Vec::new();
    let mut notifications = HashSet::new();
    for r in 0..rounds {
        let message_id = uuid::Uuid::now_v7().to_string();
        notifications.insert(format!("sns:{message_id}"));
        let good = json!({"Type": "Notification", "MessageId": message_id, "TopicArn": "arn:aws:sns:us-east-1:123456789012:relay-ses",
            "Message": "{\"eventType\": \"Delivery\"}", "Timestamp": "2026-01-01T00:00:00Z"}).to_string();
        let not_json = "the body is not JSON".to_owned();
        let bad = [
            (format!("<xml>{r}</xml>"), not_json.clone()),
            (json!({"Type": "SubscriptionConfirmation", "MessageId": format!("c{r}"), "TopicArn": "arn:aws:sns:us-east-1:1:t", "Message": "confirm"}).to_string(),
                "SNS message of type \"SubscriptionConfirmation\", not a Notification".to_owned()),
            (format!("{r}{}", "y".repeat(HUGE)), not_json),
        ];
        for body in std::iter::once(&good).chain(bad.iter().map(|(b, _)| b)) {
            client
                .send_message()
                .queue_url(&ingress_q)
                .message_body(body)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
        }
        ingress_poison.extend(bad);
    }
    for _ in 0..1000 {
        let event = harness::receive_event(&client, &ingress_q, 0).await?;
        if event.records.is_empty() {
            break;
        }
        received += event.records.len();
        let response = ingress.handle(event.clone()).await;
        let failed: Vec<String> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
        report.check(failed.is_empty(), format!("ingress returned {} records to the queue", failed.len()));
        harness::delete_acknowledged(&client, &ingress_q, &event, &failed).await?;
    }
    // The provider events ingress created run on a worker loop here.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let workers = platform.spawn_workers(1, &stop);
    let pool = platform.pool.clone();
    let finished = harness::wait_until(Duration::from_secs(60), || harness::all_terminal(&pool)).await;
    let _ = stop_tx.send(true);
    futures::future::join_all(workers).await;

    let db = pool.get().await?;
    let kept: Vec<(String, String, String)> =
        readouts::dead_letters(&db).await?.into_iter().map(|d| (d.source, d.body, d.reason)).collect();
    // Each poison body kept once, under its own queue, with its kind's reason.
    let placed = |poison: &[(String, String)], source: &str| {
        poison
            .iter()
            .filter(|(body, reason)| {
                let rows: Vec<_> = kept.iter().filter(|(_, b, _)| b == body).collect();
                rows.len() == 1 && rows[0].0 == source && rows[0].2.starts_with(reason.as_str())
            })
            .count()
    };
    let arn = |url: &str| format!("arn:aws:sqs:us-east-1:123456789012:{}", url.rsplit('/').next().unwrap_or("q"));
    let work_kept = placed(&poison_bodies, &format!("executor:{}", arn(&work)));
    let ingress_kept = placed(&ingress_poison, &format!("ingress:{}", arn(&ingress_q)));
    let poison_total = poison_bodies.len() + ingress_poison.len();
    let reasons: std::collections::BTreeMap<String, usize> =
        kept.iter().fold(Default::default(), |mut m, (s, _, r)| {
            // The reason's first words, ids masked: one entry per kind of poison.
            let words: Vec<&str> = r
                .split_whitespace()
                .take(5)
                .map(|w| if w.chars().any(|c| c.is_ascii_digit()) { "<id>" } else { w })
                .collect();
            *m.entry(format!("{}: {}", s.split(':').next().unwrap_or(""), words.join(" "))).or_default() += 1;
            m
        });
    let left = left_in(&client, &work).await? + left_in(&client, &ingress_q).await?;
    let runs = effects::count_among(&db, &healthy).await?;
    let first_time = |j: &&Job| j.status == JobStatus::Succeeded && j.attempt == 1;
    let once = readouts::jobs_among(&db, &healthy).await?.iter().filter(first_time).count() as i64;
    let events = readouts::jobs(&db)
        .await?
        .iter()
        .filter(|j| j.task_type == "provider.event" && notifications.contains(&j.idempotency_key))
        .filter(first_time)
        .count() as i64;
    report.fig("records received (both queues)", received);
    report.fig(
        "work queue: poison sent / kept once, in place, with its reason",
        format!("{} / {work_kept}", poison_bodies.len()),
    );
    report.fig(
        "ingress queue: poison sent / kept once, in place, with its reason",
        format!("{} / {ingress_kept}", ingress_poison.len()),
    );
    report.fig("dead letters (all) / poison sent", format!("{} / {poison_total}", kept.len()));
    report.fig("dead letters by place and reason", &reasons);
    report.fig("messages left in the queues", left);
    report.fig("healthy work messages: jobs run once / effects", format!("{once} / {runs}"));
    report.fig("healthy notifications: provider events run once", events);
    report.check(
        work_kept == poison_bodies.len(),
        format!(
            "{} work-queue poison messages not kept once under the work queue with their reason",
            poison_bodies.len() - work_kept
        ),
    );
    report.check(
        ingress_kept == ingress_poison.len(),
        format!(
            "{} ingress poison records not kept once under the ingress queue with their reason",
            ingress_poison.len() - ingress_kept
        ),
    );
    report.check(kept.len() == poison_total, format!("{} dead letters for {poison_total} poison messages", kept.len()));
    report.check(left == 0, format!("{left} messages left in the queues"));
    report.check(
        once == rounds as i64 && runs == rounds as i64,
        format!("healthy jobs: {once} ran once, {runs} effects, of {rounds}"),
    );
    report.check(finished && events == rounds as i64, format!("{events} of {rounds} provider events ran"));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// Messages still in a queue, visible or in flight.
async fn left_in(client: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<i64> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
    let attrs = out.attributes();
    let get = |a: A| attrs.and_then(|m| m.get(&a)).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    Ok(get(A::ApproximateNumberOfMessages) + get(A::ApproximateNumberOfMessagesNotVisible))
}
