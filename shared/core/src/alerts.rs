//! One alert per new exception. At once: the log line `relay.exception.opened`
//! (`exceptions::alert_opened`, where the terminal path opens it). Then, when operators set
//! `RELAY_ALERT_TO`, an email through Relay's own `email.send` (so shadow mode and the SES
//! write switch apply to alerts too), queued by the sweep: it takes open exceptions not yet
//! alerted, submits one alert job each under the platform tenant — the job's idempotency key
//! is the exception's id, so two sweepers or a crash between submit and mark never alert
//! twice — and marks them alerted. A failing retry of a job whose exception is still open
//! opens no exception, so it alerts no one.

use chrono::{Duration, Utc};
use deadpool_postgres::Pool;
use serde_json::json;
use uuid::Uuid;

use crate::email::content;
use crate::email::task::SendEmail;
use crate::intake::Intake;
use crate::job::terms::{CorrelationId, IdempotencyKey, Limits};
use crate::store::exceptions::{self, Unalerted};
use crate::store::jobs::NewJob;
use crate::store::{StoreError, sending_identities, tenants};
use crate::task::Task;

/// Exceptions older than this when alerts are first configured are not mailed about.
pub const LOOKBACK: Duration = Duration::hours(1);
/// Most alerts queued by one sweep pass.
pub const BATCH: i64 = 100;

/// An alert setting that is not an email address; the message names the variable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AlertConfigError {
    #[error("{name} is invalid ({value:?}): not an email address")]
    NotAnAddress { name: &'static str, value: String },
}

/// Where alert emails go (`RELAY_ALERT_TO`, comma-separated) and whom they are from
/// (`RELAY_ALERT_FROM`, default `relay-alerts@` the first recipient's domain). The sender is
/// made a sending identity of the platform tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertConfig {
    pub to: Vec<String>,
    pub from: String,
    /// The tenant alert jobs run under (the ingress tenant, `platform`).
    pub tenant: String,
}

impl AlertConfig {
    /// `None` when `RELAY_ALERT_TO` is unset: alerts are the log line only.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Option<AlertConfig>, AlertConfigError> {
        let Some(raw) = get("RELAY_ALERT_TO").filter(|v| !v.trim().is_empty()) else { return Ok(None) };
        let mut to = Vec::new();
        for a in raw.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let bare = content::bare(a)
                .ok_or_else(|| AlertConfigError::NotAnAddress { name: "RELAY_ALERT_TO", value: a.into() })?;
            to.push(bare);
        }
        let from = match get("RELAY_ALERT_FROM").map(|f| f.trim().to_owned()).filter(|f| !f.is_empty()) {
            Some(f) => {
                content::bare(&f).ok_or(AlertConfigError::NotAnAddress { name: "RELAY_ALERT_FROM", value: f })?
            }
            None => format!("relay-alerts@{}", to[0].rsplit_once('@').map_or("localhost", |(_, d)| d)),
        };
        let tenant = get("RELAY_INGRESS_TENANT").filter(|t| !t.trim().is_empty()).unwrap_or_else(|| "platform".into());
        Ok(Some(AlertConfig { to, from, tenant }))
    }
}

/// An alert has ten attempts of a minute each.
const ALERT_LIMITS: Limits = Limits::fixed(10, 60);

/// The alert email of one exception, as an `email.send` job.
fn alert_job(cfg: &AlertConfig, e: &Unalerted) -> NewJob {
    let params = json!({
        "from": format!("Relay alerts <{}>", cfg.from),
        "to": cfg.to,
        // The message is an inline template: what the exception says travels in `data`, so a
        // cause quoting template syntax (`{{`) is shown as it is, never rendered.
        "subject": "[Relay] {{ kind }} in {{ task_type }} (tenant {{ tenant }})",
        "text": "A job failed for good and needs an operator.\n\n\
             exception: {{ id }}\njob: {{ job_id }}\ntenant: {{ tenant }}\ntask type: {{ task_type }}\nkind: {{ kind }}\n\
             opened: {{ opened }}\ncorrelation id: {{ correlation_id }}\n\ncause:\n{{ cause }}\n\n\
             Act on it: relay exceptions show {{ id }}\n",
        "data": {"id": e.id.to_string(), "job_id": e.job_id.to_string(), "tenant": e.tenant.to_string(),
            "task_type": e.task_type.to_string(), "kind": e.kind.to_string(), "opened": e.opened_at.to_rfc3339(),
            "correlation_id": e.correlation_id.to_string(), "cause": e.cause.to_string()},
        "message_key": format!("alert:{}", e.id),
    });
    let key = IdempotencyKey::exception_alert(e.id);
    NewJob {
        correlation_id: CorrelationId::exception_alert(e.id),
        limits: ALERT_LIMITS,
        ..NewJob::new(SendEmail::NAME, params, key)
    }
}

/// Queue the alert emails of new exceptions; returns how many were queued.
pub async fn queue_due(pool: &Pool, intake: &Intake, cfg: &AlertConfig) -> Result<usize, StoreError> {
    let (due, tenant) = {
        let db = pool.get().await?;
        let due = exceptions::unalerted(&db, Utc::now() - LOOKBACK, BATCH).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let tenant = tenants::ensure(&db, &cfg.tenant).await?.id;
        sending_identities::add(&db, tenant, &cfg.from).await?;
        (due, tenant)
    };
    let jobs: Vec<NewJob> = due.iter().map(|e| alert_job(cfg, e)).collect();
    intake.enqueue(tenant, jobs).await.map_err(StoreError::Intake)?;
    let ids: Vec<Uuid> = due.iter().map(|e| e.id).collect();
    exceptions::mark_alerted(&pool.get().await?, &ids).await?;
    tracing::info!(event = "relay.alerts.queued", count = ids.len(), "alert emails queued for new exceptions");
    Ok(ids.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Option<AlertConfig>, AlertConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        AlertConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn alerts_are_off_until_someone_is_named() {
        assert_eq!(read(&[]).unwrap(), None);
        let c = read(&[("RELAY_ALERT_TO", "Ops@Acme.example, oncall@acme.example")]).unwrap().unwrap();
        assert_eq!(c.to, ["ops@acme.example", "oncall@acme.example"]);
        assert_eq!(c.from, "relay-alerts@acme.example");
        assert_eq!(c.tenant, "platform");
        let e = read(&[("RELAY_ALERT_TO", "ops")]).unwrap_err();
        assert!(e.to_string().contains("RELAY_ALERT_TO"), "{e}");
    }

    #[test]
    fn a_cause_quoting_template_syntax_is_shown_as_it_is() {
        let cfg = read(&[("RELAY_ALERT_TO", "ops@acme.example")]).unwrap().unwrap();
        let cause = "template \"welcome\", text: syntax error near {{ name {% endraw %}";
        let e = Unalerted {
            id: Uuid::nil(),
            job_id: crate::job::JobId::new(),
            tenant: "acme".into(),
            task_type: "email.send".into(),
            kind: crate::job::ExceptionKind::FatalError,
            cause: cause.into(),
            opened_at: Utc::now(),
            correlation_id: "c{{1}}".into(),
        };
        let p: content::SendParams = serde_json::from_value(alert_job(&cfg, &e).params).unwrap();
        assert_eq!(p.check(), Ok(()));
        let r = p.render(None).unwrap();
        assert_eq!(r.subject, "[Relay] fatal_error in email.send (tenant acme)");
        let text = r.text.unwrap();
        assert!(text.contains(&format!("cause:\n{cause}\n")) && text.contains("correlation id: c{{1}}"), "{text}");
    }
}
