//! Phase "respond": the upstream's answer on its way down (hop-by-hop headers removed, `Via`
//! added, the route's ResponseHeaderModifier applied, the body streamed under the remaining
//! timeouts, MCP session ids wrapped), or, when the request failed, egressd's own reply.

use std::time::Duration;

use http::{Response, Version};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::attempt::Answered;
use super::ctx::RequestCtx;
use super::mcp::McpExchange;
use super::route::Routed;
use crate::http::body::{ProxyBody, UpstreamBody};
use crate::http::error::ProxyError;
use crate::http::headers::{append_via, strip_hop_by_hop};
use crate::snapshot::router::RouteEntry;
use crate::snapshot::Target;
use crate::telemetry::blocked::Via;
use crate::telemetry::metrics::{CauseLabel, CodeLabel};
use crate::upstream::body::Lease;
use crate::upstream::breaker::Admission;
use crate::upstream::endpoint::ActiveRequest;

/// Phase "respond" for an HTTP request's upstream answer.
pub(super) async fn phase(
    ctx: &RequestCtx<'_>,
    routed: &Routed<'_>,
    answered: Answered,
    admission: Admission,
    mcp: Option<McpExchange<'_>>,
    deadline: Option<(Instant, Duration)>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let target = &**routed.target;
    let Answered {
        mut response,
        lease,
        endpoint,
        active,
    } = answered;
    let mut deadline = deadline;
    let mut verdict = None;
    if let Some(m) = mcp {
        m.port.outbound(
            &super::mcp::session_home(target, endpoint.addr),
            response.headers_mut(),
        );
        verdict = (m.post && response.status() == http::StatusCode::OK)
            .then(|| super::mcp::Verdict::new(ctx.shared, target, &endpoint));
        if let Some(policy) = m
            .port
            .tools
            .as_ref()
            .filter(|_| ctx.mcp_method.as_deref() == Some("tools/list"))
        {
            // Boxed: only these responses are read whole; every other would carry the future.
            // The body drives its HTTP/1.1 connection (`upstream::h1_conn`) as it is read; the
            // reading has its own idle limit.
            let response = response.map(|body| UpstreamBody::new(body, lease, active, None, None));
            return Box::pin(super::mcp::filtered_tools_list(
                ctx.shared,
                response,
                policy,
                routed.entry,
                target,
                endpoint.addr,
                verdict,
            ))
            .await;
        }
        // An MCP event stream lives as long as the session needs it: only the stream idle
        // timeout ends it, not the request timeout.
        if crate::mcp::is_event_stream(response.headers()) {
            deadline = None;
        }
    }
    let response = upstream_response(
        response,
        lease,
        active.holding(admission),
        target,
        routed.entry,
        deadline,
        ctx.grpc.is_some(),
    );
    let response = match verdict {
        Some(verdict) => super::mcp::watch_errors(response, verdict),
        None => response,
    };
    Ok(match mcp {
        Some(m) if m.port.legacy_sse && crate::mcp::is_event_stream(response.headers()) => {
            super::mcp::announce_through_proxy(response, m.port, target, endpoint.addr)
        }
        _ => response,
    })
}

/// Headers cleaned and filtered, body streamed with the remaining timeouts.
fn upstream_response(
    response: Response<Incoming>,
    lease: Lease,
    active: ActiveRequest,
    target: &Target,
    entry: Option<&RouteEntry>,
    deadline: Option<(Instant, Duration)>,
    grpc: bool,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    clean_response_headers(&mut parts, entry);
    let body = UpstreamBody::new(
        body,
        lease,
        active,
        target.policy.stream_idle_timeout,
        deadline,
    )
    .ending_grpc_calls_with_status(grpc);
    parts.version = Version::HTTP_11;
    Response::from_parts(parts, ProxyBody::Upstream(Box::new(body)))
}

/// What every upstream response goes through on its way down: hop-by-hop headers removed,
/// `Via` added, the route's ResponseHeaderModifier applied.
pub(super) fn clean_response_headers(
    parts: &mut http::response::Parts,
    entry: Option<&RouteEntry>,
) {
    strip_hop_by_hop(&mut parts.headers);
    append_via(&mut parts.headers, parts.version);
    if let Some(entry) = entry {
        entry
            .action
            .filters
            .response_headers
            .apply(&mut parts.headers);
    }
}

/// A failed request: egressd's reply (in gRPC's form for a gRPC call), with the failure's
/// side effects — metrics, `/blocked`, the debug log — taken here, once.
pub(super) fn failure(ctx: &mut RequestCtx<'_>, err: &ProxyError) -> Response<ProxyBody> {
    let shared = ctx.shared;
    let code = err.code();
    shared
        .metrics
        .local_replies
        .get_or_create(&CodeLabel { code })
        .inc();
    if ctx.upstream.endpoint.is_none() {
        ctx.upstream.endpoint = err.endpoint();
    }
    if err.status().is_server_error() {
        tracing::debug!(error = %err, code, "local reply");
    }
    match err {
        ProxyError::Overflow { backend, limit, .. } => {
            shared.metrics.overflow(backend, limit.as_str())
        }
        ProxyError::DestinationNotAllowed { host, port, via }
        | ProxyError::DestinationDenied {
            host, port, via, ..
        } => shared.blocked(host, *port, *via),
        // Another port of a declared hostname: declarable by a Backend of its own.
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
    match ctx.grpc {
        Some(_) => crate::http::grpc::local_reply(err),
        None => crate::http::error::local_reply(err),
    }
}
