//! Email through SES, sent at most once per tenant and message key.
//!
//! One attempt of `email.send` (`send`):
//! 1. render the content and decide whether it may go at all (the sender is the tenant's, no
//!    recipient is suppressed) and whether it really goes (the `ses` write switch, shadow mode);
//! 2. open this run's AWS access (the task's role, or the tenant's own sending role);
//! 3. record the intent on `messages` under the job's fence, committed on its own (and on
//!    disk before the call; a message that is not sent is durable with the job's outcome,
//!    `messages::record_unsent`): from here on no other attempt or job will send this key;
//! 4. wait for a slot under every rate the send keeps (`pace`; a slot too far ahead defers
//!    the job, no attempt used, the message back to `throttled`), call SES once, retries off, and record what happened: sent; throttled or never
//!    connected (nothing sent: back to `throttled`, retried through the one retry policy; a
//!    throttle also lowers the account's rate for a while, `pace`);
//!    rejected (fatal); or ambiguous (`unknown`, never retried: an exception opens, and an SES
//!    event that proves the send settles both — see `settle`).

pub mod campaign;
pub mod content;
pub mod cutover;
pub mod departure;
pub mod document;
pub mod encoded_words;
pub mod events;
pub mod list_management;
pub mod media_type;
pub mod mime;
pub mod pace;
pub mod reputation;
pub mod rules;
pub mod ses;
pub mod ses_tenants;
pub mod task;

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::job::TaskError;
use crate::store::messages::{self, Intent, Message, NewMessage, Status};
use crate::store::send_reads::{self, SendQuery, SendReads};
use crate::store::{StoreError, message_events, send_rates, suppressions, topics};
use crate::task::TaskContext;
use content::SendParams;
use ses::SendFailure;

/// The write switch that lets email leave the machine (`write:ses`, with shadow off).
pub const INTEGRATION: &str = "ses";

/// The configuration set a send names when its request names none (`RELAY_SES_CONFIGURATION_SET`,
/// set once at a Lambda container's start): every send then publishes its events, whatever
/// the sending identity's own default.
static DEFAULT_CONFIGURATION_SET: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Set the process's default configuration set (the first call wins).
pub fn set_default_configuration_set(name: &str) {
    let _ = DEFAULT_CONFIGURATION_SET.set(name.to_owned());
}

/// The request's own configuration set, else the default.
fn with_default_set(mut p: SendParams, default: Option<&String>) -> SendParams {
    if p.configuration_set.is_none() {
        p.configuration_set = default.cloned();
    }
    p
}

/// What a run reports about its message.
fn report(m: &Message, note: &str) -> Value {
    json!({
        "message_id": m.id,
        "status": m.status,
        "provider_message_id": m.provider_message_id,
        "note": note,
    })
}

/// What a run reports about a message skipped on purpose: `skipped` names why (`suppressed`,
/// or `unsubscribed` from its topic), which a parent counts apart from the sent (`progress`).
fn skipped(m: &Message) -> Value {
    let why = match &m.reason {
        Some(r) if r.starts_with(SKIPPED_UNSUBSCRIBED) => SKIPPED_UNSUBSCRIBED,
        _ => SKIPPED_SUPPRESSED,
    };
    json!({
        "message_id": m.id,
        "status": m.status,
        "skipped": why,
        "reason": m.reason,
    })
}

/// The reason a skipped message's result gives.
pub const SKIPPED_SUPPRESSED: &str = "suppressed";
/// The reason a message skipped for its topic's opt-outs gives.
pub const SKIPPED_UNSUBSCRIBED: &str = "unsubscribed";

