//! Email cut over in stages, per tenant and task type (issue 50): `shadow` (every send recorded,
//! none sent) → `share` (live for a stated fraction of recipients, the rest shadowed) → `live`.
//! The stage is an operating mode: set by an operator (audited), read by every attempt, and it
//! only narrows what the global modes allow (shadow on, or `write:ses` off, holds every send
//! whatever the stage). A recipient is in the share by a hash of its address (`in_share`), so
//! it is in or out for the whole stage, on every rerun, and a larger share keeps everyone a
//! smaller one had. A `share` stage halts itself back to `shadow` (`judge`) when the tenant's
//! permanent-bounce, complaint or refusal rate over its sends since the stage started crosses
//! the stage's threshold: judged as each bounce or complaint is applied and as SES refuses a
//! send, never by a sweep.

use serde_json::json;
use sha2::{Digest, Sha256};

use super::task::{SendCampaign, SendEmail};
use crate::job::TenantId;
use crate::store::cutover::{self, Stage};
use crate::store::reputation::{Counts, counts_since};
use crate::store::{GenericClient, StoreError, admin_actions};
use crate::task::Task;

/// Default halt level: 2 % of the stage's sends bounced for good (the guard's warning level).
pub const HALT_BOUNCE: f64 = super::reputation::WARN_BOUNCE;
/// Default halt level: 0.05 % complaints (the guard's warning level).
pub const HALT_COMPLAINT: f64 = super::reputation::WARN_COMPLAINT;
/// Default halt level: 5 % of the stage's sends refused by SES.
pub const HALT_FAILURE: f64 = 0.05;
/// Default fewest sends since the stage started for its rates to be judged.
pub const MIN_SENDS: i64 = 20;

/// The stage a send is judged under: a campaign's children (message key `campaign:…`) by
/// `email.campaign`'s, every other send by `email.send`'s.
pub fn task_type_of(message_key: Option<&str>) -> &'static str {
    if message_key.is_some_and(|k| k.starts_with("campaign:")) { SendCampaign::NAME } else { SendEmail::NAME }
}

