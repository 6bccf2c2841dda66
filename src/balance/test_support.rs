//! Helpers for the balancers' unit tests.

use std::sync::Arc;
use std::time::Duration;

use super::Balancer;
use crate::upstream::group::EndpointList;
use crate::upstream::h2_pool::H2Pool;
use crate::upstream::pool::H1Pool;
use crate::upstream::Endpoint;

/// An endpoint 127.0.0.1:`port` with `weight` (ports 1.. index the results of [`shares`]).
pub fn endpoint(port: u16, weight: u32) -> Arc<Endpoint> {
    Arc::new(Endpoint::new(
        ([127, 0, 0, 1], port).into(),
        weight,
        H1Pool::new(Default::default()),
        H2Pool::new(Duration::from_secs(60)),
    ))
}

/// An endpoint list as a group publishes it.
pub fn list(endpoints: Vec<Arc<Endpoint>>) -> Arc<EndpointList> {
    Arc::new(EndpointList::resolved(endpoints))
}

/// The share of `picks` picks each endpoint got, in endpoint order.
pub fn shares(balancer: &dyn Balancer, endpoints: &[Arc<Endpoint>], picks: usize) -> Vec<f64> {
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
pub fn assert_shares(got: &[f64], expected: &[f64], tolerance: f64) {
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
pub fn shares_under_load(
    balancer: &dyn Balancer,
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
pub fn weight_sets(n: usize) -> [Vec<u32>; 2] {
    [vec![1; n], (0..n).map(|i| (i % 3) as u32 + 1).collect()]
}

/// Each weight's share of the total.
pub fn proportional(weights: &[u32]) -> Vec<f64> {
    let total: u32 = weights.iter().sum();
    weights
        .iter()
        .map(|&w| f64::from(w) / f64::from(total))
        .collect()
}
