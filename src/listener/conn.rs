//! Accepting and serving downstream connections (terminating TLS on HTTPS listeners), and
//! draining them.
//!
//! The life of a connection: accept (counted against `maxConnections`, or closed at once) →
//! TLS handshake (HTTPS) → protocol detection → HTTP/1.1 or HTTP/2 server, watched by the
//! connection's watchdog. Everything up to the first request head (the HTTP/2 preface, for
//! HTTP/2) must happen within `headerReadTimeout` of accept; after that, a connection with no
//! request in flight is closed after `idleTimeout`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::cap::{AcceptBackoff, Slot};
use super::detect::{sniff, Protocol, ServedIo};
use super::gate::Gated;
use super::http::HttpServer;
use super::tracker::{ConnGuard, ConnTracker};
use super::watchdog::{watchdog, Activity, Expiry, InFlight, Tracked};
use super::Accept;
use crate::http::body::ProxyBody;
use crate::http::pipeline::{handle, ConnInfo, NestedHttp, NestedStream};
use crate::http::sending::{self, BodyLimits, SendTimer, SendWatch};
use crate::policy::identity::TlsIdentity;
use crate::snapshot::shared::Shared;
use crate::snapshot::{AcceptMode, DownstreamSettings};
use crate::telemetry::log_limit::limited;
use crate::telemetry::metrics::{CodeLabel, ReasonLabel};

pub(super) struct AcceptCtx {
    pub(crate) key: Arc<str>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) tracker: Arc<ConnTracker>,
    pub(crate) stop: watch::Receiver<bool>,
    /// How the listener handles connections now, see `Running::accept`.
    pub(crate) accept: Arc<ArcSwap<Accept>>,
}

/// How long a client told to go away (HTTP/2 GOAWAY after `idleTimeout`) may take to let the
/// connection close before it is closed under it, unless a request started meanwhile.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

