//! What the pipeline knows about a request: the connection it came on, the config generation
//! it runs under, and what each phase learned on the way (for the reply, the metrics and the
//! access log line).

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use http::{Method, Request, Version};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::http::grpc::GrpcCall;
use crate::http::headers::client_address_value;
use crate::snapshot::router::RouteAction;
use crate::snapshot::shared::Shared;
use crate::snapshot::Snapshot;
use crate::telemetry::trace::RequestSpan;
use crate::upstream::connect::TlsSummary;

/// What the proxy knows about the connection a request arrived on.
#[derive(Debug)]
pub(crate) struct ConnInfo {
    pub(crate) listener: Arc<str>,
    pub(crate) client: SocketAddr,
    /// `client`'s address as an `X-Forwarded-For` value, formatted once per connection.
    pub(crate) client_header: HeaderValue,
    /// Whether the client connected with TLS (an HTTPS listener): `X-Forwarded-Proto: https`.
    pub(crate) tls: bool,
    /// What the client's certificate proved (HTTPS listeners with `tls.frontendValidation`).
    pub(crate) identity: Option<Arc<crate::policy::identity::TlsIdentity>>,
    /// The drain tracker: a CONNECT tunnel or websocket outlives its HTTP exchange and
    /// registers itself, so SIGTERM waits for it (up to the drain timeout) like for any
    /// connection.
    pub(crate) tracker: Option<Arc<dyn Outliving>>,
    /// The listener's request metrics (looked up once per connection).
    pub(crate) stats: Option<Arc<crate::telemetry::metrics::RequestStats>>,
    /// Set on the connection inside an intercepted CONNECT tunnel: what the CONNECT asked
    /// for and who sent it.
    pub(crate) tunnel: Option<Box<TunnelOrigin>>,
    /// Serves HTTP on a connection carried inside this one (an intercepted tunnel); set by
    /// the listener.
    pub(crate) nested: Option<Arc<dyn NestedHttp>>,
}

/// What the CONNECT of an intercepted tunnel established for the requests inside it.
#[derive(Debug)]
pub(crate) struct TunnelOrigin {
    /// The CONNECT's host (canonical) and port: every request inside must be for them (421
    /// otherwise: no domain fronting).
    pub(crate) host: Box<str>,
    pub(crate) port: u16,
    /// The proxy user the CONNECT authenticated: requests inside a tunnel carry no
    /// `Proxy-Authorization` of their own.
    pub(crate) user: Option<Box<str>>,
}

/// A byte stream a nested connection is served on (TLS inside a CONNECT tunnel, or the
/// tunnel itself).
pub(crate) trait NestedStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> NestedStream for T {}

