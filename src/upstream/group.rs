//! Endpoint groups: the addresses of one Backend port, and what picks among them.
//!
//! For FQDN destinations the list is replaced by the DNS refresher, for IP destinations it is
//! fixed. Picks read `pickable`: the endpoints that are neither ejected nor failing active
//! health checks (or all of them when too few are healthy, Envoy's panic mode), rebuilt
//! whenever the list, an ejection or an endpoint's health changes, never per request.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant;

use super::breaker::{Admission, Breaker, BreakerSettings};
use super::Endpoint;
use crate::balance::health::{ActiveSettings, CheckResult, Transition};
use crate::balance::outlier::{
    rate_outliers, Detection, EjectReason, Outcome, OutlierSettings, Verdict,
};
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
    /// What picks choose from: `list` without ejected and unhealthy endpoints (or all, in
    /// panic).
    pickable: ArcSwap<EndpointList>,
    balancer: Box<dyn Balancer>,
    outlier: OutlierSettings,
    /// `circuitBreaker` limits and counts.
    breaker: Breaker,
    /// Some endpoint is neither ejected nor unhealthy (or the group has not resolved yet):
    /// routes send traffic to `fallback` Backends only when this is false for every primary.
    has_healthy: std::sync::atomic::AtomicBool,
    /// `healthCheck.active`; without it the endpoints' active health is ignored (it may be
    /// left over from a config that had checks).
    active: Option<ActiveSettings>,
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
            active: None,
            breaker: Breaker::new(BreakerSettings::default()),
            has_healthy: std::sync::atomic::AtomicBool::new(true),
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
            active: None,
            breaker: Breaker::new(BreakerSettings::default()),
            has_healthy: std::sync::atomic::AtomicBool::new(true),
            ejections: Mutex::new(()),
            resolved_tx,
        }
    }

    pub fn outlier_settings(&self) -> &OutlierSettings {
        &self.outlier
    }

    /// Sets `healthCheck.active` (when the group is built).
    pub fn with_active_checks(mut self, active: Option<ActiveSettings>) -> Self {
        self.active = active;
        self
    }

    pub fn active_settings(&self) -> Option<&ActiveSettings> {
        self.active.as_ref()
    }

    /// Sets the `circuitBreaker` limits (when the group is built).
    pub fn with_breaker(mut self, settings: BreakerSettings) -> Self {
        self.breaker = Breaker::new(settings);
        self
    }

    /// Phase "admit": a slot under `maxParallelRequests`, held until the response ends; `None`
    /// when the group is full (the request gets 503 `overflow`).
    pub fn admit(&self) -> Option<Admission> {
        self.breaker.admit()
    }

    /// Whether some endpoint can take traffic without panic mode (true until the first DNS
    /// answer: a group still resolving is not a failed one).
    pub fn has_healthy(&self) -> bool {
        self.has_healthy.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Closes one idle HTTP/1.1 connection of the group (the oldest of the first endpoint
    /// that has one): at `maxConnections`, its slot is worth more to a waiting request.
    pub fn close_an_idle_connection(&self) {
        let list = self.list.load();
        for endpoint in list.endpoints.iter() {
            if endpoint.pool.close_oldest_idle() {
                return;
            }
        }
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

    /// Picks the endpoint for the next request.
    pub fn pick(&self) -> Option<Arc<Endpoint>> {
        let list = self.pickable.load();
        self.balancer.pick(&list.endpoints, list.weights).cloned()
    }

    /// Records how an exchange with `endpoint` went; when that completes a run of failures,
    /// says which detector fired and what became of it (ejected, or why not).
    pub fn record(&self, endpoint: &Endpoint, outcome: Outcome) -> Option<Detection> {
        let reason = endpoint.outlier.record(outcome, &self.outlier)?;
        Some(Detection {
            reason,
            verdict: self.eject(endpoint, reason),
        })
    }

    fn eject(&self, endpoint: &Endpoint, reason: EjectReason) -> Verdict {
        let _serial = self.lock();
        let list = self.list.load();
        let verdict = self.eject_locked(&list, endpoint, reason, Instant::now());
        if verdict == Verdict::Ejected {
            self.rebuild_pickable_locked(&list);
        }
        verdict
    }

    fn eject_locked(
        &self,
        list: &EndpointList,
        endpoint: &Endpoint,
        reason: EjectReason,
        now: Instant,
    ) -> Verdict {
        let ejected_now = list
            .endpoints
            .iter()
            .filter(|e| e.outlier.is_ejected())
            .count();
        let verdict = endpoint.outlier.try_eject(
            reason,
            &self.outlier,
            ejected_now,
            list.endpoints.len(),
            now,
        );
        match verdict {
            Verdict::Ejected => {
                let e = endpoint.outlier.ejection();
                tracing::info!(endpoint = %endpoint.addr, reason = reason.as_str(), duration = ?e.duration, ejections = e.ejections, "endpoint ejected");
            }
            Verdict::AlreadyEjected => {}
            other => {
                tracing::debug!(endpoint = %endpoint.addr, reason = reason.as_str(), verdict = other.as_str(), ejected_now, "outlier detected, not ejected");
            }
        }
        verdict
    }

    /// The interval tick: unejects endpoints whose time is up, decays multipliers, then runs
    /// rate-based detection over the interval that just ended. Returns its detections.
    pub fn outlier_tick(&self) -> Vec<Detection> {
        let _serial = self.lock();
        let list = self.list.load();
        let now = Instant::now();
        let mut changed = false;
        for endpoint in &list.endpoints {
            if endpoint.outlier.tick(&self.outlier, now) {
                tracing::info!(endpoint = %endpoint.addr, "endpoint back from ejection");
                endpoint.mark_ready();
                changed = true;
            }
        }
        let mut detections = Vec::new();
        if self.outlier.counts_rates() {
            let counts: Vec<_> = list
                .endpoints
                .iter()
                .map(|e| {
                    let counts = e.outlier.take_interval_counts();
                    (!e.outlier.is_ejected()).then_some(counts)
                })
                .collect();
            for (i, reason) in rate_outliers(&counts, &self.outlier) {
                let verdict = self.eject_locked(&list, &list.endpoints[i], reason, now);
                changed |= verdict == Verdict::Ejected;
                detections.push(Detection { reason, verdict });
            }
        }
        if changed {
            self.rebuild_pickable_locked(&list);
        }
        detections
    }

    /// Records an active check of `endpoint`: a change of health, or a pass that ends an
    /// outlier ejection (Envoy's `successful_active_health_check_uneject_host`: the multiplier
    /// is kept), rebuilds `pickable`. Returns the health change, if any.
    pub fn record_check(&self, endpoint: &Endpoint, result: &CheckResult) -> Option<Transition> {
        let Some(active) = &self.active else {
            return None;
        };
        let _serial = self.lock();
        let transition = endpoint
            .health
            .record(result, active, std::time::SystemTime::now());
        let unejected = result == &CheckResult::Pass
            && active.uneject_on_pass
            && !endpoint.health.is_unhealthy()
            && endpoint.outlier.uneject(Instant::now());
        match transition {
            Some(Transition::BecameUnhealthy) => {
                let reason = match result {
                    CheckResult::Fail(reason) => reason.as_str(),
                    CheckResult::Pass => "",
                };
                tracing::warn!(endpoint = %endpoint.addr, reason, "endpoint failed active health checks: unhealthy")
            }
            Some(Transition::BecameHealthy) => {
                endpoint.mark_ready();
                tracing::info!(endpoint = %endpoint.addr, "endpoint passed active health checks: healthy")
            }
            None => {}
        }
        if unejected {
            endpoint.mark_ready();
            tracing::info!(endpoint = %endpoint.addr, "endpoint back from ejection: active health check passed");
        }
        if transition.is_some() || unejected {
            let list = self.list.load();
            self.rebuild_pickable_locked(&list);
        }
        transition
    }

    /// Rebuilds `pickable` from the endpoints' current state (a new health checker does this
    /// once, in case a check of the previous config's checker changed health meanwhile).
    pub fn rebuild_pickable(&self) {
        let _serial = self.lock();
        let list = self.list.load();
        self.rebuild_pickable_locked(&list);
    }

    fn rebuild_pickable_locked(&self, list: &Arc<EndpointList>) {
        let healthy: Vec<Arc<Endpoint>> = list
            .endpoints
            .iter()
            .filter(|e| self.is_pickable(e))
            .cloned()
            .collect();
        let total = list.endpoints.len();
        self.has_healthy
            .store(!healthy.is_empty(), std::sync::atomic::Ordering::Relaxed);
        let panic = 100 * healthy.len() < self.outlier.panic_threshold as usize * total;
        if healthy.len() == total || panic {
            if panic {
                tracing::warn!(
                    healthy = healthy.len(),
                    total,
                    "too few healthy endpoints: balancing over all of them (panic threshold)"
                );
            }
            // A fresh allocation even when it holds the same endpoints: balancers tell lists
            // apart by identity, and an endpoint's return (slow start) must look like a change.
            let mut all = EndpointList::resolved(list.endpoints.clone());
            all.resolved = list.resolved;
            all.last_error = list.last_error.clone();
            self.pickable.store(Arc::new(all));
            return;
        }
        let mut pickable = EndpointList::resolved(healthy);
        pickable.last_error = list.last_error.clone();
        self.pickable.store(Arc::new(pickable));
    }

    /// Neither ejected nor (when active checks are on) unhealthy.
    fn is_pickable(&self, endpoint: &Endpoint) -> bool {
        let unhealthy = self.active.is_some() && endpoint.health.is_unhealthy();
        !endpoint.outlier.is_ejected() && !unhealthy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // Guards no data of its own: poisoning means nothing here.
        self.ejections.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where detections made off the request path (on the interval tick) are reported.
pub type DetectionSink = Box<dyn Fn(Detection) + Send + Sync>;

/// Runs the outlier detector's interval tick for `group` until the group is dropped (its last
/// snapshot is gone).
pub async fn outlier_ticks(group: Weak<EndpointGroup>, detections: DetectionSink) {
    let Some(interval) = group.upgrade().map(|g| g.outlier.interval) else {
        return;
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    loop {
        tick.tick().await;
        match group.upgrade() {
            Some(group) => {
                for detection in group.outlier_tick() {
                    detections(detection);
                }
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::health::CheckKind;
    use crate::balance::test_support::endpoint;
    use crate::balance::RoundRobin;

    fn active(uneject_on_pass: bool) -> ActiveSettings {
        ActiveSettings {
            kind: CheckKind::Tcp,
            interval: Duration::from_secs(1),
            interval_jitter: Duration::ZERO,
            timeout: Duration::from_millis(100),
            unhealthy_threshold: 1,
            healthy_threshold: 1,
            uneject_on_pass,
        }
    }

    fn group(n: u16, active: Option<ActiveSettings>) -> EndpointGroup {
        let endpoints = (1..=n).map(|port| endpoint(port, 1)).collect();
        let outlier = OutlierSettings {
            max_ejection_percent: 100,
            ..OutlierSettings::default()
        };
        EndpointGroup::new_static(endpoints, Box::new(RoundRobin::new()), outlier)
            .with_active_checks(active)
    }

    fn pickable_ports(g: &EndpointGroup) -> Vec<u16> {
        g.pickable
            .load()
            .endpoints
            .iter()
            .map(|e| e.addr.port())
            .collect()
    }

    fn fail() -> CheckResult {
        CheckResult::Fail("refused".into())
    }

    #[test]
    fn an_unhealthy_endpoint_leaves_pickable_and_returns_when_it_passes() {
        let g = group(3, Some(active(true)));
        let first = g.list().endpoints[0].clone();
        assert_eq!(
            g.record_check(&first, &fail()),
            Some(Transition::BecameUnhealthy)
        );
        assert_eq!(pickable_ports(&g), vec![2, 3]);
        assert_eq!(
            g.record_check(&first, &CheckResult::Pass),
            Some(Transition::BecameHealthy)
        );
        assert_eq!(pickable_ports(&g), vec![1, 2, 3]);
    }

    #[test]
    fn unhealthy_and_ejected_endpoints_count_together_for_the_panic_threshold() {
        let g = group(4, Some(active(true)));
        let list = g.list().endpoints.clone();
        g.record_check(&list[0], &fail());
        for _ in 0..5 {
            g.record(&list[1], Outcome::GatewayError);
        }
        assert_eq!(pickable_ports(&g), vec![3, 4], "2 of 4 healthy: no panic");
        g.record_check(&list[2], &fail());
        assert_eq!(pickable_ports(&g), vec![1, 2, 3, 4], "1 of 4: panic");
    }

    #[test]
    fn a_pass_unejects_at_once_keeping_the_multiplier_unless_turned_off() {
        for uneject in [true, false] {
            let g = group(2, Some(active(uneject)));
            let first = g.list().endpoints[0].clone();
            for _ in 0..5 {
                g.record(&first, Outcome::GatewayError);
            }
            assert!(first.outlier.is_ejected());
            g.record_check(&first, &CheckResult::Pass);
            assert_eq!(first.outlier.is_ejected(), !uneject);
            assert_eq!(first.outlier.ejection().multiplier, 1);
            let expected = if uneject { vec![1, 2] } else { vec![2] };
            assert_eq!(pickable_ports(&g), expected);
        }
    }

    #[test]
    fn without_active_checks_health_left_over_is_ignored() {
        let checked = group(2, Some(active(true)));
        let first = checked.list().endpoints[0].clone();
        checked.record_check(&first, &fail());
        assert!(first.health.is_unhealthy());
        // The same endpoint in a group of a config without active checks.
        let unchecked = EndpointGroup::new_static(
            checked.list().endpoints.clone(),
            Box::new(RoundRobin::new()),
            OutlierSettings::default(),
        );
        assert_eq!(pickable_ports(&unchecked), vec![1, 2]);
        assert_eq!(unchecked.record_check(&first, &CheckResult::Pass), None);
    }
}