/// One attempt of `email.send`.
pub async fn send(ctx: &TaskContext, p: SendParams) -> Result<Value, TaskError> {
    let p = with_default_set(p, DEFAULT_CONFIGURATION_SET.get());
    let db = ctx.db.get().await.map_err(TaskError::retryable)?;
    let tenant = ctx.tenant_id;
    let from = content::bare(&p.from).unwrap_or_default();
    let recipients: Vec<String> = p.recipients().filter_map(|r| content::bare(r)).collect();
    let stage_of = cutover::task_type_of(p.message_key.as_deref());
    let reads = send_reads::read(
        &db,
        &SendQuery {
            tenant,
            template: p.template.as_deref(),
            from: &from,
            recipients: &recipients,
            topic: p.topic.as_deref(),
            stage_of,
            configuration_set: p.configuration_set.as_deref(),
            ses_tenants: ctx.modes.writes_enabled(ses::TENANTS),
        },
    )
    .await
    .map_err(TaskError::retryable)?;
    let SendReads { template, allowed, suppressed, opted_out, role: own_role, guard, stage, ses_tenant_missing } =
        reads;
    // The template and its data are the tenant's: a failure to render them is its own.
    let body = p.render(template.as_ref()).map_err(|e| TaskError::Fatal(e.to_string()).tenants())?;
    let unsent = unsent(&p, &from, allowed, &suppressed, &opted_out);
    // The tenant's cut-over stage for this kind of send narrows what the global modes allow.
    let staged = cutover::shadows(stage.as_ref(), recipients.first().map_or("", String::as_str));
    let live = unsent.is_none() && ctx.modes.writes_enabled(INTEGRATION) && staged.is_none();
    // A tenant its reputation guard paused: a live send waits, no message recorded, no attempt
    // used, until an operator resumes the tenant (then it goes, once: its key is not used yet).
    if live && let Some(g) = guard.as_ref().filter(|g| reputation::holds(g, &p.tags)) {
        return Err(reputation::hold(tenant, g));
    }
    let (status, reason) = status_of(unsent, live, &ctx.modes, staged);
    // Credentials before the intent: a denial or an STS failure must not leave a `sending` row.
    // (No pooled connection is held across the STS call, which records its session itself.)
    let (db, aws, plan) = if live {
        let account = pace::account_of(own_role.as_deref());
        let rates = send_rates::for_send(&db, &account, &tenant.to_string(), p.configuration_set.as_deref())
            .await
            .map_err(TaskError::retryable)?;
        let bulk = p.message_key.as_deref().is_some_and(|k| k.starts_with("campaign:"));
        let plan = pace::Plan { account, tenant: tenant.to_string(), shares: ctx.send_shares, rates, bulk };
        drop(db);
        let aws = ctx.aws().await?;
        if !ses_tenant_missing.is_empty() {
            ses_tenants::set_up(&ctx.db, &aws, tenant, &ses_tenant_missing).await?;
        }
        (ctx.db.get().await.map_err(TaskError::retryable)?, Some(aws), Some(plan))
    } else {
        (db, None, None)
    };
    let id = Uuid::now_v7();
    let preview = (status == Status::Shadowed).then(|| ses::preview(&p, &body, id, ctx));
    let new = NewMessage {
        id,
        tenant_id: tenant,
        message_key: p.message_key.clone().unwrap_or_else(|| ctx.job_id.to_string()),
        job_id: ctx.job_id,
        attempt: ctx.attempt,
        correlation_id: ctx.correlation_id.clone(),
        status,
        reason,
        from: p.from.clone(),
        recipients: json!({ "to": p.to, "cc": p.cc, "bcc": p.bcc }),
        subject: body.subject.clone(),
        preview,
        configuration_set: p.configuration_set.clone(),
    };
    let recorded = match status {
        Status::Sending => messages::record_intent(&db, &new).await,
        _ => messages::record_unsent(&db, &new).await,
    };
    let m = match recorded.map_err(TaskError::retryable)? {
        Intent::Fenced => {
            return Err(TaskError::Retryable("this attempt no longer holds the job; it may not send".into()));
        }
        Intent::Existing(m) => return existing(&db, m, ctx).await,
        Intent::Recorded(m) => m,
    };
    match m.status {
        // A sender the tenant may not use: the tenant's own input.
        Status::Refused => {
            return Err(
                TaskError::Fatal(format!("message {} refused: {}", m.id, m.reason.unwrap_or_default())).tenants()
            );
        }
        Status::Shadowed => return Ok(report(&m, "not sent")),
        Status::Skipped => return Ok(skipped(&m)),
        _ => {}
    }
    let (Some(aws), Some(plan)) = (aws, plan) else {
        return Err(TaskError::Fatal(format!("message {} is {:?} but this run has no SES access", m.id, m.status)));
    };
    deliver(ctx, db, &p, &body, &m, &aws, &plan).await
}

