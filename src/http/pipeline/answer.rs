//! What every upstream answer goes through on its way down, whatever asked for it (a request,
//! a websocket handshake, an MCP exchange): hop-by-hop headers removed, `Via` added, the
//! route's ResponseHeaderModifier applied, and the body streamed under the remaining timeouts.

use http::{Response, Version};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use tokio::time::Instant;

use crate::http::body::{ProxyBody, StreamTimers, UpstreamBody};
use crate::http::deadline::Deadline;
use crate::http::headers::{append_via, strip_hop_by_hop};
use crate::snapshot::router::RouteEntry;
use crate::snapshot::Target;
use crate::upstream::body::Lease;
use crate::upstream::breaker::Admission;
use crate::upstream::endpoint::ActiveRequest;

/// The answer of the last attempt, with what it holds until the response ends.
pub(super) struct Answered {
    pub(super) response: Response<Incoming>,
    pub(super) lease: Lease,
    /// Counts the request as in flight to its endpoint until the response ends.
    pub(super) active: ActiveRequest,
    /// When the response headers came: the body's idle timer starts there.
    pub(super) at: Instant,
}

/// `answered` on its way down: headers cleaned and filtered, body streamed with the remaining
/// timeouts, holding the request's circuit-breaker `admission` until it ends. `grpc`: a gRPC
/// call, whose body ends with status trailers when a limit cuts it.
#[inline]
pub(super) fn upstream_response(
    answered: Answered,
    admission: Admission,
    target: &Target,
    entry: Option<&RouteEntry>,
    deadline: Option<Deadline>,
    grpc: bool,
) -> Response<ProxyBody> {
    let Answered {
        response,
        lease,
        active,
        at,
    } = answered;
    let (mut parts, body) = response.into_parts();
    clean_response_headers(&mut parts, entry);
    let body = UpstreamBody::new(
        body,
        lease,
        active.holding(admission),
        StreamTimers::new(target.policy.stream_idle_timeout, deadline, at),
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
    standard_reason_for_an_empty_one(parts);
    if let Some(entry) = entry {
        entry
            .action
            .filters
            .response_headers
            .apply(&mut parts.headers);
    }
}

/// httparse gives a reason phrase with non-ASCII bytes (obs-text, RFC 9112 §4) as empty, and
/// hyper would send that empty phrase on: the client gets the standard phrase of the code
/// instead (an unknown code keeps the empty one, which RFC 9112 allows).
fn standard_reason_for_an_empty_one(parts: &mut http::response::Parts) {
    let empty = parts
        .extensions
        .get::<ReasonPhrase>()
        .is_some_and(|reason| reason.as_bytes().is_empty());
    if empty && parts.status.canonical_reason().is_some() {
        parts.extensions.remove::<ReasonPhrase>();
    }
}
