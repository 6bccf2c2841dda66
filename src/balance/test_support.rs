//! Helpers for the balancers' unit tests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Balancer, Candidate, EndpointList};

/// A bare endpoint: what balancers see of one, and nothing else.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) addr: SocketAddr,
    pub(crate) weight: u32,
    active: AtomicU64,
    ready_since_ms: AtomicU64,
}

impl Candidate for Endpoint {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn weight(&self) -> u32 {
        self.weight
    }
    fn active_requests(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }
    fn ready_since_ms(&self) -> u64 {
        self.ready_since_ms.load(Ordering::Relaxed)
    }
}

impl Endpoint {
    /// A request in flight until the guard is dropped.
    pub(crate) fn start_request(self: &Arc<Self>) -> InFlight {
        self.active.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    pub(crate) fn set_ready_since_ms(&self, ms: u64) {
        self.ready_since_ms.store(ms, Ordering::Relaxed);
    }
}

/// See [`Endpoint::start_request`].
pub(crate) struct InFlight(Arc<Endpoint>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An endpoint 127.0.0.1:`port` with `weight` (ports 1.. index the results of [`shares`]).
pub(crate) fn endpoint(port: u16, weight: u32) -> Arc<Endpoint> {
    Arc::new(Endpoint {
        addr: ([127, 0, 0, 1], port).into(),
        weight,
        active: AtomicU64::new(0),
        ready_since_ms: AtomicU64::new(super::slow_start::now_ms()),
    })
}

/// An endpoint list as a group publishes it (unprepared: the first pick prepares it).
pub(crate) fn list(endpoints: Vec<Arc<Endpoint>>) -> Arc<EndpointList<Endpoint>> {
    Arc::new(EndpointList::resolved(endpoints))
}

/// The share of `picks` picks each endpoint got, in endpoint order.
pub(crate) fn shares(
    balancer: &dyn Balancer<Endpoint>,
    endpoints: &[Arc<Endpoint>],
    picks: usize,
) -> Vec<f64> {
    let mut counts = vec![0usize; endpoints.len()];
    let published = list(endpoints.to_vec());
    for _ in 0..picks {
        let picked = balancer.pick(&published, None).expect("a pick");
        let i = endpoints
            .iter()
            .position(|e| Arc::ptr_eq(e, picked))
            .expect("picked from the list");
        counts[i] += 1;
    }
    counts.iter().map(|&c| c as f64 / picks as f64).collect()
}

/// Asserts each share is within `tolerance` (absolute, e.g. 0.02 for ±2 points) of `expected`.
pub(crate) fn assert_shares(got: &[f64], expected: &[f64], tolerance: f64) {
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= tolerance,
            "endpoint {i}: share {g:.4}, expected {e:.4} ± {tolerance} (all: {got:?})"
        );
    }
}

/// The share of `picks` picks each endpoint got while `concurrency` requests are in flight:
/// each pick starts a request, and once `concurrency` are open the oldest ends before the next
/// pick (so at 1 every pick sees idle endpoints, as sequential clients do).
pub(crate) fn shares_under_load(
    balancer: &dyn Balancer<Endpoint>,
    endpoints: &[Arc<Endpoint>],
    concurrency: usize,
    picks: usize,
) -> Vec<f64> {
    let mut counts = vec![0usize; endpoints.len()];
    let published = list(endpoints.to_vec());
    let mut in_flight = std::collections::VecDeque::with_capacity(concurrency);
    for _ in 0..picks {
        if in_flight.len() >= concurrency {
            in_flight.pop_front();
        }
        let picked = balancer.pick(&published, None).expect("a pick");
        let i = endpoints
            .iter()
            .position(|e| Arc::ptr_eq(e, picked))
            .expect("picked from the list");
        counts[i] += 1;
        in_flight.push_back(picked.start_request());
    }
    counts.iter().map(|&c| c as f64 / picks as f64).collect()
}

/// Weights for property tests: `n` equal ones, or `n` unequal ones (1, 2, 3, 1, 2, 3, …).
pub(crate) fn weight_sets(n: usize) -> [Vec<u32>; 2] {
    [vec![1; n], (0..n).map(|i| (i % 3) as u32 + 1).collect()]
}

/// Each weight's share of the total.
pub(crate) fn proportional(weights: &[u32]) -> Vec<f64> {
    let total: u32 = weights.iter().sum();
    weights
        .iter()
        .map(|&w| f64::from(w) / f64::from(total))
        .collect()
}
