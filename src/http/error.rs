//! Everything that can end a request with a reply egressd makes itself, and the one function
//! that turns such a failure into that reply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use super::body::ProxyBody;
use crate::upstream::tls::TlsFailure;

/// The response header that carries the short error code of a local reply.
pub const ERROR_HEADER: &str = "x-egressd-error";

/// The status logged for a request whose client left before it was sent (nginx's 499): no
/// one receives it.
const CLIENT_CLOSED_REQUEST: StatusCode = match StatusCode::from_u16(499) {
    Ok(status) => status,
    Err(_) => StatusCode::BAD_REQUEST,
};

/// Why egressd answered a request itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("{0}")]
    HeadRejected(#[from] super::limits::HeadRejection),
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
        reason: crate::runtime::undeclared::Refusal,
    },
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
    #[error("Backend {backend} ({endpoint}) did not answer within {timeout:?}")]
    UpstreamTimeout {
        backend: Arc<str>,
        endpoint: SocketAddr,
        timeout: Duration,
    },
    #[error("Backend {backend} ({endpoint}) sent nothing for {timeout:?}")]
    StreamIdleTimeout {
        backend: Arc<str>,
        endpoint: SocketAddr,
        timeout: Duration,
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
    #[error("request loop: it has already passed egressd {hops} times (Via); a Backend or destination points back at egressd")]
    LoopDetected { hops: usize },
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

/// A CONNECT names its port; a plain request's port is usually the scheme's.
fn shown_port(via: crate::telemetry::blocked::Via, port: u16) -> String {
    match via {
        crate::telemetry::blocked::Via::Http => String::new(),
        _ => format!(":{port}"),
    }
}

impl ProxyError {
    /// The short code in `x-egressd-error` and the access log.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::InvalidRequest(_) | ProxyError::MalformedBody { .. } => "invalid_request",
            ProxyError::ClientClosed { .. } => "client_closed",
            ProxyError::BufferOverflow { .. } => "overflow",
            ProxyError::BodyTimeout { .. } => "request_body_timeout",
            ProxyError::HeadRejected(rejection) => rejection.code(),
            ProxyError::DestinationNotAllowed { .. }
            | ProxyError::DestinationDenied { .. }
            | ProxyError::PortNotAllowed { .. } => "destination_not_allowed",
            ProxyError::NoRoute { .. } => "no_route",
            ProxyError::NoBackend { .. } => "no_backend",
            ProxyError::NoHealthyUpstream { .. } => "no_healthy_upstream",
            ProxyError::ConnectFailure { .. } => "upstream_connect_failure",
            ProxyError::ConnectTimeout { .. } => "upstream_connect_timeout",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
            ProxyError::StreamIdleTimeout { .. } => "stream_idle_timeout",
            ProxyError::UpstreamReset { .. } => "upstream_reset",
            ProxyError::UpstreamTls { .. } => "upstream_tls_failure",
            ProxyError::UpstreamProtocol { .. } => "upstream_protocol_error",
            ProxyError::UpgradeNotAllowed { .. } => "upgrade_not_allowed",
            ProxyError::Overflow { .. } => "overflow",
            ProxyError::McpSessionNotFound { .. } => "mcp_session_not_found",
            ProxyError::McpProtocolVersion { .. } => "mcp_protocol_version",
            ProxyError::McpHeaderMismatch { .. } => "mcp_header_mismatch",
            ProxyError::McpBodyTooLarge { .. } => "mcp_body_too_large",
            ProxyError::CredentialUnavailable { .. } => "credential_unavailable",
            ProxyError::LoopDetected { .. } => "loop_detected",
            ProxyError::NotSupported(_) => "not_supported",
            ProxyError::ListenerGone => "listener_draining",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::HeadRejected(rejection) => rejection.status(),
            ProxyError::InvalidRequest(_)
            | ProxyError::MalformedBody { .. }
            | ProxyError::McpProtocolVersion { .. }
            | ProxyError::McpHeaderMismatch { .. } => StatusCode::BAD_REQUEST,
            ProxyError::McpBodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::McpSessionNotFound { .. } => StatusCode::NOT_FOUND,
            ProxyError::DestinationNotAllowed { .. }
            | ProxyError::DestinationDenied { .. }
            | ProxyError::PortNotAllowed { .. }
            | ProxyError::UpgradeNotAllowed { .. } => StatusCode::FORBIDDEN,
            ProxyError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ProxyError::NoBackend { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::NoHealthyUpstream { .. }
            | ProxyError::CredentialUnavailable { .. }
            | ProxyError::ConnectFailure { .. }
            | ProxyError::Overflow { .. }
            | ProxyError::BufferOverflow { .. }
            | ProxyError::ListenerGone => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::ConnectTimeout { .. }
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::StreamIdleTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::UpstreamReset { .. }
            | ProxyError::UpstreamProtocol { .. }
            | ProxyError::UpstreamTls { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::NotSupported(_) => StatusCode::NOT_IMPLEMENTED,
            ProxyError::LoopDetected { .. } => StatusCode::LOOP_DETECTED,
            ProxyError::ClientClosed { .. } => CLIENT_CLOSED_REQUEST,
        }
    }

    /// The failure of a request whose body the client broke or abandoned, when `err` (from
    /// sending upstream or reading the body ahead) comes from the client's body.
    pub fn from_client_body(err: &(dyn std::error::Error + 'static)) -> Option<ProxyError> {
        let mut source = Some(err);
        while let Some(e) = source {
            if let Some(body) = e.downcast_ref::<super::body::ClientBodyError>() {
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
    pub fn cause(&self) -> Option<&'static str> {
        match self {
            ProxyError::UpstreamTls { failure, .. } => Some(failure.code()),
            _ => None,
        }
    }

    /// How this failure counts for outlier detection: failures of the endpoint itself
    /// (no connection, no answer, a broken answer) are local-origin failures (gateway errors
    /// unless split out); failures egressd
    /// decided on its own (routing, policy) do not count.
    pub fn outlier_outcome(&self) -> Option<crate::balance::outlier::Outcome> {
        match self {
            ProxyError::ConnectFailure { .. }
            | ProxyError::ConnectTimeout { .. }
            | ProxyError::UpstreamTimeout { .. }
            | ProxyError::StreamIdleTimeout { .. }
            | ProxyError::UpstreamTls { .. }
            | ProxyError::UpstreamReset { .. }
            | ProxyError::UpstreamProtocol { .. } => {
                Some(crate::balance::outlier::Outcome::LocalOriginFailure)
            }
            _ => None,
        }
    }

    /// The upstream address involved, if any (for the access log).
    pub fn endpoint(&self) -> Option<SocketAddr> {
        match self {
            ProxyError::ConnectFailure { endpoint, .. }
            | ProxyError::ConnectTimeout { endpoint, .. }
            | ProxyError::UpstreamTimeout { endpoint, .. }
            | ProxyError::StreamIdleTimeout { endpoint, .. }
            | ProxyError::UpstreamReset { endpoint, .. }
            | ProxyError::UpstreamTls { endpoint, .. }
            | ProxyError::UpstreamProtocol { endpoint, .. } => Some(*endpoint),
            _ => None,
        }
    }
}

/// The reply for a failure: status, `x-egressd-error`, and a one-line body a person can act on.
pub fn local_reply(err: &ProxyError) -> Response<ProxyBody> {
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
    response
}

/// An error and its sources, `: `-separated (hyper's own message alone says little).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
