//! The retry policy's decision: whether a failed attempt is sent again, and how long to wait
//! first; and the read-ahead that makes a small body replayable.
//!
//! Safe means: the request can be replayed (no body, or a body of known length within
//! `replayBodyLimit`, read ahead before the first attempt), and either the upstream provably did not
//! process it (connect failure) or the method is idempotent (RFC 9110 §9.2.2) for failures
//! after the request may have arrived (reset, per-try timeout, 502/503/504, listed statuses).
//! A retry never happens after response bytes went downstream: the decision is taken on the
//! response headers, before anything is sent to the client.

use std::time::Duration;

use http::{Method, Request, Response};
use hyper::body::Incoming;

use super::unprocessed::is_idempotent;
use crate::http::budget::Buffered;
use crate::http::deadline::Deadline;
use crate::http::error::{ProxyError, RetryOn};
use crate::http::pipeline::ctx::RequestCtx;
use crate::snapshot::shared::Shared;
use crate::snapshot::{RetryPolicy, Target};
use crate::upstream::body::{Lease, RequestBody};
use crate::upstream::breaker::RetrySlot;

/// Whether the attempt that gave `sent` is made again (as `next`), holding the circuit
/// breaker's retry slot it needs. Only what the policy names, only when it is safe, only while
/// time is left.
pub(super) fn decide(
    ctx: &RequestCtx<'_>,
    target: &Target,
    policy: &RetryPolicy,
    sent: &Result<(Response<Incoming>, Lease), ProxyError>,
    next: &Request<RequestBody>,
    deadline: Option<Deadline>,
) -> Option<RetrySlot> {
    let time_left = deadline.is_none_or(|d| !d.passed());
    if !(time_left && should_retry(policy, sent, next.method())) {
        return None;
    }
    let metrics = &ctx.shared.metrics;
    match target.port.endpoints.breaker().admit_retry() {
        Ok(slot) => {
            target.backend.stats(metrics).retried();
            Some(slot)
        }
        Err(limit) => {
            // The circuit breaker's retry limit: this attempt's answer is final.
            metrics.overflow(&target.backend.label, limit.as_str());
            None
        }
    }
}

fn should_retry(
    policy: &RetryPolicy,
    attempt: &Result<(Response<Incoming>, Lease), ProxyError>,
    method: &Method,
) -> bool {
    let idempotent = is_idempotent(method);
    match attempt {
        Err(e) => match e.class().retry {
            RetryOn::ConnectFailure => policy.connect_failure,
            RetryOn::Reset => policy.reset && idempotent,
            RetryOn::Timeout => policy.gateway_error && idempotent,
            RetryOn::Never => false,
        },
        Ok((response, _)) => {
            let status = response.status().as_u16();
            let http = idempotent
                && ((policy.gateway_error && (502..=504).contains(&status))
                    || policy.status_codes.contains(&status));
            http || grpc_retriable(policy, response)
        }
    }
}

/// A gRPC error the policy names, in a trailers-only response (the status in the headers:
/// nothing of the response has streamed, so the call can be made again). gRPC calls are all
/// POSTs: as in Envoy, naming a gRPC status is the operator's statement that the call is safe
/// to repeat, whatever the method.
fn grpc_retriable(policy: &RetryPolicy, response: &Response<Incoming>) -> bool {
    if policy.grpc_statuses.is_empty() {
        return false;
    }
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|code| policy.grpc_statuses.contains(&code))
}

/// Fully jittered exponential backoff: retry `n` (1-based) waits a random time up to
/// `min(base × 2^(n-1), max)`, so retries of many clients spread out instead of arriving
/// together.
pub(super) async fn back_off(policy: &RetryPolicy, retry: u32) {
    let ceiling = policy
        .backoff_base
        .saturating_mul(1u32 << (retry.saturating_sub(1)).min(16))
        .min(policy.backoff_max);
    let wait = Duration::from_micros(fastrand::u64(..=ceiling.as_micros() as u64));
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

/// Reads a small request body ahead (its declared length within `limit`), so the request can
/// be sent again. Bodies without a known length, or larger, stream as usual and are sent once;
/// so does a body the buffer budget has no room for (`http::budget`).
pub(super) async fn read_ahead(
    shared: &Shared,
    req: Request<RequestBody>,
    limit: u64,
) -> Result<Request<RequestBody>, ProxyError> {
    let fits = matches!(req.body(), RequestBody::Client(..))
        && http_body::Body::size_hint(req.body())
            .exact()
            .is_some_and(|len| len <= limit);
    if !fits {
        return Ok(req);
    }
    let (parts, body) = req.into_parts();
    let body = match crate::http::budget::buffer_request_body(shared, body, limit).await {
        Ok(Buffered::Whole(body) | Buffered::NoRoom(body)) => body,
        Err(e) => return Err(e.into_proxy_error(shared)),
    };
    Ok(Request::from_parts(parts, body))
}