/// Where an address falls in [0, 1): the first 8 bytes of the SHA-256 of its bare, lower-cased
/// form. Stable across runs, stages and processes.
pub fn position(address: &str) -> f64 {
    let bare = super::content::bare(address).unwrap_or_else(|| address.trim().to_ascii_lowercase());
    let digest = Sha256::digest(bare.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether a send to `address` is live in a share of `share` (0.1: about 10 % of addresses).
pub fn in_share(address: &str, share: f64) -> bool {
    position(address) < share
}

/// Why a send the stage keeps from going live is shadowed; None: the stage lets it go live.
/// No stage lets every send go (the global modes decide). A send with several recipients is
/// placed by its first.
pub fn shadows(stage: Option<&Stage>, first_recipient: &str) -> Option<String> {
    let s = stage?;
    match s.stage.as_str() {
        "live" => None,
        "share" if in_share(first_recipient, s.share) => None,
        "share" => Some(format!(
            "cut-over stage share ({:.1} % of recipients live) for {}: this recipient is outside the share; recorded, not sent",
            s.share * 100.0,
            s.task_type
        )),
        _ => Some(match &s.halted_reason {
            Some(why) => format!("cut-over stage shadow for {} (halted: {why}): recorded, not sent", s.task_type),
            None => format!("cut-over stage shadow for {}: recorded, not sent", s.task_type),
        }),
    }
}

/// Why a stage's counts cross its thresholds; None below them or below its minimum of sends.
/// Failures are judged over every attempt SES answered (sends and refusals).
pub fn crossed(c: &Counts, s: &Stage) -> Option<String> {
    if c.sends + c.failures < s.min_sends {
        return None;
    }
    let rate = |n: i64, of: i64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    let (bounce, complaint) = (rate(c.permanent_bounces, c.sends), rate(c.complaints, c.sends));
    let failure = rate(c.failures, c.sends + c.failures);
    let over = [
        ("permanent bounces", c.permanent_bounces, bounce, s.halt_bounce),
        ("complaints", c.complaints, complaint, s.halt_complaint),
        ("refused sends", c.failures, failure, s.halt_failure),
    ];
    let (what, n, r, limit) = over.into_iter().find(|(_, _, r, limit)| r >= limit)?;
    Some(format!(
        "{n} {what} ({:.2} %, at or above {:.2} %) in {} sends since the stage started",
        r * 100.0,
        limit * 100.0,
        c.sends + c.failures
    ))
}

/// Judge the tenant's `share` stages after a bounce, a complaint or a refused send: each whose
/// rates since it started crossed its thresholds halts back to `shadow`, with an `admin_actions`
/// row by `system` and a warning in the log for the operator. Returns the stages halted.
pub async fn judge(db: &impl GenericClient, tenant: TenantId) -> Result<Vec<Stage>, StoreError> {
    let mut halted = Vec::new();
    for s in cutover::sharing(db, tenant).await? {
        let c = counts_since(db, tenant, s.started_at).await?;
        let Some(why) = crossed(&c, &s) else { continue };
        if !cutover::halt(db, &s, &why).await? {
            continue;
        }
        let detail = json!({
            "tenant_id": tenant.to_string(), "task_type": s.task_type, "share": s.share, "reason": why,
            "sends": c.sends, "permanent_bounces": c.permanent_bounces, "complaints": c.complaints,
            "failures": c.failures, "stage_started_at": s.started_at,
        });
        admin_actions::record(db, "cutover.halted", "system", None, true, &detail).await?;
        tracing::warn!(event = "relay.email.cutover_halted", tenant_id = %tenant, task_type = %s.task_type,
            reason = %why, "a cut-over stage halted itself back to shadow");
        halted.push(Stage { stage: "shadow".into(), halted_reason: Some(why), ..s });
    }
    Ok(halted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(kind: &str, share: f64) -> Stage {
        Stage {
            tenant_id: TenantId::from_uuid(uuid::Uuid::nil()),
            task_type: "email.campaign".into(),
            stage: kind.into(),
            share,
            halt_bounce: HALT_BOUNCE,
            halt_complaint: HALT_COMPLAINT,
            halt_failure: HALT_FAILURE,
            min_sends: MIN_SENDS,
            started_at: chrono::Utc::now(),
            halted_at: None,
            halted_reason: None,
            updated_by: "ops".into(),
        }
    }

    #[test]
    fn a_share_takes_about_its_fraction_of_addresses_and_the_same_ones_every_time() {
        let addresses: Vec<String> = (0..10_000).map(|i| format!("r{i}@example.com")).collect();
        let live = addresses.iter().filter(|a| in_share(a, 0.1)).count();
        assert!((900..=1100).contains(&live), "{live} of 10,000 in a 10 % share");
        // Stable, case- and display-name-blind, and a larger share keeps the smaller one's.
        assert_eq!(in_share("Bo <R7@Example.com>", 0.1), in_share("r7@example.com", 0.1));
        assert!(addresses.iter().filter(|a| in_share(a, 0.1)).all(|a| in_share(a, 0.5)));
        assert!(addresses.iter().all(|a| !in_share(a, 0.0) && in_share(a, 1.0)));
    }

    #[test]
    fn a_stage_shadows_outside_its_share_and_halts_only_past_its_minimum() {
        let inside = (0..1000).map(|i| format!("r{i}@example.com")).find(|a| in_share(a, 0.1)).unwrap();
        let outside = (0..1000).map(|i| format!("r{i}@example.com")).find(|a| !in_share(a, 0.1)).unwrap();
        assert_eq!(shadows(None, &outside), None, "no stage: the global modes decide");
        assert_eq!(shadows(Some(&stage("share", 0.1)), &inside), None);
        assert!(shadows(Some(&stage("share", 0.1)), &outside).unwrap().contains("outside the share"));
        assert!(shadows(Some(&stage("shadow", 0.0)), &inside).is_some());
        assert_eq!(shadows(Some(&stage("live", 0.0)), &outside), None);
        let s = stage("share", 0.1);
        let c = |sends, bounces, failures| Counts { sends, permanent_bounces: bounces, complaints: 0, failures };
        assert_eq!(crossed(&c(19, 19, 0), &s), None, "too few sends to judge");
        assert_eq!(crossed(&c(100, 1, 0), &s), None);
        assert!(crossed(&c(100, 2, 0), &s).unwrap().contains("2 permanent bounces"));
        assert!(crossed(&c(95, 0, 5), &s).unwrap().contains("5 refused sends"));
        assert_eq!(task_type_of(Some("campaign:abc:7")), "email.campaign");
        assert_eq!(task_type_of(None), "email.send");
    }
}
