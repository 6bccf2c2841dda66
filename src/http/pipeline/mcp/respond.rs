//! The MCP hook of phase "respond": an MCP exchange's answer on its way down — the server's
//! session id wrapped, a `tools/list` answer filtered by the tool policy, an event stream freed
//! from the request timeout (and, for the legacy transport, its `endpoint` event pointed back at
//! egressd), and a POST's `200` watched for JSON-RPC server errors that outlier detection counts
//! like a 5xx.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Response;

use super::McpExchange;
use crate::balance::outlier::Outcome as OutlierOutcome;
use crate::http::body::{ProxyBody, StreamTimers, UpstreamBody};
use crate::http::budget;
use crate::http::deadline::Deadline;
use crate::http::error::ProxyError;
use crate::http::pipeline::answer::{clean_response_headers, upstream_response, Answered};
use crate::http::pipeline::ctx::RequestCtx;
use crate::http::pipeline::route::Routed;
use crate::mcp::errors::ErrorScan;
use crate::mcp::inspect::{self, ToolPolicy};
use crate::mcp::{legacy, McpPort};
use crate::snapshot::router::RouteEntry;
use crate::snapshot::shared::Shared;
use crate::snapshot::{BackendPort, Target};
use crate::upstream::breaker::Admission;
use crate::upstream::Endpoint;

impl McpExchange<'_> {
    /// Phase "respond" for an MCP exchange.
    pub(in crate::http::pipeline) async fn respond(
        self,
        ctx: &RequestCtx<'_>,
        routed: &Routed<'_>,
        mut answered: Answered,
        admission: Admission,
        deadline: Option<Deadline>,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let target = &**routed.target;
        let addr = answered.active.endpoint().addr;
        let headers = answered.response.headers_mut();
        self.port.outbound(&session_home(target, addr), headers);
        let verdict = (self.post && answered.response.status() == http::StatusCode::OK)
            .then(|| Verdict::new(ctx.shared, target, answered.active.endpoint()));
        if let Some(policy) = self
            .port
            .tools
            .as_ref()
            .filter(|_| ctx.mcp_method.as_deref() == Some("tools/list"))
        {
            // The body drives its HTTP/1.1 connection (`upstream::h1_conn`) as it is read; the
            // reading has its own idle limit.
            let Answered {
                response,
                lease,
                active,
                at,
            } = answered;
            let timers = StreamTimers::new(None, None, at);
            let response = response.map(|body| UpstreamBody::new(body, lease, active, timers));
            let place = (routed.entry, target, addr);
            return filtered_tools_list(ctx.shared, response, policy, place, verdict).await;
        }
        // An MCP event stream lives as long as the session needs it: only the stream idle
        // timeout ends it, not the request timeout.
        let event_stream = crate::mcp::is_event_stream(answered.response.headers());
        let deadline = deadline.filter(|_| !event_stream);
        let grpc = ctx.grpc.is_some();
        let response = upstream_response(answered, admission, target, routed.entry, deadline, grpc);
        let response = match verdict {
            Some(verdict) => watch_errors(response, verdict),
            None => response,
        };
        Ok(if self.port.legacy_sse && event_stream {
            announce_through_proxy(response, self.port, target, addr)
        } else {
            response
        })
    }
}

/// Where a session `endpoint` of `target` issues is at home.
fn session_home(target: &Target, endpoint: SocketAddr) -> crate::mcp::session::SessionHome {
    crate::mcp::session::SessionHome {
        backend: target.backend.label.to_string(),
        port: target.port.number,
        endpoint,
    }
}

/// A legacy event stream with its `endpoint` event rewritten so the client posts its messages
/// through egressd, pinned to `endpoint` (see `mcp::legacy`).
fn announce_through_proxy(
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
async fn filtered_tools_list(
    shared: &Shared,
    response: Response<UpstreamBody>,
    policy: &ToolPolicy,
    (entry, target, endpoint): (Option<&RouteEntry>, &Target, SocketAddr),
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
    clean_response_headers(&mut parts, entry);
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
struct Verdict {
    shared: Arc<Shared>,
    port: Arc<BackendPort>,
    backend: Arc<str>,
    endpoint: Arc<Endpoint>,
}

impl Verdict {
    fn new(shared: &Arc<Shared>, target: &Target, endpoint: &Arc<Endpoint>) -> Self {
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
fn watch_errors(response: Response<ProxyBody>, verdict: Verdict) -> Response<ProxyBody> {
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
