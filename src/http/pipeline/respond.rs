//! Phase "respond": the upstream's answer on its way down (`answer`; an MCP exchange's through
//! its hook, `mcp`), or, when the request failed, egressd's own reply.

use http::Response;

use super::answer::{upstream_response, Answered};
use super::ctx::RequestCtx;
use super::mcp::McpExchange;
use super::route::Routed;
use crate::http::body::ProxyBody;
use crate::http::deadline::Deadline;
use crate::http::error::ProxyError;
use crate::telemetry::metrics::CodeLabel;
use crate::upstream::breaker::Admission;

/// Phase "respond" for an HTTP request's upstream answer: through the MCP hook for an
/// exchange with an MCP Backend's endpoint path, as it is otherwise.
pub(super) async fn phase(
    ctx: &RequestCtx<'_>,
    routed: &Routed<'_>,
    answered: Answered,
    admission: Admission,
    mcp: Option<McpExchange<'_>>,
    deadline: Option<Deadline>,
) -> Result<Response<ProxyBody>, ProxyError> {
    if let Some(mcp) = mcp {
        // Boxed: only MCP answers carry its future.
        return Box::pin(mcp.respond(ctx, routed, answered, admission, deadline)).await;
    }
    Ok(upstream_response(
        answered,
        admission,
        &routed.target,
        routed.entry,
        deadline,
        ctx.grpc.is_some(),
    ))
}

/// A failed request: egressd's reply (in gRPC's form for a gRPC call), with the failure's
/// side effects (`failure`) taken here, once.
pub(super) fn failure(ctx: &mut RequestCtx<'_>, err: &ProxyError) -> Response<ProxyBody> {
    super::failure::record(ctx, err);
    ctx.shared
        .metrics
        .local_replies
        .get_or_create(&CodeLabel { code: err.code() })
        .inc();
    match ctx.grpc {
        Some(_) => crate::http::grpc::local_reply(err),
        None => crate::http::error::local_reply(err),
    }
}