pub(super) async fn accept_loop(listener: TcpListener, mut ctx: AcceptCtx) {
    let mut backoff = AcceptBackoff::default();
    // One per listener and worker: each connection holds a reference, not a copy.
    let nested: Arc<dyn NestedHttp> = Arc::new(NestedServer {
        shared: ctx.shared.clone(),
        tracker: ctx.tracker.clone(),
        stop: ctx.stop.clone(),
        accept: ctx.accept.clone(),
    });
    loop {
        let accepted = tokio::select! {
            _ = async { let _ = ctx.stop.wait_for(|stop| *stop).await; } => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff.reset();
                let accepted_at = Instant::now();
                let accept = ctx.accept.load_full();
                let max = accept.http.settings.max_connections;
                let Some(slot) = ctx.tracker.sockets().try_take(max) else {
                    // Counted, then closed before anything is read: a client over the cap
                    // costs a descriptor for a moment, never a task or a buffer.
                    refused(&ctx.shared, "max_connections");
                    drop(stream);
                    limited!(warn, listener = %ctx.key, client = %peer, max_connections = max, "connection refused: downstream.maxConnections connections are open");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let guard = ctx.tracker.enter();
                let conn = Accepted {
                    stream,
                    peer,
                    nested: nested.clone(),
                    listener: ctx.key.clone(),
                    accept,
                    accepted_at,
                    slot,
                };
                tokio::spawn(serve(
                    conn,
                    ctx.shared.clone(),
                    ctx.stop.clone(),
                    ctx.tracker.drain_signal(),
                    guard,
                ));
            }
            Err(e) => {
                ctx.shared.metrics.downstream_accept_errors.inc();
                let pause = backoff.next();
                limited!(warn, listener = %ctx.key, error = %e, retry_in = ?pause, "accept failed");
                tokio::select! {
                    _ = async { let _ = ctx.stop.wait_for(|stop| *stop).await; } => break,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    // Dropping the listener here closes this worker's copy of the socket; once every worker
    // has dropped its copy, new connections are refused.
}

/// Counts a connection closed at accept (`egressd_downstream_connections_refused_total`).
pub(crate) fn refused(shared: &Shared, reason: &'static str) {
    shared
        .metrics
        .downstream_connections_refused
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

/// A connection just accepted, with the listener's mode and HTTP server at that moment.
struct Accepted {
    stream: TcpStream,
    peer: SocketAddr,
    nested: Arc<dyn NestedHttp>,
    listener: Arc<str>,
    accept: Arc<Accept>,
    accepted_at: Instant,
    slot: Slot,
}

async fn serve(
    conn: Accepted,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    mut drain: watch::Receiver<bool>,
    guard: ConnGuard,
) {
    shared.metrics.downstream_connections.inc();
    let activity = Activity::new(conn.accepted_at);
    let info = conn_info(&conn, &shared, &guard, &activity);
    let http = &conn.accept.http;
    // Everything up to the first request head happens by then.
    let head_deadline = http
        .settings
        .header_read_timeout
        .map(|t| conn.accepted_at + t);
    let served = Served {
        shared: &shared,
        http,
        activity,
        head_deadline,
    };
    match &conn.accept.mode {
        AcceptMode::Http => {
            served
                .http(conn.stream, info, Some(conn.slot), stop, drain)
                .await
        }
        // The rarer modes' futures are boxed: a spawned connection future is as large as its
        // largest state, and plain HTTP/1.1 connections (most of them) would each carry the
        // TLS session, the passthrough's read buffer and HTTP/2's connection state inline
        // (10.5 KiB per connection instead of 2.9).
        AcceptMode::TlsPassthrough => {
            tokio::select! {
                _ = Box::pin(super::passthrough::serve(conn.stream, &info, &shared, head_deadline)) => {}
                // A tunnel that is still being set up is closed when the proxy drains;
                // established tunnels are not cut by a reload (they do not watch `stop`).
                _ = async { let _ = drain.wait_for(|d| *d).await; } => {}
            }
            drop(conn.slot);
        }
        AcceptMode::Https(config) => {
            let handshake = Box::pin(within(
                head_deadline,
                TlsAcceptor::from(config.clone()).accept(conn.stream),
            ));
            let outcome = tokio::select! {
                outcome = handshake => Some(outcome),
                // Stopping or draining: a client still in its handshake has sent no request
                // yet, so it is simply closed rather than waited for.
                _ = closing(&mut stop, &mut drain) => None,
            };
            match outcome {
                Some(Some(Ok(stream))) => {
                    // Only listeners with `tls.frontendValidation` ask for (and verify) one.
                    let identity = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .and_then(|leaf| TlsIdentity::of_certificate(leaf))
                        .map(Arc::new);
                    let info = ConnInfo {
                        tls: true,
                        identity,
                        ..info
                    };
                    Box::pin(served.http(stream, info, Some(conn.slot), stop, drain)).await;
                }
                Some(Some(Err(e))) => handshake_failed(&shared, &info, &e.to_string()),
                Some(None) => {
                    timed_out(&shared, &info, Expiry::HeaderRead);
                    handshake_failed(&shared, &info, "no handshake within headerReadTimeout");
                }
                None => {}
            }
        }
    }
    shared.metrics.downstream_connections.dec();
}

/// What the pipeline knows of an accepted connection.
fn conn_info(
    conn: &Accepted,
    shared: &Shared,
    guard: &ConnGuard,
    activity: &Arc<Activity>,
) -> ConnInfo {
    let mut info = ConnInfo::new(conn.listener.clone(), conn.peer);
    info.nested = Some(conn.nested.clone());
    // Tunnels and websockets register with this view of the tracker: SIGTERM waits for them,
    // and while one is open its connection is not idle.
    info.tracker = Some(guard.tracker().for_connection(activity.clone()));
    info.stats = Some(Arc::new(shared.metrics.listener_stats(&info.listener)));
    info
}

/// `fut`, unless `deadline` passes first (`None`).
pub(crate) async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, fut).await.ok(),
        None => Some(fut.await),
    }
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

/// Counts (and logs at debug level, as for handshakes) a connection closed by a timer.
pub(crate) fn timed_out(shared: &Shared, info: &ConnInfo, expiry: Expiry) {
    count_timeout(shared, expiry);
    tracing::debug!(listener = %info.listener, client = %info.client, reason = expiry.as_str(), "downstream connection closed");
}

fn count_timeout(shared: &Shared, expiry: Expiry) {
    shared
        .metrics
        .downstream_connection_timeouts
        .get_or_create(&ReasonLabel {
            reason: expiry.as_str(),
        })
        .inc();
}

/// What serving one accepted connection needs besides the connection.
struct Served<'a> {
    shared: &'a Arc<Shared>,
    http: &'a HttpServer,
    /// What the connection's requests (and tunnels) are doing, for its watchdog.
    activity: Arc<Activity>,
    head_deadline: Option<Instant>,
}

impl Served<'_> {
    /// Serves HTTP/1.1 or HTTP/2 (told apart by the client's first bytes) on `io` until the
    /// client closes, a timeout closes it, or the listener stops or the proxy drains.
    async fn http<S>(
        &self,
        mut io: S,
        info: ConnInfo,
        slot: Option<Slot>,
        mut stop: watch::Receiver<bool>,
        mut drain: watch::Receiver<bool>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sniffed = tokio::select! {
            sniffed = within(self.head_deadline, sniff(&mut io)) => sniffed,
            _ = closing(&mut stop, &mut drain) => return,
        };
        let (protocol, prefix) = match sniffed {
            Some(Ok(Some(sniffed))) => sniffed,
            // Closed, or a read error, before the first bytes: nothing to answer.
            Some(Ok(None) | Err(_)) => return,
            None => return timed_out(self.shared, &info, Expiry::HeaderRead),
        };
        let io = ServedIo::new(io, prefix, slot);
        let activity = &self.activity;
        let info = Arc::new(info);
        let http2 = protocol == Protocol::Http2;
        let service = {
            let (shared, activity) = (self.shared.clone(), activity.clone());
            service_fn(move |req| {
                // Counted from here, synchronously: the watchdog must never see a request
                // whose head is complete as "no request yet".
                let in_flight = activity.begin();
                let (shared, info) = (shared.clone(), info.clone());
                // `handle` is called inside: a future made outside and moved in would be held
                // twice (12 KiB instead of 6 per request, and copied).
                async move {
                    let response = handle(shared, info, req).await?;
                    Ok::<_, Infallible>(response.map(|body| tracked(body, in_flight, http2)))
                }
            })
        };
        let settings = &self.http.settings;
        let result = match protocol {
            Protocol::Http1 => {
                let io = TokioIo::new(io.fixing_heads(activity.clone()));
                let conn = self.http.h1.serve_connection(io, service).with_upgrades();
                let timers = Timers::new(activity, self.head_deadline, settings);
                let (on_expiry, shared) = (OnExpiry::Close, self.shared);
                drive(
                    conn,
                    |c| c.graceful_shutdown(),
                    on_expiry,
                    timers,
                    &mut stop,
                    &mut drain,
                    shared,
                )
                .await
            }
            Protocol::Http2 => {
                // The preface is in: from now on the connection is idle until a stream opens.
                activity.idle_from_now();
                let conn = self.http.h2.serve_connection(TokioIo::new(io), service);
                let timers = Timers::new(activity, self.head_deadline, settings);
                let (on_expiry, shared) = (OnExpiry::GoAway, self.shared);
                Box::pin(drive(
                    conn,
                    |c| c.graceful_shutdown(),
                    on_expiry,
                    timers,
                    &mut stop,
                    &mut drain,
                    shared,
                ))
                .await
            }
        };
        if let Err(e) = result {
            count_parse_error(self.shared, &e);
            tracing::debug!(error = %e, "downstream connection ended with error");
        }
    }
}

/// Serves the connections inside a listener's intercepted CONNECT tunnels (on one worker), as
/// the listener serves its own: the same HTTP server, timeouts, drain and pipeline.
#[derive(Debug)]
struct NestedServer {
    shared: Arc<Shared>,
    tracker: Arc<ConnTracker>,
    stop: watch::Receiver<bool>,
    accept: Arc<ArcSwap<Accept>>,
}

impl NestedHttp for NestedServer {
    fn serve(
        self: Arc<Self>,
        io: Box<dyn NestedStream>,
        mut info: ConnInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let accept = self.accept.load_full();
            let http = &accept.http;
            let now = Instant::now();
            let activity = Activity::new(now);
            info.tracker = Some(self.tracker.for_connection(activity.clone()));
            let served = Served {
                shared: &self.shared,
                http,
                activity,
                head_deadline: http.settings.header_read_timeout.map(|t| now + t),
            };
            let (stop, drain) = (self.stop.clone(), self.tracker.drain_signal());
            served.http(io, info, None, stop, drain).await;
        })
    }
}

