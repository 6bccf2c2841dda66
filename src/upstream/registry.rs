//! The state registry: long-lived state that outlives config reloads, found again by identity.
//!
//! A snapshot holds strong references to what it uses; the registry holds weak ones. Compiling a
//! new snapshot looks every endpoint and DNS group up here first, so an unchanged endpoint keeps
//! its connection pool and counters across a reload, an unchanged Backend port keeps its group
//! (circuit-breaker counts, balancer state), and an unchanged FQDN keeps its resolved
//! addresses and refresher. When the last snapshot that used something is gone (and in-flight
//! requests on it finished), it is dropped and its entry pruned.

use std::collections::HashMap;

use foldhash::fast::RandomState as FastHash;
use std::hash::Hash;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::bounded::rate::Rate;
use crate::config::wire::enums::LookupFamily;
use crate::config::ObjectId;
use crate::telemetry::metrics::DnsStats;
use crate::upstream::address::AnswerPolicy;
use crate::upstream::dns::{DnsLimits, DnsResolver};
use crate::upstream::group::GroupSettings;
use crate::upstream::pool::{H1Pool, PoolSettings};
use crate::upstream::{Endpoint, EndpointGroup};

/// What the endpoints of one Backend port share in their identity: the Backend, the port and
/// how connections are made. A change to any of these is a new endpoint with a fresh pool,
/// because pooled connections made under the old settings must not be reused. One per port,
/// shared by its endpoints and its group (10,000 Backends: one copy each, not one per endpoint
/// and per registry key).
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct PortIdentity {
    pub(crate) backend: ObjectId,
    pub(crate) number: u16,
    /// Hash of the transport settings (protocol, TLS) connections are made with.
    pub(crate) transport: u64,
    pub(crate) pool: PoolSettings,
}

/// What identifies an endpoint besides its address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EndpointTemplate {
    pub(crate) port: Arc<PortIdentity>,
    pub(crate) weight: u32,
    pub(crate) priority: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EndpointKey {
    template: EndpointTemplate,
    addr: SocketAddr,
}

/// Identity of an endpoint group (one Backend port): the same key on a reload is the same
/// group, with its circuit-breaker counts, balancer state (round-robin position, weighted
/// schedules, hash tables) and pickable list. A DNS group's addresses come from its refresher,
/// a static group's from the config: a reload that changes them publishes them into the group
/// it finds here once the new config is accepted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) port: Arc<PortIdentity>,
    pub(crate) source: GroupSource,
    /// The balancer, outlier detection, active health checks and circuit-breaker limits: the
    /// group keeps this very object, shared by the groups of every Backend with the same
    /// settings (compared by value: a reload's equal settings find the group again).
    pub(crate) settings: Arc<GroupSettings>,
}

/// Where a group's addresses come from, as far as its identity goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum GroupSource {
    Dns {
        hostname: String,
        refresh: Duration,
        respect_ttl: bool,
        family: LookupFamily,
        /// Which answers the name may use: a change starts a new refresher.
        answers: AnswerPolicy,
    },
    /// `destination.ip`, with this many priority levels (each has a balancer of its own).
    Static { levels: usize },
}

/// Long-lived state shared by all snapshots.
pub struct StateRegistry {
    // Keyed by the config (not by clients), and hashed for every endpoint and group of every
    // reload: a fast hash (SipHash was a fifth of compiling 10,000 Backends). The keys are
    // boxed: a table has a quarter to a half of its slots empty. Their big parts (the port's
    // identity, the group settings) are shared with the values they key.
    endpoints: Mutex<WeakTable<EndpointKey, Endpoint>>,
    groups: Mutex<WeakTable<GroupKey, EndpointGroup>>,
    resolver: ArcSwap<DnsResolver>,
    nameservers: Mutex<Vec<SocketAddr>>,
    /// Lookups of names clients choose (`dns.maxLookupsPerSecond`): one bucket for the
    /// process, kept across reloads.
    lookups: Rate,
    /// Addresses of one DNS answer used at most (`dns.maxAddressesPerAnswer`).
    max_addresses: AtomicUsize,
    /// What the refreshers count (clones of the handles `/metrics` exports).
    dns_stats: DnsStats,
    /// Ticks the outlier detectors of every group, those made by a reload and those made on
    /// demand (a wildcard Backend's hosts).
    outlier_clock: crate::upstream::outlier_clock::OutlierClock,
}

