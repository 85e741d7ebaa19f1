//! Sending at the provider's pace. Every live send takes a slot (`store::rate_slots`) under
//! each rate it must keep, so the sum of all workers' sends stays under each:
//! 1. its tenant's and its configuration set's rates (operators'), if set: the send's own;
//! 2. then its SES account's: an operator's rate, else SES's `MaxSendRate` (read by the
//!    sweep), times the throttle back-off (AIMD: halved on a throttle answer, grown back by
//!    `RECOVERY_PER_SECOND` of the base rate each second).
//!
//! A slot a little ahead is waited for in the run (`sleep`); one further ahead than the
//! send's horizon defers the job (`TaskError::RateLimited`: pending, no attempt used). Single
//! sends have priority over a campaign's children: their horizon on the account is longer
//! (`SINGLE_HORIZON` against `BULK_HORIZON`), so a child only takes an account slot less than
//! `BULK_HORIZON` ahead while a single send may book past the children's queue; and a child
//! books at most `BULK_BOOK_AHEAD` ahead (further off, it waits unbooked in the run until its
//! slot comes near). A password reset therefore waits at most about `BULK_BOOK_AHEAD` behind
//! any campaign; the children take every slot the single sends leave.
//!
//! A rate many tenants' sends keep (an account's, a configuration set's) is shared by the
//! tenants with sends waiting on it, by weight (`store::send_shares`, `take_stage`): past its
//! share of the slots booked ahead a tenant's send is deferred (`account_share:<account>:<tenant>`);
//! a tenant alone takes the whole rate.
//!
//! The 24-hour quota: a child holds (`account_quota`) while what remains of the quota
//! (`Max24HourSend - SentLast24Hours`, less the sends since it was read) is within
//! `QUOTA_RESERVE` of the quota, kept for single sends; a single send holds only when
//! nothing remains.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::job::TaskError;
use crate::store::rate_slots::{self, Limit, Slot};
use crate::store::send_rates::{self, Scope, SendRate};
use crate::store::send_shares;

/// How far ahead a single send waits in the run for its account slot.
pub const SINGLE_HORIZON: Duration = Duration::from_secs(1);
/// How far ahead a campaign's child waits in the run for its account slot.
pub const BULK_HORIZON: Duration = Duration::from_millis(500);
/// How far ahead a campaign's child books its slot: one further off is waited for unbooked
/// (`wait_for_slot`), so a single send books at most this far behind the children's queue.
pub const BULK_BOOK_AHEAD: Duration = Duration::from_millis(100);
/// How far ahead any send waits in the run for its tenant's and configuration set's slot.
pub const OWN_HORIZON: Duration = Duration::from_secs(1);
/// Every rate is kept at this share of itself. Slots are 1/(HEADROOM × rate) apart, so N + 1
/// sends on their slots span 1/HEADROOM s; a send that reaches SES later than the one N slots
/// after it shortens that span, and once it is under 1 s SES counts N + 1 in a second and
/// throttles. The departure thread (`email::departure`) bounds the lateness at its check
/// (`LATE_SLOT`); the rest is `TRANSIT`. A second holds both while 1/HEADROOM − 1 ≥ LATE_SLOT +
/// TRANSIT (a test below). Measured with `relay bench --only pace` (debug build, a 2-core
/// machine at load 3–6): lateness p99 6.5 ms, transit p99 11 ms, at most 15 ms; 0.97 sent
/// 3,780 without a throttle there, but the tests throttled at 0.97 on the machine at load 7
/// (0.96 did not): 0.96 keeps 10 ms more for a busy CPU.
pub const HEADROOM: f64 = 0.96;
/// A call that would leave more than this after its slot is not made, and another slot is
/// taken (the slot is lost to the rate, which is never exceeded).
pub const LATE_SLOT: Duration = Duration::from_millis(15);
/// What a second at `HEADROOM` allows, besides `LATE_SLOT`, between two sends' times from the
/// departure's check to SES counting them (the request written and read, a busy CPU).
pub const TRANSIT: Duration = Duration::from_millis(25);
/// How many slots one run takes (each missed by more than `LATE_SLOT`) before its job is deferred.
pub const RETAKES: u32 = 3;
/// While other tenants wait on a shared rate, a send within its tenant's share may take a slot
/// this much further ahead than its horizon: behind what the others booked (at most this).
pub const SHARED_AHEAD: Duration = SINGLE_HORIZON;
/// A tenant waits on a shared rate while it asked for a slot there within this window (a
/// deferred send comes back within its wait, at most a horizon and its spread).
pub const WAITING_WINDOW: Duration = Duration::from_secs(3);
/// The back-off never goes below this share of the base rate.
pub const FLOOR: f64 = 0.1;
/// The back-off grows back by this share of the base rate per second without a throttle.
pub const RECOVERY_PER_SECOND: f64 = 0.005;
/// Throttles within this many seconds of the last are one signal (one halving).
pub const THROTTLE_GAP_SECONDS: f64 = 1.0;
/// The share of the 24-hour quota campaigns leave for single sends.
pub const QUOTA_RESERVE: f64 = 0.01;
/// How long a send held by the quota waits before it looks again.
pub const QUOTA_HOLD: Duration = Duration::from_secs(300);

