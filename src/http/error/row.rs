//! The rows of [`ProxyError::class`](super::ProxyError::class)'s table: the reply to each kind of
//! failure and how it counts, one constant per `x-egressd-error` code.
#![cfg_attr(rustfmt, rustfmt::skip)]

use super::{Class, RetryOn as R, CLIENT_CLOSED_REQUEST};
use crate::http::grpc::GrpcStatus as G;
use http::StatusCode as S;

/// A failure egressd answers itself, or one upstream after the connection was made.
const fn local(status: S, code: &'static str, grpc: G, retry: R) -> Class {
    Class {
        status,
        code,
        grpc,
        retry,
        connect_failure: false,
    }
}

/// Opening the connection failed: nothing reached the upstream.
const fn connect(status: S, code: &'static str, retry: R) -> Class {
    Class {
        status,
        code,
        grpc: G::Unavailable,
        retry,
        connect_failure: true,
    }
}

// One row per code: status, code, gRPC status (connect failures: UNAVAILABLE), retry
// condition.
pub(crate) const INVALID_REQUEST:          Class = local(S::BAD_REQUEST, "invalid_request", G::InvalidArgument, R::Never);
/// Status and code come from the rejection (431, 414, 400).
pub(crate) const HEAD_REJECTED:            Class = local(S::BAD_REQUEST, "", G::InvalidArgument, R::Never);
pub(crate) const CLIENT_HELLO_TIMEOUT:     Class = local(S::REQUEST_TIMEOUT, "client_hello_timeout", G::DeadlineExceeded, R::Never);
pub(crate) const NOT_TLS:                  Class = local(S::BAD_REQUEST, "not_tls", G::InvalidArgument, R::Never);
pub(crate) const NO_SNI:                   Class = local(S::BAD_REQUEST, "no_sni", G::InvalidArgument, R::Never);
pub(crate) const INVALID_SNI:              Class = local(S::BAD_REQUEST, "invalid_sni", G::InvalidArgument, R::Never);
pub(crate) const CLIENT_CLOSED:            Class = local(CLIENT_CLOSED_REQUEST, "client_closed", G::InvalidArgument, R::Never);
pub(crate) const OVERFLOW:                 Class = local(S::SERVICE_UNAVAILABLE, "overflow", G::Unavailable, R::Never);
pub(crate) const REQUEST_BODY_TIMEOUT:     Class = local(S::REQUEST_TIMEOUT, "request_body_timeout", G::DeadlineExceeded, R::Never);
pub(crate) const DESTINATION_NOT_ALLOWED:  Class = local(S::FORBIDDEN, "destination_not_allowed", G::PermissionDenied, R::Never);
pub(crate) const CONNECT_TO_ORIGINATING_PORT: Class = local(S::FORBIDDEN, "connect_to_originating_port", G::PermissionDenied, R::Never);
pub(crate) const MISDIRECTED_REQUEST:      Class = local(S::MISDIRECTED_REQUEST, "misdirected_request", G::InvalidArgument, R::Never);
pub(crate) const INTERCEPTION_FAILURE:     Class = local(S::INTERNAL_SERVER_ERROR, "interception_failure", G::Internal, R::Never);
pub(crate) const NO_ROUTE:                 Class = local(S::NOT_FOUND, "no_route", G::Unimplemented, R::Never);
pub(crate) const NO_BACKEND:               Class = local(S::INTERNAL_SERVER_ERROR, "no_backend", G::Internal, R::Never);
pub(crate) const DESTINATION_ADDRESS_DENIED: Class = local(S::BAD_GATEWAY, "destination_address_denied", G::PermissionDenied, R::Never);
pub(crate) const NO_HEALTHY_UPSTREAM:      Class = local(S::SERVICE_UNAVAILABLE, "no_healthy_upstream", G::Unavailable, R::Never);
pub(crate) const DNS_RATE_LIMITED:         Class = local(S::SERVICE_UNAVAILABLE, "dns_rate_limited", G::Unavailable, R::Never);
pub(crate) const UPSTREAM_CONNECT_FAILURE: Class = connect(S::SERVICE_UNAVAILABLE, "upstream_connect_failure", R::ConnectFailure);
pub(crate) const UPSTREAM_CONNECT_TIMEOUT: Class = connect(S::GATEWAY_TIMEOUT, "upstream_connect_timeout", R::ConnectFailure);
pub(crate) const UPSTREAM_TLS_FAILURE:     Class = connect(S::BAD_GATEWAY, "upstream_tls_failure", R::Never);
pub(crate) const UPSTREAM_TIMEOUT:         Class = local(S::GATEWAY_TIMEOUT, "upstream_timeout", G::DeadlineExceeded, R::Timeout);
pub(crate) const STREAM_IDLE_TIMEOUT:      Class = local(S::GATEWAY_TIMEOUT, "stream_idle_timeout", G::Unavailable, R::Never);
pub(crate) const UPSTREAM_RESET:           Class = local(S::BAD_GATEWAY, "upstream_reset", G::Unavailable, R::Reset);
pub(crate) const UPSTREAM_PROTOCOL_ERROR:  Class = local(S::BAD_GATEWAY, "upstream_protocol_error", G::Internal, R::Never);
pub(crate) const UPGRADE_NOT_ALLOWED:      Class = local(S::FORBIDDEN, "upgrade_not_allowed", G::PermissionDenied, R::Never);
pub(crate) const MCP_SESSION_NOT_FOUND:    Class = local(S::NOT_FOUND, "mcp_session_not_found", G::InvalidArgument, R::Never);
pub(crate) const MCP_PROTOCOL_VERSION:     Class = local(S::BAD_REQUEST, "mcp_protocol_version", G::InvalidArgument, R::Never);
pub(crate) const MCP_HEADER_MISMATCH:      Class = local(S::BAD_REQUEST, "mcp_header_mismatch", G::InvalidArgument, R::Never);
pub(crate) const MCP_BODY_TOO_LARGE:       Class = local(S::PAYLOAD_TOO_LARGE, "mcp_body_too_large", G::InvalidArgument, R::Never);
pub(crate) const CREDENTIAL_UNAVAILABLE:   Class = local(S::SERVICE_UNAVAILABLE, "credential_unavailable", G::Unavailable, R::Never);
pub(crate) const CLIENT_NOT_ALLOWED:       Class = local(S::FORBIDDEN, "client_not_allowed", G::PermissionDenied, R::Never);
pub(crate) const PROXY_AUTH_REQUIRED:      Class = local(S::PROXY_AUTHENTICATION_REQUIRED, "proxy_auth_required", G::PermissionDenied, R::Never);
pub(crate) const PROXY_AUTH_BUSY:          Class = local(S::TOO_MANY_REQUESTS, "proxy_auth_busy", G::ResourceExhausted, R::Never);
pub(crate) const LOOP_DETECTED:            Class = local(S::LOOP_DETECTED, "loop_detected", G::Internal, R::Never);
pub(crate) const RATE_LIMITED:             Class = local(S::TOO_MANY_REQUESTS, "rate_limited", G::ResourceExhausted, R::Never);
pub(crate) const RATE_LIMIT_UNAVAILABLE:   Class = local(S::SERVICE_UNAVAILABLE, "rate_limit_unavailable", G::Unavailable, R::Never);
pub(crate) const NOT_SUPPORTED:            Class = local(S::NOT_IMPLEMENTED, "not_supported", G::Unimplemented, R::Never);
pub(crate) const LISTENER_DRAINING:        Class = local(S::SERVICE_UNAVAILABLE, "listener_draining", G::Unavailable, R::Never);
