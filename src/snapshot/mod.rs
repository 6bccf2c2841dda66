//! The snapshot: everything the hot path reads about the config, immutable, swapped whole.
//!
//! This is the model the request path reads and `runtime::compile` builds: settings,
//! Backends and their ports ([`Target`] is where a routed request goes), route tables
//! ([`router`]) with their filters and credentials, the destinations nothing declares
//! ([`undeclared`]), and [`shared::Shared`], the state every connection holds (the current
//! snapshot behind one `ArcSwap`, metrics, the access log). It sits below `http/`,
//! `listener/`, `admin/` and `runtime/` and imports none of them.

pub(crate) mod credentials;
pub(crate) mod fd_limit;
pub(crate) mod filters;
pub(crate) mod on_demand;
pub mod router;
pub(crate) mod shared;
pub(crate) mod undeclared;
pub(crate) mod wildcard;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use crate::config::status::{Outcome, StatusReport};
use crate::config::wire::enums::{OutboundPolicy, Protocol};
use crate::config::{ConfigSet, ObjectId};
use crate::snapshot::router::HttpRouter;
pub(crate) use crate::telemetry::access_log::AccessLogSettings;
use crate::upstream::EndpointGroup;

/// One compiled config generation.
#[derive(Debug)]
pub struct Snapshot {
    /// Increases by one with every accepted config.
    pub generation: u64,
    pub(crate) settings: ProxySettings,
    /// The listeners this config wants bound.
    pub listeners: Vec<ListenerPlan>,
    /// Request routing, per listener key.
    pub routers: router::FastMap<Arc<str>, Arc<HttpRouter>>,
    /// SNI routing of Passthrough listeners, per listener key.
    pub(crate) sni_routers: router::FastMap<Arc<str>, Arc<crate::snapshot::router::SniRouter>>,
    pub backends: Vec<Arc<Backend>>,
    /// The span exporter of `settings.tracing`, attached when the config is applied (the
    /// same one across reloads while the settings do not change).
    pub(crate) tracing: Option<Arc<crate::telemetry::trace::Tracing>>,
    /// Under `AllowAny` and `AuditOnly`: how destinations nothing declares are reached.
    pub(crate) undeclared: Option<Arc<crate::snapshot::undeclared::UndeclaredDestinations>>,
    /// `EgressPolicy` objects, `clientPolicy`: who may reach what (none when neither is
    /// configured, and the request path checks nothing).
    pub(crate) client_access: Option<Arc<crate::policy::ClientAccess>>,
    /// The key MCP session ids are authenticated with (read before a route picks: a session
    /// goes to the backendRef that issued it).
    pub(crate) mcp_session_key: Arc<crate::mcp::session::SessionKey>,
    /// `tlsInterception`: makes the certificates egressd presents in intercepted tunnels.
    pub(crate) interception: Option<Arc<crate::interception::Interceptor>>,
    /// Where `global` rate limit rules count (`rateLimit.redis`), attached when the config is
    /// applied (the same store across reloads while its settings do not change).
    pub(crate) rate_limit_store: Option<Arc<crate::ratelimit::redis::GlobalStore>>,
    /// Every `rateLimit` section in use, per scope (for `/status` and the console).
    pub(crate) rate_limits: Vec<RateLimitRef>,
    /// The config as written (for `/config`, redacted there).
    pub(crate) config: Arc<ConfigSet>,
    /// What compiling this config reported (warnings only, for a config that serves): each
    /// object's conditions are derived from them on request ([`Snapshot::status`]); kept for
    /// 10,000 objects, they were 12 MB).
    pub(crate) diagnostics: Arc<[crate::config::Diagnostic]>,
    /// Files the config refers to (certificates, keys, CA bundles): watched, and part of the
    /// "did anything change" fingerprint, so rotating one reloads.
    pub(crate) referenced_files: Vec<std::path::PathBuf>,
    /// Of the referenced files holding certificates (by path) and of the certificates the
    /// config's Secrets and ConfigMaps hold (`Secret ns/name tls.crt`): when each expires
    /// first (Unix seconds), for `egressd_certificate_expiry_seconds`.
    pub(crate) certificate_expiries: Vec<(String, i64)>,
}

