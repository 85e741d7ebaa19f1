//! One tenant's bounces never stop another tenant's mail (issue 50): each tenant's rolling
//! permanent-bounce and complaint rates over a window (`store::reputation::counts`), judged as
//! each bounce or complaint arrives against the operator's thresholds for that tenant (defaults
//! below SES's account review levels of about 5 % bounces / 0.1 % complaints): at `warning` the
//! tenant hears of it (a `message.reputation_warning` event) and the operator sees it; at
//! `paused` that tenant's live sends are held (`hold`), not failed, until an operator resumes.

use serde_json::Value;

use crate::job::{TaskError, TenantId};
use crate::store::reputation::{self, Counts, Guard};
use crate::store::{GenericClient, StoreError, admin_actions, message_events, messages::Message};

/// Default warning level: 2 % of the window's sends bounced for good.
pub const WARN_BOUNCE: f64 = 0.02;
/// Default warning level: 0.05 % of the window's sends drew a complaint.
pub const WARN_COMPLAINT: f64 = 0.0005;
/// Default pause level: 4 % permanent bounces (SES reviews an account at about 5 %).
pub const PAUSE_BOUNCE: f64 = 0.04;
/// Default pause level: 0.08 % complaints (SES reviews an account at about 0.1 %).
pub const PAUSE_COMPLAINT: f64 = 0.0008;
/// Default rolling window, in hours.
pub const WINDOW_HOURS: i32 = 24;
/// Default fewest sends in the window for the rates to be judged.
pub const MIN_SENDS: i64 = 200;
/// How long a held send waits before it looks again (an operator's resume makes it due at once).
pub const HOLD_RECHECK: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The guard that holds for a tenant with no row of its own.
pub fn defaults() -> Guard {
    Guard {
        warn_bounce: WARN_BOUNCE,
        warn_complaint: WARN_COMPLAINT,
        pause_bounce: PAUSE_BOUNCE,
        pause_complaint: PAUSE_COMPLAINT,
        window_hours: WINDOW_HOURS,
        min_sends: MIN_SENDS,
        exempt_tags: Vec::new(),
        state: "ok".into(),
        state_reason: None,
        state_since: None,
        configured: false,
    }
}

/// The rate name a pause holds a tenant's sends under (`job_rate_waits`, `waiting_rate`).
pub fn hold_rate(tenant: TenantId) -> String {
    format!("reputation:tenant:{tenant}")
}

/// The rates of a window's counts (0 with no sends).
pub fn rates(c: &Counts) -> (f64, f64) {
    if c.sends == 0 {
        return (0.0, 0.0);
    }
    (c.permanent_bounces as f64 / c.sends as f64, c.complaints as f64 / c.sends as f64)
}

/// The level the counts reach under a guard (`ok`, `warning`, `paused`) and why; `ok` below
/// the minimum of sends.
pub fn judge(c: &Counts, g: &Guard) -> (&'static str, String) {
    let (bounce, complaint) = rates(c);
    let why = |level: &str| {
        format!(
            "{level}: {} permanent bounces ({:.2} %) and {} complaints ({:.3} %) in {} sends over {} h",
            c.permanent_bounces,
            bounce * 100.0,
            c.complaints,
            complaint * 100.0,
            c.sends,
            g.window_hours
        )
    };
    if c.sends < g.min_sends {
        return ("ok", why("ok"));
    }
    if bounce >= g.pause_bounce || complaint >= g.pause_complaint {
        return ("paused", why("paused"));
    }
    if bounce >= g.warn_bounce || complaint >= g.warn_complaint {
        return ("warning", why("warning"));
    }
    ("ok", why("ok"))
}

/// Whether a pause holds a send with these tags (an exempt tag lets it go).
pub fn holds(g: &Guard, tags: &std::collections::BTreeMap<String, String>) -> bool {
    g.state == "paused" && !tags.iter().any(|(k, v)| g.exempt_tags.contains(&format!("{k}={v}")))
}

/// The deferral a paused tenant's send gets: pending again later, no attempt used, its
/// `waiting_reason` `reputation_paused` and `waiting_rate` the pause.
pub fn hold(tenant: TenantId, g: &Guard) -> TaskError {
    TaskError::RateLimited {
        rate: hold_rate(tenant),
        note: format!(
            "held: this tenant's sends are paused by its reputation guard until an operator resumes them ({})",
            g.state_reason.as_deref().unwrap_or("paused")
        ),
        wait: HOLD_RECHECK,
    }
}

/// Judge the tenant of `m` after a bounce or complaint (inside the event's transaction): raise
/// its state if the rates crossed a level, keep that as an event on the message for the tenant
/// (`reputation_warning` / `reputation_paused`, callback and feed) and as an `admin_actions`
/// row by `system` for the operator. Returns the new state and the event's id when it rose.
pub async fn evaluate(
    db: &impl GenericClient,
    event_key: &str,
    m: &Message,
) -> Result<Option<(&'static str, i64)>, StoreError> {
    let g = reputation::get(db, m.tenant_id).await?.unwrap_or_else(defaults);
    let c = reputation::counts(db, m.tenant_id, g.window_hours).await?;
    let (level, why) = judge(&c, &g);
    if level == "ok" || !reputation::raise(db, m.tenant_id, &g, level, &why).await? {
        return Ok(None);
    }
    let (bounce, complaint) = rates(&c);
    let detail = serde_json::json!({
        "tenant_id": m.tenant_id.to_string(), "state": level, "reason": why,
        "sends": c.sends, "permanent_bounces": c.permanent_bounces, "complaints": c.complaints,
        "bounce_rate": bounce, "complaint_rate": complaint,
    });
    admin_actions::record(db, &format!("reputation.{level}"), "system", None, true, &detail).await?;
    tracing::warn!(event = "relay.email.reputation", tenant_id = %m.tenant_id, state = level, reason = %why,
        "a tenant's reputation guard rose");
    let id = message_events::record_reputation(db, event_key, m, level, &why, &detail).await?;
    Ok(id.map(|id| (level, id)))
}

