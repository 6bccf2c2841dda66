//! MCP as hooks the generic phases call, for exchanges with the MCP path of a `protocol: MCP`
//! Backend; the phases themselves know nothing of MCP:
//!
//! - route: [`session_target`] — a request of a session goes to the backendRef that issued it;
//! - on the way in: [`inbound`] — the version check and session affinity (`crate::mcp`), then
//!   a bounded look at the JSON-RPC request (access log, metrics, tool policy);
//! - respond: [`McpExchange::respond`] (`respond.rs`) — the session id wrapped, `tools/list`
//!   filtered, event streams freed from the request timeout, errors inside a `200` judged.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};

mod respond;

use super::ctx::RequestCtx;
use crate::http::body::ProxyBody;
use crate::http::budget;
use crate::http::error::ProxyError;
use crate::mcp::inspect::{self, Call, Mirrored};
use crate::mcp::{legacy, McpPort};
use crate::ratelimit::rules::{McpCall, RateLimitPolicy};
use crate::snapshot::router::RouteAction;
use crate::snapshot::shared::Shared;
use crate::snapshot::Target;
use crate::telemetry::access_log;
use crate::telemetry::metrics::{BackendLabel, BackendReasonLabel};
use crate::upstream::body::RequestBody;
use crate::upstream::Endpoint;

/// An exchange with an MCP Backend's endpoint path: what the way back needs to know.
#[derive(Clone, Copy)]
pub(super) struct McpExchange<'t> {
    pub(super) port: &'t McpPort,
    /// A POST (JSON-RPC messages in the body, judged by `Verdict` on the way back).
    pub(super) post: bool,
}

impl<'t> McpExchange<'t> {
    /// Set when `req` goes to the MCP path of an MCP Backend.
    pub(super) fn of(target: &'t Target, req: &Request<RequestBody>) -> Option<Self> {
        let port = target
            .port
            .mcp
            .as_deref()
            .filter(|m| m.applies_to(req.uri()))?;
        Some(McpExchange {
            port,
            post: req.method() == Method::POST,
        })
    }
}

/// What phase "mcp" decided about a request.
pub(super) enum Inbound {
    /// Send it on; to this endpoint when its session is pinned there.
    Forward(Request<RequestBody>, Option<Arc<Endpoint>>),
    /// egressd answers itself (a denied tool call, headers that contradict the body).
    Reply(Response<ProxyBody>),
}

/// Phase "mcp" on the way in.
pub(super) async fn inbound(
    ctx: &mut RequestCtx<'_>,
    mcp: &McpPort,
    target: &Target,
    mut req: Request<RequestBody>,
) -> Result<Inbound, ProxyError> {
    let shared = ctx.shared;
    let pinned = match legacy_pinned_endpoint(mcp, target, &mut req)? {
        Some(endpoint) => Some(endpoint),
        None => pinned_endpoint(mcp, target, req.headers_mut())?,
    };
    if req.method() != Method::POST {
        return Ok(Inbound::Forward(req, pinned));
    }
    let backend = &target.backend.label;
    let mirrored =
        Mirrored::from_headers(req.headers()).map_err(|reason| ProxyError::McpHeaderMismatch {
            backend: backend.clone(),
            reason,
        })?;
    let req = read_body(shared, req, mcp.tools.is_some(), target).await?;
    let calls = match req.body() {
        RequestBody::Buffered(Some(body), _) => inspect::calls(body),
        _ => mirrored.as_call().into_iter().collect(),
    };
    if let ([call], false) = (calls.as_slice(), mirrored.is_empty()) {
        if let Some(reason) = mirrored.contradiction(call) {
            // Per request and the client's doing: the access log line carries the code.
            tracing::debug!(%backend, %reason, "MCP headers contradict the body");
            ctx.local_error = Some("mcp_header_mismatch");
            let body = inspect::header_mismatch_reply(call.id.as_ref(), &reason);
            return Ok(Inbound::Reply(json_reply(
                StatusCode::BAD_REQUEST,
                body,
                "mcp_header_mismatch",
            )));
        }
    }
    if let Some(first) = calls.first() {
        // Names from the body, for the access log: bounded like every client text there.
        ctx.mcp_method = first.method.as_deref().map(access_log::clipped);
        ctx.mcp_tool = first.tool.as_deref().map(access_log::clipped);
    }
    for call in &calls {
        let method = call
            .method
            .as_deref()
            .map_or("other", inspect::method_label);
        shared
            .metrics
            .mcp_requests
            .get_or_create(&BackendReasonLabel {
                backend: backend.to_string(),
                reason: method,
            })
            .inc();
        if let Some(tool) = &call.tool {
            shared.metrics.mcp_tool_call(backend, tool);
        }
    }
    if let Some(reply) = refused_tool_call(shared, mcp, target, &calls) {
        ctx.local_error = Some("mcp_tool_denied");
        return Ok(Inbound::Reply(reply));
    }
    if let Some(rules) = target.policy.rate_limit.as_ref().filter(|r| r.0.mcp) {
        if let Some(reply) = Box::pin(rate_limited(ctx, &rules.0, mcp, &req, &calls)).await? {
            return Ok(Inbound::Reply(reply));
        }
    }
    Ok(Inbound::Forward(req, pinned))
}

