//! Endpoint groups: the addresses of one Backend port, and what picks among them.
//!
//! For FQDN destinations the list is replaced by the DNS refresher, for IP destinations it is
//! fixed. Picks read `pickable`: the endpoints that are not ejected (or all of them when too
//! few are healthy, Envoy's panic mode), rebuilt whenever the list or an ejection changes,
//! never per request.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Endpoint;
use crate::balance::outlier::{EjectReason, Outcome, OutlierSettings};
use crate::balance::Balancer;

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
    /// What picks choose from: `list` without ejected endpoints (or all, in panic).
    pickable: ArcSwap<EndpointList>,
    balancer: Box<dyn Balancer>,
    outlier: OutlierSettings,
    /// Requests in flight to this group, against `circuitBreaker.maxParallelRequests`.
    parallel: Arc<std::sync::atomic::AtomicU32>,
    max_parallel: u32,
    /// Serialises ejections, unejections and the rebuilds of `pickable` (rare events).
    ejections: Mutex<()>,
    /// Flips to true when the first resolution finished (success or failure).
    resolved_tx: watch::Sender<bool>,
}

impl EndpointGroup {
    pub fn new_static(
        endpoints: Vec<Arc<Endpoint>>,
        balancer: Box<dyn Balancer>,
        outlier: OutlierSettings,
    ) -> Self {
        let (resolved_tx, _) = watch::channel(true);
        let group = EndpointGroup {
            source: EndpointSource::Static,
            list: ArcSwap::from_pointee(EndpointList::resolved(endpoints)),
            pickable: ArcSwap::from_pointee(EndpointList::default()),
            balancer,
            outlier,
            parallel: Arc::default(),
            max_parallel: DEFAULT_MAX_PARALLEL_REQUESTS,
            ejections: Mutex::new(()),
            resolved_tx,
        };
        // Endpoints kept from the previous config may still be ejected.
        group.rebuild_pickable();
        group
    }

    pub fn new_dns(
        source: EndpointSource,
        balancer: Box<dyn Balancer>,
        outlier: OutlierSettings,
    ) -> Self {
        let (resolved_tx, _) = watch::channel(false);
        EndpointGroup {
            source,
            list: ArcSwap::from_pointee(EndpointList::default()),
            pickable: ArcSwap::from_pointee(EndpointList::default()),
            balancer,
            outlier,
            parallel: Arc::default(),
            max_parallel: DEFAULT_MAX_PARALLEL_REQUESTS,
            ejections: Mutex::new(()),
            resolved_tx,
        }
    }

    pub fn outlier_settings(&self) -> &OutlierSettings {
        &self.outlier
    }

    /// Sets `circuitBreaker.maxParallelRequests` (when the group is built).
    pub fn with_max_parallel_requests(mut self, max: u32) -> Self {
        self.max_parallel = max.max(1);
        self
    }

    /// Phase "admit": a slot under `maxParallelRequests`, held until the response ends; `None`
    /// when the group is full (the request gets 503 `overflow`). Like Envoy's, the check is a
    /// single atomic increment, so concurrent requests never exceed the limit.
    pub fn admit(&self) -> Option<Admission> {
        let before = self
            .parallel
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let admission = Admission(self.parallel.clone());
        (before < self.max_parallel).then_some(admission)
    }

    pub fn max_parallel_requests(&self) -> u32 {
        self.max_parallel
    }

    /// The current endpoints.
    pub fn list(&self) -> arc_swap::Guard<Arc<EndpointList>> {
        self.list.load()
    }