impl Snapshot {
    /// The conditions of every object of this config, which is the one serving.
    pub(crate) fn status(&self) -> StatusReport {
        StatusReport::build(&self.config, &self.diagnostics, Outcome::Serving)
    }

    /// Whether `/blocked`'s entry for `host:port` (what was done, and the policy it named)
    /// still says what this config would do: a destination some Backend now declares is not
    /// blocked (nor audited) any more, and a client refusal stands only while the policy it
    /// names is there in the same mode (or, for `clientPolicy.default`, while it is Deny).
    pub(crate) fn still_refuses(
        &self,
        host: &str,
        port: u16,
        action: crate::telemetry::blocked::Action,
        policy: Option<&str>,
    ) -> bool {
        use crate::telemetry::blocked::Action;
        match action {
            Action::Blocked | Action::Audited => !self.backends.iter().any(|b| {
                b.hostname
                    .as_deref()
                    .is_some_and(|h| crate::names::hostname_matches(h, host))
                    && b.ports.iter().any(|p| p.number == port)
            }),
            Action::ClientDenied | Action::WouldDeny => {
                let Some(access) = &self.client_access else {
                    return false;
                };
                match policy {
                    Some("clientPolicy.default") | None => access.rules.default_deny,
                    Some(name) => access.rules.mode_of(name) == Some(action == Action::WouldDeny),
                }
            }
        }
    }

    /// A snapshot that serves nothing: used before the first config is accepted.
    pub(crate) fn empty() -> Self {
        Snapshot {
            generation: 0,
            settings: ProxySettings::default(),
            listeners: Vec::new(),
            routers: router::FastMap::default(),
            sni_routers: router::FastMap::default(),
            backends: Vec::new(),
            undeclared: None,
            client_access: None,
            mcp_session_key: crate::mcp::session::SessionKey::of_this_process(),
            interception: None,
            rate_limit_store: None,
            rate_limits: Vec::new(),
            tracing: None,
            config: Arc::default(),
            diagnostics: Arc::new([]),
            referenced_files: Vec::new(),
            certificate_expiries: Vec::new(),
        }
    }
}

