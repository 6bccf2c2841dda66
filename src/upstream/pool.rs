//! Per-endpoint pool of idle HTTP/1.1 connections.
//!
//! Connections are checked out for one request and checked back in when the response body has
//! been read to the end (see `http::body`). The pool is LIFO, so the most recently used — the
//! least likely to have been closed by the server — connection is reused first, and surplus
//! connections age out. The lock is held only to push or pop, never across an `.await`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::client::conn::http1::SendRequest;
use tokio::sync::Notify;

use crate::upstream::body::RequestBody;

/// Pool limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolSettings {
    /// Idle connections older than this are closed.
    pub idle_timeout: Duration,
    /// At most this many idle connections are kept per endpoint.
    pub max_idle: usize,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            idle_timeout: Duration::from_secs(60),
            max_idle: 256,
        }
    }
}

/// A connection sender ready to carry one request.
pub type H1Sender = SendRequest<RequestBody>;

struct Idle {
    sender: H1Sender,
    since: Instant,
}

/// Idle HTTP/1.1 connections to one endpoint.
pub struct H1Pool {
    settings: PoolSettings,
    idle: Mutex<Vec<Idle>>,
    /// Requests waiting for a connection of this endpoint (at `circuitBreaker.maxConnections`);
    /// only then does a checkin wake anyone, so the common checkin touches no `Notify`.
    waiting: AtomicU32,
    returned: Notify,
}

impl std::fmt::Debug for H1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Pool")
            .field("settings", &self.settings)
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl H1Pool {
    pub fn new(settings: PoolSettings) -> Self {
        H1Pool {
            settings,
            idle: Mutex::new(Vec::new()),
            waiting: AtomicU32::new(0),
            returned: Notify::new(),
        }
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Takes the most recently used idle connection that is still open and not expired.
    pub fn checkout(&self) -> Option<H1Sender> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some(entry) = idle.pop() {
            if entry.sender.is_closed()
                || now.duration_since(entry.since) >= self.settings.idle_timeout
            {
                continue; // dropping the sender closes the connection
            }
            return Some(entry.sender);
        }
        None
    }

    /// Returns a connection after its response was read completely.
    pub fn checkin(&self, sender: H1Sender) {
        if sender.is_closed() {
            return;
        }
        {
            let mut idle = self.lock();
            if idle.len() >= self.settings.max_idle {
                return;
            }
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.returned.notify_waiters();
        }
    }

    /// Registers a request waiting for a connection to be checked in; the guard's `notified`
    /// resolves at the next checkin. Enable it before looking at the pool again.
    pub fn wait_for_checkin(&self) -> CheckinWait<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        CheckinWait { pool: self }
    }

    /// Closes the oldest idle connection, if there is one (its circuit-breaker slot is wanted
    /// by a request to another endpoint). Returns whether one was closed.
    pub fn close_oldest_idle(&self) -> bool {
        let mut idle = self.lock();
        if idle.is_empty() {
            return false;
        }
        drop(idle.remove(0));
        true
    }

    /// Closes idle connections that expired or were closed by the server.
    pub fn evict_expired(&self) {
        let now = Instant::now();
        let timeout = self.settings.idle_timeout;
        self.lock()
            .retain(|e| !e.sender.is_closed() && now.duration_since(e.since) < timeout);
    }

    pub fn idle_count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // A panic while holding this lock can only come from Vec::push/pop, which do not
        // leave the list inconsistent, so a poisoned lock is still safe to use.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A request waiting for a checkin (see `H1Pool::wait_for_checkin`).
pub struct CheckinWait<'a> {
    pool: &'a H1Pool,
}

impl CheckinWait<'_> {
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.pool.returned.notified()
    }
}

impl Drop for CheckinWait<'_> {
    fn drop(&mut self) {
        self.pool.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}
