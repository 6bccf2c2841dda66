//! CONNECT tunnels: after phases route and admit, an endpoint is picked and connected (the
//! tunnel's "attempt"), the client gets `200`, and bytes relay both ways untouched until either
//! side closes or nothing moves for the Backend's stream idle timeout. TLS passthrough
//! listeners open their upstream side with the same [`connect`].

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::admit::Admitted;
use super::attempt::{connect_error, pick};
use super::ctx::{RelayBytes, RequestCtx};
use super::route::Routed;
use crate::balance::outlier::Outcome;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::snapshot::shared::Shared;
use crate::snapshot::Target;
use crate::upstream::connect::ConnectError;
use crate::upstream::Endpoint;

/// A CONNECT tunnel, from its endpoint to its end.
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    req: Request<Incoming>,
    routed: &Routed<'_>,
    admitted: Admitted,
) -> Result<Response<ProxyBody>, ProxyError> {
    let target = &**routed.target;
    // A tunnel has no request headers of its own to hash: only SourceIP applies.
    let hash = target
        .port
        .endpoints
        .hash_key()
        .and_then(|k| k.hash_connection(ctx.conn.client.ip()));
    let endpoint = pick(target, hash).await?;
    ctx.upstream.endpoint = Some(endpoint.addr);
    let backend = target.backend.label.clone();
    let upstream = connect(ctx.shared, target, &endpoint)
        .await
        .map_err(|e| connect_error(&e, &backend, endpoint.addr))?;
    let idle = target.policy.stream_idle_timeout;
    let active = endpoint.start_request();
    let open = ctx.conn.tracker.clone().map(|t| t.hold());
    let on_upgrade = hyper::upgrade::on(req);
    let report = ctx.report_relay_end();
    tokio::spawn(async move {
        let mut bytes = None;
        match on_upgrade.await {
            Ok(upgraded) => {
                let end = crate::http::relay::relay(TokioIo::new(upgraded), upstream, idle).await;
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

/// Opens the upstream side of a tunnel (CONNECT or TLS passthrough) to `endpoint` of `target`,
/// and tells outlier detection how it went: a tunnel's only signal about an endpoint is
/// whether it could be reached.
pub(crate) async fn connect(
    shared: &Shared,
    target: &Target,
    endpoint: &Endpoint,
) -> Result<tokio::net::TcpStream, ConnectError> {
    let connected = crate::upstream::connect::connect_tcp_keepalive(
        endpoint.addr,
        target.policy.connect_timeout,
        target.port.tcp_keepalive.as_ref(),
    )
    .await;
    let seen = match &connected {
        Ok(_) => Outcome::Success,
        Err(e) => {
            endpoint.note_failure(format!("tunnel: {e}"));
            Outcome::LocalOriginFailure
        }
    };
    super::attempt::record(shared, target, endpoint, seen);
    connected
}
