//! Tunnels: a CONNECT tunnel and a TLS passthrough connection relay bytes both ways untouched
//! until either side closes or nothing moves for the Backend's stream idle timeout. After
//! phases route, authorize and admit, both [`open`] their upstream side the same way (the
//! tunnel's "pick and connect"); a CONNECT then answers the client `200` and relays once hyper
//! hands the connection over, a passthrough connection sends the ClientHello it read and
//! relays (`passthrough`).

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::admit::Admitted;
use super::attempt::{connect_error, pick, Attempt, Outcome};
use super::ctx::{RelayBytes, RequestCtx};
use super::route::Routed;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::snapshot::Target;
use crate::upstream::endpoint::ActiveRequest;

/// A CONNECT tunnel, from its endpoint to its end.
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    req: Request<Incoming>,
    routed: &Routed<'_>,
    admitted: Admitted,
) -> Result<Response<ProxyBody>, ProxyError> {
    let target = &**routed.target;
    let (upstream, active) = open(ctx, target).await?;
    let backend = target.backend.label.clone();
    let idle = target.policy.stream_idle_timeout;
    let send = ctx.snapshot.settings.downstream.send_timeout;
    let shared = ctx.shared.clone();
    let open = ctx.conn.tracker.clone().map(|t| t.hold());
    let on_upgrade = hyper::upgrade::on(req);
    let report = ctx.report_relay_end();
    tokio::spawn(async move {
        let mut bytes = None;
        match on_upgrade.await {
            Ok(upgraded) => {
                let end =
                    crate::http::relay::relay(TokioIo::new(upgraded), upstream, idle, send).await;
                end.count_cut(&shared.metrics);
                bytes = Some(RelayBytes {
                    up: end.up,
                    down: end.down,
                    complete: end.complete(),
                });
                tracing::debug!(%backend, endpoint = %active.endpoint().addr, ?end, "tunnel closed");
            }
            Err(e) => tracing::debug!(%backend, error = %e, "CONNECT upgrade failed"),
        }
        // Only now is the tunnel over for the endpoint's count, the circuit breaker and
        // draining.
        drop(active);
        drop(admitted);
        drop(open);
        if let Some(report) = report {
            let _ = report.send(bytes);
        }
    });
    Ok(Response::new(ProxyBody::empty()))
}

/// Phase "pick and connect" of a tunnel: an endpoint picked (by the client's address alone
/// where the Backend hashes: a tunnel has no request headers), a TCP connection opened to it,
/// and the attempt recorded like any other — connect failures counted for the Backend, the
/// outcome told to outlier detection (a tunnel's only signal about an endpoint is whether it
/// could be reached). The connection counts as in flight to the endpoint until the returned
/// guard is dropped.
pub(super) async fn open(
    ctx: &mut RequestCtx<'_>,
    target: &Target,
) -> Result<(TcpStream, ActiveRequest), ProxyError> {
    let hash = target
        .port
        .endpoints
        .hash_key()
        .and_then(|k| k.hash_connection(ctx.conn.client.ip()));
    let endpoint = pick(target, hash).await?;
    let attempt = Attempt::start(ctx, &endpoint);
    let connected = crate::upstream::connect::connect_tcp_keepalive(
        endpoint.addr,
        target.policy.connect_timeout,
        target.port.tcp_keepalive.as_ref(),
    )
    .await
    .map_err(|e| connect_error(&e, &target.backend.label, endpoint.addr));
    let ended = Instant::now();
    if ctx.timed() && connected.is_ok() {
        ctx.upstream.connect = Some(ended.saturating_duration_since(attempt.started()));
    }
    let outcome = match &connected {
        Ok(_) => Outcome::Connected,
        Err(e) => Outcome::Failed(e),
    };
    let active = attempt.finish(ctx.shared, target, outcome, ended);
    Ok((connected?, active))
}