/// Process-wide settings from `ProxyConfig`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProxySettings {
    pub(crate) admin_addr: SocketAddr,
    pub(crate) outbound_policy: OutboundPolicy,
    /// Addresses undeclared destinations (`AllowAny`, `AuditOnly`) may be or resolve to.
    pub(crate) undeclared_addresses: crate::upstream::address::AddressPolicy,
    /// How many undeclared destinations are kept, and for how long unused.
    pub(crate) undeclared_limits: crate::snapshot::undeclared::UndeclaredLimits,
    /// How much the blocked-egress audit (admin `/blocked`) remembers.
    pub(crate) blocked_audit: crate::telemetry::blocked::AuditLimits,
    /// The budget for bodies egressd holds whole, and how long they may take to arrive.
    pub(crate) buffered_bodies: crate::bounded::budget::BufferSettings,
    pub(crate) drain_timeout: Duration,
    pub(crate) access_log: AccessLogSettings,
    /// Name servers for FQDN destinations (empty: the system's).
    pub(crate) nameservers: Vec<SocketAddr>,
    /// Addresses per DNS answer, lookups per second of names clients choose.
    pub(crate) dns_limits: crate::upstream::dns::DnsLimits,
    /// HTTP/2 server settings of downstream connections.
    pub(crate) downstream_http2: Http2ServerSettings,
    /// Connection limits, timeouts and request head bounds of downstream connections.
    pub(crate) downstream: DownstreamSettings,
    /// Admin connections open at once; more are closed at accept.
    pub(crate) admin_max_connections: usize,
    /// Host names (exact, `*.suffix`, or `*`), lower-case, the admin server answers besides IP
    /// literals and `localhost` (`admin/guard.rs`).
    pub(crate) admin_allowed_hosts: Vec<String>,
    /// egressd's own spans (`tracing`), when configured.
    pub(crate) tracing: Option<crate::telemetry::trace::TracingSettings>,
    /// `rateLimit.redis`, when configured.
    pub(crate) rate_limit_redis: Option<crate::ratelimit::redis::RedisSettings>,
    /// `rateLimit.redis.failureMode: Closed`.
    pub(crate) rate_limit_failure_closed: bool,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 15000)),
            outbound_policy: OutboundPolicy::RegistryOnly,
            // Every non-public address (egressd's own loopback with its admin port, private
            // networks, cloud metadata): reachable only through a Backend that declares it, as
            // smokescreen and squid's `to_localhost` do by default.
            undeclared_addresses: crate::upstream::address::AddressPolicy::default(),
            undeclared_limits: Default::default(),
            blocked_audit: Default::default(),
            buffered_bodies: Default::default(),
            drain_timeout: Duration::from_secs(30),
            access_log: AccessLogSettings::default(),
            nameservers: Vec::new(),
            dns_limits: Default::default(),
            downstream_http2: Http2ServerSettings::default(),
            downstream: DownstreamSettings::default(),
            // Probes, a scraper and a person with curl: a few at a time. Enough that a
            // Prometheus scrape and the kubelet's probes never meet the cap, small enough
            // that the admin port cannot hold many descriptors.
            admin_max_connections: 32,
            admin_allowed_hosts: Vec::new(),
            tracing: None,
            rate_limit_redis: None,
            rate_limit_failure_closed: false,
        }
    }
}

/// How client connections are served (`ProxyConfig.spec.downstream`, besides `http2`),
/// validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DownstreamSettings {
    /// Client connections open at once over every listener (TLS passthrough and tunnels
    /// included); more are closed as soon as they are accepted.
    pub(crate) max_connections: usize,
    /// From accept until the first request head is complete: TLS handshake, protocol
    /// detection, HTTP/2 preface, TLS passthrough ClientHello. `None`: no limit.
    pub(crate) header_read_timeout: Option<Duration>,
    /// How long a connection with no request in flight stays open (HTTP/1.1 keep-alive,
    /// HTTP/2 without streams). `None`: no limit.
    pub(crate) idle_timeout: Option<Duration>,
    /// How long response bytes may wait for a client that does not read them (`sending`).
    /// `None`: no limit.
    pub(crate) send_timeout: Option<Duration>,
    /// Bounds of a request head.
    pub(crate) head: RequestHeadLimits,
    /// How request paths are normalised (`downstream.paths`).
    pub(crate) paths: PathRules,
}

impl Default for DownstreamSettings {
    fn default() -> Self {
        DownstreamSettings {
            max_connections: crate::snapshot::fd_limit::default_max_connections(),
            // Envoy's and nginx's order of magnitude: ample for a slow client on a slow
            // network, short enough that silent sockets do not pile up.
            header_read_timeout: Some(Duration::from_secs(10)),
            // Longer than most clients keep an idle connection (30–120 s), so the client,
            // not egressd, usually closes it; bounded so abandoned ones are reclaimed.
            idle_timeout: Some(Duration::from_secs(300)),
            // nginx's `send_timeout`: a client that takes nothing for a minute is gone or
            // hostile, and holds an upstream connection meanwhile.
            send_timeout: Some(Duration::from_secs(60)),
            head: RequestHeadLimits::default(),
            paths: PathRules::default(),
        }
    }
}

