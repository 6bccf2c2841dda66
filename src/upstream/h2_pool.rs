//! Per-endpoint HTTP/2 connections: few, shared, multiplexed.
//!
//! A request claims a stream slot on a connection that is open, has not received GOAWAY, has
//! carried fewer than `http2.maxRequestsPerConnection` streams, and is below its stream limit:
//! the smallest of the server's `SETTINGS_MAX_CONCURRENT_STREAMS`, the Backend's
//! `http2.maxConcurrentStreams`, and what the server was seen to take when it refused a stream
//! (`REFUSED_STREAM`). When every connection is full, one new connection is opened; requests
//! that arrive meanwhile wait for it instead of each opening their own (a burst of 1,000
//! requests makes one connection, not 1,000). The slot is released when the response has
//! ended, or was abandoned. A connection that has carried its share of streams takes no more:
//! it closes when its last stream ends, and the next request opens a new one.
//!
//! Locks: a std mutex over the connection list, held only to scan or change it, never across
//! an `.await`. A claim is one compare-and-swap on the connection's stream counts.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use hyper::client::conn::http2::SendRequest;
use tokio::sync::watch;

use super::h2_frames::PeerSettings;
use crate::upstream::body::RequestBody;

/// The most streams a connection carries when no `http2.maxRequestsPerConnection` applies: a
/// client has 2^30 stream ids (odd ones below 2^31, RFC 9113 §5.1.1), and a connection that
/// ran out of them could start none.
pub(crate) const STREAM_IDS: u32 = 1 << 30;

/// One stream in [`H2Conn::streams`]: one more in flight (low half), one more started (high
/// half).
const ONE_STREAM: u64 = 1 | 1 << 32;

/// One HTTP/2 connection to an endpoint.
#[derive(Debug)]
pub(crate) struct H2Conn {
    sender: SendRequest<RequestBody>,
    peer: Arc<PeerSettings>,
    addr: SocketAddr,
    /// Our own cap on concurrent streams (`http2.maxConcurrentStreams`).
    local_max: u32,
    /// Streams the connection carries in all (`http2.maxRequestsPerConnection`).
    max_requests: u32,
    /// Streams in flight (low 32 bits) and streams ever started (high 32 bits), in one word so
    /// that a claim checks and takes both with one compare-and-swap.
    streams: AtomicU64,
    /// The concurrency the server was seen to take when it refused a stream
    /// (`REFUSED_STREAM`); `u32::MAX` until then.
    refused_max: AtomicU32,
    /// When the last stream ended, in milliseconds since `epoch` (for the idle timeout).
    idle_since_ms: AtomicU64,
    epoch: Instant,
}

/// The limits a new connection starts with (the `http2` policy section).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StreamLimits {
    /// `http2.maxConcurrentStreams` (`u32::MAX`: the server's limit alone).
    pub(crate) concurrent: u32,
    /// `http2.maxRequestsPerConnection` ([`STREAM_IDS`]: none).
    pub(crate) per_connection: u32,
}

impl H2Conn {
    pub(crate) fn new(
        sender: SendRequest<RequestBody>,
        peer: Arc<PeerSettings>,
        addr: SocketAddr,
        limits: StreamLimits,
    ) -> Self {
        H2Conn {
            sender,
            peer,
            addr,
            local_max: limits.concurrent.max(1),
            max_requests: limits.per_connection.clamp(1, STREAM_IDS),
            streams: AtomicU64::new(0),
            refused_max: AtomicU32::new(u32::MAX),
            idle_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Open, not going away, and not done with its share of streams: new streams may start
    /// here.
    pub(crate) fn is_usable(&self) -> bool {
        !self.sender.is_closed() && !self.peer.goaway() && self.started() < self.max_requests
    }

    fn limit(&self) -> u32 {
        self.local_max
            .min(self.peer.max_concurrent_streams())
            .min(self.refused_max.load(Ordering::Relaxed))
    }

    /// Claims a stream slot if the connection has one.
    pub(crate) fn try_claim(self: &Arc<Self>) -> Option<H2Stream> {
        self.claim(self.limit())
    }

    /// Claims a slot while fewer than `limit` streams are in flight and the connection has
    /// streams left to start.
    fn claim(self: &Arc<Self>, limit: u32) -> Option<H2Stream> {
        let mut current = self.streams.load(Ordering::Acquire);
        loop {
            let (in_flight, started) = split(current);
            if in_flight >= limit || started >= self.max_requests {
                return None;
            }
            match self.streams.compare_exchange_weak(
                current,
                current + ONE_STREAM,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if started + 1 == self.max_requests {
                        tracing::debug!(endpoint = %self.addr, streams = self.max_requests, "upstream HTTP/2 connection carried its http2.maxRequestsPerConnection; the next request opens another");
                    }
                    return Some(H2Stream(self.clone()));
                }
                Err(now) => current = now,
            }
        }
    }

    pub(crate) fn streams_in_flight(&self) -> u32 {
        split(self.streams.load(Ordering::Acquire)).0
    }

    fn started(&self) -> u32 {
        split(self.streams.load(Ordering::Acquire)).1
    }

    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.streams_in_flight() > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed));
        Some(now.duration_since(self.epoch).saturating_sub(since))
    }
}

/// (streams in flight, streams started) of an [`H2Conn::streams`] word.
fn split(streams: u64) -> (u32, u32) {
    // Truncation keeps the low half; the shift leaves only the high one.
    (streams as u32, (streams >> 32) as u32)
}

