//! The `neighbours` scenario's sends neighbour: the account's send rate set at `RATE`/s (the SES
//! stand-in in front of moto throttles above it and answers `GetAccount` with it), the quiet
//! tenant A's `MINE` single sends timed from their submission to the last one's arrival at SES,
//! alone, then while tenant X has a queue of single sends (200 at full scale) going, then, once
//! those are out, while X has a campaign going (10,000 recipients at full scale: the most a
//! campaign takes inline; the 100k would need recipient pages uploaded through the API).
//! A fair
//! share of the account's rate between the two is half of it, so A's sends' fair-share time is
//! `MINE / (RATE × factor / 2)`, where `factor` is what Relay's back-off left of the account's
//! rate at A's last send (1 unless the stand-in throttled: a loaded machine can send one send
//! late and the next on time). A violation: A's sends beside X's queue take more than twice that
//! plus `ALLOWANCE`, or do not all reach SES.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use taskdeck::credentials::{RoleSpec, TaskCredentials, TaskRoles};
use taskdeck::email::{pace, ses};
use taskdeck::job::TenantId;
use taskdeck::platform::Platform;
use taskdeck::store::{modes, sending_identities};

use super::{Env, Report};
use crate::bench::setup::Scratch;
use crate::ses_standin::{self, Counts, Faults, FaultySes};

/// The account's send rate, sends a second.
const RATE: usize = 5;
/// The quiet tenant's single sends in each phase.
const MINE: usize = 5;
/// What the quiet tenant's sends may take beyond twice their fair-share time: a claim round, a
/// sweep of the held sends and SES's answers on a shared, loaded 2-core machine.
const ALLOWANCE: Duration = Duration::from_secs(1);
const DOMAINS: [&str; 2] = ["acme.example", "globex.example"];

/// The quiet tenant's sends beside one of X's.
pub struct Beside {
    /// From their submission to the last one at SES; `None`: not all there within 30 s.
    pub mine: Option<Duration>,
    /// X's sends at SES from this neighbour's submission to the quiet tenant's last.
    pub theirs: usize,
    /// From X's submission until its first `2 × RATE` sends were at SES (the quiet tenant's
    /// sends are submitted then).
    pub warm_up: Duration,
    /// What the back-off left of the account's rate at the quiet tenant's last send (1: none).
    pub factor: f64,
}

/// The SES stand-in and the platform whose tasks send through it.
pub struct Sending {
    ses: FaultySes,
    pub platform: Platform,
}

/// SES writes on, both tenants' domains allowed and verified in moto, the account's rate read
/// from a stand-in of this run's; the scratch's platform with `email.send`'s role on it.
pub async fn setup(env: &Env, scratch: &Scratch, x: TenantId) -> anyhow::Result<Sending> {
    let moto = env.moto().await?;
    let faults = Faults { max_per_second: Some(RATE), account: Some((RATE as f64, 100_000.0)), ..Faults::default() };
    let ses = ses_standin::start(&moto, faults, 1)?;
    let pool = &scratch.platform.pool;
    let mut db = pool.get().await?;
    modes::set(&mut db, "write:ses", true, "chaos", Some("neighbours: sends go to the SES stand-in")).await?;
    let moto_ses = ses::client(&crate::localaws::sdk_config(&moto));
    for (tenant, domain) in [scratch.tenant.id, x].into_iter().zip(DOMAINS) {
        sending_identities::set(&mut db, tenant, &[domain.into()]).await?;
        // Already there from an earlier run: fine.
        let _ = moto_ses.create_email_identity().email_identity(domain).send().await;
    }
    drop(db);
    let standin = crate::localaws::sdk_config(&ses.url);
    pace::refresh_account(pool, &standin).await?;
    let role = RoleSpec { role_arn: crate::localaws::EMAIL_SEND_ROLE.into(), external_id: None };
    let roles = TaskRoles::default().map_task("email.send", role)?;
    let platform = scratch.platform.clone().with_credentials(Arc::new(TaskCredentials::new(roles, &standin)));
    Ok(Sending { ses, platform })
}

impl Sending {
    /// The quiet tenant's `MINE` sends alone: from their submission to the last one at SES.
    pub async fn solo(&self, scratch: &Scratch) -> anyhow::Result<Option<Duration>> {
        self.mine(scratch, "a-solo").await
    }

    /// X's `queued` single sends submitted and going at the account's rate, then the quiet
    /// tenant's.
    pub async fn beside_sends(&self, scratch: &Scratch, x: TenantId, queued: usize) -> anyhow::Result<Beside> {
        let sends = (0..queued).map(|i| single(DOMAINS[1], &format!("x-send {i}"))).collect();
        let before = self.passed("x-").len();
        scratch.submit(x, "x-send", "email.send", sends).await?;
        self.beside(scratch, before, queued, "a-beside-sends").await
    }

