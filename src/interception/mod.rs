//! HTTPS interception's certificates (`ProxyConfig.spec.tlsInterception`, issue #32): the
//! operator's CA ([`InterceptionCa`]), and the leaf certificates egressd presents to clients
//! that `CONNECT` to a declared Backend on port 443 ([`Interceptor`]), minted on demand and
//! cached per host. `egressd ca init` ([`init`]) makes a CA for it.
//!
//! Nothing here touches the network or the config: the request path asks
//! [`Interceptor::server_config`] for the rustls config of the CONNECT target's host and
//! completes the client's handshake with it.

mod ca;
pub(crate) mod init;
mod leaf;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};
use rustls::ServerConfig;
use tokio::sync::{OnceCell, Semaphore};
// tokio's clock, which tests can advance (a leaf's refresh after two thirds of its validity).
use tokio::time::Instant;

pub(crate) use ca::{check_key_permissions, InterceptionCa};
use leaf::{Host, LeafKey};

/// Mints running at once, each on a thread of tokio's blocking pool: a flood of new hosts
/// waits for these rather than occupying the pool (file reads and other blocking work share
/// it). A mint is one ECDSA signature and a config, well under a millisecond.
const MAX_CONCURRENT_MINTS: usize = 4;

/// TLS sessions remembered for resumption, for all hosts together (rustls's default is 256
/// per server config, allocated up front: shared, 1024 hosts do not hold 1024 tables).
/// Sharing is safe because every config has the same client authentication (none) and rustls
/// resumes a session only for the SNI it was made for.
const SESSIONS: usize = 4096;

/// A leaf that cannot be made for a host.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum MintError {
    /// Neither a DNS name (lower-case, RFC 1123) nor an IP address.
    #[error("{0:?} is neither a DNS name nor an IP address")]
    InvalidHost(String),
    /// The CA's notAfter has passed: any leaf would be expired.
    #[error("the interception CA {subject} has expired")]
    CaExpired { subject: String },
    /// The leaf key could not be made or loaded.
    #[error("cannot make the leaf key: {0}")]
    Key(String),
    /// rcgen could not sign the leaf.
    #[error("cannot sign a leaf: {0}")]
    Sign(String),
    /// rustls refused the config.
    #[error("cannot build a TLS config for the leaf: {0}")]
    Config(String),
    /// The blocking task died (a panic) before it finished.
    #[error("minting a leaf stopped before it finished")]
    Aborted,
}

/// How leaves are made and how many are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeafSettings {
    /// How long a leaf is valid from when it is minted (never past the CA's notAfter; at least
    /// a minute). Default 24 hours.
    pub(crate) validity: Duration,
    /// Hosts whose leaves are kept; beyond it, the host used least recently is forgotten.
    /// Default 1024.
    pub(crate) max_entries: usize,
}

impl Default for LeafSettings {
    fn default() -> Self {
        LeafSettings {
            validity: Duration::from_secs(24 * 3600),
            max_entries: 1024,
        }
    }
}

/// Mints and caches leaf certificates for intercepted hosts.
///
/// One cached host costs about 1.6 KB, measured with a counting allocator over 1000 mints for
/// `host-NNNN.api.example.com` under a P-256 CA: 1.5 KB for the leaf's DER (441 bytes), the
/// chain with a copy of the CA's DER (401 bytes), the rustls `ServerConfig` with its
/// resolver and small `Arc`s, the host name and the map entry; plus the slot around it. The
/// leaf key, the crypto provider and the session store are shared by every host, so 1024
/// hosts (the default bound) hold about 1.6 MB. (rustls's default session store, 256 sessions
/// allocated up front per config, would alone cost 32 KB per host.)
pub(crate) struct Interceptor {
    ca: Arc<InterceptionCa>,
    settings: LeafSettings,
    key: Arc<LeafKey>,
    sessions: Arc<dyn StoresServerSessions>,
    cache: Mutex<Cache>,
    mints: Arc<Semaphore>,
    minted: AtomicU64,
    failed: AtomicU64,
}

/// Cached hosts, by [`Host::key`].
#[derive(Default)]
struct Cache {
    hosts: HashMap<String, Slot>,
    /// Counts lookups: a slot's `last_used` is the count when it was last looked up.
    clock: u64,
}

/// One host: its leaf (or the mint on its way, which every caller for the host awaits).
struct Slot {
    leaf: Arc<OnceCell<Result<Leaf, MintError>>>,
    last_used: u64,
}

#[derive(Clone)]
struct Leaf {
    config: Arc<ServerConfig>,
    /// When a third of its validity is left: from then on, the next caller mints again.
    refresh_at: Instant,
}

impl Slot {
    /// A leaf past its refresh time, or a failed mint, is made again; a mint under way is
    /// awaited.
    fn is_stale(&self, now: Instant) -> bool {
        match self.leaf.get() {
            Some(Ok(leaf)) => now >= leaf.refresh_at,
            Some(Err(_)) => true,
            None => false,
        }
    }
}

