//! `ProxyConfig` (egressd.dev): process-wide settings. At most one per config.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::SecretRef;
use super::enums::{
    AccessLogFormat, ClientPolicyDefault, EscapedSlashesAction, OutboundPolicy,
    RateLimitFailureMode,
};
use crate::config::units::{GwDuration, Quantity};
use crate::config::yaml::Spanned;

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct ProxyConfigSpec {
    pub(crate) admin: Option<AdminSpec>,
    /// `RegistryOnly` (default): only declared destinations are reachable. `AllowAny`: every
    /// destination is; `AuditOnly`: every destination is, and those `RegistryOnly` would
    /// refuse are recorded (admin `/blocked`).
    pub(crate) outbound_policy: Option<Spanned<OutboundPolicy>>,
    /// How `AllowAny` and `AuditOnly` reach destinations no Backend declares.
    pub(crate) undeclared_destinations: Option<UndeclaredDestinationsSpec>,
    /// The blocked-egress audit (admin `/blocked`).
    pub(crate) blocked_audit: Option<BlockedAuditSpec>,
    /// Bodies egressd holds whole (MCP inspection, retry read-ahead): their memory budget.
    pub(crate) buffered_bodies: Option<BufferedBodiesSpec>,
    pub(crate) drain: Option<DrainSpec>,
    pub(crate) access_log: Option<AccessLogSpec>,
    /// Hostnames (exact or `*.suffix`) no Backend may name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) denied_hostnames: Vec<Spanned<String>>,
    /// Name servers for FQDN destinations.
    pub(crate) dns: Option<ProxyDnsSpec>,
    pub(crate) platform_identity: Option<Spanned<PlatformIdentity>>,
    /// MCP settings shared by every `protocol: MCP` Backend.
    pub(crate) mcp: Option<Spanned<ProxyMcpSpec>>,
    /// How egressd serves its clients' connections (every listener).
    pub(crate) downstream: Option<DownstreamSpec>,
    /// egressd's own span per request, exported over OTLP/HTTP (builds with the `otel`
    /// feature only).
    pub(crate) tracing: Option<Spanned<TracingSpec>>,
    /// Who may call what: destinations no `EgressPolicy` names, and proxy users.
    pub(crate) client_policy: Option<Spanned<ClientPolicySpec>>,
    /// HTTPS interception: a `CONNECT` to a declared Backend port whose TLS egressd
    /// originates is answered `200`, and egressd completes the client's TLS with a certificate
    /// for the host signed by this CA, so the requests inside pass the HTTP pipeline.
    pub(crate) tls_interception: Option<Spanned<TlsInterceptionSpec>>,
    /// Rate limits: the Redis `global` rules count in, and the bounds of `Distinct` rules.
    pub(crate) rate_limit: Option<Spanned<ProxyRateLimitSpec>>,
    /// Every warning is an error: a reload with one is refused (the last good config keeps
    /// serving), as `egressd validate --strict` reports it. Default false. For shared
    /// gateways, where a warning such as a `Conflicted` Backend means another team's change
    /// did not do what it says.
    pub(crate) strict: Option<bool>,
}

/// `ProxyConfig.spec.rateLimit`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct ProxyRateLimitSpec {
    /// Where `global` rules count, shared by every replica pointed at it.
    pub(crate) redis: Option<Spanned<RedisSpec>>,
    /// Counters one `Distinct` local rule keeps (one per distinct value), at most (default
    /// 10000); past it, the values seen least recently are forgotten (and counted).
    pub(crate) max_distinct_values: Option<Spanned<u32>>,
}

/// `ProxyConfig.spec.rateLimit.redis`.
#[apply(wire!)]
pub(crate) struct RedisSpec {
    /// `host:port` of the Redis server (a name resolved by the system, or an address).
    pub(crate) address: Spanned<String>,
    /// TLS to Redis, verified (its name: the host of `address` unless `serverName` says).
    pub(crate) tls: Option<Spanned<RedisTlsSpec>>,
    /// An ACL user (Redis 6+); without it, the password is the default user's (`requirepass`).
    pub(crate) username: Option<Spanned<String>>,
    /// The password: `valueFile` or `secretRef` (key `password` by default).
    pub(crate) password: Option<Spanned<super::backend::CredentialSource>>,
    /// The logical database (default 0).
    pub(crate) database: Option<Spanned<u32>>,
    /// Put before every key egressd writes (default `egressd:rl:`).
    pub(crate) key_prefix: Option<Spanned<String>>,
    /// The longest a request waits for Redis's decision (default 20ms); past it, the
    /// `failureMode` applies.
    pub(crate) timeout: Option<Spanned<GwDuration>>,
    /// `Open` (default): a request Redis cannot decide on passes. `Closed`: it is refused
    /// (503 `rate_limit_unavailable`).
    pub(crate) failure_mode: Option<Spanned<RateLimitFailureMode>>,
    /// Multiplexed connections to Redis (default 2), picked in turn.
    pub(crate) connections: Option<Spanned<u32>>,
}

