//! HTTP/1.1 protocol upgrades to websocket: the request goes upstream on a connection of its
//! own (never pooled) with `Connection: upgrade` and `Upgrade: websocket` kept; on `101` both
//! sides are handed over and bytes relay both ways, without a request timeout (only the stream
//! idle timeout) and untouched by reloads. Any other answer is an ordinary response.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::body::ProxyBody;
use super::error::ProxyError;
use super::proxy::{
    clean_response_headers, connect_error, error_chain, pick_endpoint, prepare_request, ConnInfo,
    Destination, Outcome,
};
use super::router::RouteEntry;
use super::tunnel::TunnelEnd;
use crate::runtime::shared::Shared;
use crate::runtime::snapshot::Target;
use crate::telemetry::metrics::{BackendDirectionLabel, BackendLabel};
use crate::upstream::connect::connect_http1_upgradable;

/// `GET` with `Connection: upgrade` and `Upgrade: websocket` over HTTP/1.1.
pub fn is_upgrade_request(req: &Request<Incoming>) -> bool {
    req.method() == Method::GET
        && req.version() == Version::HTTP_11
        && has_token(req.headers(), header::CONNECTION, "upgrade")
        && has_token(req.headers(), header::UPGRADE, "websocket")
}

fn has_token(headers: &http::HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

fn set_upgrade_headers(headers: &mut http::HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

/// Proxies a websocket upgrade request.
pub(super) async fn proxy(
    shared: &Arc<Shared>,
    mut req: Request<Incoming>,
    dest: &Destination,
    target: &Arc<Target>,
    entry: Option<&RouteEntry>,
    conn: &ConnInfo,
    outcome: &mut Outcome,
) -> Result<Response<ProxyBody>, ProxyError> {
    let downstream = hyper::upgrade::on(&mut req);
    let mut upstream_req = prepare_request(req, dest, target, entry, conn)?;
    // prepare_request removed the hop-by-hop headers; these two are the point of the request.
    set_upgrade_headers(upstream_req.headers_mut());

    let endpoint = pick_endpoint(target).await?;
    outcome.endpoint = Some(endpoint.addr);
    let backend = &target.backend.label;
    let addr = endpoint.addr;
    let mut sender =
        connect_http1_upgradable(addr, target.policy.connect_timeout, &target.port.transport)
            .await
            .map_err(|e| connect_error(&e, backend, addr))?;
    let wait = async {
        sender.ready().await?;
        sender.send_request(upstream_req).await
    };
    // Until the answer, the usual limits apply (an upstream that never answers the upgrade).
    let limit = target
        .policy
        .attempt_timeout()
        .into_iter()
        .chain(target.policy.stream_idle_timeout)
        .min();
    let mut response = match limit {
        None => wait.await,
        Some(t) => {
            tokio::time::timeout(t, wait)
                .await
                .map_err(|_| ProxyError::UpstreamTimeout {
                    backend: backend.clone(),
                    endpoint: addr,
                    timeout: t,
                })?
        }
    }
    .map_err(|e| ProxyError::UpstreamReset {
        backend: backend.clone(),
        endpoint: addr,
        cause: error_chain(&e),
    })?;

    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upstream = switched.then(|| hyper::upgrade::on(&mut response));
    let (mut parts, body) = response.into_parts();
    clean_response_headers(&mut parts, entry);
    let Some(upstream) = upstream else {
        // Declined (e.g. 400, 403): an ordinary response on a connection we do not keep.
        let body =
            http_body_util::BodyExt::map_err(body, |e| Box::new(e) as super::body::BodyError);
        return Ok(Response::from_parts(
            parts,
            ProxyBody::Stream(Box::pin(body)),
        ));
    };
    set_upgrade_headers(&mut parts.headers);

    let idle = target.policy.stream_idle_timeout;
    let active = endpoint.start_request();
    let open = conn.tracker.as_ref().map(|t| t.enter());
    let label = backend.clone();
    let shared = shared.clone();
    tokio::spawn(async move {
        match tokio::try_join!(downstream, upstream) {
            Ok((client, server)) => {
                let metrics = &shared.metrics;
                let backend_label = BackendLabel {
                    backend: label.to_string(),
                };
                let active_gauge = metrics
                    .websockets_active
                    .get_or_create(&backend_label)
                    .clone();
                active_gauge.inc();
                let end =
                    super::tunnel::relay(TokioIo::new(client), TokioIo::new(server), idle).await;
                active_gauge.dec();
                if let TunnelEnd::Closed(up, down) = &end {
                    for (direction, bytes) in [("upstream", *up), ("downstream", *down)] {
                        metrics
                            .websocket_bytes
                            .get_or_create(&BackendDirectionLabel {
                                backend: label.to_string(),
                                direction,
                            })
                            .inc_by(bytes);
                    }
                }
                tracing::debug!(backend = %label, ?end, "websocket closed");
            }
            Err(e) => tracing::debug!(backend = %label, error = %e, "websocket upgrade failed"),
        }
        drop(active);
        drop(open);
    });
    Ok(Response::from_parts(parts, ProxyBody::empty()))
}
