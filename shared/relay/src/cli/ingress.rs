//! `relay ingress send FILE`: a provider notification fed locally through the ingress
//! function's own handler (`taskdeck::lambda::ingress::Ingress::handle`), as if SQS had
//! delivered it. The file may hold an SES event (wrapped in an SNS envelope here), an SNS
//! envelope, or a whole SQS event (`{"Records": [...]}`). The handler makes one
//! `provider.event` job per record; a worker (`relay dev`'s) runs it.
//!
//! `relay ingress complete --token T`: an outside party's completion event
//! (`{"relay_completion": {...}}`), fed the same way: the wait its token names ends, once.

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use aws_lambda_events::sqs::SqsEvent;
use serde_json::{Value, json};
use taskdeck::job::terms::IdempotencyKey;
use taskdeck::lambda::ingress::Ingress;
use taskdeck::platform::Platform;
use taskdeck::store::{jobs, tenants, tooling};
use taskdeck::view::JobView;
use uuid::Uuid;

#[derive(clap::Subcommand)]
pub enum IngressCommand {
    /// Feed a provider notification (SES event, SNS envelope or SQS event; `-` reads stdin)
    /// through the ingress handler, then wait for the job it made and print it.
    Send {
        file: PathBuf,
        /// Address the SES event to this Relay message (its id, or its `email.send` job's id):
        /// sets the event's `relay_message_id` tag, and SES's message id when it is known.
        #[arg(long)]
        message: Option<Uuid>,
        /// The tenant that owns ingress jobs (as `RELAY_INGRESS_TENANT` on AWS).
        #[arg(long, env = "RELAY_INGRESS_TENANT", default_value = "platform")]
        tenant: String,
        /// Seconds to wait for a worker to run the job (0: do not wait).
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
    /// Feed an outside party's completion event through the ingress handler, then wait for
    /// the job it made and print it (its result says whether the completion applied).
    Complete {
        /// The token the waiting task handed out.
        #[arg(long)]
        token: String,
        /// `success` or `failure`.
        #[arg(long, default_value = "success")]
        outcome: String,
        /// The result, as JSON (with success).
        #[arg(long)]
        result: Option<String>,
        /// Why it failed (with failure).
        #[arg(long)]
        error: Option<String>,
        #[arg(long, env = "RELAY_INGRESS_TENANT", default_value = "platform")]
        tenant: String,
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
}

pub async fn run(p: &Platform, command: IngressCommand) -> anyhow::Result<()> {
    let (file, message, tenant, wait) = match command {
        IngressCommand::Send { file, message, tenant, wait } => (file, message, tenant, wait),
        IngressCommand::Complete { token, outcome, result, error, tenant, wait } => {
            let mut c = json!({ "token": token, "outcome": outcome });
            if let Some(r) = result {
                c["result"] = serde_json::from_str(&r).context("--result: not JSON")?;
            }
            if let Some(e) = error {
                c["error"] = json!(e);
            }
            let input = json!({ taskdeck::provider::COMPLETION_KEY: c });
            return feed(p, input, tenant, wait).await;
        }
    };
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).context("reading stdin")?;
        s
    } else {
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut input: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    if let Some(id) = message {
        let db = p.pool.get().await?;
        let (id, ses_id) = tooling::message_for_event(&db, id)
            .await?
            .with_context(|| format!("no message (or job with a message) {id}"))?;
        address_to(&mut input, id, ses_id.as_deref())?;
    }
    feed(p, input, tenant, wait).await
}

/// Hand the input to the ingress handler as SQS would, wait for each job it made, print it.
async fn feed(p: &Platform, input: Value, tenant: String, wait: f64) -> anyhow::Result<()> {
    let (event, keys) = as_sqs_event(input)?;
    let response = Ingress::new(p, &tenant).handle(event).await;
    if !response.batch_item_failures.is_empty() {
        anyhow::bail!("ingress could not store {} record(s); see the log above", response.batch_item_failures.len());
    }
    let owner = tenants::ensure(&p.pool.get().await?, &tenant).await?;
    for key in keys {
        let db = p.pool.get().await?;
        let Some(id) = tooling::job_by_key(&db, owner.id, key.as_str()).await? else {
            eprintln!(
                "relay ingress: record {} was not a provider event; kept in dead_letters (see the warning above)",
                key.as_str()
            );
            continue;
        };
        let deadline = Instant::now() + Duration::from_secs_f64(wait.clamp(0.0, 600.0));
        let job = loop {
            let job = jobs::get(&db, owner.id, id).await?.context("the job ingress made vanished")?;
            if job.status.is_terminal() || Instant::now() >= deadline {
                break job;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if !job.status.is_terminal() && wait > 0.0 {
            eprintln!(
                "relay ingress: job {id} is {} after {wait} s: is a worker (relay dev) running?",
                job.status.as_str()
            );
        }
        let view = JobView::bare(job);
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "id": view.id, "task_type": view.task_type, "status": view.status, "result": view.result, "last_error": view.last_error,
            }))?
        );
    }
    Ok(())
}

