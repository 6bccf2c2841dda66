//! Rate limits (`BackendTrafficPolicy.spec.rateLimit`): how many requests a rule lets through
//! per unit of time, counted in this process (`local`) or in Redis for every replica together
//! (`global`). A leaf below `snapshot`: it knows quotas, counters and the Redis store, not
//! requests (the pipeline's phase "limit" picks the rules a request matches).
//!
//! Every rule counts with a sliding window (two fixed windows, the previous one weighted by how
//! much of it still overlaps the last `period`): at most about `requests` in any `period`, as
//! users read "600 a minute", with one counter pair per rule (and per distinct value).
//!
//! - [`window`]: one rule's counter, lock-free across worker threads.
//! - [`distinct`]: the counters of a `Distinct` rule, one per value, bounded in entries.
//! - [`redis`]: the same algorithm as one Lua script in Redis, shared by replicas.

pub(crate) mod clock;
pub(crate) mod distinct;
pub(crate) mod redis;
pub(crate) mod rules;
pub(crate) mod window;

use std::time::Duration;

/// A limit: `requests` per `period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Quota {
    /// At least 1.
    pub(crate) requests: u32,
    /// One second, minute, hour or day.
    pub(crate) period: Duration,
}

impl Quota {
    /// The period in milliseconds (at most a day's 86,400,000).
    pub(crate) fn period_ms(&self) -> u64 {
        u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX)
    }
}

/// What one rule decided about one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Counted: within the limit. A request over it is not counted.
    pub(crate) allowed: bool,
    /// Requests the rule would still let through now (after this one, when allowed): the
    /// `r` of the `RateLimit` header.
    pub(crate) remaining: u32,
    /// When denied: how long until one more request would be let through (`Retry-After`,
    /// the `t` of `RateLimit`). When allowed: until the current window ends.
    pub(crate) reset: Duration,
}

/// Thin `pub` wrappers over the counters for `benches/ratelimit.rs` (criterion reaches only
/// `pub` items); not an API.
#[doc(hidden)]
pub mod bench_support {
    use std::time::Duration;

    use super::distinct::DistinctCounters;
    use super::window::WindowCounter;
    use super::{Decision, Quota};

    fn parts(decision: Decision) -> (bool, u32, Duration) {
        (decision.allowed, decision.remaining, decision.reset)
    }

    /// [`WindowCounter`]; acquires return `(allowed, remaining, reset)`.
    #[derive(Debug, Default)]
    pub struct Counter(WindowCounter);

    impl Counter {
        pub fn acquire(
            &self,
            requests: u32,
            period: Duration,
            now_ms: u64,
        ) -> (bool, u32, Duration) {
            parts(self.0.acquire(Quota { requests, period }, now_ms))
        }
    }

    /// [`DistinctCounters`].
    #[derive(Debug)]
    pub struct Distinct(DistinctCounters);

    impl Distinct {
        pub fn new(max_entries: usize) -> Self {
            Distinct(DistinctCounters::new(max_entries))
        }

        pub fn value_hash(&self, value: &[u8]) -> u64 {
            self.0.value_hash(value)
        }

        pub fn acquire(
            &self,
            key: u64,
            requests: u32,
            period: Duration,
            now_ms: u64,
        ) -> (bool, u32, Duration) {
            parts(self.0.acquire(key, Quota { requests, period }, now_ms))
        }

        pub fn entries(&self) -> usize {
            self.0.len()
        }
    }

    /// [`super::clock::now_ms`].
    pub fn now_ms() -> u64 {
        super::clock::now_ms()
    }
}
