//! Endpoint groups: the addresses of one Backend port, and what picks among them.
//!
//! For FQDN destinations the list is replaced by the DNS refresher, for IP destinations it is
//! fixed. Picks read `pickable`: the endpoints that are neither ejected nor failing active
//! health checks (or all of them when too few are healthy, Envoy's panic mode), rebuilt
//! whenever the list, an ejection or an endpoint's health changes, never per request.

use std::sync::{Arc, Mutex};
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
use crate::balance::{Balancer, EndpointList};

/// Where a group's endpoints come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum EndpointSource {
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

/// What picks choose from: one list per priority level that takes load (usually one).
#[derive(Debug)]
pub(crate) struct Pickable {
    pub(crate) levels: Vec<Level>,
}

impl Default for Pickable {
    fn default() -> Self {
        Pickable {
            levels: vec![Level::default()],
        }
    }
}

/// One priority level's pickable endpoints and its share of the load.
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// Cumulative load (percent) up to and including this level: a pick rolling below it
    /// (and not below the previous level's) uses this level.
    pub(crate) load_end: u32,
    /// The level's rank among the group's priorities (selects its balancer).
    pub(crate) rank: usize,
    pub(crate) list: Arc<EndpointList<Endpoint>>,
}

/// The distinct priorities of `endpoints`, ascending (0 is the most preferred).
fn priorities(endpoints: &[Arc<Endpoint>]) -> Vec<u32> {
    let mut p: Vec<u32> = endpoints.iter().map(|e| e.priority).collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// The endpoints of one Backend port, and the balancer that picks among them.
#[derive(Debug)]
pub struct EndpointGroup {
    pub(crate) source: EndpointSource,
    list: ArcSwap<EndpointList<Endpoint>>,
    /// What picks choose from: `list` without ejected and unhealthy endpoints (or all, in
    /// panic).
    pickable: ArcSwap<Pickable>,
    /// One balancer per priority level (index: the level's rank among the group's
    /// priorities; one for DNS groups and groups without priorities).
    balancers: Vec<Box<dyn Balancer<Endpoint>>>,
    /// Outlier detection, active checks, limits: shared with the groups of every Backend with
    /// the same settings (and with the registry's key of this group).
    settings: Arc<GroupSettings>,
    /// `circuitBreaker` limits and counts.
    breaker: Breaker,
    /// Some endpoint is neither ejected nor unhealthy (or the group has not resolved yet):
    /// routes send traffic to `fallback` Backends only when this is false for every primary.
    has_healthy: std::sync::atomic::AtomicBool,
    /// Serialises ejections, unejections and the rebuilds of `pickable` (rare events).
    ejections: Mutex<()>,
    /// Flips to true when the first resolution finished (success or failure).
    /// Only for a group that starts unresolved (DNS): a static group is resolved from the
    /// start and needs no channel (a watch channel is 340 bytes; 10,000 groups: 3.4 MB).
    resolved_tx: Option<watch::Sender<bool>>,
}

/// Why a request pinned to an endpoint cannot go there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unroutable {
    /// No longer one of the group's endpoints (the config or DNS dropped it).
    Gone,
    /// Ejected by outlier detection.
    Ejected,
    /// Failing active health checks.
    Unhealthy,
}

impl Unroutable {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unroutable::Gone => "is no longer an endpoint of this Backend port",
            Unroutable::Ejected => "is ejected by outlier detection",
            Unroutable::Unhealthy => "is failing active health checks",
        }
    }
}

/// How a group is set up, besides its endpoints and balancers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GroupSettings {
    /// The balancing algorithm and its settings, as an identity (`BalancerKind::key`): a
    /// different balancer is a different group.
    pub balancer: String,
    pub outlier: OutlierSettings,
    /// `healthCheck.active`: without it the endpoints' active health is ignored (it may be
    /// left over from a config that had checks).
    pub active: Option<ActiveSettings>,
    /// `circuitBreaker` limits.
    pub breaker: BreakerSettings,
}

impl EndpointGroup {
    /// A group of fixed addresses (`destination.ip`; a reload that changes them publishes the
    /// new list into the same group).
    pub fn new_static(
        endpoints: Vec<Arc<Endpoint>>,
        make_balancer: impl Fn() -> Box<dyn Balancer<Endpoint>>,
        settings: impl Into<Arc<GroupSettings>>,
    ) -> Self {
        Self::new(
            EndpointSource::Static,
            EndpointList::resolved(endpoints),
            make_balancer,
            settings,
        )
    }

