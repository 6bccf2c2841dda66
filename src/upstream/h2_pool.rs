//! Per-endpoint HTTP/2 connections: few, shared, multiplexed.
//!
//! A request claims a stream slot on a connection that is open, has not received GOAWAY and is
//! below its stream limit — the smaller of the server's `SETTINGS_MAX_CONCURRENT_STREAMS` and
//! the Backend's `http2.maxConcurrentStreams`. When every connection is full, one new
//! connection is opened; requests that arrive meanwhile wait for it instead of each opening
//! their own (a burst of 1,000 requests makes one connection, not 1,000). The slot is released
//! when the response has ended, or was abandoned.
//!
//! Locks: a std mutex over the connection list, held only to scan or change it, never across
//! an `.await`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::client::conn::http2::SendRequest;
use tokio::sync::watch;

use super::h2_frames::PeerSettings;
use crate::upstream::body::RequestBody;

/// One HTTP/2 connection to an endpoint.
#[derive(Debug)]
pub(crate) struct H2Conn {
    sender: SendRequest<RequestBody>,
    peer: Arc<PeerSettings>,
    /// Our own cap on concurrent streams (`http2.maxConcurrentStreams`).
    local_max: u32,
    in_flight: AtomicU32,
    /// When the last stream ended, in milliseconds since `epoch` (for the idle timeout).
    idle_since_ms: AtomicU64,
    epoch: Instant,
}

impl H2Conn {
    pub(crate) fn new(
        sender: SendRequest<RequestBody>,
        peer: Arc<PeerSettings>,
        local_max: u32,
    ) -> Self {
        H2Conn {
            sender,
            peer,
            local_max: local_max.max(1),
            in_flight: AtomicU32::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Open and not going away: new streams may start here.
    pub(crate) fn is_usable(&self) -> bool {
        !self.sender.is_closed() && !self.peer.goaway()
    }

    fn limit(&self) -> u32 {
        self.local_max.min(self.peer.max_concurrent_streams())
    }

    /// Claims a stream slot if the connection has one.
    pub(crate) fn try_claim(self: &Arc<Self>) -> Option<H2Stream> {
        let limit = self.limit();
        let mut current = self.in_flight.load(Ordering::Acquire);
        loop {
            if current >= limit {
                return None;
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(H2Stream(self.clone())),
                Err(now) => current = now,
            }
        }
    }

    pub(crate) fn streams_in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.streams_in_flight() > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed));
        Some(now.duration_since(self.epoch).saturating_sub(since))
    }
}

/// A claimed stream slot; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct H2Stream(Arc<H2Conn>);

impl H2Stream {
    /// A handle to send this stream's request on.
    pub(crate) fn sender(&self) -> SendRequest<RequestBody> {
        self.0.sender.clone()
    }
}

impl Drop for H2Stream {
    fn drop(&mut self) {
        let conn = &self.0;
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ms = conn.epoch.elapsed().as_millis();
            conn.idle_since_ms
                .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }
}

/// The outcome of a connection attempt other requests are waiting for.
#[derive(Clone, Debug)]
pub(crate) enum Attempt {
    Pending,
    /// A connection was added (or the endpoint turned out to speak HTTP/1.1: look again).
    Done,
    /// The attempt failed; waiters fail with the same message rather than queueing up
    /// attempts of their own behind a dead endpoint.
    Failed(Arc<crate::upstream::connect::ConnectError>),
}

/// What a request gets from [`H2Pool::checkout`].
pub(crate) enum Checkout {
    /// A stream slot on an existing connection.
    Stream(H2Stream),
    /// No slot: this request opens a connection and must call [`ConnectTicket::finish`].
    Connect(ConnectTicket),
    /// Another request is opening a connection: wait on this, then check out again.
    Wait(watch::Receiver<Attempt>),
}

/// The duty to open a connection for an endpoint. Dropped without `finish` (the request was
/// cancelled mid-connect), the waiters are released to try again themselves.
pub(crate) struct ConnectTicket {
    tx: watch::Sender<Attempt>,
    pool: Arc<H2Pool>,
}

impl ConnectTicket {
    pub(crate) fn finish(self, outcome: Attempt) {
        self.tx.send_replace(outcome);
        // Drop clears the pool's pending attempt.
    }
}

impl Drop for ConnectTicket {
    fn drop(&mut self) {
        if matches!(*self.tx.borrow(), Attempt::Pending) {
            self.tx.send_replace(Attempt::Done);
        }
        self.pool.lock().connecting = None;
    }
}

#[derive(Debug, Default)]
struct Conns {
    list: Vec<Arc<H2Conn>>,
    /// The connection attempt in progress, if any.
    connecting: Option<watch::Receiver<Attempt>>,
}

/// The HTTP/2 connections of one endpoint.
#[derive(Debug)]
pub(crate) struct H2Pool {
    conns: Mutex<Conns>,
    idle_timeout: Duration,
}

impl H2Pool {
    pub(crate) fn new(idle_timeout: Duration) -> Self {
        H2Pool {
            conns: Mutex::default(),
            idle_timeout,
        }
    }

    /// A stream slot, or what to do to get one.
    pub(crate) fn checkout(self: &Arc<Self>) -> Checkout {
        let mut conns = self.lock();
        conns.list.retain(|c| c.is_usable());
        // Most recently opened first: older connections drain and idle out when the load
        // drops.
        if let Some(stream) = conns.list.iter().rev().find_map(|c| c.try_claim()) {
            return Checkout::Stream(stream);
        }
        if let Some(rx) = &conns.connecting {
            return Checkout::Wait(rx.clone());
        }
        let (tx, rx) = watch::channel(Attempt::Pending);
        conns.connecting = Some(rx);
        Checkout::Connect(ConnectTicket {
            tx,
            pool: self.clone(),
        })
    }

    /// Adds a new connection and claims a slot on it for the request that opened it.
    pub(crate) fn add(&self, conn: H2Conn) -> Option<H2Stream> {
        let conn = Arc::new(conn);
        let stream = conn.try_claim();
        self.lock().list.push(conn);
        stream
    }

    /// A slot on the usable connection with the fewest streams, past its limit if need be:
    /// the request then waits inside that connection for a stream to end. A connection whose
    /// server allows no stream at all now (`SETTINGS_MAX_CONCURRENT_STREAMS` lowered to 0) is
    /// not one to wait in: nothing says it will ever allow one again.
    pub(crate) fn claim_least_busy(&self) -> Option<H2Stream> {
        let conns = self.lock();
        let conn = conns
            .list
            .iter()
            .filter(|c| c.is_usable() && c.peer.max_concurrent_streams() > 0)
            .min_by_key(|c| c.streams_in_flight())?;
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(H2Stream(conn.clone()))
    }

    /// Open connections (for `/status` and tests).
    pub(crate) fn connection_count(&self) -> usize {
        let mut conns = self.lock();
        conns.list.retain(|c| c.is_usable());
        conns.list.len()
    }

    /// Closes connections without streams that were idle longer than the idle timeout, and
    /// forgets closed ones. Called periodically.
    pub(crate) fn evict_expired(&self) {
        let now = Instant::now();
        let timeout = self.idle_timeout;
        self.lock()
            .list
            .retain(|c| c.is_usable() && c.idle_for(now).is_none_or(|idle| idle < timeout));
    }

    fn lock(&self) -> MutexGuard<'_, Conns> {
        // Every change to the list is a single push or retain: a panic elsewhere while the lock
        // was held cannot leave it inconsistent.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}
