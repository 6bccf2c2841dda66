//! Endpoints: one upstream address and the state that belongs to it.
//!
//! An `Endpoint` outlives reloads while its identity (backend, port, address, transport) is
//! unchanged: its connection pools, counters, outlier and active health state are found again
//! in the state registry.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::breaker::Admission;
use super::h2_pool::H2Pool;
use super::pool::H1Pool;
use crate::balance::health::HealthState;
use crate::balance::outlier::OutlierState;

/// One upstream address and the state that belongs to it.
#[derive(Debug)]
pub struct Endpoint {
    pub(crate) addr: SocketAddr,
    /// Relative weight for balancing.
    pub weight: u32,
    /// Priority level (0 first; higher levels take load only as lower ones lose health).
    pub(crate) priority: u32,
    /// Idle HTTP/1.1 connections to this address.
    pub(crate) pool: H1Pool,
    /// Outlier detection state (consecutive failures, ejection).
    pub(crate) outlier: OutlierState,
    /// Active health check state (healthy flag, runs of results, last check).
    pub(crate) health: HealthState,
    /// HTTP/2 connections to this address: made on first use (most endpoints only ever see
    /// HTTP/1.1; 10,000 Backends: 1.6 MB), see `h2()`.
    h2: std::sync::OnceLock<Arc<H2Pool>>,
    /// For ports whose version is negotiated by ALPN: the last connection came out HTTP/1.1,
    /// so requests look for pooled HTTP/1.1 connections first.
    negotiated_http1: AtomicBool,
    /// Requests in flight to this endpoint.
    active: AtomicU64,
    /// Requests ever sent (for `/status`).
    total: AtomicU64,
    /// When the endpoint last became ready (created, back from an ejection, healthy again),
    /// in `slow_start::now_ms` milliseconds: slow start counts from here.
    ready_since_ms: AtomicU64,
    /// The last failure seen talking to this endpoint, for `/endpoints` (written on failures
    /// only).
    last_failure: std::sync::Mutex<Option<Box<LastFailure>>>,
    /// Connections ever opened for traffic.
    connections_opened: AtomicU64,
    /// What the latest TLS handshake settled on (0: none yet), see `tls()`.
    tls: std::sync::atomic::AtomicU8,
}

/// When and how an exchange with an endpoint last failed.
#[derive(Clone, Debug)]
pub(crate) struct LastFailure {
    pub(crate) at: std::time::SystemTime,
    pub(crate) detail: String,
}

impl Endpoint {
    pub fn new(addr: SocketAddr, weight: u32, pool: H1Pool) -> Self {
        Endpoint {
            addr,
            weight,
            priority: 0,
            pool,
            h2: std::sync::OnceLock::new(),
            outlier: OutlierState::default(),
            health: HealthState::default(),
            negotiated_http1: AtomicBool::new(false),
            active: AtomicU64::new(0),
            total: AtomicU64::new(0),
            last_failure: std::sync::Mutex::new(None),
            connections_opened: AtomicU64::new(0),
            tls: std::sync::atomic::AtomicU8::new(0),
            ready_since_ms: AtomicU64::new(crate::balance::slow_start::now_ms()),
        }
    }

    /// The HTTP/2 connections to this address (the pool is made on first use).
    pub(crate) fn h2(&self) -> &Arc<H2Pool> {
        self.h2
            .get_or_init(|| Arc::new(H2Pool::new(self.pool.settings().idle_timeout)))
    }

    /// The HTTP/2 pool, if anything ever used it.
    pub(crate) fn h2_if_used(&self) -> Option<&Arc<H2Pool>> {
        self.h2.get()
    }

    /// Sets the priority level (when the endpoint is built).
    pub(crate) fn with_priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }

    /// Marks a request as started; the guard marks it finished when dropped.
    pub fn start_request(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        ActiveRequest(self.clone(), None)
    }

    /// Whether ALPN chose HTTP/1.1 on the last new connection (ports with `HTTP` over TLS).
    pub(crate) fn negotiated_http1(&self) -> bool {
        self.negotiated_http1.load(Ordering::Relaxed)
    }

    pub(crate) fn set_negotiated_http1(&self, http1: bool) {
        self.negotiated_http1.store(http1, Ordering::Relaxed);
    }

    pub(crate) fn active_requests(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Starts slow start over: the endpoint is back in rotation after being out of it.
    pub(crate) fn mark_ready(&self) {
        self.ready_since_ms
            .store(crate::balance::slow_start::now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn ready_since_ms(&self) -> u64 {
        self.ready_since_ms.load(Ordering::Relaxed)
    }

    /// Remembers a failure (a local-origin error or a 5xx) for `/endpoints`.
    /// A connection for traffic was opened (with `tls`, what its handshake settled on).
    pub(crate) fn note_connection(&self, tls: Option<crate::upstream::connect::TlsSummary>) {
        self.connections_opened.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = tls {
            let version = match t.version {
                "TLSv1.3" => 1,
                "TLSv1.2" => 2,
                _ => 3,
            };
            let alpn = match t.alpn {
                None => 0,
                Some("h2") => 1,
                Some("http/1.1") => 2,
                Some(_) => 3,
            };
            self.tls.store(version << 2 | alpn, Ordering::Relaxed);
        }
    }

    pub(crate) fn connections_opened(&self) -> u64 {
        self.connections_opened.load(Ordering::Relaxed)
    }

    /// What the latest TLS handshake with this endpoint settled on (every connection to one
    /// endpoint is made with the same settings); None before the first, or without TLS.
    pub(crate) fn tls(&self) -> Option<crate::upstream::connect::TlsSummary> {
        let code = self.tls.load(Ordering::Relaxed);
        let version = match code >> 2 {
            0 => return None,
            1 => "TLSv1.3",
            2 => "TLSv1.2",
            _ => "other",
        };
        let alpn = match code & 3 {
            0 => None,
            1 => Some("h2"),
            2 => Some("http/1.1"),
            _ => Some("other"),
        };
        Some(crate::upstream::connect::TlsSummary { version, alpn })
    }

    pub(crate) fn note_failure(&self, detail: String) {
        let failure = LastFailure {
            at: std::time::SystemTime::now(),
            detail,
        };
        // Plain data: a poisoned lock still holds a valid value.
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(failure));
    }

    pub(crate) fn last_failure(&self) -> Option<LastFailure> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            .cloned()
    }

    pub(crate) fn total_requests(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

impl crate::balance::Candidate for Endpoint {
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn weight(&self) -> u32 {
        self.weight
    }

    fn active_requests(&self) -> u64 {
        Endpoint::active_requests(self)
    }

    fn ready_since_ms(&self) -> u64 {
        Endpoint::ready_since_ms(self)
    }
}

/// An endpoint 127.0.0.1:`port` with `weight` and empty pools, for unit tests.
#[cfg(test)]
pub(crate) fn test_endpoint(port: u16, weight: u32) -> Arc<Endpoint> {
    Arc::new(Endpoint::new(
        ([127, 0, 0, 1], port).into(),
        weight,
        H1Pool::new(Default::default()),
    ))
}

/// A request in flight to an endpoint; decrements the active count when dropped.
#[derive(Debug)]
pub struct ActiveRequest(Arc<Endpoint>, Option<Admission>);

impl ActiveRequest {
    /// Holds the request's circuit-breaker slot for as long as the request is active.
    pub(crate) fn holding(mut self, admission: Admission) -> Self {
        self.1 = Some(admission);
        self
    }

    pub(crate) fn endpoint(&self) -> &Arc<Endpoint> {
        &self.0
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}
