//! Load balancing: choosing an endpoint of a group for each request.
//!
//! [`Balancer`] is what an endpoint group picks with: [`LeastRequest`] (the default),
//! [`RoundRobin`], [`Random`] and [`ConsistentHash`] (ring hash or Maglev). Each pick reads the
//! endpoints' atomic active-request counters; the weighted schedules are short mutex-guarded
//! heaps or score lists, rebuilt when the endpoint list they were built for is replaced; the
//! consistent-hash ring or table is built once per list and published with arc-swap.
//! [`outlier`] (passive) and [`health`] (active) decide which endpoints are pickable.

mod consistent_hash;
mod edf;
pub mod hash_key;
pub mod health;
mod least_request;
pub mod maglev;
pub mod outlier;
mod random;
pub mod ring_hash;
mod round_robin;
pub mod slow_start;
#[cfg(test)]
pub(crate) mod test_support;

pub use consistent_hash::{ConsistentHash, ConsistentHashSettings, HashTable};
pub use hash_key::HashKey;
pub use least_request::{LeastRequest, LeastRequestSettings, MAX_CHOICES};
pub use random::Random;
pub use round_robin::RoundRobin;

use std::fmt::Debug;
use std::sync::Arc;

use crate::upstream::group::EndpointList;
use crate::upstream::Endpoint;

/// Picks one endpoint per request. Implementations must be cheap: this runs on every request;
/// no lock is held beyond one pick, and never across an `.await`.
pub trait Balancer: Send + Sync + Debug {
    /// One endpoint of `list` (its `weights` are computed once per list). `hash` is the
    /// request's hash when the balancer has a [`HashKey`] and the request carries the key;
    /// balancers without a key ignore it. The list is passed as its `Arc` so that a balancer
    /// can tell lists apart by identity (a new list is a new allocation).
    fn pick<'a>(&self, list: &'a Arc<EndpointList>, hash: Option<u64>)
        -> Option<&'a Arc<Endpoint>>;

    /// What requests are hashed by, for balancers that hash (`None`: the caller computes no
    /// hash, so other balancers cost nothing extra).
    fn hash_key(&self) -> Option<&HashKey> {
        None
    }

    /// Builds whatever `list` needs before it is published, so that picks do not (called
    /// under the group's lock whenever its pickable lists are rebuilt; rare).
    fn prepare(&self, _list: &Arc<EndpointList>) {}

    /// The weight `endpoint` is balanced with now (its configured weight, reduced during slow
    /// start), for `/endpoints`.
    fn effective_weight(&self, endpoint: &Endpoint) -> f64 {
        f64::from(endpoint.weight)
    }
}

/// Which balancer a Backend port uses (`loadBalancer`), comparable so that an unchanged setting
/// keeps its endpoint group across reloads.
#[derive(Clone, Debug, PartialEq)]
pub enum BalancerKind {
    LeastRequest(LeastRequestSettings),
    RoundRobin,
    Random,
    ConsistentHash(ConsistentHashSettings),
}

impl Default for BalancerKind {
    fn default() -> Self {
        BalancerKind::LeastRequest(LeastRequestSettings::default())
    }
}

impl BalancerKind {
    pub fn build(&self) -> Box<dyn Balancer> {
        match self {
            BalancerKind::LeastRequest(settings) => Box::new(LeastRequest::new(*settings)),
            BalancerKind::RoundRobin => Box::new(RoundRobin::new()),
            BalancerKind::Random => Box::new(Random),
            BalancerKind::ConsistentHash(settings) => {
                Box::new(ConsistentHash::new(settings.clone()))
            }
        }
    }

    /// A key for identity comparisons (the bias is a float: compared by its bits).
    pub fn key(&self) -> String {
        format!("{self:?}")
    }
}
