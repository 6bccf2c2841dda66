//! The list of endpoints a balancer picks from, and what its balancer built for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::Candidate;

/// Endpoints as one group publishes them: all of its endpoints, or one priority level's
/// pickable ones. Immutable once published; a change is a new list.
#[derive(Debug)]
pub struct EndpointList<E> {
    pub(crate) endpoints: Vec<Arc<E>>,
    /// Summary of the endpoints' weights, computed once per list so picks need not scan it.
    pub(crate) weights: Weights,
    /// Set once a DNS group has resolved at least once (always true for static groups).
    pub(crate) resolved: bool,
    /// Last resolution error, kept while the last good addresses keep serving.
    pub(crate) last_error: Option<String>,
    /// The last resolution's answers were all refused by the destination's address policy
    /// (`last_error` says which): a request that finds no endpoint is refused, not failed.
    pub(crate) address_denied: bool,
    /// What the list's balancer built for it (see [`Prepared`]): set when the list is
    /// published, so picks only read it.
    prepared: OnceLock<Prepared>,
    /// Whether this list was ever published as what picks choose from (see
    /// [`EndpointList::publish_once`]).
    published: AtomicBool,
}

impl<E> Default for EndpointList<E> {
    fn default() -> Self {
        EndpointList {
            endpoints: Vec::new(),
            weights: Weights::default(),
            resolved: false,
            last_error: None,
            address_denied: false,
            prepared: OnceLock::new(),
            published: AtomicBool::new(false),
        }
    }
}

impl<E: Candidate> EndpointList<E> {
    /// A list of resolved (or static) endpoints.
    pub fn resolved(endpoints: Vec<Arc<E>>) -> Self {
        EndpointList {
            weights: Weights::of(&endpoints),
            endpoints,
            resolved: true,
            last_error: None,
            address_denied: false,
            prepared: OnceLock::new(),
            published: AtomicBool::new(false),
        }
    }

    /// True the first time only: a group's list can itself be what picks choose from while
    /// every endpoint takes load, but only once; a later rebuild makes a new list, so what
    /// its balancer prepares (schedules, slow start) starts over.
    pub(crate) fn publish_once(&self) -> bool {
        !self.published.swap(true, Ordering::Relaxed)
    }

    /// What the balancer built for this list, building it now if it has not been.
    pub(super) fn prepared(&self, build: impl FnOnce() -> Prepared) -> &Prepared {
        self.prepared.get_or_init(build)
    }
}

/// Per-list state of one kind of balancer. A list belongs to one priority level of one group,
/// which has one balancer, so a list holds at most one of these.
#[derive(Debug)]
pub(super) enum Prepared {
    LeastRequest(super::least_request::Prepared),
    RoundRobin(super::round_robin::Prepared),
    ConsistentHash(super::consistent_hash::Lookup),
}

/// What balancers need to know about a list's weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Weights {
    /// Every endpoint has the same weight.
    pub(crate) uniform: bool,
    pub(crate) total: u64,
}

impl Weights {
    pub(crate) fn of<E: Candidate>(endpoints: &[Arc<E>]) -> Self {
        Weights {
            uniform: endpoints.windows(2).all(|w| w[0].weight() == w[1].weight()),
            total: endpoints.iter().map(|e| u64::from(e.weight())).sum(),
        }
    }
}