    /// Publishes a new endpoint list (DNS refresh).
    pub fn publish(&self, list: EndpointList) {
        self.list.store(Arc::new(list));
        self.rebuild_pickable();
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

    /// Picks the endpoint for the next request; `hash` is the request's hash under
    /// [`EndpointGroup::hash_key`] (`None` for balancers without one, or no key in the request).
    pub fn pick(&self, hash: Option<u64>) -> Option<Arc<Endpoint>> {
        let list = self.pickable.load();
        self.balancer.pick(&list, hash).cloned()
    }

    /// What requests to this group are hashed by (consistent hashing only).
    pub fn hash_key(&self) -> Option<&crate::balance::HashKey> {
        self.balancer.hash_key()
    }

    /// Records how an exchange with `endpoint` went; ejects it when that completes a run of
    /// failures, and then says why.
    pub fn record(&self, endpoint: &Endpoint, outcome: Outcome) -> Option<EjectReason> {
        let reason = endpoint.outlier.record(outcome, &self.outlier)?;
        self.eject(endpoint, reason).then_some(reason)
    }

    fn eject(&self, endpoint: &Endpoint, reason: EjectReason) -> bool {
        let _serial = self.lock();
        let list = self.list.load();
        let ejected_now = list
            .endpoints
            .iter()
            .filter(|e| e.outlier.is_ejected())
            .count();
        let ejected = endpoint.outlier.try_eject(
            reason,
            &self.outlier,
            ejected_now,
            list.endpoints.len(),
            Instant::now(),
        );
        if ejected {
            let e = endpoint.outlier.ejection();
            tracing::info!(endpoint = %endpoint.addr, reason = reason.as_str(), duration = ?e.duration, ejections = e.ejections, "endpoint ejected");
            self.rebuild_pickable_locked(&list);
        } else if !endpoint.outlier.is_ejected() {
            tracing::debug!(endpoint = %endpoint.addr, reason = reason.as_str(), ejected_now, "ejection skipped: maxEjectionPercent reached");
        }
        ejected
    }

    /// The interval tick: unejects endpoints whose time is up, decays multipliers.
    pub fn outlier_tick(&self) {
        let _serial = self.lock();
        let list = self.list.load();
        let now = Instant::now();
        let mut changed = false;
        for endpoint in &list.endpoints {
            if endpoint.outlier.tick(&self.outlier, now) {
                tracing::info!(endpoint = %endpoint.addr, "endpoint back from ejection");
                changed = true;
            }
        }
        if changed {
            self.rebuild_pickable_locked(&list);
        }
    }

    fn rebuild_pickable(&self) {
        let _serial = self.lock();
        let list = self.list.load();
        self.rebuild_pickable_locked(&list);
    }

    fn rebuild_pickable_locked(&self, list: &Arc<EndpointList>) {
        let healthy: Vec<Arc<Endpoint>> = list
            .endpoints
            .iter()
            .filter(|e| !e.outlier.is_ejected())
            .cloned()
            .collect();
        let total = list.endpoints.len();
        let panic = 100 * healthy.len() < self.outlier.panic_threshold as usize * total;
        if healthy.len() == total || panic {
            if panic {
                tracing::warn!(
                    healthy = healthy.len(),
                    total,
                    "too few healthy endpoints: balancing over all of them (panic threshold)"
                );
            }
            self.pickable.store(list.clone());
            return;
        }
        let mut pickable = EndpointList::resolved(healthy);
        pickable.last_error = list.last_error.clone();
        self.pickable.store(Arc::new(pickable));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // Guards no data of its own: poisoning means nothing here.
        self.ejections.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Envoy's default for `max_requests`.
pub const DEFAULT_MAX_PARALLEL_REQUESTS: u32 = 1024;

/// A request counted against its group's `maxParallelRequests`; dropping it frees the slot.
#[derive(Debug)]
pub struct Admission(Arc<std::sync::atomic::AtomicU32>);

impl Drop for Admission {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Runs the outlier detector's interval tick for `group` until the group is dropped (its last
/// snapshot is gone).
pub async fn outlier_ticks(group: Weak<EndpointGroup>) {
    let Some(interval) = group.upgrade().map(|g| g.outlier.interval) else {
        return;
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    loop {
        tick.tick().await;
        match group.upgrade() {
            Some(group) => group.outlier_tick(),
            None => return,
        }
    }
}
