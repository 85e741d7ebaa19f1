//! Scenario 7, poison messages: malformed bodies, ids of jobs that do not exist and huge
//! bodies, mixed with healthy records, in the work queue (executor function) and the ingress
//! queue (ingress function), both on moto. Every poison record must be kept in `dead_letters`
//! with a reason; the batches' healthy records must run once each.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use super::harness;
use super::{Env, Report};
use crate::lambda::ingress::Ingress;
use crate::platform::Settings;
use crate::store::jobs::NewJob;
use crate::transport::sqs::WorkMessage;

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
    let mut poison_bodies: Vec<String> = Vec::new();
    for r in 0..rounds {
        let job = NewJob {
            id: uuid::Uuid::now_v7(),
            task_type: "test.effect".into(),
            params: json!({}),
            correlation_id: format!("poison-{r}"),
            idempotency_key: format!("poison-{r}"),
            request_hash: vec![0; 32],
            parent_id: None,
            run_at: chrono::Utc::now(),
            max_attempts: 3,
            timeout_seconds: 60,
            ..NewJob::default()
        };
        healthy.push(job.id);
        // Inserted straight through intake with the Postgres transport: nobody listens, so
        // only the SQS message below runs it.
        platform.intake.enqueue(scratch.tenant.id, vec![job]).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let good = serde_json::to_string(&WorkMessage { job_id: *healthy.last().unwrap_or(&uuid::Uuid::nil()), run_at: chrono::Utc::now() })?;
        let bad = [
            format!("not json {r}"),
            format!("{{\"job_id\": {r}}}"),
            serde_json::to_string(&WorkMessage { job_id: uuid::Uuid::now_v7(), run_at: chrono::Utc::now() })?,
            format!("{r}{}", "x".repeat(HUGE)),
        ];
        for body in std::iter::once(&good).chain(&bad) {
            client.send_message().queue_url(&work).message_body(body).send().await.map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
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
        let response = crate::lambda::executor::handle(&exec, event.clone(), None).await;
        let failed: Vec<String> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
        report.check(failed.is_empty(), format!("the executor returned {} records to the queue", failed.len()));
        harness::delete_acknowledged(&client, &work, &event, &failed).await?;
    }

    // Ingress: SNS notifications (healthy), bodies that are not JSON, SNS messages of the wrong
    // type, huge junk.
    let ingress = Ingress::new(platform, "platform");
    let mut ingress_poison = Vec::new();
    let mut notifications = HashSet::new();
    for r in 0..rounds {
        let message_id = uuid::Uuid::now_v7().to_string();
        notifications.insert(format!("sns:{message_id}"));
        let good = json!({"Type": "Notification", "MessageId": message_id, "TopicArn": "arn:aws:sns:us-east-1:123456789012:relay-ses",
            "Message": "{\"eventType\": \"Delivery\"}", "Timestamp": "2026-01-01T00:00:00Z"}).to_string();
        let bad = [
            format!("<xml>{r}</xml>"),
            json!({"Type": "SubscriptionConfirmation", "MessageId": format!("c{r}"), "TopicArn": "arn:aws:sns:us-east-1:1:t", "Message": "confirm"}).to_string(),
            format!("{r}{}", "y".repeat(HUGE)),
        ];
        for body in std::iter::once(&good).chain(&bad) {
            client.send_message().queue_url(&ingress_q).message_body(body).send().await.map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(e)))?;
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
    let kept: Vec<(String, String, String)> = db
        .query("SELECT source, body, reason FROM dead_letters", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let kept_bodies: HashSet<&str> = kept.iter().map(|(_, b, _)| b.as_str()).collect();
    let work_kept = poison_bodies.iter().filter(|b| kept_bodies.contains(b.as_str())).count();
    let ingress_kept = ingress_poison.iter().filter(|b| kept_bodies.contains(b.as_str())).count();
    let no_reason = kept.iter().filter(|(_, _, r)| r.trim().is_empty()).count();
    let runs: i64 = db.query_one("SELECT count(*) FROM effects_ledger WHERE job_id = ANY($1)", &[&healthy]).await?.get(0);
    let once: i64 = db
        .query_one("SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'succeeded' AND attempt = 1", &[&healthy])
        .await?
        .get(0);
    let events: i64 = db
        .query_one("SELECT count(*) FROM jobs WHERE task_type = 'provider.event' AND status = 'succeeded' AND attempt = 1 AND idempotency_key = ANY($1)",
            &[&notifications.iter().collect::<Vec<_>>()])
        .await?
        .get(0);
    report.fig("records received (both queues)", received);
    report.fig("work queue: poison sent / kept", format!("{} / {work_kept}", poison_bodies.len()));
    report.fig("ingress queue: poison sent / kept", format!("{} / {ingress_kept}", ingress_poison.len()));
    report.fig("dead letters without a reason", no_reason);
    report.fig("healthy work messages: jobs run once / effects", format!("{once} / {runs}"));
    report.fig("healthy notifications: provider events run once", events);
    report.check(work_kept == poison_bodies.len(), format!("{} work-queue poison messages not kept", poison_bodies.len() - work_kept));
    report.check(ingress_kept == ingress_poison.len(), format!("{} ingress poison records not kept", ingress_poison.len() - ingress_kept));
    report.check(no_reason == 0, "a dead letter has no reason");
    report.check(once == rounds as i64 && runs == rounds as i64, format!("healthy jobs: {once} ran once, {runs} effects, of {rounds}"));
    report.check(finished && events == rounds as i64, format!("{events} of {rounds} provider events ran"));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
