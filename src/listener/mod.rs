//! Listeners: binding, accept loops on the worker runtimes, connection limits and timeouts,
//! and connection draining.
//!
//! Each worker is a current-thread runtime on its own thread (measured faster than a
//! multi-thread runtime for this workload, see docs/design.md). A listening socket is shared by all
//! workers (one `dup` per worker); each worker accepts on its own copy and serves the
//! connections it accepted.

pub(crate) mod cap;
mod conn;
pub(crate) mod detect;
mod gate;
mod head_fixes;
mod http;
mod passthrough;
pub mod sni;
pub(crate) mod tls;
mod tracker;
pub(crate) mod watchdog;

pub(crate) use conn::{count_parse_error, drive, refused, OnExpiry, Timers};
pub(crate) use http::http1_server;
pub(crate) use tracker::ConnTracker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::snapshot::shared::Shared;
use crate::snapshot::{AcceptMode, DownstreamSettings, Http2ServerSettings, ListenerPlan};

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} (listener {key}): {source}")]
pub(crate) struct BindError {
    pub(crate) key: Arc<str>,
    pub(crate) addr: SocketAddr,
    #[source]
    pub(crate) source: std::io::Error,
}

struct Running {
    requested: SocketAddr,
    bound: SocketAddr,
    stop: watch::Sender<bool>,
    /// How new connections are handled (plaintext HTTP, TLS termination with a config, TLS
    /// passthrough, and the HTTP servers with the connection limits and timeouts), shared
    /// with the accept loops. A reload that changes only the certificates (rotation),
    /// HTTP ↔ HTTPS, the HTTP/2 settings or the downstream limits keeps the socket and swaps this in [`ListenerManager::activate`], right after the new
    /// snapshot is published: connections accepted from then on use the new values, open ones
    /// keep the session and settings they have. Held here rather than looked up in the
    /// snapshot at each accept, because a removed listener is still accepting for a moment
    /// after the snapshot without it is published, and an accept needs no search through the
    /// listeners. Mode and server are one value so an accept never sees half a reload.
    accept: Arc<ArcSwap<Accept>>,
}

/// What an accept loop hands each new connection.
#[derive(Debug)]
struct Accept {
    mode: AcceptMode,
    http: Arc<http::HttpServer>,
}

/// Sockets bound for a config that is not serving yet.
pub(crate) struct Bound {
    new: Vec<(ListenerPlan, std::net::TcpListener, SocketAddr)>,
}

/// Owns the listeners and reconciles them with each new config.
pub(crate) struct ListenerManager {
    workers: Vec<Handle>,
    running: HashMap<Arc<str>, Running>,
    shared: Arc<Shared>,
    tracker: Arc<ConnTracker>,
    /// The HTTP servers for new connections, and the HTTP/2 settings they were built from
    /// (rebuilt only when a reload changes them or the downstream settings).
    http: Arc<http::HttpServer>,
    http2: Http2ServerSettings,
}

impl ListenerManager {
    pub(crate) fn new(
        workers: Vec<Handle>,
        shared: Arc<Shared>,
        tracker: Arc<ConnTracker>,
    ) -> Self {
        let http2 = Http2ServerSettings::default();
        let cuts = shared.metrics.downstream_send_timeouts.clone();
        ListenerManager {
            workers,
            running: HashMap::new(),
            shared,
            tracker,
            http: Arc::new(http::server(&http2, &DownstreamSettings::default(), cuts)),
            http2,
        }
    }

    /// Binds the listeners of `plans` that are not running yet (or whose address changed).
    /// Nothing accepts on them until [`ListenerManager::activate`]; on error nothing changes.
    pub(crate) fn bind(&self, plans: &[ListenerPlan]) -> Result<Bound, BindError> {
        let mut new = Vec::new();
        for plan in plans {
            if self
                .running
                .get(&plan.key)
                .is_some_and(|r| r.requested == plan.addr)
            {
                continue;
            }
            let listener = bind_socket(plan.addr).map_err(|source| BindError {
                key: plan.key.clone(),
                addr: plan.addr,
                source,
            })?;
            let local = listener.local_addr().map_err(|source| BindError {
                key: plan.key.clone(),
                addr: plan.addr,
                source,
            })?;
            new.push((plan.clone(), listener, local));
        }
        Ok(Bound { new })
    }