/// How often the sweep reads Relay's SES account's rate and quota (`GetAccount`).
pub const ACCOUNT_READ_EVERY: Duration = Duration::from_secs(60);

/// Read Relay's own SES account's rate and quota if the last read is older than
/// `ACCOUNT_READ_EVERY` (any sweeper may: the row says when it was last read). Returns
/// whether it read. A failed read keeps the last figures, with why.
pub async fn refresh_account(
    pool: &deadpool_postgres::Pool,
    sdk: &aws_config::SdkConfig,
) -> Result<bool, crate::store::StoreError> {
    if !send_rates::account_read_due(&pool.get().await?, "default", ACCOUNT_READ_EVERY.as_secs_f64()).await? {
        return Ok(false);
    }
    read_account(pool, sdk).await?;
    Ok(true)
}

/// Read Relay's own SES account's rate and quota now, however recent the last read (`relay dev
/// --local-ses` at start, whose rate may differ from the last start's). A failed read keeps
/// the last figures, with why.
pub async fn read_account(
    pool: &deadpool_postgres::Pool,
    sdk: &aws_config::SdkConfig,
) -> Result<(), crate::store::StoreError> {
    let read = super::ses::account_quota(&super::ses::client(sdk)).await;
    let db = pool.get().await?;
    match read {
        Ok((rate, max, sent)) => send_rates::record_account(&db, "default", rate, max, sent).await?,
        Err(why) => {
            tracing::warn!(event = "relay.email.account_unread", error = %why, "could not read the SES account's quota");
            send_rates::record_account_error(&db, "default", &why.to_string()).await?
        }
    }
    Ok(())
}

/// The account a tenant's sends go through: its own sending role's, else Relay's (`default`).
pub fn account_of(own_role: Option<&str>) -> String {
    own_role
        .and_then(|arn| arn.split(':').nth(4))
        .filter(|a| !a.is_empty() && a.bytes().all(|b| b.is_ascii_digit()))
        .map_or_else(|| "default".to_owned(), str::to_owned)
}

/// The back-off now: as last written, grown back with the time since.
pub fn factor_now(r: &SendRate, now: DateTime<Utc>) -> f64 {
    let secs = (now - r.factor_at).num_milliseconds().max(0) as f64 / 1000.0;
    (r.factor + RECOVERY_PER_SECOND * secs).min(1.0)
}

/// The back-off after a throttle answer: half of what it is now, not below `FLOOR`.
pub fn after_throttle(r: Option<&SendRate>, now: DateTime<Utc>) -> f64 {
    (r.map_or(1.0, |r| factor_now(r, now)) / 2.0).max(FLOOR)
}

/// The rate a send under this row keeps now: an account's base (the operator's, else SES's)
/// times its back-off; a tenant's or a configuration set's as set. None: no limit.
pub fn effective(r: &SendRate, now: DateTime<Utc>) -> Option<f64> {
    match r.scope {
        Scope::Account => {
            let base = r.rate_per_second.or(r.provider_rate.filter(|x| *x > 0.0))?;
            Some(base * factor_now(r, now))
        }
        _ => r.rate_per_second,
    }
}

