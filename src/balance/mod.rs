//! Load balancing: choosing an endpoint of a group for each request.
//!
//! [`Balancer`] is what an endpoint group picks with: [`LeastRequest`] (the default),
//! [`RoundRobin`] and [`Random`]. Each pick reads the endpoints' atomic active-request counters;
//! the weighted schedules are short mutex-guarded heaps or score lists, rebuilt when the
//! endpoint list they were built for is replaced. [`outlier`] (passive) and [`health`] (active)
//! decide which endpoints are pickable.

mod edf;
pub mod health;
mod least_request;
pub mod outlier;
mod random;
mod round_robin;
pub mod slow_start;
#[cfg(test)]
pub(crate) mod test_support;

pub use least_request::{LeastRequest, LeastRequestSettings, MAX_CHOICES};
pub use random::Random;
pub use round_robin::RoundRobin;

use std::fmt::Debug;
use std::sync::Arc;

use crate::upstream::group::Weights;
use crate::upstream::Endpoint;

/// Picks one endpoint per request. Implementations must be cheap: this runs on every request;
/// no lock is held beyond one pick, and never across an `.await`.
pub trait Balancer: Send + Sync + Debug {
    /// `weights` summarises `endpoints` (computed once per list, see `EndpointList`).
    fn pick<'a>(
        &self,
        endpoints: &'a [Arc<Endpoint>],
        weights: Weights,
    ) -> Option<&'a Arc<Endpoint>>;
}

/// Which balancer a Backend port uses (`loadBalancer`), comparable so that an unchanged setting
/// keeps its endpoint group across reloads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BalancerKind {
    LeastRequest(LeastRequestSettings),
    RoundRobin,
    Random,
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
        }
    }

    /// A key for identity comparisons (the bias is a float: compared by its bits).
    pub fn key(&self) -> String {
        format!("{self:?}")
    }
}