    /// A group resolved from a hostname: empty until its refresher publishes the first answer.
    pub(crate) fn new_dns(
        source: EndpointSource,
        make_balancer: impl Fn() -> Box<dyn Balancer<Endpoint>>,
        settings: impl Into<Arc<GroupSettings>>,
    ) -> Self {
        Self::new(source, EndpointList::default(), make_balancer, settings)
    }

    /// The one constructor: everything is set before `pickable` is first built, so endpoints
    /// kept from the previous config that are ejected, or that active checks found unhealthy,
    /// are never pickable, not even for a moment.
    fn new(
        source: EndpointSource,
        list: EndpointList<Endpoint>,
        make_balancer: impl Fn() -> Box<dyn Balancer<Endpoint>>,
        settings: impl Into<Arc<GroupSettings>>,
    ) -> Self {
        // One balancer per priority level, so weighted schedules are not rebuilt as picks
        // move between levels (DNS groups have one level).
        let settings = settings.into();
        let levels = priorities(&list.endpoints).len().max(1);
        let resolved_tx = (!list.resolved).then(|| watch::channel(false).0);
        let group = EndpointGroup {
            source,
            list: ArcSwap::from_pointee(list),
            pickable: ArcSwap::from_pointee(Pickable::default()),
            balancers: (0..levels).map(|_| make_balancer()).collect(),
            breaker: Breaker::new(settings.breaker),
            settings,
            has_healthy: std::sync::atomic::AtomicBool::new(true),
            ejections: Mutex::new(()),
            resolved_tx,
        };
        group.rebuild_pickable();
        group
    }

    /// Whether the current list is exactly `endpoints`, in order.
    pub(crate) fn holds(&self, endpoints: &[Arc<Endpoint>]) -> bool {
        let list = self.list.load();
        list.endpoints.len() == endpoints.len()
            && list
                .endpoints
                .iter()
                .zip(endpoints)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    pub(crate) fn active_settings(&self) -> Option<&ActiveSettings> {
        self.settings.active.as_ref()
    }

    /// Phase "admit": a slot under `maxParallelRequests`, held until the response ends; `None`
    /// when the group is full (the request gets 503 `overflow`).
    pub(crate) fn admit(&self) -> Option<Admission> {
        self.breaker.admit()
    }

    /// The endpoint at `addr`, if it is in the group and neither ejected nor unhealthy
    /// (requests pinned to an endpoint, e.g. MCP sessions); else why not.
    pub(crate) fn routable(&self, addr: std::net::SocketAddr) -> Result<Arc<Endpoint>, Unroutable> {
        let list = self.list.load();
        let endpoint = list
            .endpoints
            .iter()
            .find(|e| e.addr == addr)
            .ok_or(Unroutable::Gone)?;
        if endpoint.outlier.is_ejected() {
            Err(Unroutable::Ejected)
        } else if self.settings.active.is_some() && endpoint.health.is_unhealthy() {
            Err(Unroutable::Unhealthy)
        } else {
            Ok(endpoint.clone())
        }
    }

    /// Whether some endpoint can take traffic without panic mode (true until the first DNS
    /// answer: a group still resolving is not a failed one).
    pub(crate) fn has_healthy(&self) -> bool {
        self.has_healthy.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Closes one idle HTTP/1.1 connection of the group (the oldest of the first endpoint
    /// that has one): at `maxConnections`, its slot is worth more to a waiting request.
    pub(crate) fn close_an_idle_connection(&self) {
        let list = self.list.load();
        for endpoint in list.endpoints.iter() {
            if endpoint.pool.close_oldest_idle() {
                return;
            }
        }
    }

    /// The current endpoints.
    pub(crate) fn list(&self) -> arc_swap::Guard<Arc<EndpointList<Endpoint>>> {
        self.list.load()
    }

    /// Publishes a new endpoint list (a DNS answer, or a reload's new static addresses).
    pub(crate) fn publish(&self, list: EndpointList<Endpoint>) {
        self.list.store(Arc::new(list));
        self.rebuild_pickable();
        if let Some(tx) = &self.resolved_tx {
            tx.send_replace(true);
        }
    }

    /// Whether the first resolution has finished.
    pub(crate) fn is_resolved(&self) -> bool {
        self.resolved_tx.as_ref().is_none_or(|tx| *tx.borrow())
    }

    /// Waits until the first resolution has finished, for at most `limit`.
    pub(crate) async fn wait_resolved(&self, limit: Duration) {
        let Some(tx) = &self.resolved_tx else {
            return;
        };
        let mut rx = tx.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|resolved| *resolved)).await;
    }

    /// Picks the endpoint for the next request; `hash` is the request's hash under
    /// [`EndpointGroup::hash_key`] (`None` for balancers without one, or no key in the request).
    pub fn pick(&self, hash: Option<u64>) -> Option<Arc<Endpoint>> {
        let pickable = self.pickable.load();
        let level = match pickable.levels.as_slice() {
            [only] => only,
            levels => {
                let roll = fastrand::u32(..100);
                levels
                    .iter()
                    .find(|l| roll < l.load_end)
                    .or(levels.last())?
            }
        };
        let balancer = self.balancers.get(level.rank).or(self.balancers.first())?;
        balancer.pick(&level.list, hash).cloned()
    }

    /// The weight `endpoint` is balanced with now (slow start lowers it), for `/endpoints`.
    pub(crate) fn effective_weight(&self, endpoint: &Endpoint) -> f64 {
        self.balancers
            .first()
            .map_or(f64::from(endpoint.weight), |b| b.effective_weight(endpoint))
    }

    /// What requests to this group are hashed by (consistent hashing only).
    pub(crate) fn hash_key(&self) -> Option<&crate::balance::HashKey> {
        self.balancers.first()?.hash_key()
    }

    /// Records how an exchange with `endpoint` went; when that completes a run of failures,
    /// says which detector fired and what became of it (ejected, or why not).
    pub fn record(&self, endpoint: &Endpoint, outcome: Outcome) -> Option<Detection> {
        let reason = endpoint.outlier.record(outcome, &self.settings.outlier)?;
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
        list: &EndpointList<Endpoint>,
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
            &self.settings.outlier,
            ejected_now,
            list.endpoints.len(),
            now,
        );
        match verdict {
            Verdict::Ejected => {
                let e = endpoint.outlier.ejection();
                crate::telemetry::log_limit::limited!(info, endpoint = %endpoint.addr, reason = reason.as_str(), duration = ?e.duration, ejections = e.ejections, "endpoint ejected");
            }
            Verdict::AlreadyEjected => {}
            other => {
                tracing::debug!(endpoint = %endpoint.addr, reason = reason.as_str(), verdict = other.as_str(), ejected_now, "outlier detected, not ejected");
            }
        }
        verdict
    }

