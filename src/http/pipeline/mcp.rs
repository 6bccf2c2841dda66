//! Phase "mcp" of the request lifecycle, for requests on the MCP path of a `protocol: MCP`
//! Backend: on the way in the version check and session affinity (`crate::mcp`), then a
//! bounded look at the JSON-RPC request (access log, metrics, tool policy); on the way out the
//! session id wrapped, `tools/list` filtered, event streams freed from the request timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};

use super::ctx::RequestCtx;
use crate::balance::outlier::Outcome as OutlierOutcome;
use crate::http::body::{ProxyBody, UpstreamBody};
use crate::http::budget;
use crate::http::error::ProxyError;
use crate::mcp::errors::ErrorScan;
use crate::mcp::inspect::{self, Call, Mirrored, ToolPolicy};
use crate::mcp::{legacy, McpPort};
use crate::snapshot::router::{RouteAction, RouteEntry};
use crate::snapshot::shared::Shared;
use crate::snapshot::{BackendPort, Target};
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
    Ok(Inbound::Forward(req, pinned))
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

/// Where a session `endpoint` of `target` issues is at home.
pub(super) fn session_home(
    target: &Target,
    endpoint: SocketAddr,
) -> crate::mcp::session::SessionHome {
    crate::mcp::session::SessionHome {
        backend: target.backend.label.to_string(),
        port: target.port.number,
        endpoint,
    }
}

/// A legacy event stream with its `endpoint` event rewritten so the client posts its messages
/// through egressd, pinned to `endpoint` (see `mcp::legacy`).
pub(super) fn announce_through_proxy(
    response: Response<ProxyBody>,
    mcp: &McpPort,
    target: &Target,
    endpoint: SocketAddr,
) -> Response<ProxyBody> {
    let key = mcp.key.clone();
    let home = session_home(target, endpoint);
    let rewrite: Rewrite =
        Box::new(move |announced: &str| legacy::rewrite_endpoint(announced, &key, &home));
    response.map(|inner| {
        ProxyBody::Stream(Box::pin(EndpointRewrite {
            inner,
            rewrite: legacy::EndpointEvent::new(rewrite),
            ended: false,
        }))
    })
}

type Rewrite = Box<dyn FnOnce(&str) -> String + Send>;

struct EndpointRewrite {
    inner: ProxyBody,
    rewrite: legacy::EndpointEvent<Rewrite>,
    ended: bool,
}

impl http_body::Body for EndpointRewrite {
    type Data = bytes::Bytes;
    type Error = crate::http::body::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if this.rewrite.done() {
                return std::pin::Pin::new(&mut this.inner).poll_frame(cx);
            }
            let frame = match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    this.ended = true;
                    let held = this.rewrite.finish();
                    if held.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(http_body::Frame::data(held.into()))));
                }
                other => return other,
            };
            match frame.into_data() {
                Ok(data) => {
                    let out = this.rewrite.feed(&data);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(http_body::Frame::data(out.into()))));
                    }
                }
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.rewrite.done() && self.inner.is_end_stream())
    }
}