/// Serves HTTP/1.1 or HTTP/2 on a connection inside a client's connection, as the listener
/// serves its own (timeouts, drain, the pipeline). A trait, so the pipeline knows nothing of
/// listeners.
pub(crate) trait NestedHttp: Send + Sync + std::fmt::Debug {
    /// Serves `io` until it closes, a timeout closes it, or the proxy drains.
    fn serve(
        self: Arc<Self>,
        io: Box<dyn NestedStream>,
        info: ConnInfo,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

impl ConnInfo {
    pub(crate) fn new(listener: Arc<str>, client: SocketAddr) -> Self {
        ConnInfo {
            listener,
            client_header: client_address_value(client.ip()),
            client,
            tls: false,
            identity: None,
            tracker: None,
            stats: None,
            tunnel: None,
            nested: None,
        }
    }
}

/// Where a CONNECT tunnel or websocket registers while it outlives its HTTP exchange: the
/// listener's drain tracker, so that SIGTERM waits for it and its connection is not idle
/// meanwhile. A trait, so the pipeline knows nothing of listeners.
pub(crate) trait Outliving: Send + Sync + std::fmt::Debug {
    /// Registers one; it counts until the returned guard is dropped.
    fn hold(self: Arc<Self>) -> Held;
}

/// What [`Outliving::hold`] gives: dropping it ends the registration.
pub(crate) type Held = Box<dyn std::fmt::Debug + Send + Sync>;

/// One request on its way through the phases.
pub(super) struct RequestCtx<'a> {
    pub(super) shared: &'a Arc<Shared>,
    /// The config generation the whole request runs under (a reload in the middle changes
    /// nothing for it).
    pub(super) snapshot: &'a Snapshot,
    pub(super) conn: &'a ConnInfo,
    pub(super) started: Instant,
    /// Set when the request is a gRPC call: its deadline, and the form of egressd's replies.
    pub(super) grpc: Option<GrpcCall>,
    /// What the access log and the span will want; `None` when both are off (then nothing
    /// is copied or timed for them).
    pub(super) logged: Option<LoggedRequest>,
    pub(super) span: Option<RequestSpan>,
    /// Phase "route": the matched HTTPRoute rule (none for an implicit route or a tunnel).
    pub(super) route: Option<Arc<RouteAction>>,
    /// Phase "route": the Backend that serves the request.
    pub(super) backend: Option<Arc<str>>,
    /// Phase "authorize": the proxy user `Proxy-Authorization` authenticated.
    pub(super) user: Option<Box<str>>,
    /// Phase "attempt": what happened upstream.
    pub(super) upstream: UpstreamFacts,
    /// Phase "mcp": the JSON-RPC method (and tool) of an MCP request, when egressd saw them.
    pub(super) mcp_method: Option<String>,
    pub(super) mcp_tool: Option<String>,
    /// The `x-egressd-error` code of an answer egressd gave itself without failing (a denied
    /// MCP tool call is a JSON-RPC error inside a 200).
    pub(super) local_error: Option<&'static str>,
    /// Phase "limit": `limited policy/rule` or `would_limit policy/rule`, for the access log.
    pub(super) rate_limit: Option<String>,
    /// The bytes of a request body without a declared length, counted as it is sent (only
    /// when logged).
    pub(super) bytes_in: Option<Arc<AtomicU64>>,
    /// A tunnel's or websocket's end, for the access log line written when it closes.
    pub(super) relay_end: Option<tokio::sync::oneshot::Receiver<Option<RelayBytes>>>,
}

/// What phase "attempt" learned about the upstream side.
#[derive(Default)]
pub(super) struct UpstreamFacts {
    pub(super) endpoint: Option<SocketAddr>,
    /// Times the request went upstream (retries included).
    pub(super) attempts: u32,
    /// From the request's arrival until the last attempt's response headers (measured only
    /// when logged).
    pub(super) ttfb: Option<Duration>,
    /// The last attempt opened a connection, taking this long.
    pub(super) connect: Option<Duration>,
    /// What TLS with the endpoint settled on (its latest handshake).
    pub(super) tls: Option<TlsSummary>,
}

/// The bytes a tunnel or websocket carried each way, and whether both sides closed in order.
#[derive(Clone, Copy, Debug)]
pub(super) struct RelayBytes {
    pub(super) up: u64,
    pub(super) down: u64,
    pub(super) complete: bool,
}

/// The request fields the access log records, taken before the request moves on.
pub(super) struct LoggedRequest {
    pub(super) time: std::time::SystemTime,
    /// The request's method; `TLS` for a passthrough connection.
    pub(super) method: Method,
    pub(super) protocol: LoggedProtocol,
    pub(super) authority: String,
    pub(super) path: String,
    pub(super) bytes_in: Option<u64>,
}

impl<'a> RequestCtx<'a> {
    /// A request that has just arrived: its span opened (when tracing is on; the request goes
    /// upstream under it) and what the log needs copied.
    pub(super) fn new<B: http_body::Body>(
        shared: &'a Arc<Shared>,
        snapshot: &'a Snapshot,
        conn: &'a ConnInfo,
        req: &mut Request<B>,
    ) -> Self {
        let started = Instant::now();
        let span = snapshot.tracing.as_ref().map(|tracing| {
            let method = req.method().clone();
            let authority = request_authority(req).to_owned();
            tracing.request_span(
                req.headers_mut(),
                &method,
                &authority,
                &conn.listener,
                conn.client,
            )
        });
        let logged = (shared.access_log.enabled() || span.is_some()).then(|| LoggedRequest {
            time: std::time::SystemTime::now(),
            bytes_in: req.body().size_hint().exact(),
            method: req.method().clone(),
            protocol: LoggedProtocol::Http(req.version()),
            authority: request_authority(req).to_owned(),
            path: req.uri().path().to_owned(),
        });
        let grpc = crate::http::grpc::call(req.headers());
        RequestCtx::arrived(shared, snapshot, conn, started, logged, grpc, span)
    }

