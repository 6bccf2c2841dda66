//! Per-endpoint pool of idle HTTP/1.1 connections.
//!
//! Connections are checked out for one request and checked back in when the response body has
//! been read to the end (see `http::body`). The pool is LIFO, so the most recently used — the
//! least likely to have been closed by the server — connection is reused first, and surplus
//! connections sink to the bottom. The lock is held only to push or pop, never across an
//! `.await`.
//!
//! Surplus connections are closed gradually, as HAProxy's `pool-purge-delay` does: at each
//! sweep (every 5 s), half of the connections that stayed idle through the whole period since
//! the previous sweep are closed, oldest first. Under a steady load the pool keeps what the
//! load uses; after a burst it shrinks by half per period instead of holding every connection
//! the burst opened (and the memory behind each) for `idle_timeout`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::h1_conn::{current_runtime, H1Conn};

/// Pool limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolSettings {
    /// Idle connections older than this are closed.
    pub(crate) idle_timeout: Duration,
    /// At most this many idle connections are kept per endpoint.
    pub(crate) max_idle: usize,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            idle_timeout: Duration::from_secs(60),
            max_idle: 256,
        }
    }
}

struct Idle {
    conn: H1Conn,
    since: Instant,
}

/// The idle connections, oldest first.
#[derive(Default)]
struct IdleList {
    conns: Vec<Idle>,
    /// The fewest idle connections since the last sweep: the bottom `low` connections were not
    /// used during the whole period (checkouts take from the top).
    low: usize,
}

/// Idle HTTP/1.1 connections to one endpoint.
pub struct H1Pool {
    settings: PoolSettings,
    idle: Mutex<IdleList>,
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
            idle: Mutex::default(),
            waiting: AtomicU32::new(0),
            returned: Notify::new(),
        }
    }

    pub(crate) fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Takes the most recently used idle connection of the calling task's runtime (see
    /// `H1Conn::home`) that is still open and not expired.
    pub(crate) fn checkout(&self) -> Option<H1Conn> {
        self.take(Some(current_runtime()))
    }

    /// Like `checkout`, but a connection of another worker's runtime will do: for a request
    /// that would otherwise wait at `circuitBreaker.maxConnections`.
    pub(crate) fn checkout_any(&self) -> Option<H1Conn> {
        self.take(None)
    }

    fn take(&self, home: Option<Option<tokio::runtime::Id>>) -> Option<H1Conn> {
        let now = Instant::now();
        let mut idle = self.lock();
        let mut i = idle.conns.len();
        let mut found = None;
        while i > 0 {
            i -= 1;
            if home.is_some_and(|home| idle.conns[i].conn.home() != home) {
                continue;
            }
            let mut entry = idle.conns.remove(i);
            // The ones below were not touched.
            idle.low = idle.low.min(i);
            if now.duration_since(entry.since) < self.settings.idle_timeout
                && entry.conn.is_reusable()
            {
                found = Some(entry.conn);
                break;
            }
            // Dropped: closes the connection.
        }
        found
    }

    /// Returns a connection after its response was read completely. One that cannot take
    /// another request right away (closed, or still sending a request body the server answered
    /// before it ended) is closed instead.
    /// `now`: the caller has just read the clock.
    pub(crate) fn checkin(&self, mut conn: H1Conn, now: Instant) {
        if !conn.is_done() {
            return;
        }
        {
            let mut idle = self.lock();
            if idle.conns.len() >= self.settings.max_idle {
                return;
            }
            idle.conns.push(Idle { conn, since: now });
        }
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.returned.notify_waiters();
        }
    }

    /// Registers a request waiting for a connection to be checked in; the guard's `notified`
    /// resolves at the next checkin. Enable it before looking at the pool again.
    pub(crate) fn wait_for_checkin(&self) -> CheckinWait<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        CheckinWait { pool: self }
    }

    /// Closes the oldest idle connection, if there is one (its circuit-breaker slot is wanted
    /// by a request to another endpoint). Returns whether one was closed.
    pub(crate) fn close_oldest_idle(&self) -> bool {
        let mut idle = self.lock();
        if idle.conns.is_empty() {
            return false;
        }
        drop(idle.conns.remove(0));
        // It was one of the untouched ones at the bottom, if there were any.
        idle.low = idle.low.saturating_sub(1);
        true
    }

    /// The periodic sweep: closes idle connections that expired or were closed by the server,
    /// and half (rounded up) of those that stayed idle through the whole period since the
    /// previous sweep (see the module's documentation).
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let timeout = self.settings.idle_timeout;
        let mut idle = self.lock();
        let surplus = {
            // Counted before dropping the dead ones: `low` counts from the bottom.
            let low = idle.low.min(idle.conns.len());
            let mut i = 0;
            let mut untouched_alive = 0;
            idle.conns.retain_mut(|e| {
                let keep = now.duration_since(e.since) < timeout && e.conn.is_reusable();
                untouched_alive += usize::from(keep && i < low);
                i += 1;
                keep
            });
            untouched_alive
        };
        // Oldest first: the bottom of the stack.
        drop(idle.conns.drain(..surplus.div_ceil(2)));
        idle.low = idle.conns.len();
    }

    pub(crate) fn idle_count(&self) -> usize {
        self.lock().conns.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IdleList> {
        // A panic while holding this lock can only come from Vec::push/pop, which do not
        // leave the list inconsistent, so a poisoned lock is still safe to use.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A request waiting for a checkin (see `H1Pool::wait_for_checkin`).
pub(crate) struct CheckinWait<'a> {
    pool: &'a H1Pool,
}

impl CheckinWait<'_> {
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.pool.returned.notified()
    }
}

