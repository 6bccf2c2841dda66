//! Phase "attempt": pick an endpoint, send, classify the result, record it (metrics, outlier
//! detection, the endpoint's last failure); after each failed attempt phase "retry" decides
//! whether another one is made.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::ctx::RequestCtx;
use super::exchange;
use super::prepare::Prepared;
use crate::balance::outlier::Outcome as OutlierOutcome;
use crate::http::error::ProxyError;
use crate::snapshot::shared::Shared;
use crate::snapshot::Target;
use crate::upstream::body::{Lease, RequestBody};
use crate::upstream::connect::ConnectError;
use crate::upstream::endpoint::ActiveRequest;
use crate::upstream::Endpoint;

/// The answer of the last attempt, with what it holds until the response ends.
pub(super) struct Answered {
    pub(super) response: Response<Incoming>,
    pub(super) lease: Lease,
    pub(super) endpoint: Arc<Endpoint>,
    /// Counts the request as in flight to `endpoint` until the response ends.
    pub(super) active: ActiveRequest,
}

/// What an HTTP request's attempts need besides the request.
pub(super) struct Plan<'p> {
    /// The endpoint an MCP session is pinned to: every attempt goes there.
    pub(super) pinned: Option<Arc<Endpoint>>,
    /// An MCP POST: its 200 is judged by the JSON-RPC messages in it once they have passed
    /// (`mcp::Verdict`), not here.
    pub(super) mcp_post: bool,
    /// When the whole exchange must be over, and the timeout that says so.
    pub(super) deadline: Option<(Instant, Duration)>,
    pub(super) target: &'p Target,
}

/// Phase "attempt" for an HTTP request, as often as phase "retry" allows.
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    plan: Plan<'_>,
    prepared: Prepared,
) -> Result<Answered, ProxyError> {
    let target = plan.target;
    let retry = target.policy.retry.as_ref();
    let mut req = prepared.req;
    if let Some(policy) = retry {
        req = super::retry::read_ahead(ctx.shared, req, policy.replay_body_limit).await?;
    }
    let mut retries = 0u32;
    let mut retry_slot = None;
    let mut previous: Option<Arc<Endpoint>> = None;
    loop {
        // A copy to send again, taken only while a retry is possible.
        let replay = retry
            .filter(|r| retries < r.num_retries)
            .and_then(|_| exchange::replayable_copy(&req));
        let endpoint = match &plan.pinned {
            // A session stays where it began, retries included.
            Some(endpoint) => endpoint.clone(),
            None => pick_avoiding(target, previous.as_ref(), prepared.hash).await?,
        };
        let deadline = attempt_deadline(&plan, retry.and_then(|r| r.per_try_timeout));
        // One attempt. Sent from here rather than from an `async fn` of its own: every level
        // of futures is one more copy of the ones below it per request.
        let started = Started::now(ctx, &endpoint);
        let sent = if ctx.timed() {
            let (sent, connected) = timed_send(target, &endpoint, req, deadline).await;
            note_timing(ctx, &endpoint, &sent, connected);
            sent
        } else {
            exchange::send(target, &endpoint, req, deadline).await
        };
        let active = started.finish(ctx, &plan, &endpoint, &sent);
        if let (Some(policy), Some(next)) = (retry, replay) {
            if let Some(slot) =
                super::retry::decide(ctx, target, policy, &sent, &next, plan.deadline)
            {
                // Held until the retried attempt has its answer (the next round).
                retry_slot = Some(slot);
                retries += 1;
                tracing::debug!(backend = %target.backend.label, endpoint = %endpoint.addr, retries, "retrying");
                drop(sent);
                drop(active);
                super::retry::back_off(policy, retries).await;
                req = next;
                previous = Some(endpoint);
                continue;
            }
        }
        drop(retry_slot);
        let (response, lease) = sent?;
        return Ok(Answered {
            response,
            lease,
            endpoint,
            active,
        });
    }
}

/// What an attempt's start knows: the request counts as in flight to its endpoint, and when
/// it was sent.
struct Started {
    active: ActiveRequest,
    at: Instant,
}

