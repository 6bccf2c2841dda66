//! When an exchange must be over, and the timeout that set that time (for the error that
//! names it): the request timeout, a gRPC client's own deadline, a retry's per-try timeout.

use std::time::Duration;

use tokio::time::Instant;

/// A point in time an exchange must be over by, and the timeout it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline {
    pub(crate) at: Instant,
    pub(crate) timeout: Duration,
    /// The client set it (`grpc-timeout`): running out is not the upstream's failure.
    pub(crate) client: bool,
}

impl Deadline {
    /// `timeout` from `start`.
    pub(crate) fn after(start: Instant, timeout: Duration) -> Self {
        Deadline {
            at: start + timeout,
            timeout,
            client: false,
        }
    }

    /// Whichever of `self` and `other` comes first (`self` when they are at the same time).
    pub(crate) fn earlier(self, other: Option<Deadline>) -> Deadline {
        match other {
            Some(other) if other.at < self.at => other,
            _ => self,
        }
    }

    /// Whether the time is up.
    pub(crate) fn passed(&self) -> bool {
        Instant::now() >= self.at
    }
}
