//! The one token bucket every EC2 call waits for (`--limit-ipam-api-qps`,
//! `--limit-ipam-api-burst`), so the operator never exceeds its share of the account's EC2
//! request rate however many nodes it serves.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Default sustained rate of EC2 calls per second.
pub const DEFAULT_QPS: f64 = 20.0;
/// Default number of calls that may go out back to back.
pub const DEFAULT_BURST: u32 = 4;

/// The rate settings were unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimiterError {
    /// The rate must be a positive, finite number of calls per second.
    #[error("--limit-ipam-api-qps must be a positive number, got {0}")]
    Qps(f64),
    /// The burst must allow at least one call.
    #[error("--limit-ipam-api-burst must be at least 1")]
    Burst,
}

/// A token bucket shared by every EC2 call.
pub struct ApiLimiter {
    bucket: DefaultDirectRateLimiter,
}

impl std::fmt::Debug for ApiLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiLimiter").finish_non_exhaustive()
    }
}

impl ApiLimiter {
    /// A bucket refilling at `qps` tokens a second and holding at most `burst`.
    pub fn new(qps: f64, burst: u32) -> Result<Self, LimiterError> {
        if !(qps.is_finite() && qps > 0.0) {
            return Err(LimiterError::Qps(qps));
        }
        let burst = NonZeroU32::new(burst).ok_or(LimiterError::Burst)?;
        let period = Duration::from_secs_f64(1.0 / qps);
        let quota = Quota::with_period(period)
            .ok_or(LimiterError::Qps(qps))?
            .allow_burst(burst);
        Ok(Self {
            bucket: RateLimiter::direct(quota),
        })
    }

    /// Waits for a token and returns how long that took.
    pub async fn acquire(&self) -> Duration {
        let start = Instant::now();
        self.bucket.until_ready().await;
        start.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unusable_settings() {
        assert_eq!(ApiLimiter::new(0.0, 4).err(), Some(LimiterError::Qps(0.0)));
        assert!(ApiLimiter::new(f64::NAN, 4).is_err());
        assert_eq!(ApiLimiter::new(20.0, 0).err(), Some(LimiterError::Burst));
    }

    #[tokio::test]
    async fn burst_goes_out_at_once_then_the_rate_holds() {
        // 50 qps: after a burst of 4, six more calls need at least 6 × 20 ms.
        let limiter = ApiLimiter::new(50.0, 4).expect("limiter");
        let start = Instant::now();
        for _ in 0..4 {
            limiter.acquire().await;
        }
        assert!(
            start.elapsed() < Duration::from_millis(40),
            "burst was throttled"
        );
        for _ in 0..6 {
            limiter.acquire().await;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(110),
            "rate not held: {elapsed:?}"
        );
    }
}