/// Why a message is not sent, if it is not: refused (the tenant's to fix: the job fails) or
/// skipped (the recipient's choice: the job succeeds, `skipped` in its result).
fn unsent(
    p: &SendParams,
    from: &str,
    allowed: bool,
    suppressed: &[send_reads::Suppressed],
    opted_out: &[String],
) -> Option<(Status, String)> {
    if !allowed {
        Some((Status::Refused, format!("{from} is not one of this tenant's sending identities")))
    } else if !suppressed.is_empty() {
        let who: Vec<String> = suppressed.iter().map(|s| format!("{} ({})", s.address, s.reason)).collect();
        Some((Status::Skipped, format!("suppressed recipients: {}", who.join(", "))))
    } else {
        (!opted_out.is_empty()).then(|| {
            let who = opted_out.join(", ");
            let topic = p.topic.as_deref().unwrap_or_default();
            (Status::Skipped, format!("{SKIPPED_UNSUBSCRIBED} from topic {topic}: {who}"))
        })
    }
}

/// The status (and reason) the message is recorded with: unsent as decided, `sending` when it
/// goes live, else shadowed with why (shadow mode, SES writes off, or the tenant's cut-over stage).
fn status_of(
    unsent: Option<(Status, String)>,
    live: bool,
    modes: &crate::store::modes::Modes,
    staged: Option<String>,
) -> (Status, Option<String>) {
    match (unsent, live) {
        (Some((status, why)), _) => (status, Some(why)),
        (None, true) => (Status::Sending, None),
        (None, false) if modes.shadow() => (Status::Shadowed, Some("shadow mode: recorded, not sent".to_owned())),
        (None, false) if !modes.writes_enabled(INTEGRATION) => {
            (Status::Shadowed, Some(format!("SES writes are off (write:{INTEGRATION}): recorded, not sent")))
        }
        (None, false) => (Status::Shadowed, staged),
    }
}

/// Step 4 of a live send whose intent is recorded: take a slot, call SES once, record the outcome.
async fn deliver(
    ctx: &TaskContext,
    db: deadpool_postgres::Client,
    p: &SendParams,
    body: &content::Rendered,
    m: &Message,
    aws: &aws_config::SdkConfig,
    plan: &pace::Plan,
) -> Result<Value, TaskError> {
    let client = ses::client(aws);
    // Where the deployment uses SES tenants, the send names the tenant's, so SES's own
    // per-tenant reputation and pause apply too.
    let ses_tenant = ctx.modes.writes_enabled(ses::TENANTS).then(|| ses::tenant_name(ctx.tenant_id));
    // A topic the tenant maps onto an SES contact list: SES's unsubscribe link and header apply.
    let list = match &p.topic {
        Some(topic) => topics::ses_topic(&db, ctx.tenant_id, topic).await.map_err(TaskError::retryable)?,
        None => None,
    };
    let ids = ses::Identity {
        message_id: &m.id.to_string(),
        job_id: &ctx.job_id.to_string(),
        correlation_id: &ctx.correlation_id,
        ses_tenant: ses_tenant.as_deref(),
        list: list.as_ref().map(|l| (l.contact_list.as_str(), l.ses_topic.as_str())),
    };
    // No pooled connection is held across the call (it may take SEND_TIMEOUT).
    drop(db);
    // The message is built before its slot, so the call leaves on time.
    let raw = match ses::raw_message(p, body, &ids) {
        Ok(raw) => raw,
        Err(why) => {
            return record_outcome(ctx.db.get().await, m, Err(SendFailure::Rejected(why.to_string()))).await;
        }
    };
    // The slot comes last, just before the call, so each rate holds where SES counts it (a
    // slot taken before the intent's commit let one send arrive hundreds of milliseconds late
    // beside an on-time one); a call not on its way soon after its slot is not made, and the
    // send takes another. Held: the message goes back to `throttled` (nothing was sent) and
    // the next attempt takes it up again.
    let mut misses = 0;
    let outcome = loop {
        let held = match pace::wait_for_slot(&ctx.db, plan).await {
            Ok(booked) => match ses::send(&client, p, &raw, &ids, booked.departure).await {
                Err(SendFailure::MissedSlot) => {
                    misses += 1;
                    match pace::missed(&ctx.db, &booked, misses).await {
                        Ok(()) => continue,
                        Err(held) => held,
                    }
                }
                outcome => break outcome,
            },
            Err(held) => held,
        };
        let db = ctx.db.get().await.map_err(TaskError::retryable)?;
        messages::transition(&db, m.id, Status::Sending, Status::Throttled, &held.to_string())
            .await
            .map_err(TaskError::retryable)?;
        return Err(held);
    };
    let db = ctx.db.get().await;
    if let (Err(SendFailure::Throttled(_)), Ok(db)) = (&outcome, &db) {
        let factor = pace::after_throttle(plan.account_rate(), chrono::Utc::now());
        if let Err(e) = send_rates::throttled(db, &plan.account, factor, pace::THROTTLE_GAP_SECONDS).await {
            tracing::warn!(event = "relay.email.throttle_unrecorded", error = %e, "SES throttled a send; the back-off could not be recorded");
        }
    }
    record_outcome(db, m, outcome).await
}

