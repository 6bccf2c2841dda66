//! Accepting and serving downstream connections (terminating TLS on HTTPS listeners), and
//! draining them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_rustls::TlsAcceptor;

use crate::http::proxy::{handle, ConnInfo};
use crate::runtime::shared::Shared;
use crate::runtime::snapshot::AcceptMode;

use super::Accept;

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

impl ConnGuard {
    fn tracker(&self) -> Arc<ConnTracker> {
        self.0.clone()
    }
}

impl ConnTracker {
    /// Registers an open connection (or tunnel) until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> ConnGuard {
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
    pub stop: watch::Receiver<bool>,
    /// How the listener handles connections now, see `Running::accept`.
    pub accept: Arc<ArcSwap<Accept>>,
}

/// How long a client may take to complete the TLS handshake on an HTTPS listener. Bounds what
/// a client that connects and says nothing (or trickles its ClientHello) costs.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
                let conn = Accepted {
                    stream,
                    peer,
                    listener: ctx.key.clone(),
                    accept: ctx.accept.load_full(),
                };
                tokio::spawn(serve(
                    conn,
                    ctx.shared.clone(),
                    ctx.stop.clone(),
                    ctx.tracker.drain.subscribe(),
                    guard,
                ));
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: back off instead of spinning; the backlog holds
                // connections meanwhile.
                crate::telemetry::log_limit::limited!(warn, listener = %ctx.key, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // Dropping the listener here closes this worker's copy of the socket; once every worker
    // has dropped its copy, new connections are refused.
}

/// A connection just accepted, with the listener's mode and HTTP server at that moment.
struct Accepted {
    stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<str>,
    accept: Arc<Accept>,
}

async fn serve(
    conn: Accepted,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    mut drain: watch::Receiver<bool>,
    guard: ConnGuard,
) {
    shared.metrics.downstream_connections.inc();
    let mut info = ConnInfo::new(conn.listener, conn.peer);
    info.tracker = Some(guard.tracker());
    info.stats = Some(Arc::new(shared.metrics.listener_stats(&info.listener)));
    let http = &conn.accept.http;
    match &conn.accept.mode {
        AcceptMode::Http => serve_http(conn.stream, info, &shared, http, stop, drain).await,
        AcceptMode::TlsPassthrough => {
            tokio::select! {
                _ = super::passthrough::serve(conn.stream, &info, &shared) => {}
                // A tunnel that is still being set up is closed when the proxy drains;
                // established tunnels are not cut by a reload (they do not watch `stop`).
                _ = async { let _ = drain.wait_for(|d| *d).await; } => {}
            }
        }
        AcceptMode::Https(config) => {
            let handshake = tokio::time::timeout(
                HANDSHAKE_TIMEOUT,
                TlsAcceptor::from(config.clone()).accept(conn.stream),
            );
            let outcome = tokio::select! {
                outcome = handshake => Some(outcome),
                // Stopping or draining: a client still in its handshake has sent no request
                // yet, so it is simply closed rather than waited for.
                _ = closing(&mut stop, &mut drain) => None,
            };
            match outcome {
                Some(Ok(Ok(stream))) => {
                    let info = ConnInfo { tls: true, ..info };
                    serve_http(stream, info, &shared, http, stop, drain).await;
                }
                Some(Ok(Err(e))) => handshake_failed(&shared, &info, &e.to_string()),
                Some(Err(_)) => handshake_failed(
                    &shared,
                    &info,
                    &format!("no handshake within {}s", HANDSHAKE_TIMEOUT.as_secs()),
                ),
                None => {}
            }
        }
    }
    shared.metrics.downstream_connections.dec();
}

/// Resolves when the listener stops or the proxy drains.
async fn closing(stop: &mut watch::Receiver<bool>, drain: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = stop.wait_for(|s| *s) => {}
        _ = drain.wait_for(|d| *d) => {}
    }
}

/// Counts and logs a failed handshake. Logged at debug level: the cause is the client (an
/// untrusted certificate, a plaintext request, a scanner), one line per connection would let
/// any client flood the log, and the counter is what alerts.
fn handshake_failed(shared: &Shared, info: &ConnInfo, error: &str) {
    shared.metrics.downstream_tls_handshake_failures.inc();
    tracing::debug!(
        listener = %info.listener,
        client = %info.client,
        error,
        "downstream TLS handshake failed"
    );
}

/// Serves HTTP/1.1 or HTTP/2 (told apart by the client's first bytes) on `io` until the client
/// closes, or the listener stops or the proxy drains.
async fn serve_http<S>(
    io: S,
    info: ConnInfo,
    shared: &Arc<Shared>,
    http: &auto::Builder<TokioExecutor>,
    mut stop: watch::Receiver<bool>,
    mut drain: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let info = Arc::new(info);
    let svc_shared = shared.clone();
    let service = service_fn(move |req| handle(svc_shared.clone(), info.clone(), req));
    let conn = http.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = closing(&mut stop, &mut drain) => {
            // Finish what is in flight, then close (HTTP/1.1: after the current response;
            // HTTP/2: GOAWAY).
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "downstream connection ended with error");
    }
}