/// SES paused the SES tenant a send named (or the account): pause the Relay tenant's guard
/// too, so its other sends are held rather than each meeting the pause, with an `admin_actions`
/// row by `system` and a `reputation_paused` event on the message when it rose. Returns the
/// guard as it now holds.
pub async fn paused_by_ses(db: &impl GenericClient, m: &Message, said: &str) -> Result<Guard, StoreError> {
    let g = reputation::get(db, m.tenant_id).await?.unwrap_or_else(defaults);
    let why = format!("paused: SES paused sending for this tenant ({said})");
    if reputation::raise(db, m.tenant_id, &g, "paused", &why).await? {
        let detail = serde_json::json!({"tenant_id": m.tenant_id.to_string(), "state": "paused", "reason": why,
            "source": "ses"});
        admin_actions::record(db, "reputation.paused", "system", None, true, &detail).await?;
        tracing::warn!(event = "relay.email.reputation", tenant_id = %m.tenant_id, state = "paused", reason = %why,
            "SES paused a tenant; its sends are held");
        message_events::record_reputation(db, &format!("ses-paused:{}", m.id), m, "paused", &why, &detail).await?;
    }
    Ok(Guard { state: "paused".into(), state_reason: Some(why), ..g })
}

/// What a tenant reads of its own reputation (`GET /v1/reputation`).
pub fn view(g: &Guard, c: &Counts) -> Value {
    let (bounce, complaint) = rates(c);
    serde_json::json!({
        "state": g.state, "state_reason": g.state_reason, "state_since": g.state_since,
        "window_hours": g.window_hours, "min_sends": g.min_sends,
        "sends": c.sends, "permanent_bounces": c.permanent_bounces, "complaints": c.complaints,
        "bounce_rate": bounce, "complaint_rate": complaint, "judged": c.sends >= g.min_sends,
        "thresholds": {
            "warn_bounce": g.warn_bounce, "warn_complaint": g.warn_complaint,
            "pause_bounce": g.pause_bounce, "pause_complaint": g.pause_complaint,
        },
        "exempt_tags": g.exempt_tags, "configured": g.configured,
    })
}

/// A tenant's reputation as the status contract shows it (`scope` `tenant`, keyed by its name).
pub fn tenant_status(name: &str, g: &Guard, c: &Counts) -> relay_status::ReputationStatus {
    relay_status::ReputationStatus {
        scope: "tenant".into(),
        key: name.to_owned(),
        state: Some(g.state.clone()),
        state_reason: g.state_reason.clone(),
        state_since: g.state_since,
        judged: c.sends >= g.min_sends,
        ..set_status(name, g.window_hours, c)
    }
}

/// A configuration set's reputation as the status contract shows it (no guard of its own:
/// judged against the default minimum of sends).
pub fn set_status(name: &str, window_hours: i32, c: &Counts) -> relay_status::ReputationStatus {
    let (bounce_rate, complaint_rate) = rates(c);
    relay_status::ReputationStatus {
        scope: "configuration_set".into(),
        key: name.to_owned(),
        state: None,
        state_reason: None,
        state_since: None,
        window_hours,
        sends: c.sends,
        permanent_bounces: c.permanent_bounces,
        complaints: c.complaints,
        bounce_rate,
        complaint_rate,
        judged: c.sends >= MIN_SENDS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_sit_below_ses_review_levels_and_a_window_under_its_minimum_is_not_judged() {
        let g = defaults();
        assert!(g.pause_bounce < 0.05 && g.pause_complaint < 0.001);
        assert!(g.warn_bounce < g.pause_bounce && g.warn_complaint < g.pause_complaint);
        let c = |sends, b, cpl| Counts { sends, permanent_bounces: b, complaints: cpl, failures: 0 };
        assert_eq!(judge(&c(199, 199, 0), &g).0, "ok", "too few sends to judge");
        assert_eq!(judge(&c(1000, 19, 0), &g).0, "ok");
        assert_eq!(judge(&c(1000, 20, 0), &g).0, "warning");
        assert_eq!(judge(&c(1000, 40, 0), &g).0, "paused");
        assert_eq!(judge(&c(10_000, 0, 5), &g).0, "warning");
        assert_eq!(judge(&c(10_000, 0, 8), &g).0, "paused");
        assert!(judge(&c(1000, 40, 0), &g).1.contains("40 permanent bounces (4.00 %)"));
    }

    #[test]
    fn a_pause_holds_every_send_but_those_with_an_exempt_tag() {
        let mut g = defaults();
        let tags = |k: &str, v: &str| std::collections::BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert!(!holds(&g, &tags("kind", "reset")), "not paused");
        g.state = "paused".into();
        g.exempt_tags = vec!["kind=password_reset".into()];
        assert!(holds(&g, &tags("kind", "newsletter")));
        assert!(!holds(&g, &tags("kind", "password_reset")));
        assert!(
            matches!(hold(TenantId::from_uuid(uuid::Uuid::nil()), &g), TaskError::RateLimited { rate, .. } if rate.starts_with("reputation:"))
        );
    }
}
