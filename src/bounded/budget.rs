//! The process-wide budget for bodies egressd holds in memory (`bufferedBodies`): every byte
//! of a body read whole is reserved here first; `http::budget` says when bodies are read whole
//! and what happens when the budget is spent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `ProxyConfig.spec.bufferedBodies`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BufferSettings {
    /// Bytes all buffered bodies together may hold.
    pub(crate) budget: u64,
    /// How long a body egressd buffers may take to arrive whole.
    pub(crate) read_timeout: Duration,
}

impl Default for BufferSettings {
    fn default() -> Self {
        BufferSettings {
            budget: 32 << 20,
            read_timeout: Duration::from_secs(30),
        }
    }
}

/// Bytes reserved now, process-wide.
#[derive(Debug, Default)]
pub(crate) struct BufferBudget {
    used: AtomicU64,
}

impl BufferBudget {
    /// Bytes held by buffered bodies now (for `/metrics`).
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation that can grow up to `budget` in all.
    pub(crate) fn reservation(self: &Arc<Self>, budget: u64) -> Reservation {
        Reservation {
            pool: self.clone(),
            budget,
            held: 0,
        }
    }
}

/// Bytes of the budget held for one buffered body; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    pool: Arc<BufferBudget>,
    budget: u64,
    held: u64,
}

impl Reservation {
    /// Takes `n` more bytes of the budget; false (and nothing taken) when they do not fit.
    pub(crate) fn grow(&mut self, n: u64) -> bool {
        let fitted = self
            .pool
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.budget)
            })
            .is_ok();
        if fitted {
            self.held += n;
        }
        fitted
    }

    /// Bytes this reservation holds.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_one_budget_and_give_it_back() {
        let pool = Arc::new(BufferBudget::default());
        let mut a = pool.reservation(100);
        let mut b = pool.reservation(100);
        assert!(a.grow(60));
        assert!(!b.grow(50), "60 + 50 is over 100");
        assert!(b.grow(40));
        assert_eq!(pool.used(), 100);
        drop(a);
        assert_eq!(pool.used(), 40);
        assert!(b.grow(60));
        drop(b);
        assert_eq!(pool.used(), 0);
    }
}
