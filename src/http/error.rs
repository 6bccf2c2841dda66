//! Everything that can end a request with a reply egressd makes itself, and the one function
//! that turns such a failure into that reply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use super::body::ProxyBody;
use super::grpc::GrpcStatus;
use crate::upstream::tls::TlsFailure;

pub(crate) use blame::Blame;
pub(crate) use hello::HelloRejection;

/// The response header that carries the short error code of a local reply.
pub(crate) const ERROR_HEADER: &str = "x-egressd-error";

/// The status logged for a request whose client left before it was sent (nginx's 499): no
/// one receives it.
const CLIENT_CLOSED_REQUEST: StatusCode = match StatusCode::from_u16(499) {
    Ok(status) => status,
    Err(_) => StatusCode::BAD_REQUEST,
};

/// Why egressd answered a request itself.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("{0}")]
    HeadRejected(#[from] super::limits::HeadRejection),
    /// A TLS passthrough connection whose ClientHello cannot be routed by (its destination
    /// phase).
    #[error("{0}")]
    ClientHello(HelloRejection),
    #[error("destination {host}{} is not allowed: no Backend or route declares it", shown_port(*via, *port))]
    DestinationNotAllowed {
        host: String,
        port: u16,
        via: crate::telemetry::blocked::Via,
    },
    #[error("destination {host}{} is not allowed: {reason}", shown_port(*via, *port))]
    DestinationDenied {
        host: String,
        port: u16,
        via: crate::telemetry::blocked::Via,
        reason: crate::snapshot::undeclared::Refusal,
    },
    /// `CONNECT` to a port whose TLS egressd originates, without `tlsInterception`: a tunnel
    /// would carry the client's own TLS past everything the Backend says.
    #[error("CONNECT {host}:{port} is refused: Backend {backend} declares this port, and egressd originates its TLS (a tunnel would bypass it). Send http://{host}{} to egressd (it adds the TLS), enable ProxyConfig tlsInterception (egressd then decrypts the tunnel), or declare the port tls.mode: Passthrough", default_port_shown(*port))]
    ConnectToOriginatingPort {
        host: String,
        port: u16,
        backend: Arc<str>,
    },
    /// Inside an intercepted tunnel, a request for another host or port than the CONNECT's
    /// (or a ClientHello naming another): no domain fronting.
    #[error("this connection is for {tunnel} (its CONNECT); a request for {asked} must use a connection of its own")]
    Misdirected { tunnel: String, asked: String },
    /// egressd could not make the certificate for an intercepted host.
    #[error("cannot intercept {host}: {cause}")]
    InterceptionFailed { host: String, cause: String },
    /// A new name clients chose would take a DNS lookup over `dns.maxLookupsPerSecond`.
    #[error("cannot look up {host} now: egressd's DNS lookups of new names are at their limit (ProxyConfig dns.maxLookupsPerSecond); try again in a second")]
    DnsRateLimited { host: String },
    #[error("port {port} of {host} is not allowed: its declared ports are {declared}")]
    PortNotAllowed {
        host: String,
        port: u16,
        /// `80 (Backend a/b), 443 (Backend a/c)`.
        declared: String,
    },
    #[error("no route for {host}{path} on this listener")]
    NoRoute { host: String, path: String },
    #[error("{route} has no backend with a non-zero weight")]
    NoBackend { route: Arc<str> },
    #[error("Backend {backend} has no available endpoint{detail}")]
    NoHealthyUpstream { backend: Arc<str>, detail: String },
    /// The destination's name resolved only to addresses it may not use (link-local,
    /// loopback, …): a DNS answer is never a way around the address policy.
    #[error("Backend {backend}: {detail}")]
    DestinationAddressDenied { backend: Arc<str>, detail: String },
    #[error("cannot connect to {endpoint} for Backend {backend}: {cause}")]
    ConnectFailure {
        backend: Arc<str>,
        endpoint: SocketAddr,
        cause: String,
    },
    #[error("connecting to {endpoint} for Backend {backend} timed out after {timeout:?}")]
    ConnectTimeout {
        backend: Arc<str>,
        endpoint: SocketAddr,
        timeout: Duration,
    },
    #[error("Backend {backend} ({endpoint}) did not answer within {timeout:?}{}", blame.explain())]
    UpstreamTimeout {
        backend: Arc<str>,
        endpoint: SocketAddr,
        timeout: Duration,
        blame: Blame,
    },
    #[error("Backend {backend} ({endpoint}) sent nothing for {timeout:?}{}", blame.explain())]
    StreamIdleTimeout {
        backend: Arc<str>,
        endpoint: SocketAddr,
        timeout: Duration,
        blame: Blame,
    },
    #[error("TLS handshake with {endpoint} for Backend {backend} failed: {}: {} ({detail})", failure.code(), failure.explain())]
    UpstreamTls {
        backend: Arc<str>,
        endpoint: SocketAddr,
        failure: TlsFailure,
        detail: String,
    },
    #[error("Backend {backend} ({endpoint}) closed the connection before answering: {cause}")]
    UpstreamReset {
        backend: Arc<str>,
        endpoint: SocketAddr,
        cause: String,
    },
    #[error("Backend {backend} ({endpoint}) sent an invalid response: {cause}")]
    UpstreamProtocol {
        backend: Arc<str>,
        endpoint: SocketAddr,
        cause: String,
    },
    #[error("websocket upgrades to Backend {backend} are turned off (httpUpgrade)")]
    UpgradeNotAllowed { backend: Arc<str> },
    #[error("Backend {backend} is at its circuitBreaker limit {} ({max}); try again later", limit.field())]
    Overflow {
        backend: Arc<str>,
        limit: crate::upstream::breaker::Limit,
        max: u32,
    },
    #[error("MCP session not found at Backend {backend}: {reason}; initialize a new session")]
    McpSessionNotFound { backend: Arc<str>, reason: String },
    #[error("MCP-Protocol-Version {got} is not the version Backend {backend} speaks ({expected})")]
    McpProtocolVersion {
        backend: Arc<str>,
        expected: String,
        got: String,
    },
    #[error("MCP headers of a request to Backend {backend} are not usable: {reason}")]
    McpHeaderMismatch { backend: Arc<str>, reason: String },
    #[error("MCP request body to Backend {backend} is over {limit} bytes, the most its tool policy can inspect")]
    McpBodyTooLarge { backend: Arc<str>, limit: u64 },
    #[error("credential of extension {extension} for Backend {backend} is unavailable: {reason}")]
    CredentialUnavailable {
        backend: Arc<str>,
        extension: String,
        reason: String,
    },
    /// No `EgressPolicy` lets this client reach the destination (or `clientPolicy.default`
    /// is `Deny` and none covers it).
    #[error("client {client} may not reach {destination}: {reason}")]
    ClientNotAllowed {
        client: String,
        destination: String,
        /// Names the policy, or the default.
        reason: String,
    },
    /// `Proxy-Authorization` missing (when required), malformed or wrong.
    #[error("proxy authentication required: {reason}")]
    ProxyAuthRequired {
        reason: &'static str,
        /// The `Proxy-Authenticate` value.
        challenge: HeaderValue,
    },
    /// Too many password checks pending for the client's address (a guessing client).
    #[error("too many proxy password checks pending for this client address; retry later")]
    ProxyAuthBusy,
    #[error("request loop: it has already passed egressd {hops} times (Via); a Backend or destination points back at egressd")]
    LoopDetected { hops: usize },
    /// A `rateLimit` rule's quota is used up (`mode: Enforce`).
    #[error("rate limited by {policy} rule {rule} ({} requests per {}s); retry in {}s", quota.requests, quota.period.as_secs(), retry_after_secs(*reset))]
    RateLimited {
        policy: Arc<str>,
        rule: Arc<str>,
        quota: crate::ratelimit::Quota,
        /// Until one more request would be let through.
        reset: Duration,
    },
    /// Redis could not decide on a `global` rule and `failureMode` is `Closed`.
    #[error(
        "rate limit {policy} cannot be checked ({reason}); failureMode Closed refuses the request"
    )]
    RateLimitUnavailable { policy: Arc<str>, reason: String },
    #[error("{0} is not supported yet")]
    NotSupported(&'static str),
    #[error("this listener is being removed; retry the request")]
    ListenerGone,
    /// The client's request body broke the protocol (a bad chunk): the client's fault, never
    /// the upstream's.
    #[error("malformed request body: {cause}")]
    MalformedBody { cause: String },
    /// The client went away before its request body ended (a `Content-Length` upload cut
    /// short): nobody receives this reply; it is for the access log and metrics.
    #[error("the client closed the connection before its request body ended: {cause}")]
    ClientClosed { cause: String },
    /// egressd's memory for whole bodies (`bufferedBodies.budget`) is in use by other
    /// requests, and this one cannot go on without its body buffered.
    #[error("egressd's budget for buffered bodies ({budget} bytes, bufferedBodies.budget) is in use; try again later")]
    BufferOverflow { budget: u64 },
    /// A body egressd needs whole did not arrive in time (`bufferedBodies.readTimeout`).
    #[error(
        "the request body did not arrive whole within {timeout:?} (bufferedBodies.readTimeout)"
    )]
    BodyTimeout { timeout: Duration },
}