impl Drop for CheckinWait<'_> {
    fn drop(&mut self) {
        self.pool.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::body::RequestBody;
    use hyper_util::rt::TokioIo;
    use tokio::net::{TcpListener, TcpStream};

    /// A pool holding `n` idle connections to a loopback server that keeps them open.
    async fn pool_with(n: usize) -> (H1Pool, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let pool = H1Pool::new(PoolSettings::default());
        for _ in 0..n {
            let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
            let (sender, driver) = hyper::client::conn::http1::handshake::<_, RequestBody>(io)
                .await
                .unwrap();
            pool.checkin(H1Conn::new(sender, driver, addr, None), Instant::now());
        }
        (pool, server)
    }

    #[tokio::test]
    async fn half_of_the_connections_idle_through_a_whole_period_close_at_each_sweep() {
        let (pool, _server) = pool_with(9).await;
        // The first period started with none idle: nothing was idle through all of it.
        pool.sweep();
        assert_eq!(pool.idle_count(), 9);
        // Nine idle throughout: five go (half, rounded up), oldest first.
        pool.sweep();
        assert_eq!(pool.idle_count(), 4);
        // One used and returned in this period: three stayed idle throughout, two go.
        let used = pool.checkout().unwrap();
        pool.checkin(used, Instant::now());
        pool.sweep();
        assert_eq!(pool.idle_count(), 2);
        pool.sweep();
        assert_eq!(pool.idle_count(), 1);
        pool.sweep();
        assert_eq!(pool.idle_count(), 0);
    }

    #[tokio::test]
    async fn a_connection_closed_for_another_endpoint_counts_as_one_of_the_untouched() {
        let (pool, _server) = pool_with(4).await;
        pool.sweep();
        // The top one used in this period: three untouched below it.
        let used = pool.checkout().unwrap();
        pool.checkin(used, Instant::now());
        // The oldest goes to make room elsewhere: two untouched left, one of them closes.
        assert!(pool.close_oldest_idle());
        pool.sweep();
        assert_eq!(pool.idle_count(), 2);
    }

    #[tokio::test]
    async fn connections_a_steady_load_uses_are_kept() {
        let (pool, _server) = pool_with(6).await;
        pool.sweep();
        for _ in 0..5 {
            // Every connection in use at some point of each period.
            let senders: Vec<H1Conn> = std::iter::from_fn(|| pool.checkout()).collect();
            assert_eq!(senders.len(), 6);
            senders
                .into_iter()
                .for_each(|s| pool.checkin(s, Instant::now()));
            pool.sweep();
            assert_eq!(pool.idle_count(), 6);
        }
        // Four of six used in a period: two stayed idle throughout, one goes.
        let senders: Vec<H1Conn> = (0..4).map_while(|_| pool.checkout()).collect();
        senders
            .into_iter()
            .for_each(|s| pool.checkin(s, Instant::now()));
        pool.sweep();
        assert_eq!(pool.idle_count(), 5);
    }

    #[test]
    fn a_connection_goes_to_a_task_of_its_own_runtime_first() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let (home, other) = (runtime(), runtime());
        // Opened on `home`: its socket is registered with that runtime's I/O driver.
        let (pool, _server) = home.block_on(pool_with(1));
        other.block_on(async {
            assert!(
                pool.checkout().is_none(),
                "another runtime's connection was taken"
            );
            let conn = pool.checkout_any().expect("any runtime's connection");
            pool.checkin(conn, Instant::now());
        });
        home.block_on(async {
            assert!(pool.checkout().is_some(), "its own runtime did not get it");
        });
    }
}