    /// A TLS passthrough connection that has just been accepted: no HTTP request, so no span
    /// or gRPC call; its log line says method `TLS`, protocol `passthrough`, and the SNI as
    /// authority once read.
    pub(super) fn passthrough(
        shared: &'a Arc<Shared>,
        snapshot: &'a Snapshot,
        conn: &'a ConnInfo,
        accepted: std::time::SystemTime,
        started: Instant,
    ) -> Self {
        static TLS: std::sync::LazyLock<Method> = std::sync::LazyLock::new(|| {
            Method::from_bytes(b"TLS").expect("TLS is a method token (RFC 9110 §9.1)")
        });
        let logged = shared.access_log.enabled().then(|| LoggedRequest {
            time: accepted,
            method: TLS.clone(),
            protocol: LoggedProtocol::Passthrough,
            authority: String::new(),
            path: String::new(),
            bytes_in: None,
        });
        RequestCtx::arrived(shared, snapshot, conn, started, logged, None, None)
    }

    /// What is known when a request or connection arrives; every phase's findings empty.
    /// Built in one literal (inlined), not assigned field by field after: once per request.
    #[inline]
    fn arrived(
        shared: &'a Arc<Shared>,
        snapshot: &'a Snapshot,
        conn: &'a ConnInfo,
        started: Instant,
        logged: Option<LoggedRequest>,
        grpc: Option<GrpcCall>,
        span: Option<RequestSpan>,
    ) -> Self {
        RequestCtx {
            shared,
            snapshot,
            conn,
            started,
            grpc,
            logged,
            span,
            route: None,
            backend: None,
            user: None,
            upstream: UpstreamFacts::default(),
            mcp_method: None,
            mcp_tool: None,
            local_error: None,
            rate_limit: None,
            bytes_in: None,
            relay_end: None,
        }
    }

    /// Whether timings and byte counts are wanted (by the access log or a span).
    pub(super) fn timed(&self) -> bool {
        self.logged.is_some()
    }

    /// Where the end of a tunnel or websocket is reported, when the log wants it.
    pub(super) fn report_relay_end(
        &mut self,
    ) -> Option<tokio::sync::oneshot::Sender<Option<RelayBytes>>> {
        self.timed().then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.relay_end = Some(rx);
            tx
        })
    }
}

/// What the access log's `protocol` says: the request's HTTP version, or `passthrough`. One
/// byte or two, so that a request's context stays small.
#[derive(Clone, Copy)]
pub(super) enum LoggedProtocol {
    Http(Version),
    Passthrough,
}

impl LoggedProtocol {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            LoggedProtocol::Http(Version::HTTP_09) => "HTTP/0.9",
            LoggedProtocol::Http(Version::HTTP_10) => "HTTP/1.0",
            LoggedProtocol::Http(Version::HTTP_2) => "HTTP/2",
            LoggedProtocol::Http(Version::HTTP_3) => "HTTP/3",
            LoggedProtocol::Http(_) => "HTTP/1.1",
            LoggedProtocol::Passthrough => "passthrough",
        }
    }
}

/// The authority the client named: the URI's (absolute-form, HTTP/2 `:authority`), else
/// `Host`; empty when neither is there.
fn request_authority<B>(req: &Request<B>) -> &str {
    match req.uri().authority() {
        Some(a) => a.as_str(),
        None => req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default(),
    }
}
