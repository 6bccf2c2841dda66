//! Endpoints (one upstream address) and endpoint groups (the addresses of one Backend port).
//!
//! An `Endpoint` outlives reloads while its identity (backend, port, address, transport) is
//! unchanged: its connection pool and counters are found again in the state registry. An
//! `EndpointGroup` is what a Backend port balances over; for FQDN destinations its list is
//! replaced by the DNS refresher, for IP destinations it is fixed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::h2_pool::H2Pool;
use super::pool::H1Pool;
use crate::balance::Balancer;

/// One upstream address and the state that belongs to it.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// Relative weight for balancing.
    pub weight: u32,
    /// Idle HTTP/1.1 connections to this address.
    pub pool: H1Pool,
    /// HTTP/2 connections to this address.
    pub h2: Arc<H2Pool>,
    /// For ports whose version is negotiated by ALPN: the last connection came out HTTP/1.1,
    /// so requests look for pooled HTTP/1.1 connections first.
    negotiated_http1: AtomicBool,
    /// Requests in flight to this endpoint.
    active: AtomicU64,
    /// Requests ever sent (for `/status`).
    total: AtomicU64,
}

impl Endpoint {
    pub fn new(addr: SocketAddr, weight: u32, pool: H1Pool, h2: H2Pool) -> Self {
        Endpoint {
            addr,
            weight,
            pool,
            h2: Arc::new(h2),
            negotiated_http1: AtomicBool::new(false),
            active: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    /// Marks a request as started; the guard marks it finished when dropped.
    pub fn start_request(self: &Arc<Self>) -> ActiveRequest {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        ActiveRequest(self.clone())
    }

    /// Whether ALPN chose HTTP/1.1 on the last new connection (ports with `HTTP` over TLS).
    pub fn negotiated_http1(&self) -> bool {
        self.negotiated_http1.load(Ordering::Relaxed)
    }

    pub fn set_negotiated_http1(&self, http1: bool) {
        self.negotiated_http1.store(http1, Ordering::Relaxed);
    }

    pub fn active_requests(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    pub fn total_requests(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A request in flight to an endpoint; decrements the active count when dropped.
#[derive(Debug)]
pub struct ActiveRequest(Arc<Endpoint>);

impl ActiveRequest {
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.0
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a group's endpoints come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EndpointSource {
    /// Fixed addresses from `destination.ip`.
    Static,
    /// Resolved from a hostname.
    Dns {
        hostname: String,
        port: u16,
        refresh: Duration,
        respect_ttl: bool,
    },
}

/// The current endpoints of a group.
#[derive(Debug, Default)]
pub struct EndpointList {
    pub endpoints: Vec<Arc<Endpoint>>,
    /// Summary of the endpoints' weights, computed once per list so picks need not scan it.
    pub weights: Weights,
    /// Set once a DNS group has resolved at least once (always true for static groups).
    pub resolved: bool,
    /// Last resolution error, kept while the last good addresses keep serving.
    pub last_error: Option<String>,
}

impl EndpointList {
    /// A list of resolved (or static) endpoints.
    pub fn resolved(endpoints: Vec<Arc<Endpoint>>) -> Self {
        EndpointList {
            weights: Weights::of(&endpoints),
            endpoints,
            resolved: true,
            last_error: None,
        }
    }
}

/// What balancers need to know about a list's weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weights {
    /// Every endpoint has the same weight.
    pub uniform: bool,
    pub total: u64,
}

impl Weights {
    pub fn of(endpoints: &[Arc<Endpoint>]) -> Self {
        Weights {
            uniform: endpoints.windows(2).all(|w| w[0].weight == w[1].weight),
            total: endpoints.iter().map(|e| u64::from(e.weight)).sum(),
        }
    }
}

/// The endpoints of one Backend port, and the balancer that picks among them.
#[derive(Debug)]
pub struct EndpointGroup {
    pub source: EndpointSource,
    list: ArcSwap<EndpointList>,
    balancer: Box<dyn Balancer>,
    /// Flips to true when the first resolution finished (success or failure).
    resolved_tx: watch::Sender<bool>,
}

impl EndpointGroup {
    pub fn new_static(endpoints: Vec<Arc<Endpoint>>, balancer: Box<dyn Balancer>) -> Self {
        let (resolved_tx, _) = watch::channel(true);
        EndpointGroup {
            source: EndpointSource::Static,
            list: ArcSwap::from_pointee(EndpointList::resolved(endpoints)),
            balancer,
            resolved_tx,
        }
    }

    pub fn new_dns(source: EndpointSource, balancer: Box<dyn Balancer>) -> Self {
        let (resolved_tx, _) = watch::channel(false);
        EndpointGroup {
            source,
            list: ArcSwap::from_pointee(EndpointList::default()),
            balancer,
            resolved_tx,
        }
    }

    /// The current endpoints.
    pub fn list(&self) -> arc_swap::Guard<Arc<EndpointList>> {
        self.list.load()
    }

    /// Publishes a new endpoint list (DNS refresh).
    pub fn publish(&self, list: EndpointList) {
        self.list.store(Arc::new(list));
        self.resolved_tx.send_replace(true);
    }

    /// Whether the first resolution has finished.
    pub fn is_resolved(&self) -> bool {
        *self.resolved_tx.borrow()
    }

    /// Waits until the first resolution has finished, for at most `limit`.
    pub async fn wait_resolved(&self, limit: Duration) {
        let mut rx = self.resolved_tx.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|resolved| *resolved)).await;
    }

    /// Picks the endpoint for the next request.
    pub fn pick(&self) -> Option<Arc<Endpoint>> {
        let list = self.list.load();
        self.balancer.pick(&list.endpoints, list.weights).cloned()
    }
}