/// What [`timed_send`] gives: the attempt's result and, when it opened a connection, how long
/// that took.
type TimedSent = (
    Result<(Response<Incoming>, Lease), ProxyError>,
    Option<Duration>,
);

impl Started {
    fn now(ctx: &mut RequestCtx<'_>, endpoint: &Arc<Endpoint>) -> Self {
        ctx.upstream.endpoint = Some(endpoint.addr);
        ctx.upstream.attempts += 1;
        Started {
            // Counted from now, not from the response headers: least-request balancing must
            // see the requests still waiting for an answer (a slow endpoint's pile-up is the
            // signal).
            active: endpoint.start_request(),
            at: Instant::now(),
        }
    }

    /// The attempt is over: classified and recorded (metrics, outlier detection, the
    /// endpoint's last failure). The request stays in flight until the response ends.
    fn finish(
        self,
        ctx: &RequestCtx<'_>,
        plan: &Plan<'_>,
        endpoint: &Endpoint,
        sent: &Result<(Response<Incoming>, Lease), ProxyError>,
    ) -> ActiveRequest {
        let target = plan.target;
        count(ctx.shared, target, sent, self.at);
        // An MCP POST's 200 is judged by the JSON-RPC messages in it, once they have passed.
        let seen = match sent {
            Ok((response, _)) if plan.mcp_post && response.status() == http::StatusCode::OK => None,
            Ok((response, _)) => Some(OutlierOutcome::of_status(response.status().as_u16())),
            Err(e) => e.outlier_outcome(),
        };
        if let Some(seen) = seen {
            record(ctx.shared, target, endpoint, seen);
        }
        match sent {
            Err(e) if e.endpoint().is_some() => endpoint.note_failure(format!("{}: {e}", e.code())),
            Ok((response, _)) if response.status().is_server_error() => {
                endpoint.note_failure(format!("answered {}", response.status()))
            }
            _ => {}
        }
        self.active
    }
}

/// What the access log learns of a timed attempt.
fn note_timing(
    ctx: &mut RequestCtx<'_>,
    endpoint: &Endpoint,
    sent: &Result<(Response<Incoming>, Lease), ProxyError>,
    connected: Option<Duration>,
) {
    ctx.upstream.connect = connected;
    ctx.upstream.tls = endpoint.tls();
    if sent.is_ok() {
        ctx.upstream.ttfb = Some(ctx.started.elapsed());
    }
}

/// An attempt of a request that is logged: also whether it opened a connection, and how long
/// that took. Boxed: only requests that are logged carry the larger future.
fn timed_send<'a>(
    target: &'a Target,
    endpoint: &'a Arc<Endpoint>,
    req: Request<RequestBody>,
    deadline: Option<(Instant, Duration)>,
) -> std::pin::Pin<Box<impl std::future::Future<Output = TimedSent> + Send + 'a>> {
    let new_connection = &exchange::NEW_CONNECTION;
    Box::pin(
        new_connection.scope(std::cell::Cell::new(None), async move {
            let sent = exchange::send(target, endpoint, req, deadline).await;
            (sent, new_connection.with(std::cell::Cell::get))
        }),
    )
}

/// The Backend's request metrics, its connect failures, or its failures after connecting.
fn count(
    shared: &Shared,
    target: &Target,
    sent: &Result<(Response<Incoming>, Lease), ProxyError>,
    sent_at: Instant,
) {
    match sent {
        Ok((response, _)) => target
            .backend
            .stats(&shared.metrics)
            .responses
            .record(response.status().as_u16(), sent_at.elapsed()),
        Err(e) if e.class().connect_failure => {
            target
                .backend
                .stats(&shared.metrics)
                .connect_failed(e.code());
        }
        Err(e) => target.backend.stats(&shared.metrics).failed(e.code()),
    }
}

/// An attempt's deadline: the request's, or the per-try timeout's when that comes first.
fn attempt_deadline(plan: &Plan<'_>, per_try: Option<Duration>) -> Option<(Instant, Duration)> {
    match per_try {
        Some(t) => {
            let per_try = (Instant::now() + t, t);
            Some(
                plan.deadline
                    .map_or(per_try, |d| if d.0 <= per_try.0 { d } else { per_try }),
            )
        }
        None => plan.deadline,
    }
}

