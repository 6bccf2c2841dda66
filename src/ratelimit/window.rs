//! One rule's sliding-window counter: two fixed windows, lock-free, exact across threads.
//!
//! Time is cut into fixed windows of `quota.period` (`P` ms): window `w = now_ms / P`, elapsed
//! `e = now_ms % P`. The requests of the last period are estimated as
//! `prev × (P − e) / P + cur`, `cur` being the count of window `w` and `prev` the count of
//! window `w − 1` (Cloudflare's "sliding window counter"): the previous window is weighted by
//! how much of it still overlaps the last period. A request is allowed iff that estimate plus
//! one is at most `requests`, computed exactly in integers:
//! `(cur + 1) × P + prev × (P − e) ≤ requests × P`. Allowed requests are counted; denied ones
//! are not.
//!
//! The state is two `AtomicU64`s, each a window index (high 32 bits) and that window's count
//! (low 32 bits): `current` and `previous`. The window index is `w` truncated to `u32`: it
//! wraps after 2³² periods of the process's clock ([`super::clock`], which starts at 0), about
//! 136 years with a one-second period; no process lives that long.
//!
//! - Rollover (`current`'s window is older than `w`): `previous.fetch_max(current)` first, then
//!   `current` is swapped from exactly that value to `(w, 0)` by CAS (retried on failure).
//!   `fetch_max` makes the write of a thread that loses the CAS harmless: within a window the
//!   value it writes is at most the one the winner wrote, and a write of an older window never
//!   replaces a newer one. (A [`WindowCounter::release`] between a loser's load and its
//!   `fetch_max` can leave `previous` one above the final count: the estimate errs on the
//!   strict side, by at most the releases racing a rollover.)
//! - Counting: `current` goes from `(w, c)` to `(w, c + 1)` by CAS only after the check passed
//!   with that `c`; on failure the whole decision is made again. So N threads sending 10,000
//!   requests at once against a limit of 1,000 get exactly 1,000 through.
//! - `prev` for window `w` is `previous`'s count when its window is `w − 1`, else 0 (the
//!   window before `w` saw no request).
//! - A caller whose `now_ms` is already behind the counter's window (another thread read the
//!   clock later and rolled over first) is decided at the start of the counter's window: the
//!   strictest moment of it (the previous window weighs fully), never a looser one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Decision, Quota};

/// One rule's counter (see the module's docs). 16 bytes.
#[derive(Debug, Default)]
pub(crate) struct WindowCounter {
    /// `(window << 32) | count` of the window being counted.
    current: AtomicU64,
    /// `(window << 32) | count` of the window before it (when `window` is one less).
    previous: AtomicU64,
}

fn pack(window: u32, count: u32) -> u64 {
    (u64::from(window) << 32) | u64::from(count)
}

fn unpack(value: u64) -> (u32, u32) {
    ((value >> 32) as u32, value as u32)
}

/// Where `now_ms` falls for a quota: window index (truncated, see the module's docs), elapsed
/// milliseconds in it, and the period (at least 1 ms).
fn locate(quota: Quota, now_ms: u64) -> (u32, u64, u64) {
    let period = quota.period_ms().max(1);
    ((now_ms / period) as u32, now_ms % period, period)
}

/// The counts one decision works with.
#[derive(Clone, Copy, Debug)]
struct View {
    /// The raw `current` they were read from (the CAS's expected value).
    raw: u64,
    /// Count of the window being decided in.
    cur: u32,
    /// Count of the window before it.
    prev: u32,
    /// Elapsed ms of that window at the moment decided.
    elapsed: u64,
    /// Ms from the caller's `now_ms` to that moment (0 unless the caller's clock was behind).
    lead: u64,
}

/// The decision's arithmetic, exact in `u128` (counts < 2³², periods < 2⁶⁴).
#[derive(Clone, Copy, Debug)]
struct Math {
    requests: u128,
    period: u128,
}

impl Math {
    fn new(quota: Quota, period: u64) -> Self {
        Math {
            requests: u128::from(quota.requests),
            period: u128::from(period),
        }
    }

    /// `P × estimate` for counts `cur` and `prev` at `elapsed`.
    fn scaled(&self, cur: u32, prev: u32, elapsed: u64) -> u128 {
        u128::from(cur) * self.period
            + u128::from(prev) * (self.period - u128::from(elapsed).min(self.period))
    }

    /// One more request fits.
    fn allows(&self, cur: u32, prev: u32, elapsed: u64) -> bool {
        self.scaled(cur, prev, elapsed) + self.period <= self.requests * self.period
    }

    /// floor(requests − estimate), 0 when negative, saturated to `u32`.
    fn remaining(&self, cur: u32, prev: u32, elapsed: u64) -> u32 {
        let room = (self.requests * self.period).saturating_sub(self.scaled(cur, prev, elapsed));
        u32::try_from(room / self.period).unwrap_or(u32::MAX)
    }