/// What `ProxyConfig.spec.downstream.paths` asks for; `http::path` applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PathRules {
    /// RFC 3986 normalisation: percent-encodings made canonical, dot-segments removed, and
    /// kept escaped slashes checked for the dot-segments they could hide.
    pub(crate) normalize: bool,
    pub(crate) merge_slashes: bool,
    pub(crate) escaped_slashes: EscapedSlashes,
}

impl Default for PathRules {
    fn default() -> Self {
        PathRules {
            normalize: true,
            merge_slashes: false,
            escaped_slashes: EscapedSlashes::KeepUnchanged,
        }
    }
}

/// What happens to `%2F`, `%5C` and `\` in a path (Envoy's `PathWithEscapedSlashesAction`,
/// without its redirect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EscapedSlashes {
    /// Forwarded as they are (upper-cased); refused where they would hide a dot-segment.
    KeepUnchanged,
    /// 400 `invalid_path`.
    RejectRequest,
    /// Turned into `/` before the dot-segments are removed, and forwarded so.
    UnescapeAndForward,
}

/// What a request head may hold (HTTP/1.1 and HTTP/2 alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestHeadLimits {
    /// The head's size: request line and header lines as HTTP/1.1 writes them.
    pub(crate) max_bytes: usize,
    /// Header fields.
    pub(crate) max_headers: usize,
    /// The request target (path and query, or the absolute URI).
    pub(crate) max_uri_bytes: usize,
    pub(crate) max_method_bytes: usize,
}

impl RequestHeadLimits {
    /// hyper's own bound on header fields, which it keeps on the stack: a different one costs
    /// a heap allocation per request.
    pub(crate) const HYPER_MAX_HEADERS: usize = 100;
    /// The smallest head limit hyper's HTTP/1.1 server accepts.
    pub(crate) const MIN_BYTES: usize = 1024;
}

impl Default for RequestHeadLimits {
    fn default() -> Self {
        RequestHeadLimits {
            // Envoy's default (60 KiB): big cookies and JWTs fit; hyper's ~400 KiB would
            // let one connection hold that much in buffers.
            max_bytes: 60 * 1024,
            max_headers: Self::HYPER_MAX_HEADERS,
            // Long signed URLs and GET queries fit; nginx and Apache stop at 8 KiB.
            max_uri_bytes: 16 * 1024,
            // The longest registered method (UPDATEREDIRECTREF) has 17 bytes.
            max_method_bytes: 32,
        }
    }
}

/// The HTTP/2 server side of downstream connections (`ProxyConfig.spec.downstream.http2`),
/// validated: every value is in the range HTTP/2 and h2 accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Http2ServerSettings {
    pub(crate) max_concurrent_streams: u32,
    pub(crate) max_header_list_size: u32,
    pub(crate) initial_stream_window_size: u32,
    pub(crate) initial_connection_window_size: u32,
    pub(crate) max_pending_accept_reset_streams: usize,
    pub(crate) max_local_error_reset_streams: usize,
}

impl Http2ServerSettings {
    /// The largest flow-control window HTTP/2 allows (RFC 9113 §6.9.1).
    pub(crate) const MAX_WINDOW_SIZE: u32 = (1 << 31) - 1;
    /// The connection window every HTTP/2 connection starts with (RFC 9113 §6.9.2). SETTINGS
    /// cannot lower it; egressd can only raise it with a WINDOW_UPDATE.
    pub(crate) const SPEC_CONNECTION_WINDOW_SIZE: u32 = 65_535;
}

impl Default for Http2ServerSettings {
    fn default() -> Self {
        Http2ServerSettings {
            // A little above hyper's 200: browsers and gRPC clients open up to ~100, and a
            // connection proxying for many callers may want more; each stream costs a task
            // and, at most, a stream window of buffered body.
            max_concurrent_streams: 256,
            // Large enough for big cookies and JWTs (h2's 16Ki is not); the same order as
            // what HTTP/1.1 connections accept.
            max_header_list_size: 64 * 1024,
            // hyper's defaults, which egressd used before these were configurable. The
            // connection window bounds what one client connection can make egressd buffer.
            initial_stream_window_size: 1024 * 1024,
            initial_connection_window_size: 1024 * 1024,
            // h2's defaults (see listener/http.rs for what they protect against).
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
        }
    }
}