/// A response body as it goes to the client: in flight for the watchdog, watched for the send
/// timeout (on its HTTP/2 stream's watch, or its connection's) with its own limits.
fn tracked(body: ProxyBody, in_flight: InFlight, http2: bool) -> Tracked<ProxyBody> {
    let (deadline, idle) = body.limits();
    let limits = BodyLimits { deadline, idle };
    // Only HTTP/2 streams run in a task of their own, with a watch of their own.
    let stream = if http2 {
        sending::current_stream()
    } else {
        // The next write carries the response's head (`head_fixes`).
        in_flight.head_due();
        None
    };
    Tracked::new(body, in_flight, stream, limits)
}

/// The timeouts a connection's watchdog applies.
pub(crate) struct Timers<'a> {
    pub(crate) activity: &'a Activity,
    pub(crate) head_deadline: Option<Instant>,
    pub(crate) idle: Option<Duration>,
    /// `sendTimeout`, for the HTTP/1.1 response being sent (`sending`).
    pub(crate) send: Option<Duration>,
}

impl<'a> Timers<'a> {
    pub(crate) fn new(
        activity: &'a Activity,
        head_deadline: Option<Instant>,
        settings: &DownstreamSettings,
    ) -> Self {
        Timers {
            activity,
            head_deadline,
            idle: settings.idle_timeout,
            send: settings.send_timeout,
        }
    }
}