/// What remains of an account's 24-hour quota (None: unknown or unlimited).
pub fn quota_left(r: &SendRate) -> Option<f64> {
    let max = r.max_24h.filter(|m| *m >= 0.0)?;
    Some(max - r.sent_24h.unwrap_or(0.0) - r.sent_since_read as f64)
}

/// The sends of a quota of `max` kept for single sends.
fn reserve(max: f64) -> f64 {
    (max * QUOTA_RESERVE).ceil().max(0.0)
}

/// Whether a send may use the quota now: a single send while any remains, a child while
/// more than the reserve does.
pub fn quota_allows(r: &SendRate, bulk: bool) -> bool {
    match (quota_left(r), r.max_24h) {
        (Some(left), Some(max)) if bulk => left > reserve(max),
        (Some(left), _) => left > 0.0,
        _ => true,
    }
}

/// What a campaign with `to_send` recipients still to send is told when its account's quota
/// (less the reserve campaigns leave) will not cover them.
pub fn quota_warning(to_send: i64, account: &SendRate) -> Option<String> {
    let left = quota_left(account)?;
    let usable = (left - reserve(account.max_24h.unwrap_or(0.0))).floor().max(0.0);
    (to_send as f64 > usable).then(|| {
        format!(
            "SES account {}'s 24-hour quota covers {usable:.0} more campaign sends ({left:.0} of {:.0} left, {:.0}% kept \
             for single sends) and this campaign has {to_send} still to send: the rest will wait \
             (waiting_reason rate_limited, account_quota) until the quota frees",
            account.key,
            account.max_24h.unwrap_or(0.0),
            QUOTA_RESERVE * 100.0
        )
    })
}

/// The rates of one send, read at the start of its run (`send_rates::for_send`).
pub struct Plan {
    pub account: String,
    /// The sending tenant (its id): its share of a shared rate.
    pub tenant: String,
    /// Whether it takes its tenant's share of a shared rate (off: first come, to measure).
    pub shares: bool,
    pub rates: Vec<SendRate>,
    /// A campaign's child (its message key is the campaign's `campaign:<id>:<position>`).
    pub bulk: bool,
}

impl Plan {
    fn rate(&self, scope: Scope) -> Option<&SendRate> {
        self.rates.iter().find(|r| r.scope == scope)
    }

    /// The account's row, for the throttle back-off.
    pub fn account_rate(&self) -> Option<&SendRate> {
        self.rate(Scope::Account)
    }
}

/// The most slots an account's key may have taken before the quota (less the reserve, for a
/// campaign's child) is used up.
pub fn quota_cap(r: &SendRate, bulk: bool) -> Option<i64> {
    let max = r.max_24h.filter(|m| *m >= 0.0)?;
    let reserve = if bulk { reserve(max) } else { 0.0 };
    Some(r.taken_at_read + (max - r.sent_24h.unwrap_or(0.0) - reserve).floor().max(0.0) as i64)
}

/// One rate a stage of a send keeps: its name (`scope:key`), its slot key's limit, and whether
/// many tenants' sends keep it (an account's, a configuration set's), so each has a share.
struct Kept {
    name: String,
    limit: Limit,
    shared: bool,
}

fn limit(r: &SendRate, now: DateTime<Utc>, bulk: bool) -> Option<Kept> {
    let cap = if r.scope == Scope::Account { quota_cap(r, bulk) } else { None };
    let rate = effective(r, now).map(|x| x * HEADROOM);
    if rate.is_none() && cap.is_none() {
        return None;
    }
    let name = format!("{}:{}", r.scope.as_str(), r.key);
    // A quota with no known rate still counts its sends (a slot a microsecond apart).
    let rate_per_second = rate.unwrap_or(1e6);
    let limit = Limit { key: send_rates::slot_key(r.scope, &r.key), rate_per_second, cap };
    Some(Kept { name, limit, shared: r.scope != Scope::Tenant })
}

