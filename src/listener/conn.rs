//! Accepting and serving downstream connections, and draining them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

use crate::http::proxy::{handle, ConnInfo};
use crate::runtime::shared::Shared;

/// Counts open downstream connections and tells them to finish up when draining.
#[derive(Debug)]
pub struct ConnTracker {
    open: AtomicUsize,
    closed: Notify,
    drain: watch::Sender<bool>,
}

impl Default for ConnTracker {
    fn default() -> Self {
        ConnTracker {
            open: AtomicUsize::new(0),
            closed: Notify::new(),
            drain: watch::channel(false).0,
        }
    }
}

/// One open connection; dropping it updates the count.
pub struct ConnGuard(Arc<ConnTracker>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}

impl ConnTracker {
    fn enter(self: &Arc<Self>) -> ConnGuard {
        self.open.fetch_add(1, Ordering::AcqRel);
        ConnGuard(self.clone())
    }

    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Asks every connection to finish its in-flight requests and close.
    pub fn start_drain(&self) {
        self.drain.send_replace(true);
    }

    /// Waits until no connection is open, for at most `limit`. True if all closed.
    pub async fn wait_closed(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let closed = self.closed.notified();
                if self.open_connections() == 0 {
                    return;
                }
                closed.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

pub(super) struct AcceptCtx {
    pub key: Arc<str>,
    pub shared: Arc<Shared>,
    pub tracker: Arc<ConnTracker>,
    pub http: Arc<auto::Builder<TokioExecutor>>,
    pub stop: watch::Receiver<bool>,
}

pub(super) async fn accept_loop(listener: TcpListener, mut ctx: AcceptCtx) {
    loop {
        let accepted = tokio::select! {
            _ = async { let _ = ctx.stop.wait_for(|stop| *stop).await; } => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let guard = ctx.tracker.enter();
                let info = Arc::new(ConnInfo::new(ctx.key.clone(), peer));
                tokio::spawn(serve(
                    stream,
                    info,
                    ctx.shared.clone(),
                    ctx.http.clone(),
                    ctx.stop.clone(),
                    ctx.tracker.drain.subscribe(),
                    guard,
                ));
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning; the backlog holds
                // connections meanwhile.
                tracing::warn!(listener = %ctx.key, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // Dropping the listener here closes this worker's copy of the socket; once every worker
    // has dropped its copy, new connections are refused.
}

async fn serve(
    stream: TcpStream,
    info: Arc<ConnInfo>,
    shared: Arc<Shared>,
    http: Arc<auto::Builder<TokioExecutor>>,
    mut stop: watch::Receiver<bool>,
    mut drain: watch::Receiver<bool>,
    _guard: ConnGuard,
) {
    shared.metrics.downstream_connections.inc();
    let svc_shared = shared.clone();
    let service = service_fn(move |req| handle(svc_shared.clone(), info.clone(), req));
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = async { tokio::select! { _ = async { let _ = stop.wait_for(|s| *s).await; } => {}, _ = async { let _ = drain.wait_for(|d| *d).await; } => {} } } => {
            // Finish what is in flight, then close (HTTP/1.1: after the current response;
            // HTTP/2: GOAWAY).
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "downstream connection ended with error");
    }
    shared.metrics.downstream_connections.dec();
}