/// Record what the SES call did, and tell the executor what comes next.
async fn record_outcome(
    db: Result<deadpool_postgres::Client, deadpool_postgres::PoolError>,
    m: &Message,
    outcome: Result<String, SendFailure>,
) -> Result<Value, TaskError> {
    let db = match db {
        Ok(db) => db,
        // The outcome cannot be recorded: the message stays `sending`, which the next attempt
        // reads as unknown (never a second send); SES events settle it.
        Err(e) => {
            tracing::error!(event = "relay.email.record_failed", message_id = %m.id, error = %e, ?outcome,
                "no database connection to record the send's outcome");
            return Err(TaskError::Retryable(format!("message {}: could not record the outcome: {e}", m.id)));
        }
    };
    let db = &db;
    let failure = match outcome {
        Ok(provider_id) => {
            // Sent: the answer must be kept. If the database will not take it, the message stays
            // `sending` (a later attempt would call it unknown, never send) and SES's own events
            // settle it; the job still reports success with the id.
            for wait in [0, 200, 1000] {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                match messages::mark_sent(db, m.id, &provider_id).await {
                    Ok(()) => break,
                    Err(e) => tracing::warn!(event = "relay.email.record_failed", message_id = %m.id, error = %e,
                        "sent, but recording it failed"),
                }
            }
            tracing::info!(event = "relay.email.sent", message_id = %m.id, provider_message_id = %provider_id, "email sent");
            return Ok(json!({ "message_id": m.id, "status": Status::Sent, "provider_message_id": provider_id }));
        }
        Err(f) => f,
    };
    let why = failure.to_string();
    let (to, error) = match failure {
        SendFailure::Throttled(_) | SendFailure::NotSent(_) | SendFailure::MissedSlot => {
            (Status::Throttled, TaskError::Retryable(format!("message {}: {why}", m.id)))
        }
        SendFailure::Rejected(_) => (Status::Rejected, TaskError::Fatal(format!("message {}: SES {why}", m.id))),
        // Held, not retried blindly: the tenant's guard is paused (audited, the tenant told)
        // and its sends wait until an operator resumes them, as for Relay's own pause.
        SendFailure::Paused(_) => {
            let g = reputation::paused_by_ses(db, m, &why).await.map_err(TaskError::retryable)?;
            (Status::Throttled, reputation::hold(m.tenant_id, &g))
        }
        SendFailure::Ambiguous(_) => (
            Status::Unknown,
            TaskError::Ambiguous(format!("message {}: {why}; it may have been sent, so it will not be retried", m.id)),
        ),
    };
    tracing::warn!(event = "relay.email.not_sent", message_id = %m.id, status = to.as_str(), reason = %why, "email send failed");
    let refused = to == Status::Rejected;
    // An event may have got there first (a Send event is proof): then the message moved on and
    // the job may say so.
    if !messages::transition(db, m.id, Status::Sending, to, &why).await.map_err(TaskError::retryable)? {
        let now = messages::by_key(db, m.tenant_id, &m.message_key).await.map_err(TaskError::retryable)?;
        let proven = |s: Status| {
            matches!(s, Status::Sent | Status::Delayed | Status::Delivered | Status::Bounced | Status::Complained)
        };
        if let Some(now) = now.filter(|n| proven(n.status)) {
            return Ok(report(&now, "confirmed by an SES event"));
        }
    } else if refused {
        // A refusal counts against the tenant's cut-over stages in `share` (`cutover::judge`).
        if let Err(e) = cutover::judge(db, m.tenant_id).await {
            tracing::warn!(event = "relay.email.cutover_unjudged", tenant_id = %m.tenant_id, error = %e,
                "a refused send could not be judged against the tenant's cut-over stages");
        }
    }
    Err(error)
}