/// The most slots ahead a tenant may hold under a shared rate while others wait on it: its
/// weight's share of the slots booked ahead there (everyone's, with the one it asks for), and
/// at least its weight's share of what the horizon and `SHARED_AHEAD` hold at the rate (and
/// one), so that a tenant whose share others do not use keeps the rate busy.
pub fn share_cap(s: &send_shares::Standing, rate_per_second: f64, horizon: Duration) -> f64 {
    let share = s.weight / (s.weight + s.others).max(f64::MIN_POSITIVE);
    // A single send (the longer horizon) may pass its own tenant's children by the difference.
    let passing = horizon.saturating_sub(BULK_HORIZON).as_secs_f64() * rate_per_second * share;
    let of_booked = share * (s.ahead + s.others_ahead + 1) as f64 + passing;
    let of_horizon = ((horizon + SHARED_AHEAD).as_secs_f64() * rate_per_second * share).round().max(1.0);
    of_booked.max(of_horizon)
}

/// The name of a tenant's share of a rate named `scope:key`: `scope_share:key:tenant`.
pub fn share_name(rate: &str, tenant: &str) -> String {
    let (scope, key) = rate.split_once(':').unwrap_or((rate, ""));
    format!("{scope}_share:{key}:{tenant}")
}

fn quota_held(plan: &Plan) -> TaskError {
    let acct = plan.account_rate();
    let (left, max) = (acct.and_then(quota_left).unwrap_or(0.0), acct.and_then(|a| a.max_24h).unwrap_or(0.0));
    defer(
        format!("account_quota:{}", plan.account),
        format!(
            "SES account {}'s 24-hour quota is used up to its reserve ({left:.0} of {max:.0} left): held until it frees",
            plan.account
        ),
        QUOTA_HOLD,
    )
}

/// A deferral a little past the slot, spread so that waiting sends do not all come back at once.
fn defer(rate: String, note: String, wait: Duration) -> TaskError {
    let spread = Duration::from_millis(rand::random_range(0..500));
    TaskError::RateLimited { rate, note, wait: wait.max(Duration::from_millis(250)) + spread }
}

/// The slots a send took: when its call leaves and must have left by, and the keys that counted it.
#[derive(Debug, Default)]
pub struct Booked {
    /// Its last slot, and that plus `LATE_SLOT` (None: no rate applies). The request waits for
    /// the slot in the connector, built and signed (`ses::send`); one not on its way by the
    /// end is not made and another slot is taken.
    pub departure: Option<super::departure::Departure>,
    keys: Vec<String>,
}

/// Take this send's slots: its own rates' first (waited for here when the account's follows),
/// then its account's, which the call waits for in the connector (`Booked::departure`).
/// Returns the booking, or a deferral naming the rate (or the share of one) that holds it.
pub async fn wait_for_slot(db: &deadpool_postgres::Pool, plan: &Plan) -> Result<Booked, TaskError> {
    let now = Utc::now();
    if plan.account_rate().is_some_and(|a| !quota_allows(a, plan.bulk)) {
        return Err(quota_held(plan));
    }
    let own: Vec<Kept> =
        plan.rates.iter().filter(|r| r.scope != Scope::Account).filter_map(|r| limit(r, now, plan.bulk)).collect();
    let account = plan.account_rate().and_then(|r| limit(r, now, plan.bulk));
    let horizon = if plan.bulk { BULK_HORIZON } else { SINGLE_HORIZON };
    let mut booked = Booked::default();
    let stages = [(own, OWN_HORIZON), (account.into_iter().collect::<Vec<_>>(), horizon)];
    let last = stages.iter().rposition(|(stage, _)| !stage.is_empty());
    for (i, (stage, horizon)) in stages.into_iter().enumerate() {
        if stage.is_empty() {
            continue;
        }
        let mut taken = take_stage(db, plan, &stage, horizon).await?;
        // A campaign's child books at most `BULK_BOOK_AHEAD` ahead: further off, it waits
        // unbooked (within its horizon) until its slot comes near, so a single send that comes
        // meanwhile books before it rather than behind the children's whole queue.
        // It looks again no sooner than one slot later (others wait beside it).
        let until = std::time::Instant::now() + horizon;
        let one_slot = stage.iter().map(|k| k.limit.rate_per_second).fold(f64::MIN_POSITIVE, f64::max).recip();
        while let Slot::Wait(wait) = taken
            && plan.bulk
            && std::time::Instant::now() + wait <= until
        {
            tokio::time::sleep(wait.saturating_sub(BULK_BOOK_AHEAD).max(Duration::from_secs_f64(one_slot))).await;
            taken = take_stage(db, plan, &stage, horizon).await?;
        }
        match taken {
            Slot::Taken(wait) => {
                let slot = std::time::Instant::now() + wait;
                if Some(i) == last {
                    booked.departure = Some(super::departure::Departure { at: slot, by: slot + LATE_SLOT });
                } else {
                    tokio::time::sleep_until(slot.into()).await;
                }
                booked.keys.extend(stage.into_iter().map(|k| k.limit.key));
            }
            Slot::Full => return Err(quota_held(plan)),
            Slot::Wait(wait) => {
                let names: Vec<&str> = stage.iter().map(|k| k.name.as_str()).collect();
                let rates: Vec<String> =
                    stage.iter().map(|k| format!("{}/s", round(k.limit.rate_per_second))).collect();
                return Err(defer(
                    names.join(","),
                    format!(
                        "at its rate ({} at {}): the next slot is {wait:?} away",
                        names.join(", "),
                        rates.join(", ")
                    ),
                    wait,
                ));
            }
        }
    }
    Ok(booked)
}

