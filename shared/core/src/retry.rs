//! The one retry policy. Job retries, callback deliveries and provider calls all ask it when
//! to try again; nothing else computes when a job, a delivery or a provider call is retried.
//! (A process's own waits — a worker's pause after a failed claim, the sweep's re-dispatch of a
//! lost message — are not retries of work and keep their own short schedules.)
//!
//! The schedule is pure (`backoff`) so it can be tested exactly; jitter is a separate step.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

/// Exponential backoff: `base * 2^(attempt-1)`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
    /// Fraction of the delay that jitter may remove (0.0 = none, 0.5 = up to half).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { base: Duration::from_secs(2), max: Duration::from_secs(3600), jitter: 0.5 }
    }
}

impl RetryPolicy {
    /// Callback deliveries: 1 min doubling to 12 h, jitter up to a quarter. With
    /// `store::callbacks::MAX_ATTEMPTS` (16) the 15 waits add up to 2.8–3.2 days.
    pub const CALLBACKS: RetryPolicy =
        RetryPolicy { base: Duration::from_secs(60), max: Duration::from_secs(12 * 3600), jitter: 0.25 };

    /// The delay before the attempt after `attempt` (1-based: the attempt that just failed).
    pub fn backoff(&self, attempt: i32) -> Duration {
        let exp = u32::try_from(attempt.saturating_sub(1)).unwrap_or(0).min(31);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// Remove up to `jitter` of the delay, so retries of many jobs spread out.
    pub fn jittered(&self, delay: Duration, rng: &mut impl Rng) -> Duration {
        let cut = if self.jitter > 0.0 { rng.random_range(0.0..self.jitter) } else { 0.0 };
        delay.mul_f64(1.0 - cut)
    }

    /// When the next attempt is due, counted from `now`.
    pub fn next_run_at(&self, now: DateTime<Utc>, attempt: i32) -> DateTime<Utc> {
        self.next_run_at_after(now, attempt, None)
    }

    /// The same, but never before a delay the other side asked for (`Retry-After`), itself
    /// capped at `max`.
    pub fn next_run_at_after(&self, now: DateTime<Utc>, attempt: i32, asked: Option<Duration>) -> DateTime<Utc> {
        let delay = self.jittered(self.backoff(attempt), &mut rand::rng());
        let delay = delay.max(asked.unwrap_or(Duration::ZERO).min(self.max));
        now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_base_and_stops_at_max() {
        let p = RetryPolicy { base: Duration::from_secs(2), max: Duration::from_secs(60), jitter: 0.0 };
        let got: Vec<u64> = (1..=7).map(|a| p.backoff(a).as_secs()).collect();
        assert_eq!(got, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.backoff(0), Duration::from_secs(2));
        assert_eq!(p.backoff(10_000), Duration::from_secs(60));
    }

    #[test]
    fn jitter_only_ever_shortens_within_its_fraction() {
        let p = RetryPolicy { jitter: 0.5, ..RetryPolicy::default() };
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let d = p.jittered(Duration::from_secs(10), &mut rng);
            assert!(d <= Duration::from_secs(10) && d >= Duration::from_secs(5), "{d:?}");
        }
    }

    #[test]
    fn callback_retries_spread_over_about_three_days() {
        let p = RetryPolicy::CALLBACKS;
        let total: Duration = (1..16).map(|a| p.backoff(a)).sum();
        assert!(total.as_secs() > 3 * 86_400 && total.as_secs() < 4 * 86_400, "{total:?}");
        // Jitter removes at most a quarter: at least 2.4 days.
        assert!(total.mul_f64(0.75).as_secs() > 2 * 86_400);
    }

    #[test]
    fn a_retry_after_is_honoured_up_to_the_cap() {
        let p = RetryPolicy { base: Duration::from_secs(2), max: Duration::from_secs(60), jitter: 0.0 };
        let now = Utc::now();
        assert_eq!(p.next_run_at_after(now, 1, Some(Duration::from_secs(30))), now + chrono::Duration::seconds(30));
        assert_eq!(p.next_run_at_after(now, 1, Some(Duration::from_secs(1))), now + chrono::Duration::seconds(2));
        assert_eq!(p.next_run_at_after(now, 1, Some(Duration::from_secs(999))), now + chrono::Duration::seconds(60));
    }

    #[test]
    fn next_run_at_is_in_the_future_and_bounded() {
        let p = RetryPolicy::default();
        let now = Utc::now();
        let at = p.next_run_at(now, 3);
        assert!(at > now && at <= now + chrono::Duration::seconds(8));
    }
}