/// Someone recorded this message key before this attempt: never send, say what happened.
async fn existing(db: &deadpool_postgres::Client, m: Message, ctx: &TaskContext) -> Result<Value, TaskError> {
    if m.job_id != ctx.job_id {
        return Ok(json!({
            "message_id": m.id, "status": m.status, "duplicate_of_job": m.job_id,
            "note": "this message key was used by another job; not sent again",
        }));
    }
    let m = match m.status {
        Status::Sending => messages::abandon_earlier_attempt(db, &m, ctx.attempt)
            .await
            .map_err(|e: StoreError| TaskError::retryable(e))?
            .unwrap_or(m),
        _ => m,
    };
    let reason = m.reason.clone().unwrap_or_default();
    match m.status {
        Status::Sending | Status::Unknown => Err(TaskError::Ambiguous(format!(
            "message {}: outcome unknown ({reason}); it is never sent twice, so an operator decides",
            m.id
        ))),
        Status::Refused | Status::Rejected => {
            Err(TaskError::Fatal(format!("message {} {}: {reason}", m.id, m.status.as_str())))
        }
        Status::Throttled => {
            Err(TaskError::Retryable(format!("message {} is throttled; another attempt will take it", m.id)))
        }
        Status::Shadowed => Ok(report(&m, "not sent")),
        Status::Skipped => Ok(skipped(&m)),
        Status::Sent | Status::Delayed | Status::Delivered | Status::Bounced | Status::Complained => {
            Ok(report(&m, "already sent; not sent again"))
        }
    }
}