/// A claimed stream slot; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct H2Stream(Arc<H2Conn>);

impl H2Stream {
    /// A handle to send this stream's request on.
    pub(crate) fn sender(&self) -> SendRequest<RequestBody> {
        self.0.sender.clone()
    }

    /// The server refused this stream (`REFUSED_STREAM`) while it and the connection's other
    /// streams were in flight: it takes fewer than that many at once, whatever its SETTINGS
    /// say (it may be lowering its limit, or be short of resources). The connection is full
    /// from now on at one stream less (at least one).
    pub(crate) fn refused(&self) {
        let took = self.0.streams_in_flight().saturating_sub(1).max(1);
        let before = self.0.refused_max.fetch_min(took, Ordering::Relaxed);
        if took < before {
            tracing::debug!(endpoint = %self.0.addr, streams = took, "upstream HTTP/2 server refused a stream: this connection now takes at most this many at once");
        }
    }

    /// The connection, to keep a retry away from it.
    pub(crate) fn connection(&self) -> Weak<H2Conn> {
        Arc::downgrade(&self.0)
    }
}

impl Drop for H2Stream {
    fn drop(&mut self) {
        let conn = &self.0;
        // Only the low half (in flight) goes down; it is at least 1 while this slot exists.
        if split(conn.streams.fetch_sub(1, Ordering::AcqRel)).0 == 1 {
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

    /// A stream slot, or what to do to get one; never on `avoid` (the connection that just
    /// refused the request).
    pub(crate) fn checkout(self: &Arc<Self>, avoid: Option<&Weak<H2Conn>>) -> Checkout {
        let mut conns = self.lock();
        conns.list.retain(|c| c.is_usable());
        let avoided = |c: &Arc<H2Conn>| avoid.is_some_and(|a| std::ptr::eq(a.as_ptr(), &**c));
        // Most recently opened first: older connections drain and idle out when the load
        // drops.
        let claimed = conns
            .list
            .iter()
            .rev()
            .filter(|c| !avoided(c))
            .find_map(|c| c.try_claim());
        if let Some(stream) = claimed {
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
    /// not one to wait in: nothing says it will ever allow one again. Nor is one that has
    /// carried its share of streams (`http2.maxRequestsPerConnection`).
    pub(crate) fn claim_least_busy(&self) -> Option<H2Stream> {
        let conns = self.lock();
        conns
            .list
            .iter()
            .filter(|c| c.is_usable() && c.peer.max_concurrent_streams() > 0)
            .min_by_key(|c| c.streams_in_flight())?
            .claim(u32::MAX)
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::{TcpListener, TcpStream};

    /// A pool with one connection (`limits`) to a loopback server that accepts and holds it;
    /// the stream `add` claimed for the request that opened it has ended.
    async fn pool_with(limits: StreamLimits) -> (Arc<H2Pool>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
        let (sender, driver) =
            hyper::client::conn::http2::handshake::<_, _, RequestBody>(TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(driver);
        let pool = Arc::new(H2Pool::new(Duration::from_secs(60)));
        let conn = H2Conn::new(sender, Arc::default(), addr, limits);
        drop(pool.add(conn));
        (pool, server)
    }

    fn claim(pool: &Arc<H2Pool>) -> Option<H2Stream> {
        match pool.checkout(None) {
            Checkout::Stream(stream) => Some(stream),
            _ => None,
        }
    }

    const UNLIMITED: StreamLimits = StreamLimits {
        concurrent: u32::MAX,
        per_connection: STREAM_IDS,
    };

    #[tokio::test]
    async fn a_refused_stream_lowers_the_limit_to_the_streams_the_server_took() {
        let (pool, _server) = pool_with(UNLIMITED).await;
        let mut streams: Vec<H2Stream> = (0..5).map(|_| claim(&pool).unwrap()).collect();
        // The fifth is refused: the server had taken four.
        let refused = streams.pop().unwrap();
        refused.refused();
        drop(refused);
        assert!(claim(&pool).is_none(), "four in flight: full");
        drop(streams.pop());
        let again = claim(&pool).expect("three in flight: a slot");
        // A later refusal with fewer in flight lowers it further; never below one.
        again.refused();
        drop(again);
        drop(streams);
        let one = claim(&pool).expect("one at a time");
        one.refused();
        assert!(claim(&pool).is_none());
        drop(one);
        assert!(claim(&pool).is_some(), "at least one stream");
    }

    #[tokio::test]
    async fn a_connection_that_carried_its_share_takes_no_more_streams() {
        let (pool, _server) = pool_with(StreamLimits {
            concurrent: u32::MAX,
            per_connection: 3,
        })
        .await;
        // The first stream was the opener's (`add`), and has ended.
        let held = claim(&pool).unwrap();
        let third = claim(&pool).unwrap();
        // Three started, two in flight: none left, and not for the least busy either.
        assert!(matches!(pool.checkout(None), Checkout::Connect(_)));
        assert!(pool.claim_least_busy().is_none());
        assert_eq!(pool.connection_count(), 0, "retired");
        // The retired connection's streams go on until they end.
        drop((held, third));
    }

    #[tokio::test]
    async fn a_checkout_avoiding_a_connection_finds_none_there() {
        let (pool, _server) = pool_with(UNLIMITED).await;
        let stream = claim(&pool).unwrap();
        let avoid = stream.connection();
        assert!(matches!(pool.checkout(Some(&avoid)), Checkout::Connect(_)));
        assert!(claim(&pool).is_some(), "others still use it");
    }
}
