//! What a failure leaves behind, whatever the kind of traffic: the circuit breaker's overflow
//! counted, a refused destination in `/blocked`, a TLS failure's cause counted, the endpoint
//! involved noted for the log line, and a debug line for failures that are not the client's.
//! An HTTP request then gets egressd's reply (`respond::failure`); a passthrough connection is
//! closed (`passthrough`).

use super::ctx::RequestCtx;
use crate::http::error::ProxyError;
use crate::telemetry::blocked::Via;
use crate::telemetry::metrics::CauseLabel;

/// Records `err`, the failure of a request or connection.
pub(super) fn record(ctx: &mut RequestCtx<'_>, err: &ProxyError) {
    let shared = ctx.shared;
    if ctx.upstream.endpoint.is_none() {
        ctx.upstream.endpoint = err.endpoint();
    }
    if err.status().is_server_error() {
        tracing::debug!(error = %err, code = err.code(), "local reply");
    }
    match err {
        ProxyError::Overflow { backend, limit, .. } => {
            shared.metrics.overflow(backend, limit.as_str())
        }
        ProxyError::DestinationNotAllowed { host, port, via }
        | ProxyError::DestinationDenied {
            host, port, via, ..
        } => shared.blocked(host, *port, *via),
        // Another port of a declared hostname (only HTTP routes by hostname and port):
        // declarable by a Backend of its own.
        ProxyError::PortNotAllowed { host, port, .. } => shared.blocked(host, *port, Via::Http),
        _ => {}
    }
    if let Some(cause) = err.cause() {
        shared
            .metrics
            .upstream_tls_failures
            .get_or_create(&CauseLabel { cause })
            .inc();
    }
}