    /// How often [`EndpointGroup::outlier_tick`] is to run.
    pub(crate) fn outlier_interval(&self) -> Duration {
        self.settings.outlier.interval
    }

    /// The interval tick: unejects endpoints whose time is up, decays multipliers, then runs
    /// rate-based detection over the interval that just ended. Returns its detections.
    pub(crate) fn outlier_tick(&self) -> Vec<Detection> {
        let _serial = self.lock();
        let list = self.list.load();
        let now = Instant::now();
        let mut changed = false;
        for endpoint in &list.endpoints {
            if endpoint.outlier.tick(&self.settings.outlier, now) {
                crate::telemetry::log_limit::limited!(info, endpoint = %endpoint.addr, "endpoint back from ejection");
                endpoint.mark_ready();
                changed = true;
            }
        }
        let mut detections = Vec::new();
        if self.settings.outlier.counts_rates() {
            let counts: Vec<_> = list
                .endpoints
                .iter()
                .map(|e| {
                    let counts = e.outlier.take_interval_counts();
                    (!e.outlier.is_ejected()).then_some(counts)
                })
                .collect();
            for (i, reason) in rate_outliers(&counts, &self.settings.outlier) {
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
    pub(crate) fn record_check(
        &self,
        endpoint: &Endpoint,
        result: &CheckResult,
    ) -> Option<Transition> {
        let Some(active) = &self.settings.active else {
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
                crate::telemetry::log_limit::limited!(warn, endpoint = %endpoint.addr, reason, "endpoint failed active health checks: unhealthy")
            }
            Some(Transition::BecameHealthy) => {
                endpoint.mark_ready();
                crate::telemetry::log_limit::limited!(info, endpoint = %endpoint.addr, "endpoint passed active health checks: healthy")
            }
            None => {}
        }
        if unejected {
            endpoint.mark_ready();
            crate::telemetry::log_limit::limited!(info, endpoint = %endpoint.addr, "endpoint back from ejection: active health check passed");
        }
        if transition.is_some() || unejected {
            let list = self.list.load();
            self.rebuild_pickable_locked(&list);
        }
        transition
    }

    /// Rebuilds `pickable` from the endpoints' current state (a new health checker does this
    /// once, in case a check of the previous config's checker changed health meanwhile).
    pub(crate) fn rebuild_pickable(&self) {
        let _serial = self.lock();
        let list = self.list.load();
        self.rebuild_pickable_locked(&list);
    }

    /// Splits the endpoints into priority levels and gives each its share of the load
    /// (Envoy's priority load with overprovisioning 1.4, `reference/...` §1.7): a level takes
    /// `min(100, 1.4 × healthy%)` of what the levels before it left. Below 100% in total, a
    /// level under `panicThreshold`% healthy picks from all of its endpoints; when every level
    /// is in panic, load follows endpoint counts. With one level this is: the healthy
    /// endpoints, or all of them below the panic threshold (which never bites above 71.4%).
    fn rebuild_pickable_locked(&self, list: &Arc<EndpointList<Endpoint>>) {
        let levels = self.split_levels(list);
        let any_healthy = levels.iter().any(|l| !l.healthy.is_empty());
        self.has_healthy
            .store(any_healthy, std::sync::atomic::Ordering::Relaxed);
        let shares = LevelShares::of(&levels, self.settings.outlier.panic_threshold);
        if shares.panic.iter().any(|p| *p) {
            let healthy: usize = levels.iter().map(|l| l.healthy.len()).sum();
            // Every rebuild while in panic would say it again: an upstream flapping can cause
            // one per event.
            crate::telemetry::log_limit::limited!(
                warn,
                healthy,
                total = list.endpoints.len(),
                "too few healthy endpoints: balancing over unhealthy ones too (panic threshold)"
            );
        }
        let mut pickable = Pickable { levels: Vec::new() };
        let mut load_end = 0u32;
        let one_level = levels.len() == 1;
        for (rank, (level, load)) in levels.into_iter().zip(shares.loads).enumerate() {
            if load == 0 {
                continue;
            }
            load_end += load as u32;
            let endpoints = if shares.panic[rank] {
                level.all
            } else {
                level.healthy
            };
            // The common case, one level taking every endpoint of a list never published
            // before (a new group, new addresses): that list itself, not a copy (10,000
            // groups: 2.8 MB). Otherwise a new list even when it holds the same endpoints as
            // before: what its balancer prepares for it (schedules, slow start) starts over,
            // as an endpoint's return needs.
            let list_of_level =
                if one_level && endpoints.len() == list.endpoints.len() && list.publish_once() {
                    list.clone()
                } else {
                    let mut new = EndpointList::resolved(endpoints);
                    new.resolved = list.resolved;
                    new.last_error = list.last_error.clone();
                    new.address_denied = list.address_denied;
                    Arc::new(new)
                };
            if let Some(balancer) = self.balancers.get(rank).or(self.balancers.first()) {
                balancer.prepare(&list_of_level);
            }
            pickable.levels.push(Level {
                load_end,
                rank,
                list: list_of_level,
            });
        }
        if pickable.levels.is_empty() {
            pickable.levels.push(Level::default());
        }
        self.pickable.store(Arc::new(pickable));
    }

    /// The endpoints of each priority level (in priority order), all and pickable ones.
    fn split_levels(&self, list: &EndpointList<Endpoint>) -> Vec<LevelEndpoints> {
        let ranks = priorities(&list.endpoints);
        let mut levels: Vec<LevelEndpoints> = (0..ranks.len().max(1))
            .map(|_| LevelEndpoints::default())
            .collect();
        for e in &list.endpoints {
            let rank = ranks.binary_search(&e.priority).unwrap_or(0);
            levels[rank].all.push(e.clone());
            if self.is_pickable(e) {
                levels[rank].healthy.push(e.clone());
            }
        }
        levels
    }

    /// Neither ejected nor (when active checks are on) unhealthy.
    fn is_pickable(&self, endpoint: &Endpoint) -> bool {
        let unhealthy = self.settings.active.is_some() && endpoint.health.is_unhealthy();
        !endpoint.outlier.is_ejected() && !unhealthy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // Guards no data of its own: poisoning means nothing here.
        self.ejections.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One priority level's endpoints while `pickable` is rebuilt.
#[derive(Default)]
struct LevelEndpoints {
    all: Vec<Arc<Endpoint>>,
    /// Neither ejected nor unhealthy.
    healthy: Vec<Arc<Endpoint>>,
}

/// Each level's share of the load (percent, summing to 100) and whether it is in panic.
struct LevelShares {
    loads: Vec<u64>,
    panic: Vec<bool>,
}

impl LevelShares {
    fn of(levels: &[LevelEndpoints], panic_threshold: u32) -> LevelShares {
        let health: Vec<u64> = levels
            .iter()
            .map(|l| match l.all.len() {
                0 => 0,
                n => (140 * l.healthy.len() as u64 / n as u64).min(100),
            })
            .collect();
        let total_health = health.iter().sum::<u64>().min(100);
        let threshold = u64::from(panic_threshold);
        let panic: Vec<bool> = levels
            .iter()
            .map(|l| {
                total_health < 100
                    && 100 * (l.healthy.len() as u64) < threshold * l.all.len() as u64
            })
            .collect();
        let mut loads: Vec<u64> = if panic.iter().all(|p| *p) {
            let hosts = levels.iter().map(|l| l.all.len()).sum::<usize>().max(1) as u64;
            levels
                .iter()
                .map(|l| 100 * l.all.len() as u64 / hosts)
                .collect()
        } else if total_health == 0 {
            // Nothing healthy and panic off: the first level, empty (503 no_healthy_upstream).
            let mut loads = vec![0; levels.len()];
            loads[0] = 100;
            loads
        } else {
            // In order of priority: each level takes its availability, scaled so that the
            // levels together take 100, from what the levels before it left.
            let mut remaining = 100u64;
            health
                .iter()
                .map(|h| {
                    let load = (h * 100 / total_health).min(remaining);
                    remaining -= load;
                    load
                })
                .collect()
        };
        // Rounding leftovers go to the first level that takes load.
        let leftover = 100u64.saturating_sub(loads.iter().sum());
        if let Some(first) = loads.iter_mut().find(|l| **l > 0) {
            *first += leftover;
        }
        LevelShares { loads, panic }
    }
}

/// Where detections made off the request path (on the interval tick) are reported.
pub(crate) type DetectionSink = Box<dyn Fn(Detection) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::health::CheckKind;
    use crate::balance::RoundRobin;
    use crate::upstream::endpoint::test_endpoint as endpoint;

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
        EndpointGroup::new_static(
            endpoints,
            || Box::new(RoundRobin::new()),
            GroupSettings {
                outlier,
                active,
                ..GroupSettings::default()
            },
        )
    }

    fn pickable_ports(g: &EndpointGroup) -> Vec<u16> {
        g.pickable
            .load()
            .levels
            .iter()
            .flat_map(|l| l.list.endpoints.iter().map(|e| e.addr.port()))
            .collect()
    }

    fn fail() -> CheckResult {
        CheckResult::Fail("refused".into())
    }

    /// While every endpoint takes load, picks choose from the group's own list (no copy per
    /// group); once one leaves and returns, from a new list (its balancer starts over).
    #[test]
    fn a_whole_list_is_pickable_as_it_is_once() {
        let g = group(2, Some(active(true)));
        let same = |g: &EndpointGroup| Arc::ptr_eq(&g.pickable.load().levels[0].list, &g.list());
        assert!(same(&g));
        let first = g.list().endpoints[0].clone();
        g.record_check(&first, &fail());
        assert!(!same(&g));
        g.record_check(&first, &CheckResult::Pass);
        assert_eq!(pickable_ports(&g), vec![1, 2]);
        assert!(!same(&g), "a returning endpoint gets a new list");
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
    fn a_new_group_never_lists_an_endpoint_kept_unhealthy_or_ejected() {
        let before = group(4, Some(active(true)));
        let list = before.list().endpoints.clone();
        before.record_check(&list[0], &fail());
        for _ in 0..5 {
            before.record(&list[1], Outcome::GatewayError);
        }
        // The same endpoints in the group of the next config: pickable from its first moment.
        let after = EndpointGroup::new_static(
            list,
            || Box::new(RoundRobin::new()),
            GroupSettings {
                active: Some(active(true)),
                ..GroupSettings::default()
            },
        );
        assert_eq!(pickable_ports(&after), vec![3, 4]);
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
            || Box::new(RoundRobin::new()),
            GroupSettings::default(),
        );
        assert_eq!(pickable_ports(&unchecked), vec![1, 2]);
        assert_eq!(unchecked.record_check(&first, &CheckResult::Pass), None);
    }

    /// Ports 1..=n at priority 0, then n+1..=n+m at priority 1; active checks fail at once.
    fn two_levels(n: u16, m: u16) -> EndpointGroup {
        let endpoints = (1..=n + m)
            .map(|port| {
                let e = Arc::try_unwrap(endpoint(port, 1)).unwrap();
                Arc::new(e.with_priority(u32::from(port > n)))
            })
            .collect();
        EndpointGroup::new_static(
            endpoints,
            || Box::new(RoundRobin::new()),
            GroupSettings {
                active: Some(active(true)),
                ..GroupSettings::default()
            },
        )
    }

    fn fail_ports(g: &EndpointGroup, ports: &[u16]) {
        for e in g.list().endpoints.iter() {
            if ports.contains(&e.addr.port()) {
                g.record_check(e, &fail());
            }
        }
    }

    /// (load share in percent, ports) per level that takes load.
    fn levels(g: &EndpointGroup) -> Vec<(u32, Vec<u16>)> {
        let mut previous = 0;
        g.pickable
            .load()
            .levels
            .iter()
            .map(|l| {
                let share = l.load_end - previous;
                previous = l.load_end;
                (
                    share,
                    l.list.endpoints.iter().map(|e| e.addr.port()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn priority_levels_take_load_as_the_ones_before_lose_health() {
        let g = two_levels(4, 2);
        assert_eq!(levels(&g), vec![(100, vec![1, 2, 3, 4])]);
        // One of four down: 1.4 × 75% ≥ 100%, all still on P0.
        fail_ports(&g, &[1]);
        assert_eq!(levels(&g), vec![(100, vec![2, 3, 4])]);
        // Two of four down: P0 is 70% available, P1 takes the other 30%.
        fail_ports(&g, &[2]);
        assert_eq!(levels(&g), vec![(70, vec![3, 4]), (30, vec![5, 6])]);
        // P0 gone: everything on P1.
        fail_ports(&g, &[3, 4]);
        assert_eq!(levels(&g), vec![(100, vec![5, 6])]);
        // Picks follow the split.
        let g = two_levels(4, 2);
        fail_ports(&g, &[1, 2]);
        let on_p1 = (0..10_000)
            .filter(|_| g.pick(None).unwrap().priority == 1)
            .count();
        assert!((2_800..=3_200).contains(&on_p1), "{on_p1}");
    }

    #[test]
    fn when_every_level_is_in_panic_load_follows_endpoint_counts() {
        // Envoy's docs: P0 and P1 each 25% healthy → both in panic → 50/50, all endpoints.
        let g = two_levels(4, 4);
        fail_ports(&g, &[1, 2, 3, 5, 6, 7]);
        assert_eq!(
            levels(&g),
            vec![(50, vec![1, 2, 3, 4]), (50, vec![5, 6, 7, 8])]
        );
    }

    #[tokio::test]
    async fn an_ejected_endpoint_loses_only_its_own_keys() {
        use crate::balance::hash_key::hash_bytes;
        use crate::balance::outlier::Outcome;
        use crate::balance::{ConsistentHash, ConsistentHashSettings, HashKey, HashTable};
        for table in [HashTable::default(), HashTable::Maglev { size: 65537 }] {
            let eps: Vec<_> = (1..=5).map(|p| endpoint(p, 1)).collect();
            let settings = ConsistentHashSettings {
                key: HashKey::SourceIp,
                table,
            };
            let group = EndpointGroup::new_static(
                eps.clone(),
                || Box::new(ConsistentHash::new(settings.clone())),
                GroupSettings::default(),
            );
            let place = || -> Vec<u16> {
                (0..10_000)
                    .map(|k| {
                        group
                            .pick(Some(hash_bytes(format!("user-{k}").as_bytes())))
                            .unwrap()
                            .addr
                            .port()
                    })
                    .collect()
            };
            let before = place();
            while group.record(&eps[1], Outcome::GatewayError).is_none() {}
            let during = place();
            for (b, d) in before.iter().zip(&during) {
                assert_ne!(*d, 2, "{table:?}: a key went to the ejected endpoint");
                if *b != 2 && table == HashTable::default() {
                    assert_eq!(b, d, "{table:?}: a survivor's key moved");
                }
            }
            let kept = before
                .iter()
                .zip(&during)
                .filter(|(b, d)| **b != 2 && b == d)
                .count();
            let survivors = before.iter().filter(|&&b| b != 2).count();
            assert!(
                kept as f64 / survivors as f64 > 0.97,
                "{table:?}: kept {kept}"
            );
        }
    }
}
