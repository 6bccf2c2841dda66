//! Load balancing: choosing an endpoint of a list for each request.
//!
//! [`Balancer`] is what an endpoint group picks with: [`LeastRequest`] (the default),
//! [`RoundRobin`], [`Random`] and [`ConsistentHash`] (ring hash or Maglev). Balancers know an
//! endpoint only as a [`Candidate`] (address, weight, requests in flight, when it became
//! ready): `upstream::Endpoint` is one, the unit tests use a bare one. A pick reads the
//! candidates' atomic counters and takes no lock. What a balancer needs beyond the endpoints
//! (the weighted least-request schedule, the smooth round-robin order, the consistent-hash ring
//! or table) is built when a list is published ([`Balancer::prepare`]) and travels inside the
//! [`EndpointList`], so a pick never asks which list it has.
//! [`outlier`] (passive) and [`health`] (active) decide which endpoints are pickable.

mod consistent_hash;
mod edf;
pub(crate) mod hash_key;
pub(crate) mod health;
mod least_request;
mod list;
pub mod maglev;
pub mod outlier;
mod random;
pub mod ring_hash;
mod round_robin;
pub(crate) mod slow_start;
#[cfg(test)]
pub(crate) mod test_support;

pub use consistent_hash::{ConsistentHash, ConsistentHashSettings, HashTable};
pub use hash_key::HashKey;
pub(crate) use least_request::MAX_CHOICES;
pub use least_request::{LeastRequest, LeastRequestSettings};
pub use list::EndpointList;
pub use random::Random;
pub use round_robin::RoundRobin;

use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::Arc;

/// What a balancer knows of an endpoint.
pub trait Candidate: Send + Sync + Debug + 'static {
    /// Its address (consistent hashing places endpoints by it).
    fn addr(&self) -> SocketAddr;
    /// Its relative weight (≥ 1 in practice; 0 is treated as 1 where it would divide).
    fn weight(&self) -> u32;
    /// Requests in flight to it now.
    fn active_requests(&self) -> u64;
    /// When it last became ready, in [`slow_start::now_ms`] milliseconds.
    fn ready_since_ms(&self) -> u64;
}

/// Picks one endpoint per request. Implementations must be cheap: this runs on every request;
/// no lock is taken, and nothing is held across an `.await`.
pub trait Balancer<E: Candidate>: Send + Sync + Debug {
    /// One endpoint of `list`. `hash` is the request's hash when the balancer has a
    /// [`HashKey`] and the request carries the key; balancers without a key ignore it.
    fn pick<'a>(&self, list: &'a EndpointList<E>, hash: Option<u64>) -> Option<&'a Arc<E>>;

    /// What requests are hashed by, for balancers that hash (`None`: the caller computes no
    /// hash, so other balancers cost nothing extra).
    fn hash_key(&self) -> Option<&HashKey> {
        None
    }

    /// Builds what picks from `list` need, before the list is published (rare: whenever an
    /// endpoint joins, leaves, is ejected or comes back). A list picked from unprepared is
    /// prepared by its first pick.
    fn prepare(&self, _list: &EndpointList<E>) {}

    /// The weight `endpoint` is balanced with now (its configured weight, reduced during slow
    /// start), for `/endpoints`.
    fn effective_weight(&self, endpoint: &E) -> f64 {
        f64::from(endpoint.weight())
    }
}

/// Which balancer a Backend port uses (`loadBalancer`), comparable so that an unchanged setting
/// keeps its endpoint group across reloads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BalancerKind {
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
    pub(crate) fn build<E: Candidate>(&self) -> Box<dyn Balancer<E>> {
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
    pub(crate) fn key(&self) -> String {
        format!("{self:?}")
    }
}