/// Take one slot under every rate of a stage at once, within the tenant's share of each shared
/// rate: while other tenants wait on it, a tenant holds at most `share_cap` slots ahead there
/// (held past it: `scope_share:key:tenant`), and a send within its share may book up to
/// `SHARED_AHEAD` past its horizon (behind what the others booked). The tenant's asks are
/// recorded whatever the answer (they make it a waiting tenant), its booking with the slot.
async fn take_stage(
    db: &deadpool_postgres::Pool,
    plan: &Plan,
    stage: &[Kept],
    horizon: Duration,
) -> Result<Slot, TaskError> {
    let mut client = db.get().await.map_err(TaskError::retryable)?;
    let tx = client.transaction().await.map_err(TaskError::retryable)?;
    let mut ahead = horizon;
    for k in stage.iter().filter(|k| k.shared && plan.shares) {
        let s = send_shares::ask(&tx, &k.limit.key, &plan.tenant, WAITING_WINDOW.as_secs_f64())
            .await
            .map_err(TaskError::retryable)?;
        if s.others <= 0.0 {
            continue;
        }
        let cap = share_cap(&s, k.limit.rate_per_second, horizon);
        if s.ahead as f64 >= cap {
            tx.commit().await.map_err(TaskError::retryable)?;
            let wait = s.latest.and_then(|l| (l - Utc::now()).to_std().ok()).unwrap_or(horizon);
            let share = 100.0 * s.weight / (s.weight + s.others);
            let note = format!(
                "at its share of {} ({share:.0}% of {}/s while {} weight of other tenants' sends wait): {} of {} \
                 slots booked ahead are its, its share's most",
                k.name,
                round(k.limit.rate_per_second),
                round(s.others),
                s.ahead,
                s.ahead + s.others_ahead
            );
            return Err(defer(share_name(&k.name, &plan.tenant), note, wait));
        }
        ahead = horizon + SHARED_AHEAD;
    }
    let limits: Vec<Limit> = stage.iter().map(|k| k.limit.clone()).collect();
    let ahead = if plan.bulk { ahead.min(BULK_BOOK_AHEAD) } else { ahead };
    let taken = rate_slots::take(&tx, &limits, ahead).await.map_err(TaskError::retryable)?;
    let Slot::Taken(wait) = taken else {
        tx.commit().await.map_err(TaskError::retryable)?;
        return Ok(taken);
    };
    // The slot is where it is now: the booking's statements and commit take none of the wait.
    let slot = std::time::Instant::now() + wait;
    let at = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
    for k in stage.iter().filter(|k| k.shared && plan.shares) {
        send_shares::book(&tx, &k.limit.key, &plan.tenant, at).await.map_err(TaskError::retryable)?;
    }
    tx.commit().await.map_err(TaskError::retryable)?;
    Ok(Slot::Taken(slot.saturating_duration_since(std::time::Instant::now())))
}