/// What to do with a connection whose watchdog fired (nothing is in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnExpiry {
    /// Drop it, which closes the socket (HTTP/1.1: there is nothing to say).
    Close,
    /// Tell the client to go away (HTTP/2 GOAWAY) and give it [`GOAWAY_GRACE`] to close
    /// (longer while requests it sent meanwhile are in flight).
    GoAway,
}

/// Drives a connection until it ends: on stop or drain it finishes what is in flight and
/// closes (HTTP/1.1: after the current response; HTTP/2: GOAWAY); when the watchdog fires,
/// `on_expiry` says how it ends.
pub(crate) async fn drive<C>(
    conn: C,
    graceful_shutdown: fn(Pin<&mut C>),
    on_expiry: OnExpiry,
    timers: Timers<'_>,
    stop: &mut watch::Receiver<bool>,
    drain: &mut watch::Receiver<bool>,
    shared: &Shared,
) -> hyper::Result<()>
where
    C: Future<Output = hyper::Result<()>>,
{
    // Stop, drain and the watchdog in one future, polled only when one of them woke (see
    // `gate`); the connection first, without the random branch order.
    let control = Gated::new(async {
        tokio::select! {
            _ = closing(stop, drain) => Control::Closing,
            expiry = watchdog(timers.activity, timers.head_deadline, timers.idle) => {
                Control::Expired(expiry)
            }
        }
    });
    let conn = SendGuarded {
        conn,
        watch: &timers.activity.send,
        timer: SendTimer::new(timers.send),
        shared,
    };
    tokio::pin!(conn, control);
    tokio::select! {
        biased;
        result = conn.as_mut() => result,
        control = control => match control {
            Control::Closing => {
                graceful_shutdown(conn.as_mut().conn());
                conn.await
            }
            Control::Expired(expiry) => {
                count_timeout(shared, expiry);
                tracing::debug!(reason = expiry.as_str(), "downstream connection closed");
                match on_expiry {
                    OnExpiry::Close => Ok(()),
                    OnExpiry::GoAway => {
                        graceful_shutdown(conn.as_mut().conn());
                        // A request the client sent before it saw the GOAWAY is still served.
                        loop {
                            match tokio::time::timeout(GOAWAY_GRACE, conn.as_mut()).await {
                                Ok(result) => return result,
                                Err(_) if timers.activity.is_busy() => {}
                                Err(_) => return Ok(()),
                            }
                        }
                    }
                }
            }
        },
    }
}

pin_project_lite::pin_project! {
    /// A connection whose HTTP/1.1 response is cut (the connection closed) when it waits for
    /// the client too long (`sending`).
    struct SendGuarded<'a, C> {
        #[pin]
        conn: C,
        watch: &'a SendWatch,
        timer: SendTimer,
        shared: &'a Shared,
    }
}

impl<C> SendGuarded<'_, C> {
    fn conn(self: Pin<&mut Self>) -> Pin<&mut C> {
        self.project().conn
    }
}

impl<C: Future<Output = hyper::Result<()>>> Future for SendGuarded<'_, C> {
    type Output = hyper::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.conn.poll(cx) {
            return Poll::Ready(result);
        }
        match this.timer.poll_expired(this.watch, cx) {
            Poll::Ready(cut) => {
                sending::count(&this.shared.metrics.downstream_send_timeouts, cut);
                tracing::debug!(
                    reason = cut.as_str(),
                    "downstream connection closed: the client did not read its response"
                );
                // Dropped by the caller: the socket closes, the response body and the
                // upstream connection it read from are released.
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// What ended `drive`'s wait besides the connection itself.
enum Control {
    /// Stop or drain: finish what is in flight and close.
    Closing,
    Expired(Expiry),
}

/// A request head hyper refused itself (HTTP/1.1: it answered 431, 414 or 400 before egressd
/// saw the request) counts as the local reply it is.
pub(crate) fn count_parse_error(shared: &Shared, e: &hyper::Error) {
    let code = if e.is_parse_too_large() {
        "request_header_too_large"
    } else if e.is_parse() {
        "invalid_request"
    } else {
        return;
    };
    shared
        .metrics
        .local_replies
        .get_or_create(&CodeLabel { code })
        .inc();
}