impl std::fmt::Debug for StateRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateRegistry").finish_non_exhaustive()
    }
}

impl StateRegistry {
    pub fn new(resolver: DnsResolver) -> Self {
        let limits = DnsLimits::default();
        StateRegistry {
            endpoints: Mutex::default(),
            groups: Mutex::default(),
            resolver: ArcSwap::from_pointee(resolver),
            nameservers: Mutex::default(),
            lookups: Rate::new(limits.max_lookups_per_second),
            max_addresses: AtomicUsize::new(limits.max_addresses_per_answer),
            dns_stats: DnsStats::default(),
            outlier_clock: Default::default(),
        }
    }

    /// Counts into `stats` (the handles `/metrics` exports) instead of handles of its own.
    pub(crate) fn counting(mut self, stats: DnsStats) -> Self {
        self.dns_stats = stats;
        self
    }

    /// What the DNS refreshers count.
    pub(crate) fn dns_stats(&self) -> &DnsStats {
        &self.dns_stats
    }

    /// The lookup rate of names clients choose.
    pub(crate) fn lookups(&self) -> &Rate {
        &self.lookups
    }

    /// Addresses of one DNS answer used at most.
    pub(crate) fn max_addresses(&self) -> usize {
        self.max_addresses.load(Ordering::Relaxed)
    }

    /// Applies the config's DNS limits (a reload; idempotent).
    pub(crate) fn set_dns_limits(&self, limits: &DnsLimits) {
        self.lookups.set(limits.max_lookups_per_second);
        self.max_addresses
            .store(limits.max_addresses_per_answer, Ordering::Relaxed);
    }

    /// The one timer of every group's outlier detector.
    pub(crate) fn outlier_clock(&self) -> &crate::upstream::outlier_clock::OutlierClock {
        &self.outlier_clock
    }

    /// The endpoint for this identity: the existing one if any snapshot still holds it.
    pub(crate) fn endpoint(&self, template: &EndpointTemplate, addr: SocketAddr) -> Arc<Endpoint> {
        // One identity per address, however it was spelled (`::ffff:10.0.0.1` is 10.0.0.1).
        let addr = SocketAddr::new(
            crate::upstream::address::canonical_ip(addr.ip()),
            addr.port(),
        );
        let key = EndpointKey {
            template: template.clone(),
            addr,
        };
        get_or_insert(&self.endpoints, key, || {
            Endpoint::new(addr, template.weight, H1Pool::new(template.port.pool))
                .with_priority(template.priority)
        })
        .0
    }

    /// The group for this identity, and whether it was just created (and so needs its
    /// refresher and outlier ticks started once the snapshot that uses it is accepted).
    pub(crate) fn group(
        &self,
        key: GroupKey,
        make: impl FnOnce() -> EndpointGroup,
    ) -> (Arc<EndpointGroup>, bool) {
        get_or_insert(&self.groups, key, make)
    }

    /// The resolver refreshers use now.
    pub(crate) fn resolver(&self) -> Arc<DnsResolver> {
        self.resolver.load_full()
    }

    /// Switches to other name servers (empty: the system's). Idempotent.
    pub(crate) fn set_nameservers(
        &self,
        nameservers: &[SocketAddr],
    ) -> Result<(), crate::upstream::dns::DnsError> {
        let mut current = lock(&self.nameservers);
        if current.as_slice() != nameservers {
            self.resolver
                .store(Arc::new(DnsResolver::new(nameservers)?));
            *current = nameservers.to_vec();
        }
        Ok(())
    }

