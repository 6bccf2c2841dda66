//! Circuit breakers of one Backend port (`circuitBreaker`): limits that turn overload into
//! fast 503s instead of queues that grow without bound.
//!
//! Counts are atomics shared by every request of the port's endpoint group; a limit is checked
//! with one increment (the value before it decides), so concurrent requests never exceed it.
//! Guards give the count back when dropped: [`Admission`] when the response ends,
//! [`RetrySlot`] when the retried attempt has its answer, [`ConnectionSlot`] when the
//! connection closes, [`PendingSlot`] when a waiting request got its connection.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// `circuitBreaker`, resolved. Envoy's defaults, except `max_parallel_retries`: Envoy's 3
/// turns retries off for the 4th concurrent failure (one endpoint dying under a few
/// concurrent clients is enough), which is why Istio lifts it too. A retry belongs to an
/// admitted request, so retries never exceed `max_parallel_requests` anyway; the retry budget
/// is the tool for bounding them as a share of traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BreakerSettings {
    pub(crate) max_parallel_requests: u32,
    pub(crate) max_connections: u32,
    pub(crate) max_pending_requests: u32,
    pub(crate) max_parallel_retries: u32,
    /// When set, replaces `max_parallel_retries` with a share of the requests in flight.
    pub(crate) retry_budget: Option<RetryBudget>,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            max_parallel_requests: 1024,
            max_connections: 1024,
            max_pending_requests: 1024,
            max_parallel_retries: 1024,
            retry_budget: None,
        }
    }
}

/// `retryBudget`: at most `percent` of the requests in flight may be retries, but always
/// `min_concurrency`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RetryBudget {
    /// Percent × 1000 (kept integral so settings compare and hash exactly).
    pub(crate) milli_percent: u32,
    pub(crate) min_concurrency: u32,
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget {
            milli_percent: 20_000,
            min_concurrency: 3,
        }
    }
}

/// Which limit turned a request (or a retry) away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    ParallelRequests,
    /// A websocket or tunnel needs a connection of its own and none is left.
    Connections,
    PendingRequests,
    ParallelRetries,
    RetryBudget,
}

impl Limit {
    /// The config field that sets the limit.
    pub(crate) fn field(self) -> &'static str {
        match self {
            Limit::ParallelRequests => "maxParallelRequests",
            Limit::Connections => "maxConnections",
            Limit::PendingRequests => "maxPendingRequests",
            Limit::ParallelRetries => "maxParallelRetries",
            Limit::RetryBudget => "retryBudget",
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Limit::ParallelRequests => "max_parallel_requests",
            Limit::Connections => "max_connections",
            Limit::PendingRequests => "max_pending_requests",
            Limit::ParallelRetries => "max_parallel_retries",
            Limit::RetryBudget => "retry_budget",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    requests: AtomicU32,
    retries: AtomicU32,
    connections: AtomicU32,
    pending: AtomicU32,
    /// Woken when a connection closes (a waiting request may open one now).
    connection_closed: Notify,
}

/// The limits and counts of one endpoint group.
#[derive(Debug)]
pub(crate) struct Breaker {
    settings: BreakerSettings,
    counts: Arc<Counts>,
}

/// Takes one unit of `counter` if it was below `max`; the guard gives it back.
fn take(counter: &AtomicU32, max: u32) -> bool {
    if counter.fetch_add(1, Ordering::AcqRel) < max {
        true
    } else {
        counter.fetch_sub(1, Ordering::AcqRel);
        false
    }
}

impl Breaker {
    pub(crate) fn new(settings: BreakerSettings) -> Self {
        Breaker {
            settings,
            counts: Arc::default(),
        }
    }

    pub(crate) fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    /// A request slot under `maxParallelRequests`, held until the response ends.
    pub(crate) fn admit(&self) -> Option<Admission> {
        take(&self.counts.requests, self.settings.max_parallel_requests)
            .then(|| Admission(self.counts.clone()))
    }

    /// A slot for one retry, under the retry budget when there is one, else under
    /// `maxParallelRetries`.
    pub(crate) fn admit_retry(&self) -> Result<RetrySlot, Limit> {
        let (max, limit) = match self.settings.retry_budget {
            Some(budget) => {
                let active = u64::from(self.counts.requests.load(Ordering::Acquire));
                let share = active * u64::from(budget.milli_percent) / 100_000;
                (
                    (share as u32).max(budget.min_concurrency),
                    Limit::RetryBudget,
                )
            }
            None => (self.settings.max_parallel_retries, Limit::ParallelRetries),
        };
        if take(&self.counts.retries, max) {
            Ok(RetrySlot(self.counts.clone()))
        } else {
            Err(limit)
        }
    }

