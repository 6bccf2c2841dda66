//! Counting open connections for the drain on SIGTERM, and keeping a connection from looking
//! idle while a tunnel or websocket it carries is open.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::cap::ConnectionCap;
use super::watchdog::{Activity, InFlight};

/// Counts open downstream connections (and the CONNECT tunnels and websockets that outlive
/// their HTTP exchange) and tells them to finish up when draining.
///
/// The process has one. Each connection hands its requests a view of it
/// ([`ConnTracker::for_connection`]): what registers there is counted by the process for the
/// drain, and also keeps that connection busy for its watchdog, so that an HTTP/2 connection
/// whose only streams are tunnels or websockets is not idle.
#[derive(Debug)]
pub(crate) struct ConnTracker {
    scope: Scope,
}

#[derive(Debug)]
enum Scope {
    Process(Process),
    Connection {
        /// Always a [`Scope::Process`] tracker.
        process: Arc<ConnTracker>,
        activity: Arc<Activity>,
    },
}

#[derive(Debug)]
struct Process {
    open: AtomicUsize,
    closed: Notify,
    drain: watch::Sender<bool>,
    /// Client sockets open, against `downstream.maxConnections` (unlike `open`, a CONNECT
    /// tunnel over HTTP/2 is not counted apart from its connection).
    sockets: Arc<ConnectionCap>,
}

impl Default for ConnTracker {
    fn default() -> Self {
        ConnTracker {
            scope: Scope::Process(Process {
                open: AtomicUsize::new(0),
                closed: Notify::new(),
                drain: watch::channel(false).0,
                sockets: Arc::default(),
            }),
        }
    }
}

/// One open connection, tunnel or websocket; dropping it updates the count.
#[derive(Debug)]
pub(crate) struct ConnGuard {
    /// The process's tracker.
    process: Arc<ConnTracker>,
    /// For a tunnel or websocket: its connection is busy meanwhile.
    _busy: Option<InFlight>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let process = self.process.process();
        if process.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            process.closed.notify_waiters();
        }
    }
}

impl ConnGuard {
    /// The process's tracker.
    pub(super) fn tracker(&self) -> &Arc<ConnTracker> {
        &self.process
    }
}

impl ConnTracker {
    /// A view of the process's tracker for one connection, whose watchdog reads `activity`.
    pub(super) fn for_connection(self: &Arc<Self>, activity: Arc<Activity>) -> Arc<ConnTracker> {
        Arc::new(ConnTracker {
            scope: Scope::Connection {
                process: self.process_tracker().clone(),
                activity,
            },
        })
    }

    /// Registers an open connection (or tunnel, or websocket) until the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> ConnGuard {
        match &self.scope {
            Scope::Process(process) => {
                process.open.fetch_add(1, Ordering::AcqRel);
                ConnGuard {
                    process: self.clone(),
                    _busy: None,
                }
            }
            Scope::Connection { process, activity } => {
                let mut guard = process.enter();
                guard._busy = Some(activity.begin());
                guard
            }
        }
    }

    pub(crate) fn open_connections(&self) -> usize {
        self.process().open.load(Ordering::Acquire)
    }

    /// Asks every connection to finish its in-flight requests and close.
    pub(crate) fn start_drain(&self) {
        self.process().drain.send_replace(true);
    }

    /// Waits until no connection is open, for at most `limit`. True if all closed.
    pub(crate) async fn wait_closed(&self, limit: Duration) -> bool {
        let process = self.process();
        let wait = async {
            loop {
                let closed = process.closed.notified();
                if process.open.load(Ordering::Acquire) == 0 {
                    return;
                }
                closed.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    /// Resolves to true once the proxy drains.
    pub(super) fn drain_signal(&self) -> watch::Receiver<bool> {
        self.process().drain.subscribe()
    }

    /// The cap on client sockets.
    pub(super) fn sockets(&self) -> &Arc<ConnectionCap> {
        &self.process().sockets
    }

    fn process_tracker(self: &Arc<Self>) -> &Arc<ConnTracker> {
        match &self.scope {
            Scope::Process(_) => self,
            Scope::Connection { process, .. } => process,
        }
    }

    fn process(&self) -> &Process {
        match &self.scope {
            Scope::Process(process) => process,
            Scope::Connection { process, .. } => process.process(),
        }
    }
}

impl crate::http::pipeline::Outliving for ConnTracker {
    fn hold(self: Arc<Self>) -> crate::http::pipeline::Held {
        Box::new(self.enter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tunnel_counts_for_the_drain_and_keeps_its_connection_busy() {
        let process = Arc::new(ConnTracker::default());
        let connection = process.enter();
        let activity = Activity::new(tokio::time::Instant::now());
        let view = connection.tracker().for_connection(activity.clone());
        let tunnel = view.enter();
        assert_eq!(process.open_connections(), 2);
        assert!(activity.is_busy());
        drop(connection);
        assert!(!process.wait_closed(Duration::from_millis(10)).await);
        drop(tunnel);
        assert!(!activity.is_busy());
        assert!(process.wait_closed(Duration::from_millis(10)).await);
    }
}