    /// Starts accepting on newly bound listeners and stops those the config no longer has;
    /// connections accepted from now on get `http2` and the snapshot's downstream settings
    /// (limits, timeouts). Called right after the new snapshot is published, so new
    /// listeners route with it.
    pub(crate) fn activate(
        &mut self,
        bound: Bound,
        plans: &[ListenerPlan],
        http2: &Http2ServerSettings,
    ) {
        let downstream = self.shared.snapshot.load().settings.downstream;
        if *http2 != self.http2 || downstream != self.http.settings {
            let cuts = self.shared.metrics.downstream_send_timeouts.clone();
            self.http = Arc::new(http::server(http2, &downstream, cuts));
            self.http2 = *http2;
        }
        for (plan, listener, local) in bound.new {
            if let Some(old) = self.running.remove(&plan.key) {
                let _ = old.stop.send(true);
            }
            let (stop, _) = watch::channel(false);
            let accept = Arc::new(ArcSwap::from_pointee(self.accept(&plan)));
            for worker in &self.workers {
                let copy = match listener.try_clone() {
                    Ok(copy) => copy,
                    Err(e) => {
                        tracing::error!(listener = %plan.key, error = %e, "cannot share listening socket with a worker");
                        continue;
                    }
                };
                let ctx = conn::AcceptCtx {
                    key: plan.key.clone(),
                    shared: self.shared.clone(),
                    tracker: self.tracker.clone(),
                    stop: stop.subscribe(),
                    accept: accept.clone(),
                };
                worker.spawn(async move {
                    match TcpListener::from_std(copy) {
                        Ok(listener) => conn::accept_loop(listener, ctx).await,
                        Err(e) => tracing::error!(error = %e, "cannot register listening socket"),
                    }
                });
            }
            tracing::info!(listener = %plan.key, address = %local, mode = ?mode_name(&plan.mode), "listener bound");
            self.running.insert(
                plan.key.clone(),
                Running {
                    requested: plan.addr,
                    bound: local,
                    stop,
                    accept,
                },
            );
        }
        // Listeners kept across the reload take the new TLS and HTTP settings (a no-op for
        // new ones).
        for plan in plans {
            if let Some(running) = self.running.get(&plan.key) {
                running.accept.store(Arc::new(self.accept(plan)));
            }
        }
        let keep: Vec<&Arc<str>> = plans.iter().map(|p| &p.key).collect();
        self.running.retain(|key, running| {
            let kept = keep.contains(&key);
            if !kept {
                tracing::info!(listener = %key, "listener removed");
                let _ = running.stop.send(true);
            }
            kept
        });
        self.publish_bound();
    }

    /// Stops accepting everywhere (SIGTERM); open connections are drained separately.
    pub(crate) fn stop_all(&mut self) {
        for (_, running) in self.running.drain() {
            let _ = running.stop.send(true);
        }
        self.publish_bound();
    }

    fn accept(&self, plan: &ListenerPlan) -> Accept {
        Accept {
            mode: plan.mode.clone(),
            http: self.http.clone(),
        }
    }

    fn publish_bound(&self) {
        let mut bound: Vec<(Arc<str>, SocketAddr)> = self
            .running
            .iter()
            .map(|(k, r)| (k.clone(), r.bound))
            .collect();
        bound.sort();
        *self.shared.bound.lock().unwrap_or_else(|p| p.into_inner()) = bound;
    }
}

fn mode_name(mode: &AcceptMode) -> &'static str {
    match mode {
        AcceptMode::Http => "http",
        AcceptMode::Https(_) => "https",
        AcceptMode::TlsPassthrough => "tls-passthrough",
    }
}

/// A listening socket with the options a proxy wants.
fn bind_socket(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Lets a restarted egressd bind while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}