/// `ProxyConfig.spec.rateLimit.redis.tls`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RedisTlsSpec {
    /// CA certificates (PEM) Redis's certificate must chain to (default: the system's).
    pub(crate) ca_certificate_file: Option<Spanned<String>>,
    /// The name verified and sent as SNI (default: the host of `address`).
    pub(crate) server_name: Option<Spanned<String>>,
}

/// `ProxyConfig.spec.tlsInterception`.
#[apply(wire!)]
pub(crate) struct TlsInterceptionSpec {
    /// The CA that signs the certificates egressd presents to intercepted clients.
    pub(crate) ca: Spanned<InterceptionCaSpec>,
    /// The certificates egressd makes for intercepted hosts.
    pub(crate) leaf: Option<Spanned<InterceptionLeafSpec>>,
}

/// `ProxyConfig.spec.tlsInterception.ca`: PEM files, or a `kubernetes.io/tls` Secret of the
/// config (`tls.crt`, `tls.key`).
#[apply(wire!)]
pub(crate) struct InterceptionCaSpec {
    /// The CA certificate (PEM; relative to this YAML file).
    pub(crate) certificate_file: Option<Spanned<String>>,
    /// Its private key (PEM), readable by its owner alone: a key group or others may read is
    /// refused.
    pub(crate) private_key_file: Option<Spanned<String>>,
    /// A Secret document of the config holding `tls.crt` and `tls.key`, instead of the files.
    pub(crate) secret_ref: Option<Spanned<SecretRef>>,
}

/// `ProxyConfig.spec.tlsInterception.leaf`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct InterceptionLeafSpec {
    /// How long a certificate egressd makes is valid (default 24h); one is made again when a
    /// third of it is left.
    pub(crate) validity: Option<Spanned<GwDuration>>,
    /// Hosts whose certificates are kept at once (default 1024); the least recently used
    /// makes room.
    pub(crate) cache_size: Option<Spanned<u32>>,
}

/// `ProxyConfig.spec.clientPolicy`.
#[apply(wire!)]
pub(crate) struct ClientPolicySpec {
    /// `Allow` (default): a destination no `EgressPolicy` names is open to every client.
    /// `Deny`: it is refused (403 `client_not_allowed`).
    pub(crate) default: Option<Spanned<ClientPolicyDefault>>,
    /// Users of forward-proxy clients, authenticated by `Proxy-Authorization: Basic`.
    pub(crate) proxy_users: Option<Spanned<ProxyUsersSpec>>,
}

/// `ProxyConfig.spec.clientPolicy.proxyUsers`.
#[apply(wire!)]
pub(crate) struct ProxyUsersSpec {
    /// A file of `user:hash` lines, watched: bcrypt (`htpasswd -B`, `$2y$`) or SHA-crypt
    /// (`openssl passwd -5` / `-6`, `$5$`/`$6$`). Relative to this YAML file.
    pub(crate) file: Spanned<String>,
    /// Every request must carry valid credentials (407 otherwise). Default false: a request
    /// without `Proxy-Authorization` has no user; wrong credentials are 407 either way.
    pub(crate) required: Option<bool>,
    /// The realm of `Proxy-Authenticate` (default `egressd`).
    pub(crate) realm: Option<Spanned<String>>,
}

/// `ProxyConfig.spec.tracing`.
#[apply(wire!)]
pub(crate) struct TracingSpec {
    /// OTLP/HTTP (protobuf) traces URL of a collector, e.g.
    /// `http://127.0.0.1:4318/v1/traces`. Plain `http://` only.
    pub(crate) otlp_endpoint: Spanned<String>,
    /// Percent of new traces sampled (0–100, default 100); requests with a `traceparent`
    /// follow its sampled flag.
    pub(crate) sampling_percent: Option<Spanned<f64>>,
    /// `service.name` of the spans (default `egressd`).
    pub(crate) service_name: Option<Spanned<String>>,
    /// How long finished spans wait to be exported together (default 5s).
    pub(crate) export_interval: Option<GwDuration>,
}