    /// X's campaign of `recipients` submitted and sending at the account's rate, then the quiet
    /// tenant's sends.
    pub async fn beside_campaign(&self, scratch: &Scratch, x: TenantId, recipients: usize) -> anyhow::Result<Beside> {
        let to: Vec<Value> = (0..recipients).map(|i| json!({"to": format!("c{i}@example.com")})).collect();
        let message = json!({"from": format!("News <news@{}>", DOMAINS[1]), "subject": "x-campaign", "text": "Hi"});
        let campaign = json!({"message": message, "recipients": to, "concurrency_limit": 20});
        let before = self.passed("x-").len();
        scratch.submit(x, "x-campaign", "email.campaign", vec![campaign]).await?;
        self.beside(scratch, before, recipients, "a-beside-campaign").await
    }

    /// Once X's sends (`before` of them at SES before its submission) go at the account's rate,
    /// the quiet tenant's.
    async fn beside(&self, scratch: &Scratch, before: usize, queued: usize, mine: &str) -> anyhow::Result<Beside> {
        let started = Instant::now();
        let theirs = || self.passed("x-").len() - before;
        while theirs() < 2 * RATE.min(queued) && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let warm_up = started.elapsed();
        let mine = self.mine(scratch, mine).await?;
        let rates = taskdeck::store::send_rates::list(&scratch.platform.pool.get().await?).await?;
        let factor =
            rates.iter().find(|r| r.scope == taskdeck::store::send_rates::Scope::Account).map_or(1.0, |r| r.factor);
        Ok(Beside { mine, theirs: theirs(), warm_up, factor })
    }

    async fn mine(&self, scratch: &Scratch, name: &str) -> anyhow::Result<Option<Duration>> {
        let started = Instant::now();
        let sends = (0..MINE).map(|i| single(DOMAINS[0], &format!("{name} {i}"))).collect();
        scratch.submit(scratch.tenant.id, name, "email.send", sends).await?;
        let deadline = started + Duration::from_secs(30);
        while self.passed(name).len() < MINE && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let at = self.passed(name);
        Ok(at.iter().max().filter(|_| at.len() == MINE).map(|t| t.duration_since(started)))
    }

    /// Wait until `n` sends (subjects `prefix`) are at SES, at most 60 s.
    pub async fn drain(&self, prefix: &str, n: usize) {
        let started = Instant::now();
        while self.passed(prefix).len() < n && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn passed(&self, prefix: &str) -> Vec<Instant> {
        self.ses.counts.passed().into_iter().filter(|(_, s)| s.starts_with(prefix)).map(|(at, _)| at).collect()
    }

    /// The figures and the checks: A's sends alone and beside each of X's (`(name, time)`),
    /// against twice their fair-share time plus `ALLOWANCE`.
    pub fn report(&self, report: &mut Report, solo: Option<Duration>, beside: &[(String, Beside)]) {
        let fair_at = |factor: f64| Duration::from_secs_f64(MINE as f64 / (RATE as f64 * factor / 2.0));
        let (fair, bound) = (fair_at(1.0), 2 * fair_at(1.0) + ALLOWANCE);
        let ms = |d: Option<Duration>| d.map_or("not all at SES".to_owned(), |d| format!("{} ms", d.as_millis()));
        report.fig("account send rate (/s); victim's single sends per phase", format!("{RATE}; {MINE}"));
        report.fig(
            &format!("victim's {MINE} sends: fair-share time; bound (2 × it + allowance)"),
            format!("{} ms; {} ms", fair.as_millis(), bound.as_millis()),
        );
        report.fig(&format!("victim's {MINE} sends at SES: solo"), ms(solo));
        for (name, b) in beside {
            report.fig(&format!("victim's {MINE} sends at SES: {name}"), ms(b.mine));
            report.fig(&format!("{name}: noisy tenant's first {} sends at SES after", 2 * RATE), b.warm_up.as_millis());
            report.fig(&format!("{name}: noisy tenant's sends at SES by the victim's last"), b.theirs);
            // After a throttle the account's rate is what the back-off left of it.
            let bound = 2 * fair_at(b.factor.min(1.0)) + ALLOWANCE;
            report.fig(
                &format!("{name}: account rate's back-off factor at the victim's last; bound"),
                format!("{:.2}; {} ms", b.factor, bound.as_millis()),
            );
            report.check(
                b.mine.is_some_and(|d| d <= bound),
                format!("victim's {MINE} sends {name}: {} > {} ms", ms(b.mine), bound.as_millis()),
            );
        }
        report.fig("sends throttled by the stand-in", Counts::get(&self.ses.counts.throttled));
    }
}

fn single(domain: &str, subject: &str) -> Value {
    json!({"from": format!("Chaos <noreply@{domain}>"), "to": ["one@example.com"], "subject": subject, "text": "Hi"})
}