    /// Closes expired and surplus idle connections (`H1Pool::sweep`) and forgets dropped
    /// entries. Called every 5 s.
    pub fn sweep(&self) {
        let live: Vec<Arc<Endpoint>> = {
            let mut endpoints = lock(&self.endpoints);
            endpoints.prune();
            endpoints.map.values().filter_map(Weak::upgrade).collect()
        };
        for endpoint in live {
            endpoint.pool.sweep();
            if let Some(h2) = endpoint.h2_if_used() {
                h2.evict_expired();
            }
        }
        lock(&self.groups).prune();
    }

    /// Entries in the endpoint table, those of dropped endpoints not pruned yet included.
    #[cfg(test)]
    pub(crate) fn endpoint_entries(&self) -> usize {
        lock(&self.endpoints).map.len()
    }
}

/// Weak references by identity. An entry whose value was dropped stays until a prune: every
/// 5 s (`sweep`), and whenever the table has doubled since the last prune, so the entries of
/// hosts clients named and egressd forgot never outnumber the live ones by much, whatever the
/// rate at which clients name new ones (each dead entry keeps its key and the value's
/// allocation).
struct WeakTable<K, V> {
    map: HashMap<Box<K>, Weak<V>, FastHash>,
    live_after_prune: usize,
}

impl<K, V> Default for WeakTable<K, V> {
    fn default() -> Self {
        WeakTable {
            map: HashMap::default(),
            live_after_prune: 0,
        }
    }
}

impl<K: Hash + Eq, V> WeakTable<K, V> {
    /// Forgets the entries of dropped values.
    fn prune(&mut self) {
        self.map.retain(|_, weak| weak.strong_count() > 0);
        self.live_after_prune = self.map.len();
    }
}

/// Tables this small are not pruned between sweeps.
const PRUNE_FLOOR: usize = 64;

fn get_or_insert<K: Hash + Eq, V>(
    table: &Mutex<WeakTable<K, V>>,
    key: K,
    make: impl FnOnce() -> V,
) -> (Arc<V>, bool) {
    let mut table = lock(table);
    if let Some(existing) = table.map.get(&key).and_then(Weak::upgrade) {
        return (existing, false);
    }
    if table.map.len() >= 2 * table.live_after_prune.max(PRUNE_FLOOR) {
        table.prune();
    }
    let value = Arc::new(make());
    table.map.insert(Box::new(key), Arc::downgrade(&value));
    (value, true)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps stay consistent even if a panic happened while one was held (inserts and
    // removals are single operations), so poisoning is not a reason to fail.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(host: usize) -> EndpointTemplate {
        EndpointTemplate {
            port: Arc::new(PortIdentity {
                backend: ObjectId {
                    kind: "Backend".into(),
                    namespace: "default".into(),
                    name: format!("w h{host}.w.test").into(),
                },
                number: 80,
                transport: 0,
                pool: PoolSettings::default(),
            }),
            weight: 1,
            priority: 0,
        }
    }

    /// The endpoints of 10,000 hosts named one after the other, each dropped when the next
    /// comes (a flood of names a wildcard Backend forgets): their entries are pruned as they
    /// pile up, not only every 5 s.
    #[tokio::test]
    async fn entries_of_dropped_endpoints_do_not_pile_up_between_sweeps() {
        let registry =
            StateRegistry::new(DnsResolver::new(&["127.0.0.1:53".parse().unwrap()]).unwrap());
        let kept: Vec<_> = (0..10)
            .map(|i| registry.endpoint(&template(i), "127.0.0.1:80".parse().unwrap()))
            .collect();
        for host in 10..10_000 {
            drop(registry.endpoint(&template(host), "127.0.0.1:80".parse().unwrap()));
            assert!(registry.endpoint_entries() <= 2 * PRUNE_FLOOR, "{host}");
        }
        assert!(kept.iter().all(|e| Arc::strong_count(e) == 1));
    }
}