/// A booked send whose call did not leave by its time (a busy machine): its slots stay spent
/// (the rate loses them, never exceeds) but no longer count against a quota. After `RETAKES`
/// misses in one run the job is deferred.
pub async fn missed(db: &deadpool_postgres::Pool, booked: &Booked, misses: u32) -> Result<(), TaskError> {
    let db = db.get().await.map_err(TaskError::retryable)?;
    rate_slots::give_back(&db, &booked.keys).await.map_err(TaskError::retryable)?;
    if misses < RETAKES {
        return Ok(());
    }
    let names = booked.keys.join(",");
    let note = format!("its call left over {LATE_SLOT:?} after each of {RETAKES} slots ({names}): a busy worker");
    Err(defer(names, note, LATE_SLOT))
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(rate: Option<f64>, provider: Option<f64>, factor: f64, at: DateTime<Utc>) -> SendRate {
        SendRate {
            scope: Scope::Account,
            key: "default".into(),
            rate_per_second: rate,
            provider_rate: provider,
            max_24h: Some(1000.0),
            sent_24h: Some(900.0),
            read_at: None,
            read_error: None,
            sent_since_read: 85,
            factor,
            factor_at: at,
            throttles: 0,
            last_throttle_at: None,
            weight: None,
            updated_by: None,
            updated_at: at,
            taken_at_read: 40,
        }
    }

    #[test]
    fn the_operator_rate_wins_and_the_back_off_grows_back() {
        let t = Utc::now();
        assert_eq!(effective(&account(Some(5.0), Some(14.0), 1.0, t), t), Some(5.0));
        assert_eq!(effective(&account(None, Some(14.0), 1.0, t), t), Some(14.0));
        assert_eq!(effective(&account(None, None, 1.0, t), t), None);
        let halved = account(None, Some(10.0), 0.5, t);
        assert_eq!(effective(&halved, t), Some(5.0));
        let later = t + chrono::Duration::seconds(20);
        assert!((effective(&halved, later).expect("a rate") - 6.0).abs() < 1e-9, "+0.5 % of the base per second");
        assert_eq!(effective(&halved, t + chrono::Duration::seconds(1000)), Some(10.0), "never above the base");
        assert_eq!(after_throttle(Some(&halved), t), 0.25);
        assert_eq!(after_throttle(Some(&account(None, Some(10.0), 0.1, t)), t), FLOOR);
        assert_eq!(after_throttle(None, t), 0.5);
    }

    #[test]
    fn a_second_at_the_headroom_holds_a_late_call_and_its_transit() {
        let slack = 1.0 / HEADROOM - 1.0;
        assert!(
            slack >= (LATE_SLOT + TRANSIT).as_secs_f64(),
            "at {HEADROOM}, N + 1 sends span {slack:.3} s more than a second: less than {LATE_SLOT:?} + {TRANSIT:?}"
        );
    }

    #[test]
    fn campaigns_leave_the_quota_reserve_to_single_sends() {
        let t = Utc::now();
        let mut a = account(None, Some(10.0), 1.0, t);
        assert_eq!(quota_left(&a), Some(15.0));
        assert!(quota_allows(&a, true) && quota_allows(&a, false));
        a.sent_since_read = 91; // 9 left: within the reserve of 10
        assert!(!quota_allows(&a, true) && quota_allows(&a, false));
        a.sent_since_read = 100;
        assert!(!quota_allows(&a, false));
        // The cap on the account's slot count: read at 40 taken, 100 left less a reserve of 10.
        assert_eq!((quota_cap(&a, true), quota_cap(&a, false)), (Some(130), Some(140)));
        a.max_24h = Some(-1.0); // unlimited
        assert!(quota_allows(&a, true));
        assert_eq!(quota_cap(&a, true), None);
    }

    #[test]
    fn a_tenants_own_role_sends_through_its_own_account() {
        assert_eq!(account_of(None), "default");
        assert_eq!(account_of(Some("arn:aws:iam::123456789012:role/x")), "123456789012");
        assert_eq!(account_of(Some("nonsense")), "default");
    }
}