/// When the whole exchange must be over, and the timeout that says so: the request timeout,
/// or a gRPC client's own deadline (`grpc-timeout`) when that comes first.
pub(super) fn request_deadline(
    ctx: &RequestCtx<'_>,
    target: &Target,
) -> Option<(Instant, Duration)> {
    let shortest = match (
        target.policy.request_timeout,
        ctx.grpc.and_then(|g| g.timeout),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    shortest.map(|t| (ctx.started + t, t))
}

/// Outlier detection learns how `endpoint` did.
pub(crate) fn record(shared: &Shared, target: &Target, endpoint: &Endpoint, seen: OutlierOutcome) {
    if let Some(d) = target.port.endpoints.record(endpoint, seen) {
        shared
            .metrics
            .outlier_detection(&target.backend.label, d.into());
    }
}

/// The request's consistent-hash key hashed, when the Backend balances by one (nothing is
/// computed for the other balancers).
pub(super) fn request_hash(
    ctx: &RequestCtx<'_>,
    target: &Target,
    headers: &http::HeaderMap,
) -> Option<u64> {
    target
        .port
        .endpoints
        .hash_key()?
        .hash(headers, ctx.conn.client.ip())
}

/// Picks an endpoint. A DNS Backend that has not resolved yet is waited for (bounded by the
/// connect timeout) rather than failed. `hash`: the request's consistent-hash key hashed (see
/// [`request_hash`]).
pub(crate) async fn pick(target: &Target, hash: Option<u64>) -> Result<Arc<Endpoint>, ProxyError> {
    let group = &target.port.endpoints;
    if !group.is_resolved() {
        group.wait_resolved(target.policy.connect_timeout).await;
    }
    group.pick(hash).ok_or_else(|| {
        let list = group.list();
        if list.address_denied {
            return ProxyError::DestinationAddressDenied {
                backend: target.backend.label.clone(),
                detail: list.last_error.clone().unwrap_or_default(),
            };
        }
        let detail = match &list.last_error {
            Some(e) => format!(": {e}"),
            None if !list.resolved => ": DNS resolution has not finished".to_owned(),
            None => String::new(),
        };
        ProxyError::NoHealthyUpstream {
            backend: target.backend.label.clone(),
            detail,
        }
    })
}

/// For a retry: another endpoint than the one that just failed, when the group has one.
async fn pick_avoiding(
    target: &Target,
    previous: Option<&Arc<Endpoint>>,
    hash: Option<u64>,
) -> Result<Arc<Endpoint>, ProxyError> {
    let mut endpoint = pick(target, hash).await?;
    if let Some(previous) = previous {
        for attempt in 1..=3u64 {
            if !Arc::ptr_eq(&endpoint, previous) {
                break;
            }
            // The same hash would find the same endpoint: move it far away, as Envoy's Maglev
            // does for retries (most bits flipped).
            let moved = hash.map(|h| h ^ (u64::MAX - attempt + 1));
            endpoint = pick(target, moved).await?;
        }
    }
    Ok(endpoint)
}

/// The reply for a failed connection attempt.
pub(crate) fn connect_error(
    e: &ConnectError,
    backend: &Arc<str>,
    endpoint: SocketAddr,
) -> ProxyError {
    match e {
        ConnectError::Timeout { timeout, .. } => ProxyError::ConnectTimeout {
            backend: backend.clone(),
            endpoint,
            timeout: *timeout,
        },
        ConnectError::Tls {
            failure, detail, ..
        } => ProxyError::UpstreamTls {
            backend: backend.clone(),
            endpoint,
            failure: *failure,
            detail: detail.clone(),
        },
        ConnectError::NotHttp2 { .. } => ProxyError::UpstreamProtocol {
            backend: backend.clone(),
            endpoint,
            cause: e.to_string(),
        },
        ConnectError::Io { source, .. } => ProxyError::ConnectFailure {
            backend: backend.clone(),
            endpoint,
            cause: source.to_string(),
        },
        other => ProxyError::ConnectFailure {
            backend: backend.clone(),
            endpoint,
            cause: other.to_string(),
        },
    }
}