/// `ProxyConfig.spec.undeclaredDestinations`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct UndeclaredDestinationsSpec {
    /// CIDRs an undeclared destination may not be or resolve to. Default: every non-public
    /// network (loopback, where egressd's admin port listens; RFC 1918; CGNAT; link-local;
    /// ULA; multicast; documentation and reserved ranges). Setting it replaces that list
    /// (`[]` denies nothing but link-local and unspecified addresses, which are refused
    /// whatever this says). Addresses are compared in canonical form (`::ffff:127.0.0.1` is
    /// 127.0.0.1).
    pub(crate) denied_addresses: Option<Vec<Spanned<String>>>,
    /// CIDRs undeclared destinations may reach although `deniedAddresses` holds them, e.g.
    /// `10.0.0.0/8` for an internal network (default none).
    pub(crate) allowed_addresses: Option<Vec<Spanned<String>>>,
    /// Undeclared destinations (host, port, how) kept at once, each with its DNS refresher
    /// and connection pool (default 1024); the least recently used makes room.
    pub(crate) max_destinations: Option<Spanned<u32>>,
    /// Endpoints (resolved addresses) of all undeclared destinations together (default
    /// 4096); a destination whose answer does not fit gets what is left, at least one.
    pub(crate) max_endpoints: Option<Spanned<u32>>,
    /// An undeclared destination nobody asked for this long is forgotten, and its DNS
    /// refresher stops (default 5m, as Envoy's dynamic forward proxy `host_ttl`).
    pub(crate) idle_timeout: Option<Spanned<GwDuration>>,
}

/// `ProxyConfig.spec.bufferedBodies`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct BufferedBodiesSpec {
    /// Bytes all bodies egressd holds whole may take together, process-wide (default `32Mi`).
    /// Past it, a retry read-ahead is skipped (the request streams, without retries), an MCP
    /// request without a tool policy passes uninspected, and what needs its body whole gets
    /// 503 `overflow`.
    pub(crate) budget: Option<Spanned<Quantity>>,
    /// How long a body egressd holds whole may take to arrive (default 30s); later: 408.
    pub(crate) read_timeout: Option<Spanned<GwDuration>>,
}

/// `ProxyConfig.spec.blockedAudit`: how much of what was refused admin `/blocked` remembers.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct BlockedAuditSpec {
    /// Destinations listed at most (default 1024); the least recently seen makes room.
    pub(crate) max_entries: Option<Spanned<u32>>,
    /// A destination not seen for this long leaves the list (default 24h).
    pub(crate) retention: Option<Spanned<GwDuration>>,
}

/// `ProxyConfig.spec.mcp`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct ProxyMcpSpec {
    /// File with the key (at least 32 bytes) that authenticates the MCP session ids egressd
    /// hands out; replicas that share it route each other's sessions. Unset: a key made at
    /// start, valid for this process only.
    pub(crate) session_key_file: Option<Spanned<String>>,
}

/// Settings of downstream (client) connections.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct DownstreamSpec {
    /// HTTP/2 server settings: h2c (prior knowledge) on HTTP listeners, `h2` by ALPN on HTTPS
    /// listeners. A change applies to connections accepted after the reload.
    pub(crate) http2: Option<DownstreamHttp2Spec>,
    /// Client connections open at once, over every listener (TLS passthrough and tunnels
    /// included); more are closed as soon as they are accepted. Default: half of the file
    /// descriptors the process may open (`RLIMIT_NOFILE`) less 64.
    pub(crate) max_connections: Option<Spanned<u32>>,
    /// From accept until the first request head is complete (TLS handshake, HTTP/2 preface
    /// and TLS passthrough ClientHello included); a connection that sends nothing is closed
    /// too (default 10s; `0s` disables).
    pub(crate) header_read_timeout: Option<Spanned<GwDuration>>,
    /// How long a connection with no request in flight stays open: HTTP/1.1 keep-alive, and
    /// HTTP/2 without streams (closed with GOAWAY). Default 5m; `0s` disables.
    pub(crate) idle_timeout: Option<Spanned<GwDuration>>,
    /// How long response bytes may wait for a client that does not read them: an HTTP/1.1
    /// response (the connection is closed), an HTTP/2 stream (reset), a tunnel or websocket
    /// (closed). A stream that is slow because its upstream is slow is not affected.
    /// Default 60s; `0s` disables.
    pub(crate) send_timeout: Option<Spanned<GwDuration>>,
    /// Largest request head: request line and headers as HTTP/1.1 writes them (default
    /// 60Ki); larger ones are answered 431.
    pub(crate) max_request_headers_bytes: Option<Spanned<Quantity>>,
    /// Most header fields in a request (default 100); more are answered 431.
    pub(crate) max_request_headers: Option<Spanned<u32>>,
    /// Longest request target, path and query or absolute URI (default 16Ki); longer ones
    /// are answered 414.
    pub(crate) max_request_uri_bytes: Option<Spanned<Quantity>>,
    /// Longest request method (default 32); longer ones are answered 400.
    pub(crate) max_request_method_bytes: Option<Spanned<u32>>,
    /// How request paths are normalised before routes match them and before they are
    /// forwarded.
    pub(crate) paths: Option<DownstreamPathsSpec>,
}

