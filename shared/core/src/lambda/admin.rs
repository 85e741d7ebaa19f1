//! The admin function: what an operator did with a direct database connection, done from
//! inside the VPC by `aws lambda invoke --function-name <stack>-admin --payload '{...}'`.
//! Each invocation names an `action` and an `actor` (who asks; the IAM caller is in CloudTrail)
//! and writes one `admin_actions` row, whatever the outcome. The answer is JSON: `{"ok": true,
//! ...}` or `{"ok": false, "error": {"code", "message"}}`; never a crash, never a key in a log.
//!
//! Actions: `migrate`; `tenant.create`, `operator.create`, `status_key.create` (`name`; the
//! answer holds the new key, shown once); `dead_letters.redrive` (`queue`: `work` or
//! `ingress`, `max` messages, default 100), which moves messages from a dead-letter queue back
//! to the queue it serves.

use serde_json::{Value, json};

use crate::config::LambdaConfig;
use crate::platform::Platform;
use crate::store::{admin_actions, operators, status_keys, tenants};
use crate::transport::sqs;

/// Longest `name` or `actor` accepted.
const MAX_NAME: usize = 100;

/// Apply pending migrations and ensure the built-in schedules (what `relay migrate` does);
/// the names of the migrations applied.
pub async fn migrate(platform: &Platform, retention_days: u32) -> anyhow::Result<Vec<&'static str>> {
    let applied = platform.migrate().await?;
    crate::schedules::ensure_builtin(&platform.pool, retention_days.clamp(1, 3650), chrono::Utc::now()).await?;
    Ok(applied)
}

/// A refusal: a stable code and what to fix.
#[derive(Debug)]
struct Refused {
    code: &'static str,
    message: String,
}

fn refused(code: &'static str, message: impl Into<String>) -> Refused {
    Refused { code, message: message.into() }
}

/// What the admin function holds per container.
pub struct Admin {
    pub platform: Platform,
    sqs: aws_sdk_sqs::Client,
    retention_days: u32,
    /// The queues `dead_letters.redrive` moves messages between, for `work` and `ingress`.
    work: Option<Redrive>,
    ingress: Option<Redrive>,
}

/// A dead-letter queue's URL and that of the queue it serves.
struct Redrive {
    dlq: String,
    queue: String,
}

impl Admin {
    pub fn new(cfg: &LambdaConfig, platform: Platform, sdk: &aws_config::SdkConfig) -> Self {
        let pair = |dlq: &Option<String>, queue: &Option<String>| {
            dlq.clone().zip(queue.clone()).map(|(dlq, queue)| Redrive { dlq, queue })
        };
        Self {
            platform,
            sqs: sqs::SqsTransport::client(sdk),
            retention_days: cfg.retention_days,
            work: pair(&cfg.work_dlq_url, &cfg.work_queue_url),
            ingress: pair(&cfg.ingress_dlq_url, &cfg.ingress_queue_url),
        }
    }

    /// One invocation: act, audit, answer.
    pub async fn handle(&self, event: &Value, request_id: Option<&str>) -> Value {
        let action = event["action"].as_str().unwrap_or_default();
        let actor = event["actor"].as_str().unwrap_or_default();
        let outcome = match checked_name("actor", actor) {
            Ok(_) => self.act(action, event).await,
            Err(e) => Err(e),
        };
        let (ok, answer) = match outcome {
            Ok(v) => (true, v),
            Err(e) => (false, json!({"error": {"code": e.code, "message": e.message}})),
        };
        // The audit never holds a key: only the action's inputs and the answer's other fields,
        // each as text Postgres can store (no NUL) and at most 200 characters.
        let mut detail = json!({});
        for k in ["name", "queue", "max"] {
            if let Some(v) = event.get(k) {
                detail[k] = storable(v);
            }
        }
        for (k, v) in answer.as_object().into_iter().flatten().filter(|(k, _)| k.as_str() != "key") {
            detail[k] = storable(v);
        }
        let audit_action =
            if action.is_empty() || action.len() > MAX_NAME || action.contains('\0') { "invalid" } else { action };
        let audit_actor = if ok || checked_name("actor", actor).is_ok() { actor } else { "unknown" };
        let audited = async {
            let db = self.platform.pool.get().await?;
            admin_actions::record(&db, audit_action, audit_actor, request_id, ok, &detail).await
        };
        let audited = audited.await;
        tracing::info!(
            event = "relay.admin.action",
            action = audit_action,
            actor = audit_actor,
            ok,
            audited = audited.is_ok(),
            "admin action"
        );
        crate::metrics::emf::record(&[
            ("AdminActions", 1.0),
            ("AdminRefused", f64::from(u8::from(!ok))),
            ("DatabaseErrors", crate::metrics::emf::database_errors()),
        ]);
        let mut answer = answer;
        answer["ok"] = json!(ok);
        if let Err(e) = audited {
            // An action whose audit could not be written still happened (a migration, a key):
            // say so rather than hide it.
            answer["audit_error"] = json!(e.to_string());
        }
        answer
    }