    /// Ms until one more request would be allowed, nothing else arriving, after a denial at
    /// `elapsed` with counts `cur` and `prev` (at least 1).
    fn retry_after(&self, cur: u32, prev: u32, elapsed: u64) -> u64 {
        let (p, e) = (self.period, u128::from(elapsed).min(self.period));
        let limit = self.requests * p;
        let prev = u128::from(prev);
        let cur = u128::from(cur);
        // Within this window: `prev`'s weight decays by `prev` per ms.
        let over = (cur + 1) * p + prev * (p - e);
        if prev > 0 && over > limit {
            let t = (over - limit).div_ceil(prev);
            if t < p - e {
                return clamp_ms(t.max(1));
            }
        }
        // In the next window `cur` is the previous one: smallest t' with
        // P + cur × (P − t') ≤ requests × P.
        let over = p + cur * p;
        let t = if over <= limit {
            0
        } else {
            // cur > 0 here (requests ≥ 1); t' ≤ P since requests ≥ 1.
            (over - limit).div_ceil(cur.max(1))
        };
        clamp_ms((p - e + t).max(1))
    }
}

fn clamp_ms(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl WindowCounter {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Decides one request at `now_ms` ([`super::clock::now_ms`]) and counts it when allowed.
    pub(crate) fn acquire(&self, quota: Quota, now_ms: u64) -> Decision {
        let (window, elapsed, period) = locate(quota, now_ms);
        let math = Math::new(quota, period);
        loop {
            let Some(view) = self.view(window, elapsed, period) else {
                continue;
            };
            if !math.allows(view.cur, view.prev, view.elapsed) {
                let reset = view.lead + math.retry_after(view.cur, view.prev, view.elapsed);
                return Decision {
                    allowed: false,
                    remaining: math.remaining(view.cur, view.prev, view.elapsed),
                    reset: Duration::from_millis(reset),
                };
            }
            let counted = view.raw + 1; // cur < requests ≤ u32::MAX: no carry into the window.
            if self
                .current
                .compare_exchange_weak(view.raw, counted, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Decision {
                    allowed: true,
                    remaining: math.remaining(view.cur + 1, view.prev, view.elapsed),
                    reset: Duration::from_millis(view.lead + (period - view.elapsed)),
                };
            }
        }
    }

    /// The counts to decide with at window `window`, `elapsed` ms in; `None` after rolling the
    /// counter over to `window` (or losing that race): read again.
    fn view(&self, window: u32, elapsed: u64, period: u64) -> Option<View> {
        let raw = self.current.load(Ordering::Acquire);
        let (at, cur) = unpack(raw);
        if at < window {
            self.roll_over(raw, window);
            return None;
        }
        // `at > window`: the caller's clock is behind; decide at the start of `at`.
        let (elapsed, lead) = if at == window {
            (elapsed, 0)
        } else {
            (0, u64::from(at - window).saturating_mul(period) - elapsed)
        };
        Some(View {
            raw,
            cur,
            prev: self.previous_count(at),
            elapsed,
            lead,
        })
    }

    /// Moves the counter from `seen` (an older window, as `current` was read) to `window`;
    /// nothing when `current` is no longer `seen` (another thread moved it or counted).
    fn roll_over(&self, seen: u64, window: u32) {
        // `previous` first: whoever sees `current` at `window` sees `previous` set. A stale
        // `seen` is lower than what the winner wrote: `fetch_max` keeps the winner's.
        self.previous.fetch_max(seen, Ordering::AcqRel);
        let _ = self.current.compare_exchange(
            seen,
            pack(window, 0),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The count of the window before `window`, 0 when `previous` holds another window.
    fn previous_count(&self, window: u32) -> u32 {
        let (at, count) = unpack(self.previous.load(Ordering::Acquire));
        if window.checked_sub(1) == Some(at) {
            count
        } else {
            0
        }
    }

    /// Gives back one request `acquire` counted at `now_ms` (when a later rule of the same
    /// request refused it): decrements `cur` if the current window is still the one of
    /// `now_ms` and cur > 0; otherwise does nothing (also for a request decided with a late
    /// clock, counted in a window after the one of its `now_ms`: the count errs on the strict
    /// side).
    pub(crate) fn release(&self, quota: Quota, now_ms: u64) {
        let (window, _, _) = locate(quota, now_ms);
        let _ = self
            .current
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |raw| {
                let (at, cur) = unpack(raw);
                (at == window && cur > 0).then(|| raw - 1)
            });
    }

    /// Counts nothing: a counter whose estimate is 0 at now_ms (both windows older than w-1,
    /// or zero counts) can be dropped and recreated without changing any decision.
    pub(crate) fn is_idle(&self, quota: Quota, now_ms: u64) -> bool {
        let (cur, prev, _) = self.counts_at(quota, now_ms);
        cur == 0 && prev == 0
    }

    /// The estimate (requests counted in the last period) — for the admin console's "use
    /// against limit". Rounded down, saturated to `u32`.
    pub(crate) fn used(&self, quota: Quota, now_ms: u64) -> u32 {
        let (cur, prev, elapsed) = self.counts_at(quota, now_ms);
        let period = quota.period_ms().max(1);
        let scaled = Math::new(quota, period).scaled(cur, prev, elapsed);
        u32::try_from(scaled / u128::from(period)).unwrap_or(u32::MAX)
    }

    /// `(cur, prev, elapsed)` as a decision at `now_ms` would see them, without rolling over.
    fn counts_at(&self, quota: Quota, now_ms: u64) -> (u32, u32, u64) {
        let (window, elapsed, _) = locate(quota, now_ms);
        let (at, cur) = unpack(self.current.load(Ordering::Acquire));
        if at >= window {
            let elapsed = if at == window { elapsed } else { 0 };
            (cur, self.previous_count(at), elapsed)
        } else if window.checked_sub(1) == Some(at) {
            (0, cur, elapsed)
        } else {
            (0, 0, elapsed)
        }
    }
}

#[cfg(test)]
mod tests;