/// `ProxyConfig.spec.downstream.paths`: request path normalisation (docs/protocols.md).
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct DownstreamPathsSpec {
    /// RFC 3986 normalisation: dot-segments removed (`..` above the root refused),
    /// percent-encoded unreserved characters decoded, a `%` that starts no encoding refused
    /// (default true; false is reported Degraded: routes then match paths the upstream may
    /// resolve elsewhere).
    pub(crate) normalize: Option<Spanned<bool>>,
    /// `//` merged into `/` (default false, as Envoy's `merge_slashes`).
    pub(crate) merge_slashes: Option<bool>,
    /// `%2F`, `%5C` and `\` in a path: `KeepUnchanged` (default; refused where they would hide
    /// a `.` or `..` segment), `RejectRequest` (400) or `UnescapeAndForward` (turned into `/`).
    pub(crate) escaped_slashes: Option<EscapedSlashesAction>,
}

/// What egressd announces in its HTTP/2 SETTINGS and how much abuse it tolerates before it
/// closes a client connection with GOAWAY `ENHANCE_YOUR_CALM`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct DownstreamHttp2Spec {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: requests in flight per connection (default 256).
    pub(crate) max_concurrent_streams: Option<Spanned<u32>>,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: larger request headers are answered 431 (default 64Ki).
    pub(crate) max_header_list_size: Option<Spanned<Quantity>>,
    /// SETTINGS_INITIAL_WINDOW_SIZE: request body bytes a client may send on one stream before
    /// egressd has forwarded them (default 1Mi, at most 2147483647).
    pub(crate) initial_stream_window_size: Option<Spanned<Quantity>>,
    /// Request body bytes a client may send on the whole connection before egressd has
    /// forwarded them (default 1Mi, 65535 to 2147483647).
    pub(crate) initial_connection_window_size: Option<Spanned<Quantity>>,
    /// Streams a client may reset before egressd has accepted them, at any one time, before
    /// the connection is closed (Rapid Reset, CVE-2023-44487; default 20).
    pub(crate) max_pending_accept_reset_streams: Option<Spanned<u32>>,
    /// Streams egressd may have to reset because of the client's protocol errors, over the
    /// connection's life, before the connection is closed (MadeYouReset, CVE-2025-8671;
    /// default 1024).
    pub(crate) max_local_error_reset_streams: Option<Spanned<u32>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct AdminSpec {
    /// `127.0.0.1:15000` by default. Binding a non-loopback address exposes config dumps.
    pub(crate) address: Option<Spanned<String>>,
    /// Admin connections open at once (default 32); more are closed as soon as they are
    /// accepted. The admin server also applies `downstream.headerReadTimeout` and
    /// `downstream.idleTimeout`.
    pub(crate) max_connections: Option<Spanned<u32>>,
    /// Host names the admin server answers besides IP addresses, `localhost` and
    /// `*.localhost`: exact, `*.suffix`, or `*` for any. Another `Host` gets 403 (DNS
    /// rebinding: a web page pointing its own name at 127.0.0.1 cannot read the admin API).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) allowed_hosts: Vec<Spanned<String>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct DrainSpec {
    /// On SIGTERM, in-flight requests get at most this long to finish (default 30s).
    pub(crate) timeout: Option<GwDuration>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct AccessLogSpec {
    /// Default true.
    pub(crate) enabled: Option<bool>,
    /// `JSON` (default) or `Text`.
    pub(crate) format: Option<AccessLogFormat>,
    /// `stdout` (default), `stderr` or a file path.
    pub(crate) path: Option<String>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct ProxyDnsSpec {
    /// `ip:port` of DNS servers to ask instead of the system's (`/etc/resolv.conf`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) nameservers: Vec<Spanned<String>>,
    /// Addresses of one DNS answer egressd uses (default 64): the lowest, so the same ones at
    /// every refresh; the others are not endpoints.
    pub(crate) max_addresses_per_answer: Option<Spanned<u32>>,
    /// DNS lookups per second (in bursts of as many) of names clients choose: the hosts of
    /// wildcard Backends and undeclared destinations (default 100). A request that needs a new
    /// name looked up over it gets 503 `dns_rate_limited`; a refresh waits its turn.
    pub(crate) max_lookups_per_second: Option<Spanned<u32>>,
}

/// The workload identity a platform (e.g. a SPIFFE agent) keeps current on disk, used by
/// Backends with `tls.mode: PlatformProvided`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct PlatformIdentity {
    /// PEM certificate chain presented as the client certificate.
    pub(crate) certificate_file: String,
    pub(crate) private_key_file: String,
    /// PEM trust bundle; verifies PlatformProvided Backends that set no CA of their own.
    pub(crate) ca_certificate_file: Option<String>,
}