/// A listener the config wants bound.
#[derive(Clone, Debug)]
pub struct ListenerPlan {
    /// `namespace/gateway/listener`: identity across reloads.
    pub key: Arc<str>,
    pub addr: SocketAddr,
    /// How connections are accepted. Changing it (a rotated certificate, HTTP ↔ HTTPS ↔
    /// Passthrough) keeps the socket; new connections use the new value.
    pub(crate) mode: AcceptMode,
}

/// What a listener does with a new connection.
#[derive(Clone, Debug)]
pub(crate) enum AcceptMode {
    /// Plaintext HTTP/1.1 or h2c (protocol HTTP).
    Http,
    /// Terminate TLS with this config, then HTTP (protocol HTTPS).
    Https(Arc<rustls::ServerConfig>),
    /// Read the ClientHello's SNI without terminating, and relay the bytes to the Passthrough
    /// Backend named by it (protocol TLS, `tls.mode: Passthrough`).
    TlsPassthrough,
}

/// A Backend, compiled.
#[derive(Debug)]
pub struct Backend {
    pub id: ObjectId,
    /// `namespace/name`, for logs and replies.
    pub(crate) label: Arc<str>,
    /// The FQDN destination, if any.
    pub(crate) hostname: Option<String>,
    pub ports: Vec<Arc<BackendPort>>,
    /// `spec.fallback`: in a route's backendRefs, used only when the others are unhealthy.
    pub(crate) fallback: bool,
    /// `spec.extensions` of type `CredentialInjector`, applied to every request.
    pub(crate) credentials: Vec<crate::snapshot::credentials::CredentialInjection>,
    /// Metric handles (responses, latency, retries, connect failures), resolved by the
    /// Backend's first request of this config generation: later requests cost atomic
    /// increments. Not at compile time: with 10,000 Backends that would put ~100,000 series
    /// of never-used Backends in `/metrics`. The series outlive reloads.
    /// Boxed: most Backends of a large config never see a request.
    pub(crate) stats: std::sync::OnceLock<Box<crate::telemetry::metrics::BackendStats>>,
}

impl Backend {
    /// The request metrics of this Backend.
    pub(crate) fn stats(
        &self,
        metrics: &crate::telemetry::metrics::Metrics,
    ) -> &crate::telemetry::metrics::BackendStats {
        self.stats
            .get_or_init(|| Box::new(metrics.backend_stats(&self.label)))
    }
}

/// One port of a Backend: where its endpoints are and how to talk to them.
#[derive(Debug)]
pub struct BackendPort {
    pub(crate) number: u16,
    pub(crate) protocol: Protocol,
    /// `tls.mode: Passthrough`: reachable by SNI on TLS listeners and by CONNECT.
    pub(crate) passthrough: bool,
    /// `interception` not `Disabled`: a CONNECT to the port may be intercepted.
    pub(crate) interception: bool,
    /// How connections are made (plaintext or TLS with a prebuilt client config).
    pub(crate) transport: crate::upstream::connect::Transport,
    /// Which HTTP version requests travel on.
    pub(crate) wire: crate::upstream::connect::HttpWire,
    /// How HTTP/2 connections are set up (window sizes, PINGs, stream cap).
    pub(crate) http2: Arc<crate::upstream::connect::Http2Options>,
    /// `protocol: MCP`: what egressd does on the MCP endpoint's path.
    pub(crate) mcp: Option<Arc<crate::mcp::McpPort>>,
    /// `tcpKeepalive` on upstream connections (none unless configured).
    pub(crate) tcp_keepalive: Option<crate::upstream::connect::TcpKeepalive>,
    pub endpoints: Arc<EndpointGroup>,
    /// `Host` to send when the authority is rewritten to the backend's hostname.
    pub(crate) authority: Option<HeaderValue>,
    /// A wildcard Backend's port: a template, made concrete per host (see
    /// [`wildcard`](crate::snapshot::wildcard)); its own `endpoints` stay empty.
    pub(crate) wildcard: Option<Arc<crate::snapshot::wildcard::WildcardHosts>>,
}

