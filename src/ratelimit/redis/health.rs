//! What the store tells /status and the console: up or down (with the last error's message),
//! errors by kind, the last success; and the log lines, one per distinct error rather than one
//! per retry.
//!
//! The success path of a decision touches two atomics and no lock; a failure takes a mutex.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::StoreError;

/// Distinct failures logged between two successes; more are in [`StoreHealth`] only.
const MAX_LOGGED: usize = 16;

/// Whether the store can decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoreState {
    /// Started; no connection has been made nor has any failed yet.
    Connecting,
    /// The last connection attempt or decision succeeded.
    Up,
    /// Down since `since`: `error` is the last failure's message (never a secret).
    Down { since: SystemTime, error: String },
}

/// Failed decisions since the store started, by [`StoreError::kind`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ErrorCounts {
    pub(crate) unavailable: u64,
    pub(crate) timeout: u64,
    pub(crate) auth: u64,
    pub(crate) other: u64,
}

/// A snapshot of the store's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoreHealth {
    pub(crate) state: StoreState,
    /// Failed decisions ([`super::GlobalStore::acquire`]) by kind.
    pub(crate) errors: ErrorCounts,
    /// Connection attempts that failed (each retry counts).
    pub(crate) failed_connects: u64,
    /// The last decision or connection that succeeded.
    pub(crate) last_success: Option<SystemTime>,
}

pub(super) struct Health {
    /// Named in log lines.
    address: String,
    /// `state` is `Up`: a success need not take the lock.
    up: AtomicBool,
    /// Milliseconds since the Unix epoch; 0 for never.
    last_success_ms: AtomicU64,
    /// [`ErrorCounts`] in the order of [`kind_index`].
    errors: [AtomicU64; 4],
    failed_connects: AtomicU64,
    inner: Mutex<Inner>,
}

struct Inner {
    state: StoreState,
    /// The messages logged since the last success (a few: a failure alternates between a
    /// handful); cleared by a success, so the same failure after it is logged again.
    logged: Vec<String>,
}

impl Health {
    pub(super) fn new(address: &str) -> Health {
        Health {
            address: address.to_owned(),
            up: AtomicBool::new(false),
            last_success_ms: AtomicU64::new(0),
            errors: Default::default(),
            failed_connects: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                state: StoreState::Connecting,
                logged: Vec::new(),
            }),
        }
    }

    /// A decision or a connection succeeded.
    pub(super) fn succeeded(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX).max(1);
        self.last_success_ms.store(ms, Ordering::Relaxed);
        if self.up.load(Ordering::Acquire) {
            return;
        }
        let mut inner = self.lock();
        if let StoreState::Down { error, .. } = &inner.state {
            tracing::info!(address = %self.address, after = %error, "Redis of global rate limits answers again");
        } else if !matches!(inner.state, StoreState::Up) {
            tracing::info!(address = %self.address, "connected to the Redis of global rate limits");
        }
        inner.state = StoreState::Up;
        inner.logged.clear();
        self.up.store(true, Ordering::Release);
    }

    /// A decision failed.
    pub(super) fn decision_failed(&self, error: &StoreError) {
        self.errors[kind_index(error)].fetch_add(1, Ordering::Relaxed);
        self.down(error);
    }

    /// A connection attempt failed.
    pub(super) fn connect_failed(&self, error: &StoreError) {
        self.failed_connects.fetch_add(1, Ordering::Relaxed);
        self.down(error);
    }

    fn down(&self, error: &StoreError) {
        let message = error.to_string();
        let mut inner = self.lock();
        self.up.store(false, Ordering::Release);
        match &mut inner.state {
            StoreState::Down { error, .. } => error.clone_from(&message),
            state => {
                *state = StoreState::Down {
                    since: SystemTime::now(),
                    error: message.clone(),
                }
            }
        }
        if inner.logged.contains(&message) || inner.logged.len() >= MAX_LOGGED {
            return;
        }
        if matches!(error, StoreError::Auth(_)) {
            tracing::error!(address = %self.address, error = %message, "Redis of global rate limits refused egressd's credentials");
        } else {
            tracing::warn!(address = %self.address, error = %message, "Redis of global rate limits failed");
        }
        inner.logged.push(message);
    }

    pub(super) fn snapshot(&self) -> StoreHealth {
        let count = |i: usize| self.errors[i].load(Ordering::Relaxed);
        let last = self.last_success_ms.load(Ordering::Relaxed);
        StoreHealth {
            state: self.lock().state.clone(),
            errors: ErrorCounts {
                unavailable: count(0),
                timeout: count(1),
                auth: count(2),
                other: count(3),
            },
            failed_connects: self.failed_connects.load(Ordering::Relaxed),
            last_success: (last > 0).then(|| UNIX_EPOCH + Duration::from_millis(last)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The guarded data stays consistent at every step, so a panic elsewhere leaves it usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn kind_index(error: &StoreError) -> usize {
    match error {
        StoreError::Unavailable(_) => 0,
        StoreError::Timeout(_) => 1,
        StoreError::Auth(_) => 2,
        StoreError::Other(_) => 3,
    }
}
