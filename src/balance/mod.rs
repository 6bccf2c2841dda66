//! Load balancing: choosing an endpoint of a group for each request.
//!
//! The [`Balancer`] trait is the seam the least-request, outlier-aware balancers plug into;
//! this build ships [`RoundRobin`].

mod round_robin;

pub use round_robin::RoundRobin;

use std::fmt::Debug;
use std::sync::Arc;

use crate::upstream::Endpoint;

/// Picks one endpoint per request. Implementations must be cheap and lock-free: this runs on
/// every request.
pub trait Balancer: Send + Sync + Debug {
    fn pick<'a>(&self, endpoints: &'a [Arc<Endpoint>]) -> Option<&'a Arc<Endpoint>>;
}