/// `:port` after an `http://` host, unless it is 80.
fn default_port_shown(port: u16) -> String {
    if port == 443 || port == 80 {
        String::new()
    } else {
        format!(":{port}")
    }
}

/// A CONNECT names its port; a plain request's port is usually the scheme's.
fn shown_port(via: crate::telemetry::blocked::Via, port: u16) -> String {
    match via {
        crate::telemetry::blocked::Via::Http => String::new(),
        _ => format!(":{port}"),
    }
}

/// Who a failure is about, which decides what learns from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin<'e> {
    /// The client's request (malformed, oversized, abandoned).
    Downstream,
    /// egressd's own decision: routing, the outbound policy, a limit, its configuration.
    Policy,
    /// A Backend, and the endpoint when one was involved: a failure with an endpoint counts
    /// for outlier detection and is the endpoint's last failure.
    Upstream {
        backend: &'e Arc<str>,
        endpoint: Option<SocketAddr>,
    },
}

/// Which retry policy condition (`retryOn`) may send the request again after the failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RetryOn {
    /// No condition: the failure is final.
    Never,
    /// `connect-failure`: nothing reached the upstream, whatever the method.
    ConnectFailure,
    /// `reset`: the connection broke before the answer (idempotent methods only).
    Reset,
    /// `gateway-error`: no answer in time (idempotent methods only).
    Timeout,
}