impl BackendPort {
    /// Whether the port speaks gRPC (`protocol: GRPC`): its requests ask for trailers.
    pub(crate) fn speaks_grpc(&self) -> bool {
        self.protocol == Protocol::Grpc
    }
}

/// Per-request settings resolved (with precedence) when the snapshot is compiled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestPolicy {
    pub connect_timeout: Duration,
    /// The whole exchange, until the end of the response.
    pub request_timeout: Option<Duration>,
    /// One attempt to a backend, until the end of its response.
    pub(crate) backend_request_timeout: Option<Duration>,
    /// Longest silence while waiting for or reading the response.
    pub(crate) stream_idle_timeout: Option<Duration>,
    /// Whether websocket upgrades are relayed (`httpUpgrade`); refused upgrades reach the
    /// upstream as plain HTTP requests.
    pub(crate) websocket: bool,
    /// `retry`, when set.
    pub(crate) retry: Option<RetryPolicy>,
    /// `rateLimit`, when set: the rules and counters of this request's scope.
    pub(crate) rate_limit: Option<RateLimitRef>,
}

/// A compiled `rateLimit` section, compared by identity: request policies that share one
/// share its counters.
#[derive(Clone, Debug)]
pub(crate) struct RateLimitRef(pub(crate) Arc<crate::ratelimit::rules::RateLimitPolicy>);

impl PartialEq for RateLimitRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RateLimitRef {}

impl std::hash::Hash for RateLimitRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

/// `retry`, resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RetryPolicy {
    pub(crate) num_retries: u32,
    pub(crate) connect_failure: bool,
    pub(crate) refused_stream: bool,
    pub(crate) reset: bool,
    pub(crate) gateway_error: bool,
    /// `retriable-status-codes`: these statuses.
    pub(crate) status_codes: Vec<u16>,
    /// gRPC statuses retried (`cancelled`, `deadline-exceeded`, `internal`,
    /// `resource-exhausted`, `unavailable`): read from a trailers-only response's headers.
    pub(crate) grpc_statuses: Vec<u32>,
    pub(crate) per_try_timeout: Option<Duration>,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    /// Request bodies up to this size (with a known length) are read ahead so they can be
    /// sent again; larger or streamed ones are sent once.
    pub(crate) replay_body_limit: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            num_retries: 2,
            connect_failure: true,
            refused_stream: true,
            reset: true,
            gateway_error: true,
            status_codes: Vec::new(),
            grpc_statuses: Vec::new(),
            per_try_timeout: None,
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_millis(250),
            replay_body_limit: 64 << 10,
        }
    }
}

impl Default for RequestPolicy {
    fn default() -> Self {
        RequestPolicy {
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            backend_request_timeout: None,
            stream_idle_timeout: Some(Duration::from_secs(300)),
            websocket: true,
            retry: None,
            rate_limit: None,
        }
    }
}

impl RequestPolicy {
    /// The deadline that applies to one attempt: the shorter of the two timeouts.
    pub(crate) fn attempt_timeout(&self) -> Option<Duration> {
        match (self.request_timeout, self.backend_request_timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Where a routed request goes: a Backend port with the policy that applies on this path.
#[derive(Debug)]
pub struct Target {
    pub(crate) backend: Arc<Backend>,
    pub(crate) port: Arc<BackendPort>,
    /// Shared by the targets with the same policy (most of a config's).
    pub policy: Arc<RequestPolicy>,
    /// Whether to send the Backend's hostname as `Host`.
    pub(crate) rewrite_authority: bool,
}