/// A `tools/list` answer without the tools the policy denies. The body (JSON, or the event
/// stream a POST is answered with) is read whole, within `FILTER_LIMIT`, the buffer budget
/// (503 `overflow` past it: unfiltered it may not pass) and the stream idle timeout, filtered,
/// and sent with its new length. The body gives its HTTP/1.1 connection back to the pool when
/// it has been read whole.
pub(super) async fn filtered_tools_list(
    shared: &Shared,
    response: Response<UpstreamBody>,
    policy: &ToolPolicy,
    entry: Option<&RouteEntry>,
    target: &Target,
    endpoint: SocketAddr,
    verdict: Option<Verdict>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (mut parts, body) = response.into_parts();
    let endpoint_error = |cause: String| ProxyError::UpstreamProtocol {
        backend: target.backend.label.clone(),
        endpoint,
        cause,
    };
    let settings = shared.snapshot.load().settings.buffered_bodies;
    let mut reservation = shared.buffered_bodies.reservation(settings.budget);
    let idle = target.policy.stream_idle_timeout.unwrap_or(Duration::MAX);
    let limit = inspect::FILTER_LIMIT as u64;
    let bytes = match budget::collect(body, limit, &mut reservation, idle).await {
        Ok(bytes) => bytes,
        Err(budget::BufferError::Overflow) => {
            shared.metrics.buffered_body_overflow("refused");
            return Err(ProxyError::BufferOverflow {
                budget: settings.budget,
            });
        }
        Err(budget::BufferError::Timeout(t)) => {
            return Err(endpoint_error(format!(
                "tools/list answer not complete within {t:?}"
            )))
        }
        Err(e) => return Err(endpoint_error(format!("tools/list answer: {e}"))),
    };
    let event_stream = crate::mcp::is_event_stream(&parts.headers);
    if let Some(verdict) = verdict {
        let mut scan = ErrorScan::new(event_stream);
        scan.feed(&bytes);
        verdict.report(scan.finish());
    }
    let body = policy
        .filter_tools_list(&bytes, event_stream)
        .map_or(bytes, bytes::Bytes::from);
    super::respond::clean_response_headers(&mut parts, entry);
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts.headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body.len()),
    );
    Ok(Response::from_parts(parts, ProxyBody::local(body)))
}

/// How an MCP POST's `200` answer went, told to outlier detection once its JSON-RPC messages
/// have passed: a server error inside (see `mcp::errors`) counts like a 5xx, otherwise a
/// success.
pub(super) struct Verdict {
    shared: Arc<Shared>,
    port: Arc<BackendPort>,
    backend: Arc<str>,
    endpoint: Arc<Endpoint>,
}

impl Verdict {
    pub(super) fn new(shared: &Arc<Shared>, target: &Target, endpoint: &Arc<Endpoint>) -> Self {
        Verdict {
            shared: shared.clone(),
            port: target.port.clone(),
            backend: target.backend.label.clone(),
            endpoint: endpoint.clone(),
        }
    }

    fn report(self, server_error: bool) {
        let seen = if server_error {
            self.endpoint
                .note_failure("answered a JSON-RPC internal error (-32603) inside 200".into());
            OutlierOutcome::ServerError
        } else {
            OutlierOutcome::Success
        };
        if let Some(d) = self.port.endpoints.record(&self.endpoint, seen) {
            self.shared
                .metrics
                .outlier_detection(&self.backend, d.into());
        }
    }
}

/// `response` with its body watched for JSON-RPC server errors; the verdict is reported when
/// the body ends or is dropped (a client that went away: what passed is judged).
pub(super) fn watch_errors(response: Response<ProxyBody>, verdict: Verdict) -> Response<ProxyBody> {
    let event_stream = crate::mcp::is_event_stream(response.headers());
    response.map(|inner| {
        ProxyBody::Stream(Box::pin(ErrorWatch {
            inner,
            scan: ErrorScan::new(event_stream),
            verdict: Some(verdict),
        }))
    })
}

struct ErrorWatch {
    inner: ProxyBody,
    scan: ErrorScan,
    verdict: Option<Verdict>,
}

impl http_body::Body for ErrorWatch {
    type Data = bytes::Bytes;
    type Error = crate::http::body::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.scan.feed(data);
                    if this.scan.found() {
                        if let Some(verdict) = this.verdict.take() {
                            verdict.report(true);
                        }
                    }
                }
            }
            std::task::Poll::Ready(None) => {
                if let Some(verdict) = this.verdict.take() {
                    verdict.report(this.scan.finish());
                }
            }
            // The stream broke (a timeout, a reset): that failure is the upstream's story,
            // not the messages'.
            std::task::Poll::Ready(Some(Err(_))) => this.verdict = None,
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ErrorWatch {
    fn drop(&mut self) {
        if let Some(verdict) = self.verdict.take() {
            verdict.report(self.scan.finish());
        }
    }
}