/// One row of the table of failures: the reply and how the failure counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Class {
    pub(crate) status: StatusCode,
    /// The short code in `x-egressd-error` and the access log.
    pub(crate) code: &'static str,
    /// The status of a gRPC call's trailers-only reply.
    pub(crate) grpc: GrpcStatus,
    pub(crate) retry: RetryOn,
    /// Opening the connection failed (`egressd_upstream_connect_failures_total`).
    pub(crate) connect_failure: bool,
}

/// The rows of [`ProxyError::class`]'s table (one constant per `x-egressd-error` code).
mod row;

impl ProxyError {
    /// The table: every kind of failure and its row (see [`row`]). Adding a kind means a
    /// variant above, a row, and a line here.
    pub(crate) fn class(&self) -> Class {
        match self {
            ProxyError::InvalidRequest(_) | ProxyError::MalformedBody { .. } => {
                row::INVALID_REQUEST
            }
            ProxyError::HeadRejected(r) => Class {
                status: r.status(),
                code: r.code(),
                ..row::HEAD_REJECTED
            },
            ProxyError::ClientHello(r) => r.class(),
            ProxyError::ClientClosed { .. } => row::CLIENT_CLOSED,
            ProxyError::BufferOverflow { .. } => row::OVERFLOW,
            ProxyError::BodyTimeout { .. } => row::REQUEST_BODY_TIMEOUT,
            ProxyError::DestinationNotAllowed { .. }
            | ProxyError::DestinationDenied { .. }
            | ProxyError::PortNotAllowed { .. } => row::DESTINATION_NOT_ALLOWED,
            ProxyError::ConnectToOriginatingPort { .. } => row::CONNECT_TO_ORIGINATING_PORT,
            ProxyError::Misdirected { .. } => row::MISDIRECTED_REQUEST,
            ProxyError::InterceptionFailed { .. } => row::INTERCEPTION_FAILURE,
            ProxyError::NoRoute { .. } => row::NO_ROUTE,
            ProxyError::NoBackend { .. } => row::NO_BACKEND,
            ProxyError::NoHealthyUpstream { .. } => row::NO_HEALTHY_UPSTREAM,
            ProxyError::DnsRateLimited { .. } => row::DNS_RATE_LIMITED,
            ProxyError::DestinationAddressDenied { .. } => row::DESTINATION_ADDRESS_DENIED,
            ProxyError::ConnectFailure { .. } => row::UPSTREAM_CONNECT_FAILURE,
            ProxyError::ConnectTimeout { .. } => row::UPSTREAM_CONNECT_TIMEOUT,
            ProxyError::UpstreamTls { .. } => row::UPSTREAM_TLS_FAILURE,
            ProxyError::UpstreamTimeout { .. } => row::UPSTREAM_TIMEOUT,
            ProxyError::StreamIdleTimeout { .. } => row::STREAM_IDLE_TIMEOUT,
            ProxyError::UpstreamReset { .. } => row::UPSTREAM_RESET,
            ProxyError::UpstreamProtocol { .. } => row::UPSTREAM_PROTOCOL_ERROR,
            ProxyError::UpgradeNotAllowed { .. } => row::UPGRADE_NOT_ALLOWED,
            ProxyError::Overflow { .. } => row::OVERFLOW,
            ProxyError::McpSessionNotFound { .. } => row::MCP_SESSION_NOT_FOUND,
            ProxyError::McpProtocolVersion { .. } => row::MCP_PROTOCOL_VERSION,
            ProxyError::McpHeaderMismatch { .. } => row::MCP_HEADER_MISMATCH,
            ProxyError::McpBodyTooLarge { .. } => row::MCP_BODY_TOO_LARGE,
            ProxyError::CredentialUnavailable { .. } => row::CREDENTIAL_UNAVAILABLE,
            ProxyError::ClientNotAllowed { .. } => row::CLIENT_NOT_ALLOWED,
            ProxyError::ProxyAuthRequired { .. } => row::PROXY_AUTH_REQUIRED,
            ProxyError::ProxyAuthBusy => row::PROXY_AUTH_BUSY,
            ProxyError::LoopDetected { .. } => row::LOOP_DETECTED,
            ProxyError::RateLimited { .. } => row::RATE_LIMITED,
            ProxyError::RateLimitUnavailable { .. } => row::RATE_LIMIT_UNAVAILABLE,
            ProxyError::NotSupported(_) => row::NOT_SUPPORTED,
            ProxyError::ListenerGone => row::LISTENER_DRAINING,
        }
    }

