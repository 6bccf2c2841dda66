//! Rate-limited log lines, for warnings and notices that clients or upstreams can trigger once
//! per event (a refused connection, a failed accept): without a bound, anyone able to connect
//! could fill the disk and drown what matters. Counters count every event; the log keeps a
//! sample.
//!
//! Each call site of [`limited!`] gets its own budget of [`lines_per_window`] lines per
//! [`WINDOW`]. Events past the budget are dropped and counted; the first line logged after
//! them is preceded by one line saying how many similar ones were suppressed.
//!
//! ```ignore
//! crate::telemetry::log_limit::limited!(warn, listener = %key, error = %e, "accept failed");
//! ```

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The period each call site's budget covers.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// Lines per call site and window unless `--log-rate-limit` says otherwise.
pub const DEFAULT_LINES_PER_WINDOW: u32 = 10;

static LINES_PER_WINDOW: AtomicU32 = AtomicU32::new(DEFAULT_LINES_PER_WINDOW);

/// Sets the lines each call site may log per [`WINDOW`] (`--log-rate-limit`); 0 turns the
/// limit off.
pub fn set_lines_per_window(lines: u32) {
    LINES_PER_WINDOW.store(lines, Ordering::Relaxed);
}

/// The lines each call site may log per [`WINDOW`] (0: no limit).
pub(crate) fn lines_per_window() -> u32 {
    LINES_PER_WINDOW.load(Ordering::Relaxed)
}

/// The budget of one call site. Lock-free: a flood from many connections on many workers
/// costs a few atomic operations per event, never a wait.
#[derive(Debug)]
pub(crate) struct LogLimit {
    /// The window the budget is counted in (whole windows since the process's first limited
    /// line).
    window: AtomicU64,
    /// Lines asked for in that window.
    asked: AtomicU64,
    /// Lines dropped since the last one logged.
    suppressed: AtomicU64,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl LogLimit {
    pub(crate) const fn new() -> Self {
        LogLimit {
            window: AtomicU64::new(0),
            asked: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the number of lines suppressed since
    /// the last one logged, or `None` when this one is to be dropped (and is counted).
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(window_now(), lines_per_window())
    }

    fn admit_at(&self, window: u64, budget: u32) -> Option<u64> {
        if budget == 0 {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        let current = self.window.load(Ordering::Relaxed);
        if current != window
            && self
                .window
                .compare_exchange(current, window, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // A racing event may be counted in the old window or the new one: the budget is
            // approximate by a line or two, never unbounded.
            self.asked.store(0, Ordering::Relaxed);
        }
        if self.asked.fetch_add(1, Ordering::Relaxed) < u64::from(budget) {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Whole [`WINDOW`]s since the first call.
fn window_now() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    (elapsed.as_millis() / WINDOW.as_millis()) as u64
}

/// `tracing::LEVEL!(args)` within this call site's budget (see the module docs). `LEVEL` is
/// `warn`, `info`, ...; `args` are what that macro takes (fields, then the message).
macro_rules! limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMIT: $crate::telemetry::log_limit::LogLimit =
            $crate::telemetry::log_limit::LogLimit::new();
        if let Some(suppressed) = LIMIT.admit() {
            if suppressed > 0 {
                ::tracing::$level!(suppressed, "{suppressed} similar messages suppressed");
            }
            ::tracing::$level!($($arg)+);
        }
    }};
}
pub(crate) use limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_budget_then_counts_and_reports_the_rest() {
        let limit = LogLimit::new();
        for _ in 0..3 {
            assert_eq!(limit.admit_at(1, 3), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(limit.admit_at(1, 3), None);
        }
        // The next window logs again, first saying how many were dropped.
        assert_eq!(limit.admit_at(2, 3), Some(5));
        assert_eq!(limit.admit_at(2, 3), Some(0));
    }

    #[test]
    fn a_zero_budget_logs_everything() {
        let limit = LogLimit::new();
        for _ in 0..100 {
            assert_eq!(limit.admit_at(1, 0), Some(0));
        }
    }
}