/// Phase "limit" for an MCP POST, once per JSON-RPC call of its body (once for a body egressd
/// could not read): the answer to the first call over a limit, as a JSON-RPC error.
async fn rate_limited(
    ctx: &mut RequestCtx<'_>,
    rules: &Arc<RateLimitPolicy>,
    mcp: &McpPort,
    req: &Request<RequestBody>,
    calls: &[Call],
) -> Result<Option<Response<ProxyBody>>, ProxyError> {
    fn request<'r>(
        req: &'r Request<RequestBody>,
        call: Option<&'r Call>,
    ) -> super::limit::Request<'r> {
        super::limit::Request {
            method: req.method().as_str(),
            path: req.uri().path(),
            headers: Some(req.headers()),
            mcp: Some(McpCall {
                method: call.and_then(|c| c.method.as_deref()),
                tool: call.and_then(|c| c.tool.as_deref()),
            }),
        }
    }
    let judged: Vec<Option<&Call>> = if calls.is_empty() {
        vec![None]
    } else {
        calls.iter().map(Some).collect()
    };
    for call in judged {
        match super::limit::phase(ctx, rules, request(req, call)).await {
            Ok(()) => {}
            Err(err @ ProxyError::RateLimited { .. }) => {
                ctx.local_error = Some("rate_limited");
                let id = call.and_then(|c| c.id.as_ref());
                let retry = match &err {
                    ProxyError::RateLimited { reset, .. } => {
                        crate::http::error::retry_after_secs(*reset)
                    }
                    _ => 1,
                };
                let body = inspect::rate_limited_reply(id, &format!("egressd: {err}"), retry);
                // The legacy transport answers on its event stream: a refused POST must fail
                // as a request there (as a denied tool call does).
                let status = if mcp.legacy_sse {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    StatusCode::OK
                };
                let mut reply = json_reply(status, body, "rate_limited");
                crate::http::error::rate_limit_headers(&err, reply.headers_mut());
                return Ok(Some(reply));
            }
            Err(err) => return Err(err),
        }
    }
    Ok(None)
}

/// Reads an MCP POST's body for inspection when it fits [`inspect::BODY_LIMIT`]. A tool policy
/// needs every body: one without a declared length is read up to the limit, and a body over
/// it is refused (413) rather than let through unchecked. Without a policy, bodies of unknown
/// or larger size stream on uninspected (the headers, when sent, still name the call), and so
/// does a body the buffer budget has no room for (`http::budget`); with a policy, that is 503
/// `overflow`.
async fn read_body(
    shared: &Shared,
    req: Request<RequestBody>,
    policy: bool,
    target: &Target,
) -> Result<Request<RequestBody>, ProxyError> {
    let size = http_body::Body::size_hint(req.body()).exact();
    let too_large = || ProxyError::McpBodyTooLarge {
        backend: target.backend.label.clone(),
        limit: inspect::BODY_LIMIT,
    };
    match (req.body(), size) {
        (RequestBody::Client(..), Some(len)) if len <= inspect::BODY_LIMIT => {}
        (RequestBody::Client(..), Some(_)) if policy => return Err(too_large()),
        (RequestBody::Client(..), None) if policy => {}
        _ => return Ok(req),
    }
    let (parts, body) = req.into_parts();
    let body = match budget::buffer_request_body(shared, body, inspect::BODY_LIMIT).await {
        Ok(budget::Buffered::Whole(body)) => body,
        Ok(budget::Buffered::NoRoom(_)) if policy => {
            return Err(budget::BufferError::Overflow.into_proxy_error(shared))
        }
        Ok(budget::Buffered::NoRoom(body)) => body,
        Err(budget::BufferError::TooLarge(_)) => return Err(too_large()),
        Err(e) => return Err(e.into_proxy_error(shared)),
    };
    Ok(Request::from_parts(parts, body))
}

/// The answer to the first call of `calls` the tool policy denies, if one does.
fn refused_tool_call(
    shared: &Shared,
    mcp: &McpPort,
    target: &Target,
    calls: &[Call],
) -> Option<Response<ProxyBody>> {
    let policy = mcp.tools.as_ref()?;
    let (call, tool) = calls
        .iter()
        .find_map(|c| Some((c, c.tool.as_deref().filter(|t| !policy.permits(t))?)))?;
    // Counted (egressd_mcp_tool_calls_denied_total) and in the access log; a line per call
    // at info would let a client fill the log.
    tracing::debug!(backend = %target.backend.label, tool = %access_log::clipped(tool), "MCP tool call denied by policy");
    shared
        .metrics
        .mcp_tools_denied
        .get_or_create(&BackendLabel {
            backend: target.backend.label.to_string(),
        })
        .inc();
    // As a server answers an unknown tool: the client learns nothing about what is hidden.
    let body = inspect::denied_reply(call.id.as_ref(), tool);
    // The legacy transport answers on its event stream, never on the POST: a refused POST
    // must fail as a request, or the client would wait for an answer that never comes.
    let status = if mcp.legacy_sse {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::OK
    };
    Some(json_reply(status, body, "mcp_tool_denied"))
}

