//! A token bucket: at most `per_second` events a second, in bursts of at most `per_second`.
//!
//! Two ways to take a token. [`Rate::try_take`] takes one only if there is one now (a
//! request that would make a new DNS name: over the rate it is refused). [`Rate::reserve`]
//! always takes one, going into debt when there is none, and says how long to wait before
//! using it (a refresher of a name already kept: it is put off, not refused). Reserved tokens
//! come before taken ones: while the bucket is in debt nothing can be taken, so those who wait
//! are served first, and over any window the events are at most a burst plus the rate times
//! the window.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The bucket.
#[derive(Debug)]
pub(crate) struct Rate {
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    per_second: u32,
    /// Tokens at `at`; negative while reserved tokens are owed.
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Adds the tokens earned since `at` (up to a full bucket).
    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate();
        self.tokens = (self.tokens + earned).min(self.rate());
        self.at = now;
    }

    fn rate(&self) -> f64 {
        f64::from(self.per_second.max(1))
    }
}

impl Rate {
    /// A full bucket of `per_second` (at least 1) tokens.
    pub(crate) fn new(per_second: u32) -> Self {
        let per_second = per_second.max(1);
        Rate {
            bucket: Mutex::new(Bucket {
                per_second,
                tokens: f64::from(per_second),
                at: Instant::now(),
            }),
        }
    }

    /// Changes the rate (a reload); what the bucket holds stays, up to the new size.
    pub(crate) fn set(&self, per_second: u32) {
        let mut bucket = self.lock();
        bucket.refill(Instant::now());
        bucket.per_second = per_second.max(1);
        bucket.tokens = bucket.tokens.min(bucket.rate());
    }

    /// Takes a token if there is one now.
    pub(crate) fn try_take(&self) -> bool {
        let mut bucket = self.lock();
        bucket.refill(Instant::now());
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes a token, owing it when there is none: the time to wait before it is earned
    /// (zero when there was one).
    pub(crate) fn reserve(&self) -> Duration {
        let mut bucket = self.lock();
        bucket.refill(Instant::now());
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / bucket.rate())
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        // Every update leaves the bucket consistent: poisoning is not a reason to fail.
        self.bucket.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of the rate, then one per 1/rate seconds; reserved tokens are owed and come
    /// before taken ones.
    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate_and_reservations_first() {
        let rate = Rate::new(10);
        assert_eq!((0..20).filter(|_| rate.try_take()).count(), 10);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(rate.try_take(), "one earned in 100 ms");
        assert!(!rate.try_take());
        // Two refreshes wait 100 and 200 ms for theirs, and nothing can be taken meanwhile.
        assert_eq!(rate.reserve(), Duration::from_millis(100));
        assert_eq!(rate.reserve(), Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(!rate.try_take(), "the second reservation is still owed");
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(rate.try_take());
        // A lower rate keeps at most its own bucket.
        tokio::time::advance(Duration::from_secs(10)).await;
        rate.set(2);
        assert_eq!((0..20).filter(|_| rate.try_take()).count(), 2);
    }
}