    /// The limit's configured value.
    pub(crate) fn max(&self, limit: Limit) -> u32 {
        let s = &self.settings;
        match limit {
            Limit::ParallelRequests => s.max_parallel_requests,
            Limit::Connections => s.max_connections,
            Limit::PendingRequests => s.max_pending_requests,
            Limit::ParallelRetries => s.max_parallel_retries,
            Limit::RetryBudget => s.retry_budget.map_or(0, |b| b.min_concurrency),
        }
    }

    /// A slot for a new connection under `maxConnections`; `None` at the limit.
    pub(crate) fn connection(&self) -> Option<ConnectionSlot> {
        take(&self.counts.connections, self.settings.max_connections)
            .then(|| ConnectionSlot(self.counts.clone()))
    }

    /// A place among the requests waiting for a connection, under `maxPendingRequests`.
    pub(crate) fn pending(&self) -> Option<PendingSlot> {
        take(&self.counts.pending, self.settings.max_pending_requests)
            .then(|| PendingSlot(self.counts.clone()))
    }

    /// Resolves when a connection of the group closes. Create it before checking for a free
    /// slot, so a close in between is not missed (`Notified` registers on `enable`).
    pub(crate) fn connection_closed(&self) -> tokio::sync::futures::Notified<'_> {
        self.counts.connection_closed.notified()
    }

    /// Open connections, in flight requests, retries, waiting requests (for `/endpoints`).
    pub(crate) fn usage(&self) -> [u32; 4] {
        let c = &self.counts;
        [
            c.connections.load(Ordering::Relaxed),
            c.requests.load(Ordering::Relaxed),
            c.retries.load(Ordering::Relaxed),
            c.pending.load(Ordering::Relaxed),
        ]
    }
}

/// A request counted against `maxParallelRequests`; dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct Admission(Arc<Counts>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A retry in progress.
#[derive(Debug)]
pub(crate) struct RetrySlot(Arc<Counts>);

impl Drop for RetrySlot {
    fn drop(&mut self) {
        self.0.retries.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An open connection; held by the task that drives it.
#[derive(Debug)]
pub(crate) struct ConnectionSlot(Arc<Counts>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
        self.0.connection_closed.notify_waiters();
    }
}

/// A request waiting for a connection.
#[derive(Debug)]
pub(crate) struct PendingSlot(Arc<Counts>);

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_hold_and_guards_give_back() {
        let b = Breaker::new(BreakerSettings {
            max_parallel_requests: 2,
            ..BreakerSettings::default()
        });
        let one = b.admit().unwrap();
        let _two = b.admit().unwrap();
        assert!(b.admit().is_none());
        drop(one);
        assert!(b.admit().is_some());
    }

    #[test]
    fn the_retry_budget_scales_with_requests_in_flight() {
        // CB-retry-budget: 20%, min 3. 100 in flight: 20 retries; 5 in flight: 3.
        let b = Breaker::new(BreakerSettings {
            max_parallel_requests: 1000,
            retry_budget: Some(RetryBudget::default()),
            ..BreakerSettings::default()
        });
        let requests: Vec<_> = (0..100).map(|_| b.admit().unwrap()).collect();
        let retries: Vec<_> = std::iter::from_fn(|| b.admit_retry().ok())
            .take(50)
            .collect();
        assert_eq!(retries.len(), 20);
        assert_eq!(b.admit_retry().unwrap_err(), Limit::RetryBudget);
        drop(retries);
        drop(requests);
        let _few: Vec<_> = (0..5).map(|_| b.admit().unwrap()).collect();
        let retries: Vec<_> = std::iter::from_fn(|| b.admit_retry().ok())
            .take(50)
            .collect();
        assert_eq!(retries.len(), 3);
    }

    #[test]
    fn without_a_budget_max_parallel_retries_applies() {
        let b = Breaker::new(BreakerSettings {
            max_parallel_retries: 3,
            ..BreakerSettings::default()
        });
        let retries: Vec<_> = std::iter::from_fn(|| b.admit_retry().ok())
            .take(10)
            .collect();
        assert_eq!(retries.len(), 3);
        assert_eq!(b.admit_retry().unwrap_err(), Limit::ParallelRetries);
    }
}
