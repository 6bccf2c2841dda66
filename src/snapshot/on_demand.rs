//! Targets made on first use for hosts clients name (undeclared destinations, the concrete
//! hosts of wildcard Backends), bounded: at most `max` at once (the least recently used makes
//! room) and one nobody asked for during `idle` is forgotten. Each entry has one task, for
//! its DNS refresher and (a wildcard host with active checks) its health checker; the task
//! stops the moment the entry leaves the table, however it leaves (made room for, idle, or
//! the table dropped), so what a forgotten name held goes with it, not when its refresher
//! would next have woken. A new name's first lookup must fit `dns.maxLookupsPerSecond`. A
//! reload starts new tables; endpoints still in use keep their pools through the state
//! registry.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::snapshot::Target;
use crate::telemetry::metrics::ActionLabel;
use crate::upstream::dns::{refresh_loop, RefreshPlan};
use crate::upstream::registry::StateRegistry;
use crate::upstream::EndpointGroup;

/// A new name would take a DNS lookup over the process's lookup rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("egressd is looking up new names at its limit (ProxyConfig dns.maxLookupsPerSecond); try again in a second")]
pub(crate) struct LookupsBusy;

/// Work that lives as long as its entry (a wildcard host's health checker).
pub(crate) type Companion = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What is made for a new key.
pub(crate) struct Made {
    pub(crate) target: Target,
    /// A hostname's DNS refresher, not started yet: only the target that makes it into the
    /// table gets one.
    pub(crate) refresh: Option<RefreshPlan>,
    pub(crate) companion: Option<Companion>,
}

/// One table of targets made on demand.
pub(crate) struct OnDemand<K> {
    /// What the table holds, for log lines (`undeclared destination`, `wildcard host`).
    what: &'static str,
    max: usize,
    idle: Duration,
    registry: Arc<StateRegistry>,
    targets: Mutex<HashMap<K, Used>>,
    /// The zero of the `last` stamps.
    epoch: Instant,
}

struct Used {
    target: Arc<Target>,
    /// When it was last asked for, in milliseconds since `epoch` (shared with the task that
    /// forgets it when idle).
    last: Arc<AtomicU64>,
    /// Dropped with the entry: its task stops.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl<K> Debug for OnDemand<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDemand")
            .field("what", &self.what)
            .field("max", &self.max)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone + Debug + Send + Sync + 'static> OnDemand<K> {
    pub(crate) fn new(
        what: &'static str,
        max: usize,
        idle: Duration,
        registry: Arc<StateRegistry>,
    ) -> Self {
        OnDemand {
            what,
            max,
            idle,
            registry,
            targets: Mutex::default(),
            epoch: Instant::now(),
        }
    }

    /// Targets kept now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Every key and target kept now (for the admin server: a copy, so the lock is held only
    /// while the `Arc`s are cloned).
    pub(crate) fn entries(&self) -> Vec<(K, Arc<Target>)> {
        self.lock()
            .iter()
            .map(|(k, used)| (k.clone(), used.target.clone()))
            .collect()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Used>> {
        // Inserts and removals are single operations: a panic elsewhere cannot leave the map
        // inconsistent, so poisoning is not a reason to fail.
        self.targets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The target of `key`, made by `make` on first use. Must run inside the runtime: a new
    /// target starts its task.
    pub(crate) fn get_or_make<E>(
        self: &Arc<Self>,
        key: K,
        make: impl FnOnce() -> Result<Made, E>,
    ) -> Result<Arc<Target>, E> {
        if let Some(used) = self.lock().get(&key) {
            used.last.store(self.now_ms(), Ordering::Relaxed);
            return Ok(used.target.clone());
        }
        // Made without the lock held: a first TLS destination may load the system's roots.
        let made = make()?;
        let built = Arc::new(made.target);
        let last = Arc::new(AtomicU64::new(self.now_ms()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        {
            let mut targets = self.lock();
            if let Some(used) = targets.get(&key) {
                // Another request made it meanwhile; ours is dropped.
                used.last.store(self.now_ms(), Ordering::Relaxed);
                return Ok(used.target.clone());
            }
            let used = Used {
                target: built.clone(),
                last: last.clone(),
                _stop: stop,
            };
            let full = targets.len() >= self.max;
            crate::bounded::insert_bounded(&mut targets, self.max, key.clone(), used, |u| {
                u.last.load(Ordering::Relaxed)
            });
            if full {
                tracing::debug!(
                    max = self.max,
                    "{}s at their limit: the least recently used was forgotten",
                    self.what
                );
            }
        }
        let forget = forget_when_idle(
            Arc::downgrade(self),
            key,
            Arc::downgrade(&built.port.endpoints),
            last,
        );
        let work = entry_work(made.refresh, made.companion, self.registry.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = work => {}
                () = forget => {}
                // The entry left the table (made room for, forgotten, the table dropped).
                _ = stopped => {}
            }
        });
        Ok(built)
    }
}

/// Takes the first lookup of a new name (for `make`, once the name is admitted): refused
/// over `dns.maxLookupsPerSecond`.
pub(crate) fn take_lookup(registry: &StateRegistry) -> Result<(), LookupsBusy> {
    if registry.lookups().try_take() {
        return Ok(());
    }
    let refused = ActionLabel { action: "refused" };
    registry
        .dns_stats()
        .rate_limited
        .get_or_create(&refused)
        .inc();
    Err(LookupsBusy)
}

/// An entry's refresher and companion, run together; then nothing, until the entry's task is
/// stopped.
async fn entry_work(
    refresh: Option<RefreshPlan>,
    companion: Option<Companion>,
    registry: Arc<StateRegistry>,
) {
    let refresher = async move {
        if let Some(plan) = refresh {
            refresh_loop(plan, registry).await;
        }
    };
    let companion = async move {
        if let Some(companion) = companion {
            companion.await;
        }
    };
    futures_util::future::join(refresher, companion).await;
    std::future::pending::<()>().await;
}

/// Waits until the target of `key` has not been asked for during the table's idle time, then
/// removes it (if the entry is still the one this task was started for). Holds nothing
/// strongly while it waits, so a reload's new table lets the old one go.
async fn forget_when_idle<K: Eq + Hash + Clone + Debug + Send + Sync + 'static>(
    table: Weak<OnDemand<K>>,
    key: K,
    group: Weak<EndpointGroup>,
    last: Arc<AtomicU64>,
) {
    loop {
        let wait = {
            let Some(table) = table.upgrade() else {
                return;
            };
            let idle_for = table.now_ms().saturating_sub(last.load(Ordering::Relaxed));
            let idle_for = Duration::from_millis(idle_for);
            if idle_for >= table.idle {
                let mut targets = table.lock();
                let same = targets.get(&key).is_some_and(|u| {
                    std::ptr::eq(Arc::as_ptr(&u.target.port.endpoints), group.as_ptr())
                });
                if same {
                    targets.remove(&key);
                    tracing::debug!(key = ?key, "{} idle: forgotten", table.what);
                }
                return;
            }
            table.idle - idle_for
        };
        tokio::time::sleep(wait).await;
    }
}