/// A JSON-RPC message egressd answers with, marked with its `x-egressd-error` code.
fn json_reply(status: StatusCode, body: Vec<u8>, code: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::local(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        crate::http::error::ERROR_HEADER,
        http::HeaderValue::from_static(code),
    );
    response
}

/// Phase "route" for MCP sessions: the backendRef of `action` that issued the request's
/// session (`Mcp-Session-Id`, or a legacy message URL's session), whatever the route's
/// weights: a session stays where it began. None for a request without a session id egressd
/// wrapped, or with one it cannot read (phase "mcp" answers that with 404); 404 when the
/// Backend port that issued it is no longer in the route.
pub(super) fn session_target<'a, B>(
    key: &crate::mcp::session::SessionKey,
    req: &Request<B>,
    action: &'a RouteAction,
) -> Result<Option<&'a Arc<Target>>, ProxyError> {
    let stateful = |t: &Arc<Target>| t.port.mcp.as_ref().is_some_and(|m| m.stateful);
    if !action
        .backends
        .iter()
        .chain(&action.fallbacks)
        .any(|b| stateful(&b.target))
    {
        return Ok(None);
    }
    let home = match req.headers().get(&crate::mcp::SESSION_ID) {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| key.unwrap(v).ok())
            .map(|(home, _)| home),
        None => req
            .uri()
            .path_and_query()
            .filter(|pq| {
                pq.query()
                    .is_some_and(crate::mcp::session::mentions_wrapped)
            })
            .and_then(|pq| legacy::unwrap_request(pq.as_str(), key).ok().flatten())
            .map(|(home, _)| home),
    };
    let Some(home) = home else {
        return Ok(None);
    };
    match action.target_of(&home.backend, home.port) {
        Some(target) => Ok(Some(target)),
        None => Err(ProxyError::McpSessionNotFound {
            backend: home.backend.as_str().into(),
            reason: format!(
                "Backend {} port {} that issued it is no longer a backend of {}",
                home.backend, home.port, action.name
            ),
        }),
    }
}

/// The endpoint an MCP request's session is pinned to, with the client's session id replaced
/// by the server's. A session whose endpoint is gone, ejected or unhealthy gets 404, so that
/// the client initializes a new one (MCP's rule for unknown sessions).
fn pinned_endpoint(
    mcp: &McpPort,
    target: &Target,
    headers: &mut http::HeaderMap,
) -> Result<Option<Arc<Endpoint>>, ProxyError> {
    let backend = &target.backend.label;
    let addr = match mcp.inbound(backend, target.port.number, headers) {
        Ok(None) => return Ok(None),
        Ok(Some(addr)) => addr,
        Err(crate::mcp::Refusal::SessionNotFound(reason)) => {
            return Err(ProxyError::McpSessionNotFound {
                backend: backend.clone(),
                reason,
            })
        }
        Err(crate::mcp::Refusal::ProtocolVersion { expected, got }) => {
            return Err(ProxyError::McpProtocolVersion {
                backend: backend.clone(),
                expected,
                got,
            })
        }
    };
    session_endpoint(target, addr).map(Some)
}

/// The endpoint that issued a session, if it can still take its requests; else 404 saying
/// why not (gone from the config, ejected, unhealthy).
fn session_endpoint(target: &Target, addr: SocketAddr) -> Result<Arc<Endpoint>, ProxyError> {
    target
        .port
        .endpoints
        .routable(addr)
        .map_err(|why| ProxyError::McpSessionNotFound {
            backend: target.backend.label.clone(),
            reason: format!("endpoint {addr} that issued it {}", why.as_str()),
        })
}

/// For the legacy transport: the endpoint a message URL's wrapped session is pinned to, with
/// the server's own session value put back into the query.
fn legacy_pinned_endpoint(
    mcp: &McpPort,
    target: &Target,
    req: &mut Request<RequestBody>,
) -> Result<Option<Arc<Endpoint>>, ProxyError> {
    if !mcp.legacy_sse {
        return Ok(None);
    }
    let Some(path_and_query) = req.uri().path_and_query() else {
        return Ok(None);
    };
    let backend = &target.backend.label;
    let refused = |reason: String| ProxyError::McpSessionNotFound {
        backend: backend.clone(),
        reason,
    };
    let (home, restored) = match legacy::unwrap_request(path_and_query.as_str(), &mcp.key) {
        Ok(None) => return Ok(None),
        Ok(Some(found)) => found,
        Err(e) => return Err(refused(format!("the session is {}", e.as_str()))),
    };
    if let Err(crate::mcp::Refusal::SessionNotFound(reason)) =
        home.issued_by(backend, target.port.number)
    {
        return Err(refused(reason));
    }
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(
        restored
            .parse()
            .map_err(|_| ProxyError::InvalidRequest("malformed MCP session query".into()))?,
    );
    *req.uri_mut() = http::Uri::from_parts(parts)
        .map_err(|_| ProxyError::InvalidRequest("malformed MCP session query".into()))?;
    session_endpoint(target, home.endpoint).map(Some)
}
