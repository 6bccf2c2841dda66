//! The request pipeline: every kind of traffic (`kind`) — an HTTP request, a websocket, a
//! CONNECT tunnel, a TLS passthrough connection — passes the same named phases, each in a file
//! of its own, sharing one [`RequestCtx`]:
//!
//! ```text
//! destination ─> route ─> authorize ─> limit ─> admit ─> prepare ─> pick and connect ⟲ retry ─> respond ─> log
//! ```
//!
//! - `destination`: the host and port asked for (a passthrough connection's SNI), canonical;
//!   head limits; loops; the path normalised (`http::path`).
//! - `route`: HTTPRoute rule, implicit route or outbound policy → a Backend port; a CONNECT by
//!   host and TCP port, a passthrough connection by SNI.
//! - `authorize`: the client's identity judged for the destination (EgressPolicy).
//! - `limit`: the `rateLimit` rules (local counters, then Redis for global ones).
//! - `admit`: the circuit breaker's slots.
//! - `prepare`: the request as it goes upstream (URI, headers, filters, credentials).
//! - `attempt`: pick an endpoint; one [`attempt::Attempt`] per try, recorded alike for every
//!   kind. `retry`: a request's attempts (`exchange` sends each) as the policy allows.
//! - `respond`: the answer on its way down (`answer`), or egressd's own reply for a failure
//!   (`failure` records it, for every kind).
//! - `log`: metrics and the access log line.
//!
//! MCP is hooks the phases call (`mcp`). Only the relay differs by kind: `websocket`, `tunnel`,
//! `passthrough`; a tunnel to a port that speaks HTTP is served as HTTP (`intercept`), its
//! requests passing the phases again. No file imports the one that calls it (`.ci/module-cycles`).

mod admit;
mod answer;
mod attempt;
mod authorize;
mod connection_slot;
mod ctx;
mod destination;
mod exchange;
mod failure;
mod intercept;
mod kind;
mod limit;
mod log;
mod logged;
mod mcp;
pub(crate) mod passthrough;
mod prepare;
mod respond;
mod retry;
mod route;
mod tunnel;
mod websocket;

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use ctx::RequestCtx;
pub(crate) use ctx::{ConnInfo, Held, NestedHttp, NestedStream, Outliving};
use kind::Kind;

use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::snapshot::shared::Shared;

/// Handles one request: never fails, every failure becomes a local reply.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    shared.metrics.requests.inc();
    let http1 = req.version() != http::Version::HTTP_2;
    let snapshot = shared.snapshot.load_full();
    let mut ctx = RequestCtx::new(&shared, &snapshot, &conn, &mut req);
    let (response, failure) = match proxy(&mut ctx, req).await {
        Ok(mut response) => {
            // RFC 9110 §8.6: a 304 keeps the `Content-Length` of what it stands for, which
            // hyper's HTTP/1.1 server drops from a response it knows to be empty.
            if http1
                && response.status() == http::StatusCode::NOT_MODIFIED
                && response
                    .headers()
                    .contains_key(http::header::CONTENT_LENGTH)
            {
                response.body_mut().keep_declared_length();
            }
            (response, log::Failure::default())
        }
        Err(err) => {
            let reply = respond::failure(&mut ctx, &err);
            let failure = log::Failure {
                code: Some(err.code()),
                cause: err.cause(),
            };
            (reply, failure)
        }
    };
    Ok(log::phase(ctx, response, failure))
}

/// The phases from "destination" to "respond".
async fn proxy(
    ctx: &mut RequestCtx<'_>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let dest = destination::phase(ctx, &req)?;
    destination::normalize_path(ctx, &mut req)?;
    let kind = Kind::of(&req)?;
    let access = ctx.snapshot.client_access.as_deref();
    if let Some(tunnel) = &ctx.conn.tunnel {
        // Inside an intercepted tunnel: the CONNECT authenticated the user.
        ctx.user = tunnel.user.clone();
    } else if let Some(access) = access.filter(|a| a.users.is_some()) {
        // Boxed: only configs with proxy users carry its future.
        Box::pin(authorize::authenticate(ctx, access, &req)).await?;
    }
    if kind == Kind::Tunnel {
        if let Some(how) = route::tunnel_http(ctx, &dest)? {
            return Box::pin(intercept::phase(ctx, req, &dest, how)).await;
        }
    }
    let routed = route::phase(ctx, &dest, Some(&req), kind)?;
    if let Some(access) = access {
        authorize::phase(ctx, access, &dest, &routed, kind)?;
    }
    let kind = kind.allowed_by(&routed.target)?;
    if let Some(rules) = &routed.target.policy.rate_limit {
        limit::of_request(ctx, &rules.0, &routed.target, &req, kind).await?;
    }
    let admitted = admit::phase(&routed.target, kind)?;
    match kind {
        // Boxed: their futures are larger than a request's, and every request would carry
        // (and copy) the largest.
        Kind::Tunnel => Box::pin(tunnel::phase(ctx, req, &routed, admitted)).await,
        // Passthrough connections come from TLS listeners (`passthrough`), never as a request.
        Kind::Passthrough => Err(ProxyError::NotSupported(
            "TLS passthrough on an HTTP listener",
        )),
        Kind::Websocket(upgrade) => {
            Box::pin(websocket::phase(
                ctx, req, &dest, &routed, admitted, upgrade,
            ))
            .await
        }
        Kind::Request => {
            if let Some(reply) = prepare::final_recipient(&req) {
                return Ok(reply);
            }
            let mut prepared = prepare::phase(ctx, req, &dest, &routed)?;
            if ctx.timed() {
                ctx.bytes_in = prepared.req.body_mut().count_undeclared();
            }
            let target = &**routed.target;
            let mcp = mcp::McpExchange::of(target, &prepared.req);
            let mut pinned = None;
            if let Some(m) = mcp {
                match mcp::inbound(ctx, m.port, target, prepared.req).await? {
                    mcp::Inbound::Forward(req, endpoint) => {
                        prepared.req = req;
                        pinned = endpoint;
                    }
                    mcp::Inbound::Reply(reply) => return Ok(reply),
                }
            }
            let deadline = retry::request_deadline(ctx, target);
            let plan = retry::Plan {
                pinned,
                mcp_post: mcp.is_some_and(|m| m.post),
                deadline,
                target,
            };
            let answered = retry::phase(ctx, plan, prepared).await?;
            let admission = admitted.into_request();
            respond::phase(ctx, &routed, answered, admission, mcp, deadline).await
        }
    }
}
