//! Starting and stopping a whole proxy: worker runtimes, the first config load, the reload
//! triggers (file changes, SIGHUP) and the drain on SIGTERM. Tests start proxies in-process
//! through [`Proxy::start`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::listener::{ConnTracker, ListenerManager};
use crate::runtime::reload::{ReloadError, Reloader};
use crate::runtime::watch::{ConfigWatcher, WatchOptions};
use crate::snapshot::shared::Shared;
use crate::upstream::dns::DnsResolver;
use crate::upstream::registry::StateRegistry;

/// How to run a proxy.
#[derive(Clone, Debug)]
pub struct Options {
    /// Config directories (or files).
    pub config: Vec<PathBuf>,
    /// Worker threads serving traffic (one current-thread runtime each).
    pub workers: usize,
    /// Overrides `ProxyConfig.spec.admin.address`.
    pub admin_address: Option<SocketAddr>,
    /// File watching; `None` disables it (SIGHUP and [`Proxy::reload`] still work).
    pub watch: Option<WatchOptions>,
}

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start worker threads: {0}")]
    Workers(std::io::Error),
    #[error("cannot set up DNS: {0}")]
    Dns(#[from] crate::upstream::dns::DnsError),
    #[error("cannot bind the admin listener: {0}")]
    Admin(std::io::Error),
    #[error("cannot watch the config: {0}")]
    Watch(#[from] crate::runtime::watch::WatchError),
}

/// A running proxy. Must be created and driven inside a tokio runtime (the control runtime:
/// reloads, DNS, admin); traffic is served on its own worker threads.
pub struct Proxy {
    shared: Arc<Shared>,
    reloader: Arc<Reloader>,
    tracker: Arc<ConnTracker>,
    workers: Workers,
    _watcher: Option<Arc<ConfigWatcher>>,
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// Starts workers, loads the config and starts serving it. An invalid first config does
    /// not stop the start: the admin server comes up (on the default or overridden address)
    /// and reports the errors, `/ready` stays 503, and the next good config serves.
    pub async fn start(options: Options) -> Result<Proxy, StartError> {
        let shared = Shared::new();
        let workers = Workers::start(options.workers.max(1)).map_err(StartError::Workers)?;
        let registry = Arc::new(
            StateRegistry::new(DnsResolver::new(&[])?).counting(shared.metrics.dns.clone()),
        );
        let tracker = Arc::new(ConnTracker::default());
        let listeners = ListenerManager::new(workers.handles(), shared.clone(), tracker.clone());
        let reloader = Arc::new(Reloader::new(
            options.config.clone(),
            shared.clone(),
            registry.clone(),
            listeners,
            options.admin_address,
        ));
        // The watcher starts first, so a change made while the first config loads is seen.
        let mut background = Vec::new();
        let watcher = match options.watch {
            None => None,
            Some(opts) => {
                let (watcher, mut changes) = ConfigWatcher::start(options.config.clone(), opts)?;
                let watcher = Arc::new(watcher);
                reloader.set_watcher(watcher.clone()).await;
                let reloader = reloader.clone();
                background.push(tokio::spawn(async move {
                    while let Some(cause) = changes.recv().await {
                        let cause = cause.to_string();
                        let _ = reloader.reload(&cause, false).await;
                    }
                }));
                Some(watcher)
            }
        };
        if let Err(e) = reloader.reload("start", true).await {
            tracing::error!("initial config not loaded: {e}");
            reloader.ensure_admin().await.map_err(StartError::Admin)?;
        }

        // Idle pooled connections are closed when they expire, not only when next used.
        let sweeper = registry.clone();
        background.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                sweeper.sweep();
            }
        }));
        Ok(Proxy {
            shared,
            reloader,
            tracker,
            workers,
            _watcher: watcher,
            background,
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The bound address of listener `namespace/gateway/listener`.
    pub fn listener_addr(&self, key: &str) -> Option<SocketAddr> {
        let bound = self.shared.bound.lock().unwrap_or_else(|p| p.into_inner());
        bound
            .iter()
            .find(|(k, _)| k.as_ref() == key)
            .map(|(_, a)| *a)
    }

    /// The admin server's address.
    pub async fn admin_addr(&self) -> Option<SocketAddr> {
        self.reloader.admin_addr().await
    }

    /// Reloads now, as SIGHUP does.
    pub async fn reload(&self) -> Result<u64, ReloadError> {
        self.reloader.reload("manual", true).await
    }

    /// Drains: `/ready` fails, listeners close (new connections are refused), in-flight
    /// requests get up to the configured drain timeout, then the workers stop. Returns true if
    /// every connection finished in time.
    pub async fn shutdown(self) -> bool {
        self.shared.start_draining();
        let timeout = self.shared.snapshot.load().settings.drain_timeout;
        self.reloader.stop_listeners().await;
        self.tracker.start_drain();
        let clean = self.tracker.wait_closed(timeout).await;
        if !clean {
            tracing::warn!(
                open = self.tracker.open_connections(),
                "drain timeout reached; closing remaining connections"
            );
        }
        self.reloader.flush_tracing().await;
        for task in &self.background {
            task.abort();
        }
        self.workers.stop();
        clean
    }
}

/// The worker threads, each running a current-thread runtime.
struct Workers {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    fn start(n: usize) -> std::io::Result<Workers> {
        let mut handles = Vec::new();
        let mut stops = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("egressd-worker-{i}"))
                    .spawn(move || {
                        runtime.block_on(async {
                            let _ = stopped.await;
                        });
                        // Dropping the runtime cancels whatever is left (after the drain).
                        runtime.shutdown_timeout(Duration::from_millis(100));
                    })?,
            );
        }
        Ok(Workers {
            handles,
            stops,
            threads,
        })
    }

    fn handles(&self) -> Vec<Handle> {
        self.handles.clone()
    }

    fn stop(self) {
        for stop in self.stops {
            let _ = stop.send(());
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}
