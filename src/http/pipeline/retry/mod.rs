//! Phase "retry": an HTTP request's attempts, as often as the retry policy allows. One unit:
//! the loop (here), the policy's decision, backoff and read-ahead budget (`policy`), and what
//! the upstream provably did not process, which is sent again within an attempt whatever the
//! policy (`unprocessed`, asked by the exchange). Each attempt is the same [`Attempt`] every
//! kind of traffic records.

mod policy;
pub(super) mod unprocessed;

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::answer::Answered;
use super::attempt::{pick, Attempt, Outcome};
use super::ctx::RequestCtx;
use super::exchange;
use super::prepare::Prepared;
use crate::http::deadline::Deadline;
use crate::http::error::ProxyError;
use crate::snapshot::Target;
use crate::upstream::body::Lease;
use crate::upstream::Endpoint;

/// What an HTTP request's attempts need besides the request.
pub(super) struct Plan<'p> {
    /// The endpoint an MCP session is pinned to: every attempt goes there.
    pub(super) pinned: Option<Arc<Endpoint>>,
    /// An MCP POST: its 200 is judged by the JSON-RPC messages in it once they have passed
    /// (`mcp::Verdict`), not here.
    pub(super) mcp_post: bool,
    /// When the whole exchange must be over.
    pub(super) deadline: Option<Deadline>,
    pub(super) target: &'p Target,
}

/// Phase "retry": attempts until one is final (answered, or failed in a way the policy does
/// not retry, or out of retries, time or retry budget).
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    plan: Plan<'_>,
    prepared: Prepared,
) -> Result<Answered, ProxyError> {
    let target = plan.target;
    let retry = target.policy.retry.as_ref();
    let mut req = prepared.req;
    if let Some(policy) = retry {
        req = policy::read_ahead(ctx.shared, req, policy.replay_body_limit).await?;
    }
    let mut retries = 0u32;
    let mut retry_slot = None;
    let mut previous: Option<Arc<Endpoint>> = None;
    loop {
        // A copy to send again, taken only while a retry is possible.
        let replay = retry
            .filter(|r| retries < r.num_retries)
            .and_then(|_| unprocessed::replayable_copy(&req));
        let endpoint = match &plan.pinned {
            // A session stays where it began, retries included.
            Some(endpoint) => endpoint.clone(),
            None => pick_avoiding(target, previous.as_ref(), prepared.hash).await?,
        };
        let deadline = attempt_deadline(&plan, retry.and_then(|r| r.per_try_timeout));
        // One attempt. Sent from here rather than from an `async fn` of its own: every level
        // of futures is one more copy of the ones below it per request.
        let attempt = Attempt::start(ctx, &endpoint);
        let mut connected = None;
        let sent = exchange::send(
            target,
            &endpoint,
            req,
            deadline,
            attempt.started(),
            &mut connected,
        )
        .await;
        // The clock read once for the attempt's end, the access log and the response body.
        let answered_at = Instant::now();
        if ctx.timed() {
            note_timing(ctx, &endpoint, &sent, connected, answered_at);
        }
        let active = attempt.finish(
            ctx.shared,
            target,
            Outcome::of_exchange(&sent, plan.mcp_post),
            answered_at,
        );
        if let (Some(policy), Some(next)) = (retry, replay) {
            if let Some(slot) = policy::decide(ctx, target, policy, &sent, &next, plan.deadline) {
                // Held until the retried attempt has its answer (the next round).
                retry_slot = Some(slot);
                retries += 1;
                tracing::debug!(backend = %target.backend.label, endpoint = %endpoint.addr, retries, "retrying");
                drop(sent);
                drop(active);
                policy::back_off(policy, retries).await;
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
            active,
            at: answered_at,
        });
    }
}

/// What the access log learns of an attempt.
fn note_timing(
    ctx: &mut RequestCtx<'_>,
    endpoint: &Endpoint,
    sent: &Result<(Response<Incoming>, Lease), ProxyError>,
    connected: Option<Duration>,
    answered_at: Instant,
) {
    ctx.upstream.connect = connected;
    ctx.upstream.tls = endpoint.tls();
    if sent.is_ok() {
        ctx.upstream.ttfb = Some(answered_at.saturating_duration_since(ctx.started));
    }
}

/// An attempt's deadline: the request's, or the per-try timeout's when that comes first.
fn attempt_deadline(plan: &Plan<'_>, per_try: Option<Duration>) -> Option<Deadline> {
    let Some(per_try) = per_try.map(|t| Deadline::after(Instant::now(), t)) else {
        return plan.deadline;
    };
    Some(match plan.deadline {
        Some(request) => request.earlier(Some(per_try)),
        None => per_try,
    })
}

/// When the whole exchange must be over: the request timeout, or a gRPC client's own deadline
/// (`grpc-timeout`) when that comes first.
pub(super) fn request_deadline(ctx: &RequestCtx<'_>, target: &Target) -> Option<Deadline> {
    let backend = target.policy.request_timeout;
    let client = ctx.grpc.and_then(|g| g.timeout);
    // The client's own deadline decides only when it is the shorter one.
    let (shortest, by_client) = match (backend, client) {
        (Some(a), Some(b)) => (Some(a.min(b)), b < a),
        (None, Some(b)) => (Some(b), true),
        (a, None) => (a, false),
    };
    shortest.map(|t| Deadline {
        client: by_client,
        ..Deadline::after(ctx.started, t)
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
