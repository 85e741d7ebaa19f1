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

    /// Take `jobs` tokens from the tenant's bucket, or say why not.
    pub fn take(&self, tenant: TenantId, jobs: usize, now: Instant) -> Result<(), Refused> {
        let Some(rate) = self.rate else { return Ok(()) };
        let cost = jobs as f64;
        if cost > rate.burst.max(1.0) {
            return Err(Refused::Never { burst: rate.burst.max(1.0) as u64 });
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = buckets.entry(tenant).or_insert((rate.burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate.per_second).min(rate.burst);
        *at = now;
        if *tokens >= cost {
            *tokens -= cost;
            return Ok(());
        }
        Err(Refused::Wait(Duration::from_secs_f64(((cost - *tokens) / rate.per_second).max(0.001))))
    }

    /// `take`, as the API's answer: 429 with `Retry-After` when waiting helps, 422 when a
    /// request is larger than the bucket can ever hold (retrying it would never pass).
    pub fn check(&self, tenant: TenantId, jobs: usize) -> Result<(), ApiError> {
        self.take(tenant, jobs, Instant::now()).map_err(|refused| match refused {
            Refused::Wait(wait) => {
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                let rate = self.rate.map(|r| r.per_second).unwrap_or_default();
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!("this tenant may submit {rate} jobs per second; retry after {secs} s"),
                )
                .with("retry_after_seconds", secs)
            }
            Refused::Never { burst } => ApiError::unprocessable(
                "over_burst",
                format!("{jobs} jobs in one request; this tenant's rate limit takes at most {burst} at once: split it"),
            )
            .with("field", "jobs")
            .with("max_jobs", burst),
        })
    }
}

/// Why the bucket refused a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refused {
    /// Enough tokens after this wait.
    Wait(Duration),
    /// More jobs than the bucket ever holds: no wait helps.
    Never { burst: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let limits = RateLimits::new(Some(TenantRate { per_second: 10.0, burst: 5.0 }));
        let (a, b) = (TenantId::new(), TenantId::new());
        let t = Instant::now();
        assert!(limits.take(a, 5, t).is_ok());
        let Refused::Wait(wait) = limits.take(a, 1, t).unwrap_err() else { panic!("a wait") };
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        assert!(limits.take(b, 5, t).is_ok(), "another tenant has its own bucket");
        assert!(limits.take(a, 1, t + Duration::from_millis(100)).is_ok());
        assert!(limits.take(a, 5, t + Duration::from_secs(60)).is_ok(), "refills only up to the burst");
        assert!(limits.take(a, 1, t + Duration::from_secs(60)).is_err());
        assert!(RateLimits::new(None).take(a, 1_000_000, t).is_ok());
    }

    #[test]
    fn a_request_larger_than_the_burst_is_refused_for_good_not_told_to_wait() {
        let limits = RateLimits::new(Some(TenantRate { per_second: 10.0, burst: 5.0 }));
        let a = TenantId::new();
        let t = Instant::now();
        assert_eq!(limits.take(a, 6, t + Duration::from_secs(3600)), Err(Refused::Never { burst: 5 }));
        assert!(limits.take(a, 5, t).is_ok(), "the refusal took no tokens");
        let e = limits.check(a, 6).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "over_burst"));
        assert_eq!(e.details["max_jobs"], 5);
    }
}