    async fn act(&self, action: &str, event: &Value) -> Result<Value, Refused> {
        let unavailable = |e: &dyn std::fmt::Display| refused("unavailable", e.to_string());
        match action {
            "migrate" => {
                let applied =
                    migrate(&self.platform, self.retention_days).await.map_err(|e| unavailable(&format!("{e:#}")))?;
                Ok(json!({"migrations_applied": applied}))
            }
            "tenant.create" | "operator.create" | "status_key.create" => {
                let name = checked_name("name", event["name"].as_str().unwrap_or_default())?;
                if action == "operator.create" && !operators::valid_name(name) {
                    return Err(refused("invalid_name", "an operator name is 1 to 100 letters, digits or `_.@:-`"));
                }
                let db = self.platform.pool.get().await.map_err(|e| unavailable(&e))?;
                let created = match action {
                    "tenant.create" => {
                        tenants::create(&db, name).await.map(|(t, key)| json!({"tenant_id": t.id, "key": key}))
                    }
                    "operator.create" => operators::create(&db, name).await.map(|(_, key)| json!({"key": key})),
                    _ => status_keys::create(&db, name).await.map(|(_, key)| json!({"key": key})),
                };
                created.map_err(|e| match e.is_unavailable() {
                    true => unavailable(&e),
                    false => refused("name_taken", format!("could not create {name:?} (is the name taken?)")),
                })
            }
            "dead_letters.redrive" => {
                let Redrive { dlq, queue } = match event["queue"].as_str() {
                    Some("work") => self.work.as_ref(),
                    Some("ingress") => self.ingress.as_ref(),
                    _ => return Err(refused("invalid_queue", "queue must be \"work\" or \"ingress\"")),
                }
                .ok_or_else(|| {
                    refused("not_configured", "this function has no URL for that queue or its dead-letter queue")
                })?;
                let max = match &event["max"] {
                    Value::Null => 100,
                    v => v
                        .as_u64()
                        .filter(|n| (1..=10_000).contains(n))
                        .ok_or_else(|| refused("invalid_max", "max is a whole number from 1 to 10000"))?
                        as usize,
                };
                let moved = sqs::move_messages(&self.sqs, dlq, queue, max)
                    .await
                    .map_err(|e| refused("redrive_failed", e.to_string()))?;
                Ok(json!({"moved": moved}))
            }
            _ => Err(refused(
                "unknown_action",
                "action must be one of: migrate, tenant.create, operator.create, status_key.create, dead_letters.redrive",
            )),
        }
    }
}

/// A value as the audit keeps it: numbers, booleans and short arrays as they are; anything
/// else as text without control characters, cut at 200 characters.
fn storable(v: &Value) -> Value {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => v.clone(),
        Value::Array(a) if a.len() <= 50 && a.iter().all(Value::is_string) => {
            Value::Array(a.iter().map(storable).collect())
        }
        other => {
            let text = other.as_str().map_or_else(|| other.to_string(), str::to_owned);
            Value::String(text.chars().filter(|c| !c.is_control()).take(200).collect())
        }
    }
}

/// A name or actor: 1 to 100 characters, no control characters.
fn checked_name<'a>(field: &str, v: &'a str) -> Result<&'a str, Refused> {
    let v = v.trim();
    if v.is_empty() || v.chars().count() > MAX_NAME || v.chars().any(char::is_control) {
        return Err(refused(
            "invalid_field",
            format!("{field} must be 1 to {MAX_NAME} characters without control characters"),
        ));
    }
    Ok(v)
}