impl std::fmt::Debug for Interceptor {
    // Never the keys: what it signs with and how much it holds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor")
            .field("ca", &self.ca.subject())
            .field("settings", &self.settings)
            .field("cached_hosts", &self.cached_hosts())
            .finish_non_exhaustive()
    }
}

impl Interceptor {
    /// An interceptor signing with `ca`. Its leaf key (ECDSA P-256) is made here.
    pub(crate) fn new(ca: Arc<InterceptionCa>, settings: LeafSettings) -> Result<Self, MintError> {
        let settings = LeafSettings {
            validity: settings.validity.max(Duration::from_secs(60)),
            max_entries: settings.max_entries.max(1),
        };
        Ok(Interceptor {
            ca,
            settings,
            key: Arc::new(LeafKey::generate()?),
            sessions: ServerSessionMemoryCache::new(SESSIONS),
            cache: Mutex::new(Cache::default()),
            mints: Arc::new(Semaphore::new(MAX_CONCURRENT_MINTS)),
            minted: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// The rustls server config presenting a leaf for `host` — a canonical lower-case DNS
    /// name, or an IP literal (IPv6 with or without brackets) — signed by the CA and sent with
    /// its chain, offering ALPN `h2` and `http/1.1`, TLS 1.2 and 1.3.
    ///
    /// Cached per host, and reused while more than a third of its validity is left; then
    /// minted again. Minting runs on tokio's blocking pool, at most
    /// [`MAX_CONCURRENT_MINTS`] at once; concurrent callers for one host await the same mint.
    /// A failed mint is not kept: the next caller tries again.
    pub(crate) async fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, MintError> {
        let host = Host::parse(host)?;
        let key = host.key();
        let cell = self.slot(&key);
        let result = cell
            .get_or_init(|| self.mint(host))
            .await
            .clone()
            .map(|leaf| leaf.config);
        if result.is_err() {
            // Forget the failure (unless the slot was replaced meanwhile): the next caller
            // tries again; those that awaited this mint share its error.
            let mut cache = self.lock();
            if cache
                .hosts
                .get(&key)
                .is_some_and(|slot| Arc::ptr_eq(&slot.leaf, &cell))
            {
                cache.hosts.remove(&key);
            }
        }
        result
    }

    /// The host's slot, made (or made anew, if stale) when needed; the least recently used
    /// host is evicted when a new one arrives at a full cache.
    fn slot(&self, key: &str) -> Arc<OnceCell<Result<Leaf, MintError>>> {
        let now = Instant::now();
        let mut cache = self.lock();
        cache.clock += 1;
        let clock = cache.clock;
        if let Some(slot) = cache.hosts.get_mut(key) {
            if !slot.is_stale(now) {
                slot.last_used = clock;
                return slot.leaf.clone();
            }
        }
        let leaf = Arc::new(OnceCell::new());
        let slot = Slot {
            leaf: leaf.clone(),
            last_used: clock,
        };
        let max = self.settings.max_entries;
        crate::bounded::insert_bounded(&mut cache.hosts, max, key.to_owned(), slot, |s| {
            s.last_used
        });
        leaf
    }

    /// Mints a leaf on the blocking pool, once a mint permit is free.
    async fn mint(&self, host: Host) -> Result<Leaf, MintError> {
        let permit = self
            .mints
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| MintError::Aborted)?;
        let (ca, key, sessions) = (self.ca.clone(), self.key.clone(), self.sessions.clone());
        let validity = self.settings.validity;
        // The permit moves into the task: it is held until the mint ends, even if every
        // caller stopped waiting.
        let minted = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            leaf::mint(&ca, &key, &host, validity, &sessions)
        })
        .await
        .unwrap_or(Err(MintError::Aborted));
        match minted {
            Ok(minted) => {
                self.minted.fetch_add(1, Ordering::Relaxed);
                Ok(Leaf {
                    config: minted.config,
                    refresh_at: Instant::now() + minted.lifetime * 2 / 3,
                })
            }
            Err(e) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Hosts cached now (mints under way included).
    pub(crate) fn cached_hosts(&self) -> usize {
        self.lock().hosts.len()
    }

    /// Leaves minted since this interceptor was made.
    pub(crate) fn minted_total(&self) -> u64 {
        self.minted.load(Ordering::Relaxed)
    }

    /// Mints that failed since this interceptor was made.
    pub(crate) fn mint_failures_total(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// The CA leaves are signed with.
    /// How its leaves are made and kept.
    pub(crate) fn settings(&self) -> &LeafSettings {
        &self.settings
    }

    pub(crate) fn ca(&self) -> &InterceptionCa {
        &self.ca
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        // The lock guards no invariant a panic could break halfway.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}