/// Every address a message was sent to (`to`, `cc`, `bcc`), bare and lower-cased as the
/// suppression list keeps them.
fn recipients_of(recipients: &Value) -> std::collections::HashSet<String> {
    ["to", "cc", "bcc"]
        .iter()
        .filter_map(|k| recipients.get(k).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(content::bare)
        .collect()
}

/// What an SES event came to (`record_event`): what is kept on the `provider.event` job, and
/// the send it proves happened when its message was `unknown` or `sending`.
pub struct Recorded {
    /// Its `exceptions_resolved` is empty: the caller settles `proves_sent` and fills it in.
    pub out: Value,
    pub proves_sent: Option<ProvedSend>,
}

/// An ambiguous send an event proved: the job's `ambiguous_outcome` exception is to be settled
/// with `result` (`exceptions::settle_ambiguous`, in the same transaction).
pub struct ProvedSend {
    pub job_id: crate::job::JobId,
    pub result: Value,
    pub why: String,
}

/// Apply one SES event (ingress's `provider.event`), once, keyed by the SNS message id, in the
/// caller's transaction: keep it on its message, move the message's status up, add hard
/// bounces and complaints to the tenant's suppression list, and say which `unknown` send it
/// proves (the caller has the job finished and its exception resolved by `system`). Not an
/// SES event: kept on the job, with why.
pub async fn record_event(
    tx: &impl crate::store::GenericClient,
    event_key: &str,
    message: &Value,
) -> Result<Recorded, TaskError> {
    let e = match events::parse(message) {
        Ok(e) => e,
        Err(why) => {
            let out = json!({ "ses_event": false, "kept": true, "reason": why.to_string() });
            return Ok(Recorded { out, proves_sent: None });
        }
    };
    let detail = match message {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| message.clone()),
        v => v.clone(),
    };
    let mut proves_sent = None;
    let out = match message_events::apply_event(tx, event_key, &e, &detail).await.map_err(TaskError::retryable)? {
        message_events::Applied::Duplicate => {
            json!({ "ses_event": e.kind.name(), "applied": false, "note": "applied before (duplicate)" })
        }
        message_events::Applied::Unmatched => {
            json!({ "ses_event": e.kind.name(), "applied": false, "note": "kept; no message of Relay's matches" })
        }
        message_events::Applied::Applied { message, before, event_id } => {
            // Only the message's own recipients, on its own tenant's list: an event cannot
            // suppress an address the message was never sent to.
            let addressed = recipients_of(&message.recipients);
            let suppress: Vec<String> = e.suppress.iter().filter(|a| addressed.contains(*a)).cloned().collect();
            let mut suppressed = Vec::new();
            let reason = if matches!(e.kind, messages::EventKind::Complaint) { "complaint" } else { "bounce" };
            if !suppress.is_empty() {
                suppressed =
                    suppressions::add(tx, message.tenant_id, &suppress, reason, e.summary.as_deref(), Some(message.id))
                        .await
                        .map_err(TaskError::retryable)?;
            }
            // The tenant hears of the event, and of the suppression it caused, through its
            // callbacks (the types it subscribes to) and its feed; the deliveries commit with them.
            let mut tenant_events = vec![(event_id, e.kind.name())];
            if matches!(e.kind, messages::EventKind::Subscription { .. }) {
                // The message's recipients the event names (all of them when it names none).
                let named = events::destination(&detail);
                let mut addresses: Vec<String> =
                    addressed.iter().filter(|a| named.is_empty() || named.contains(*a)).cloned().collect();
                addresses.sort();
                let heard = list_management::apply(tx, &message, &addresses, &detail).await;
                tenant_events.extend(heard.map_err(TaskError::retryable)?);
            }
            if !suppressed.is_empty()
                && let Some(id) =
                    message_events::record_suppressed(tx, event_key, &message, &suppressed, reason, e.occurred_at)
                        .await
                        .map_err(TaskError::retryable)?
            {
                tenant_events.push((id, "suppressed"));
            }
            // The tenant's reputation guard judges the new rates (`reputation`); a rise is the
            // tenant's to hear of too.
            let mut guard = None;
            let mut halted = Vec::new();
            if matches!(e.kind, messages::EventKind::Complaint | messages::EventKind::Bounce { permanent: true }) {
                if let Some((level, id)) =
                    reputation::evaluate(tx, event_key, &message).await.map_err(TaskError::retryable)?
                {
                    tenant_events
                        .push((id, if level == "paused" { "reputation_paused" } else { "reputation_warning" }));
                    guard = Some(level);
                }
                // So do its cut-over stages in `share`: a crossing halts them back to shadow.
                halted = cutover::judge(tx, message.tenant_id).await.map_err(TaskError::retryable)?;
            }
            let mut callbacks = Vec::new();
            for (id, stored) in tenant_events {
                if let Some(kind) = message_events::webhook_type(stored)
                    && let Some(job) = crate::store::callbacks::enqueue_message_event(tx, id, kind)
                        .await
                        .map_err(TaskError::retryable)?
                {
                    callbacks.push(job);
                }
            }
            let suppressed = suppressed.len();
            if matches!(before, Status::Unknown | Status::Sending) && e.kind.proves_sent() {
                let result = json!({ "message_id": message.id, "status": message.status, "provider_message_id": message.provider_message_id });
                let why = format!("SES {} event {event_key} proves message {} was sent", e.kind.name(), message.id);
                proves_sent = Some(ProvedSend { job_id: message.job_id, result, why });
            }
            json!({
                "ses_event": e.kind.name(), "applied": true, "message_id": message.id,
                "status_before": before, "status": message.status,
                "suppressed": suppressed, "exceptions_resolved": [], "callbacks": callbacks,
                "reputation": guard,
                "cutover_halted": halted.iter().map(|s| s.task_type.as_str()).collect::<Vec<_>>(),
            })
        }
    };
    Ok(Recorded { out, proves_sent })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_names_the_default_configuration_set_unless_it_names_its_own() {
        let p = |set: Option<&str>| {
            let mut v =
                serde_json::json!({"from": "a@example.com", "to": ["b@example.com"], "subject": "s", "text": "t"});
            if let Some(s) = set {
                v["configuration_set"] = serde_json::json!(s);
            }
            serde_json::from_value::<SendParams>(v).expect("send params")
        };
        let default = "relay-events".to_owned();
        assert_eq!(with_default_set(p(None), Some(&default)).configuration_set.as_deref(), Some("relay-events"));
        assert_eq!(with_default_set(p(Some("own")), Some(&default)).configuration_set.as_deref(), Some("own"));
        assert_eq!(with_default_set(p(None), None).configuration_set, None);
    }
}
