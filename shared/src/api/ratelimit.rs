//! Per-tenant intake rate limits: a token bucket per tenant, in this process. A job costs one
//! token (a batch costs its size); an empty bucket answers 429 `rate_limited` with
//! `Retry-After`. Buckets live per API process (per Lambda container on AWS), so the limit a
//! tenant sees is the configured rate times the number of API processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use super::error::ApiError;
use crate::job::TenantId;

/// Jobs per second each tenant may submit, and how many it may submit at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantRate {
    pub per_second: f64,
    pub burst: f64,
}

/// The buckets; `None` rate means no limit. Cheap to clone.
#[derive(Clone, Default)]
pub struct RateLimits {
    rate: Option<TenantRate>,
    buckets: Arc<Mutex<HashMap<TenantId, (f64, Instant)>>>,
}

impl RateLimits {
    pub fn new(rate: Option<TenantRate>) -> Self {
        Self { rate, buckets: Arc::default() }
    }

    /// Take `jobs` tokens from the tenant's bucket, or say how long until there are enough.
    pub fn take(&self, tenant: TenantId, jobs: usize, now: Instant) -> Result<(), Duration> {
        let Some(rate) = self.rate else { return Ok(()) };
        let cost = jobs as f64;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = buckets.entry(tenant).or_insert((rate.burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate.per_second).min(rate.burst);
        *at = now;
        if *tokens >= cost {
            *tokens -= cost;
            return Ok(());
        }
        // A request bigger than the burst can never pass: say so in the wait (the caller
        // splits it); otherwise the time until the bucket holds enough.
        let missing = cost.min(rate.burst.max(1.0)) - *tokens;
        Err(Duration::from_secs_f64((missing / rate.per_second).max(0.001)))
    }

    /// `take`, as the API's answer.
    pub fn check(&self, tenant: TenantId, jobs: usize) -> Result<(), ApiError> {
        self.take(tenant, jobs, Instant::now()).map_err(|wait| {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            let rate = self.rate.map(|r| r.per_second).unwrap_or_default();
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited",
                format!("this tenant may submit {rate} jobs per second; retry after {secs} s"))
                .with("retry_after_seconds", secs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let limits = RateLimits::new(Some(TenantRate { per_second: 10.0, burst: 5.0 }));
        let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let t = Instant::now();
        assert!(limits.take(a, 5, t).is_ok());
        let wait = limits.take(a, 1, t).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        assert!(limits.take(b, 5, t).is_ok(), "another tenant has its own bucket");
        assert!(limits.take(a, 1, t + Duration::from_millis(100)).is_ok());
        assert!(limits.take(a, 5, t + Duration::from_secs(60)).is_ok(), "refills only up to the burst");
        assert!(limits.take(a, 1, t + Duration::from_secs(60)).is_err());
        assert!(RateLimits::new(None).take(a, 1_000_000, t).is_ok());
    }
}