    /// Who the failure is about.
    pub(crate) fn origin(&self) -> Origin<'_> {
        match self {
            ProxyError::InvalidRequest(_)
            | ProxyError::HeadRejected(_)
            | ProxyError::ClientHello(_)
            | ProxyError::MalformedBody { .. }
            | ProxyError::Misdirected { .. }
            | ProxyError::ClientClosed { .. }
            | ProxyError::ProxyAuthRequired { .. }
            | ProxyError::ProxyAuthBusy
            | ProxyError::BodyTimeout { .. } => Origin::Downstream,
            ProxyError::ConnectFailure {
                backend, endpoint, ..
            }
            | ProxyError::ConnectTimeout {
                backend, endpoint, ..
            }
            | ProxyError::UpstreamTimeout {
                backend, endpoint, ..
            }
            | ProxyError::StreamIdleTimeout {
                backend, endpoint, ..
            }
            | ProxyError::UpstreamTls {
                backend, endpoint, ..
            }
            | ProxyError::UpstreamReset {
                backend, endpoint, ..
            }
            | ProxyError::UpstreamProtocol {
                backend, endpoint, ..
            } => Origin::Upstream {
                backend,
                endpoint: Some(*endpoint),
            },
            ProxyError::NoHealthyUpstream { backend, .. } => Origin::Upstream {
                backend,
                endpoint: None,
            },
            _ => Origin::Policy,
        }
    }

    /// The short code in `x-egressd-error` and the access log.
    pub(crate) fn code(&self) -> &'static str {
        self.class().code
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.class().status
    }

    /// The failure of a request whose body the client broke or abandoned, when `err` (from
    /// sending upstream or reading the body ahead) comes from the client's body.
    pub(crate) fn from_client_body(err: &(dyn std::error::Error + 'static)) -> Option<ProxyError> {
        let mut source = Some(err);
        while let Some(e) = source {
            if let Some(body) = e.downcast_ref::<crate::upstream::body::ClientBodyError>() {
                let cause = body.cause();
                return Some(if body.is_malformed() {
                    ProxyError::MalformedBody { cause }
                } else {
                    ProxyError::ClientClosed { cause }
                });
            }
            source = e.source();
        }
        None
    }

    /// The finer cause, where the code alone is not enough (TLS failures).
    pub(crate) fn cause(&self) -> Option<&'static str> {
        match self {
            ProxyError::UpstreamTls { failure, .. } => Some(failure.code()),
            _ => None,
        }
    }

    /// How this failure counts for outlier detection: failures of an endpoint itself (no
    /// connection, no answer, a broken answer) are local-origin failures (gateway errors unless
    /// split out); failures egressd decided on its own (routing, policy) do not count.
    pub(crate) fn outlier_outcome(&self) -> Option<crate::balance::outlier::Outcome> {
        self.charged_endpoint()
            .map(|_| crate::balance::outlier::Outcome::LocalOriginFailure)
    }

    /// The endpoint the failure is charged to (see [`Blame`]): one involved in it, unless
    /// the client caused it.
    pub(crate) fn charged_endpoint(&self) -> Option<SocketAddr> {
        match self {
            ProxyError::UpstreamTimeout { blame, .. }
            | ProxyError::StreamIdleTimeout { blame, .. }
                if *blame != Blame::Endpoint =>
            {
                None
            }
            _ => self.endpoint(),
        }
    }

    /// The upstream address involved, if any (for the access log).
    pub(crate) fn endpoint(&self) -> Option<SocketAddr> {
        match self.origin() {
            Origin::Upstream { endpoint, .. } => endpoint,
            _ => None,
        }
    }
}

/// The reply for a failure: status, `x-egressd-error`, and a one-line body a person can act on.
pub(crate) fn local_reply(err: &ProxyError) -> Response<ProxyBody> {
    let body = Bytes::from(format!("egressd: {err}\n"));
    let mut response = Response::new(ProxyBody::local(body));
    *response.status_mut() = err.status();
    let headers = response.headers_mut();
    headers.insert(ERROR_HEADER, HeaderValue::from_static(err.code()));
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    if let ProxyError::ProxyAuthRequired { challenge, .. } = err {
        headers.insert(http::header::PROXY_AUTHENTICATE, challenge.clone());
    }
    rate_limit_headers(err, headers);
    response
}

mod blame;
mod rate_limit;
pub(crate) use rate_limit::{rate_limit_headers, retry_after_secs};
mod hello;
#[cfg(test)]
mod tests;
