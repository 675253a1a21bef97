//! Per-principal rate limit (`server.rate_limit_per_second`,
//! `server.rate_limit_burst`): one token bucket per principal (GCRA,
//! from `governor`). Every query takes a token before its input is
//! validated or any teacher is asked; [`predict::ask`](super::predict::ask)
//! cannot run without an [`Admitted`].
//!
//! - A unary query (`Predict`, `ModelInfer`) over the rate is refused
//!   ([`RateLimit::admit`]): RESOURCE_EXHAUSTED with error reason
//!   `RATE_LIMITED` and a retry delay, so a client can tell it from
//!   `BUDGET_EXHAUSTED`.
//! - A `PredictStream` is paced instead ([`RateLimit::pace`]): its next
//!   message waits for the principal's next token, and HTTP/2 flow control
//!   slows the client down. A labelling job is one long stream; refusing a
//!   message would end the whole job over a limit that only asks it to go
//!   slower.
//!
//! # Invariants
//! - A limited query is refused or delayed before anything else happens:
//!   nothing is charged, the session is not touched (a cached repeat is
//!   limited too: the limit protects the server, not the budget).
//! - A request of n rows takes n tokens ([`RateLimit::take_more`]), the
//!   first before anything else, the others once its input is parsed.
//! - Buckets are keyed by principal, whatever the session scope: principals
//!   sharing one global budget still each have their own rate.

use super::status::ServiceError;
use crate::settings::RateQuota;
use governor::clock::Clock;
use governor::clock::QuantaInstant;
use governor::{DefaultKeyedRateLimiter, NotUntil, Quota};
use std::sync::Arc;
use std::time::Duration;

/// A token of the principal's bucket, taken (or no limit is configured).
#[derive(Debug)]
pub struct Admitted(());

/// What a query over the rate gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// Refused (unary calls).
    Refuse,
    /// Delayed until the bucket has the tokens (streams).
    Wait,
}

/// The configured limit, or none; replaced whole on reload.
pub struct RateLimit {
    current: std::sync::RwLock<Arc<Buckets>>,
}

/// One quota's buckets.
struct Buckets {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
    quota: Option<RateQuota>,
}

impl Buckets {
    fn of(quota: Option<RateQuota>) -> Buckets {
        let limiter =
            quota.map(|q| DefaultKeyedRateLimiter::keyed(Quota::per_second(q.per_second).allow_burst(q.burst)));
        Buckets { limiter, quota }
    }
}

/// The refusal of a query over `quota`, until the bucket allows it.
fn limited(
    limiter: &DefaultKeyedRateLimiter<String>,
    quota: RateQuota,
    not_until: NotUntil<QuantaInstant>,
) -> ServiceError {
    ServiceError::RateLimited {
        retry_after: not_until.wait_time_from(limiter.clock().now()).max(Duration::from_millis(1)),
        per_second: quota.per_second.get(),
        burst: quota.burst.get(),
    }
}

impl RateLimit {
    /// A bucket per principal of `quota`; `None`: every query admitted.
    pub fn new(quota: Option<RateQuota>) -> Self {
        RateLimit { current: std::sync::RwLock::new(Arc::new(Buckets::of(quota))) }
    }

    /// Puts `quota` in force from the next query, unless it is the one in
    /// force (then nothing changes); a changed quota starts with full
    /// buckets.
    pub fn reconfigure(&self, quota: Option<RateQuota>) {
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.quota != quota {
            *current = Arc::new(Buckets::of(quota));
        }
    }

    fn buckets(&self) -> Arc<Buckets> {
        Arc::clone(&self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Takes a token from `principal`'s bucket.
    ///
    /// # Errors
    /// [`ServiceError::RateLimited`] when the bucket is empty, with the
    /// time until the next token.
    pub fn admit(&self, principal: &str) -> Result<Admitted, ServiceError> {
        let buckets = self.buckets();
        let (Some(limiter), Some(quota)) = (&buckets.limiter, buckets.quota) else { return Ok(Admitted(())) };
        limiter.check_key(&principal.to_owned()).map(|()| Admitted(())).map_err(|n| limited(limiter, quota, n))
    }

    /// Takes `more` further tokens from `principal`'s bucket for the other
    /// rows of a request that already took one: a request of n rows is n
    /// queries.
    ///
    /// # Errors
    /// [`ServiceError::RateLimited`] (only with [`Over::Refuse`]);
    /// [`ServiceError::InvalidInput`] when the request has more rows than
    /// the bucket holds at all.
    pub async fn take_more(&self, principal: &str, more: usize, over: Over) -> Result<(), ServiceError> {
        let buckets = self.buckets();
        let (Some(limiter), Some(quota)) = (&buckets.limiter, buckets.quota) else { return Ok(()) };
        let Some(n) = u32::try_from(more).ok().and_then(std::num::NonZeroU32::new) else { return Ok(()) };
        let too_many = |_| {
            ServiceError::InvalidInput(format!(
                "this request has {} rows, more than this principal's rate-limit burst of {} \
                 (server.rate_limit_burst) allows at once: send at most {} rows per request",
                more + 1,
                quota.burst,
                quota.burst
            ))
        };
        let key = principal.to_owned();
        match over {
            Over::Wait => limiter.until_key_n_ready(&key, n).await.map_err(too_many),
            Over::Refuse => limiter.check_key_n(&key, n).map_err(too_many)?.map_err(|n| limited(limiter, quota, n)),
        }
    }

    /// Takes a token from `principal`'s bucket, waiting for one if it is
    /// empty (at most 1 / `per_second` per token once the burst is spent).
    pub async fn pace(&self, principal: &str) -> Admitted {
        if let Some(limiter) = &self.buckets().limiter {
            limiter.until_key_ready(&principal.to_owned()).await;
        }
        Admitted(())
    }
}