/// Set the SES event's Relay message tag (and SES's id when known), wherever the event sits.
fn address_to(input: &mut Value, id: Uuid, ses_id: Option<&str>) -> anyhow::Result<()> {
    let set = |event: &mut Value| -> anyhow::Result<()> {
        let mail = event
            .get_mut("mail")
            .and_then(Value::as_object_mut)
            .context("--message: the SES event has no `mail` object")?;
        if let Some(ses_id) = ses_id {
            mail.insert("messageId".into(), json!(ses_id));
        }
        let tags = mail.entry("tags").or_insert_with(|| json!({}));
        tags.as_object_mut()
            .context("--message: mail.tags is not an object")?
            .insert("relay_message_id".into(), json!([id]));
        Ok(())
    };
    if input.get("Records").is_some() {
        anyhow::bail!("--message applies to one SES event or SNS envelope, not to an SQS event");
    }
    if is_sns(input) {
        let mut event: Value = serde_json::from_str(input["Message"].as_str().unwrap_or_default())
            .context("--message: the SNS envelope's Message is not an SES event")?;
        set(&mut event)?;
        input["Message"] = json!(event.to_string());
        return Ok(());
    }
    set(input)
}

fn is_sns(v: &Value) -> bool {
    v.get("Type").is_some() && v.get("TopicArn").is_some()
}

/// The SQS event ingress receives for this input, and the idempotency key of each record's job.
fn as_sqs_event(input: Value) -> anyhow::Result<(SqsEvent, Vec<IdempotencyKey>)> {
    let records: Vec<Value> = if let Some(records) = input.get("Records") {
        records.as_array().context("Records is not an array")?.clone()
    } else {
        let envelope = if is_sns(&input) {
            input
        } else {
            json!({
                "Type": "Notification", "MessageId": Uuid::now_v7().to_string(),
                "TopicArn": "arn:aws:sns:local:000000000000:relay-dev-ses-events",
                "Subject": "Amazon SES Email Event Notification",
                "Message": input.to_string(), "Timestamp": chrono::Utc::now().to_rfc3339(),
            })
        };
        vec![json!({
            "messageId": Uuid::now_v7().to_string(),
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:local:000000000000:relay-ingress",
            "body": envelope.to_string(),
        })]
    };
    let mut keys = Vec::new();
    for r in &records {
        let body: Value = r["body"].as_str().and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
        let key = if is_sns(&body) {
            IdempotencyKey::provider_message("sns", body["MessageId"].as_str().unwrap_or_default())
        } else {
            IdempotencyKey::provider_message("sqs", r["messageId"].as_str().unwrap_or_default())
        };
        keys.extend(key);
    }
    let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).context("not an SQS event")?;
    Ok((event, keys))
}
