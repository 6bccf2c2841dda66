//! Admission at accept: the cap on open client connections (a count shared by every listener
//! and worker, one for the proxy's listeners and one for the admin server, taken at accept
//! and given back when the socket closes), and the pause after a failed accept.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How many connections are open against one cap.
#[derive(Debug, Default)]
pub(crate) struct ConnectionCap {
    open: AtomicUsize,
}

/// One open connection counted against a [`ConnectionCap`]. It travels with the socket
/// (inside the IO that hyper owns), so an HTTP/1.1 connection upgraded to a websocket or a
/// CONNECT tunnel keeps counting until the socket itself is closed.
#[derive(Debug)]
pub(crate) struct Slot(Arc<ConnectionCap>);

impl ConnectionCap {
    /// A slot if fewer than `max` connections are open; `None` means the new connection is
    /// to be closed at once.
    pub(crate) fn try_take(self: &Arc<Self>, max: usize) -> Option<Slot> {
        // Taken optimistically and given back when over: one atomic operation on the common
        // path, and the count never exceeds `max` for long enough to matter.
        if self.open.fetch_add(1, Ordering::AcqRel) >= max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(self.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long an accept loop pauses after `accept` failed, doubling while it keeps failing.
/// Out of file descriptors (EMFILE, ENFILE) the listening socket stays readable, so retrying
/// at once would spin; the pending connections wait in the backlog meanwhile, and open ones
/// are served as usual.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    failures: u32,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);

    /// The pause after one more failure.
    pub(crate) fn next(&mut self) -> Duration {
        let pause = Self::FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        pause
    }

    /// An accept succeeded.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_cap_and_frees_on_drop() {
        let cap = Arc::new(ConnectionCap::default());
        let a = cap.try_take(2).expect("first");
        let _b = cap.try_take(2).expect("second");
        assert!(cap.try_take(2).is_none());
        assert_eq!(cap.open.load(Ordering::Acquire), 2);
        drop(a);
        assert!(cap.try_take(2).is_some());
    }

    #[test]
    fn accept_backoff_doubles_up_to_a_second_and_resets() {
        let mut backoff = AcceptBackoff::default();
        let pauses: Vec<u64> = (0..10).map(|_| backoff.next().as_millis() as u64).collect();
        assert_eq!(pauses, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(5));
    }
}
