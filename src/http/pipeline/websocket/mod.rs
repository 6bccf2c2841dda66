//! Websockets, asked for by HTTP/1.1 clients with `Upgrade: websocket` (RFC 6455) or by
//! HTTP/2 clients with an extended CONNECT (RFC 8441). Upstream it is always an HTTP/1.1
//! upgrade on a connection of its own (never pooled) with `Connection: upgrade` and
//! `Upgrade: websocket`; on `101` both sides are handed over and bytes relay both ways,
//! without a request timeout (only the stream idle timeout) and untouched by reloads. Any other
//! answer is an ordinary response.
//!
//! For an HTTP/2 client egressd does the HTTP/1.1 handshake itself (see `handshake`): it sends
//! a key of its own, checks the `101`, and answers the client `200`.

mod handshake;

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::admit::Admitted;
use super::answer::clean_response_headers;
use super::attempt::{connect_error, pick, Attempt, Outcome};
use super::ctx::{RelayBytes, RequestCtx};
use super::destination::Destination;
use super::kind::Upgrade;
use super::prepare::Prepared;
use super::route::Routed;
use crate::http::body::ProxyBody;
use crate::http::error::{Blame, ProxyError};
use crate::snapshot::shared::Shared;
use crate::snapshot::Target;
use crate::telemetry::metrics::{BackendDirectionLabel, BackendLabel};
use crate::upstream::body::RequestBody;
use crate::upstream::connect::connect_http1_upgradable;
use crate::upstream::endpoint::ActiveRequest;
use crate::upstream::Endpoint;

fn set_upgrade_headers(headers: &mut http::HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

/// A websocket, after phases route and admit: prepared like any request (credentials
/// included), sent on a connection of its own to a picked endpoint, and on `101` relayed until
/// it closes. Its handshake is an attempt like any request's: its answer (or failure) is
/// counted for the Backend and told to outlier detection.
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    mut req: Request<Incoming>,
    dest: &Destination,
    routed: &Routed<'_>,
    admitted: Admitted,
    upgrade: Upgrade,
) -> Result<Response<ProxyBody>, ProxyError> {
    let target = &**routed.target;
    let downstream = hyper::upgrade::on(&mut req);
    // RFC 8441 §5: the CONNECT stands for the GET of an HTTP/1.1 handshake, to the same
    // authority and path.
    *req.method_mut() = Method::GET;
    let Prepared { mut req, hash } = super::prepare::phase(ctx, req, dest, routed)?;
    // Phase "prepare" removed the hop-by-hop headers; these two are the point of the request.
    set_upgrade_headers(req.headers_mut());
    let key = own_key(&mut req, upgrade);
    let endpoint = pick(target, hash).await?;
    let attempt = Attempt::start(ctx, &endpoint);
    let answer = send(target, &endpoint, req, key.as_ref())
        .await
        .and_then(|response| no_false_open(target, &endpoint, upgrade, response));
    let outcome = match &answer {
        Ok(response) => Outcome::Answered(response.status()),
        Err(e) => Outcome::Failed(e),
    };
    let active = attempt.finish(ctx.shared, target, outcome, Instant::now());
    let mut response = answer?;
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upstream = switched.then(|| hyper::upgrade::on(&mut response));
    let (mut parts, body) = response.into_parts();
    clean_response_headers(&mut parts, routed.entry);
    let Some(upstream) = upstream else {
        // Declined (e.g. 400, 403): an ordinary response on a connection we do not keep.
        let body =
            http_body_util::BodyExt::map_err(body, |e| Box::new(e) as crate::http::body::BodyError);
        return Ok(Response::from_parts(
            parts,
            ProxyBody::Stream(Box::pin(body)),
        ));
    };
    match upgrade {
        Upgrade::Http1 => set_upgrade_headers(&mut parts.headers),
        Upgrade::ExtendedConnect => {
            handshake::into_extended_connect_answer(&mut parts.status, &mut parts.headers);
        }
    }
    let relay = Relay {
        shared: ctx.shared.clone(),
        backend: target.backend.label.clone(),
        idle: target.policy.stream_idle_timeout,
        send: ctx.snapshot.settings.downstream.send_timeout,
        active,
        admitted,
        open: ctx.conn.tracker.clone().map(|t| t.hold()),
        // Like a tunnel's, the log line waits for the websocket to close, with its bytes.
        report: ctx.report_relay_end(),
    };
    tokio::spawn(relay.run(downstream, upstream));
    Ok(Response::from_parts(parts, ProxyBody::empty()))
}

/// The key of the handshake: an HTTP/1.1 client's own goes through (the client checks the
/// answer); an HTTP/2 client sends none, so egressd makes one, set here, and checks the
/// answer itself.
fn own_key(req: &mut Request<RequestBody>, upgrade: Upgrade) -> Option<HeaderValue> {
    let key = (upgrade == Upgrade::ExtendedConnect).then(handshake::new_key)?;
    // The CONNECT stream's DATA frames are the websocket itself (taken by the upgrade); the
    // GET that stands for it has no body.
    *req.body_mut() = RequestBody::Empty;
    req.headers_mut()
        .insert(handshake::SEC_WEBSOCKET_KEY, key.clone());
    Some(key)
}

/// A 2xx to a CONNECT tells the client its websocket is open: an upstream that ignored the
/// upgrade and answered e.g. 200 with a page must not look like one.
fn no_false_open(
    target: &Target,
    endpoint: &Endpoint,
    upgrade: Upgrade,
    response: Response<Incoming>,
) -> Result<Response<Incoming>, ProxyError> {
    if upgrade == Upgrade::ExtendedConnect && response.status().is_success() {
        return Err(ProxyError::UpstreamProtocol {
            backend: target.backend.label.clone(),
            endpoint: endpoint.addr,
            cause: format!(
                "answered the websocket upgrade with {}, not 101",
                response.status()
            ),
        });
    }
    Ok(response)
}

/// The upgrade request on a connection of its own, and the upstream's answer (checked when
/// egressd made the key). Until the answer the usual limits apply (an upstream that never
/// answers the upgrade).
async fn send(
    target: &Target,
    endpoint: &Endpoint,
    req: Request<RequestBody>,
    key: Option<&HeaderValue>,
) -> Result<Response<Incoming>, ProxyError> {
    let backend = &target.backend.label;
    let addr = endpoint.addr;
    let mut sender = connect_http1_upgradable(
        addr,
        target.policy.connect_timeout,
        &target.port.transport,
        target.port.tcp_keepalive.as_ref(),
    )
    .await
    .map_err(|e| connect_error(&e, backend, addr))?;
    let wait = async {
        sender.ready().await?;
        sender.send_request(req).await
    };
    let limit = target
        .policy
        .attempt_timeout()
        .into_iter()
        .chain(target.policy.stream_idle_timeout)
        .min();
    let response = match limit {
        None => wait.await,
        Some(t) => {
            tokio::time::timeout(t, wait)
                .await
                .map_err(|_| ProxyError::UpstreamTimeout {
                    backend: backend.clone(),
                    endpoint: addr,
                    timeout: t,
                    blame: Blame::Endpoint,
                })?
        }
    }
    .map_err(|e| super::exchange::upstream_error(target, endpoint, &e))?;
    if let (Some(key), StatusCode::SWITCHING_PROTOCOLS) = (key, response.status()) {
        handshake::check_switch(response.headers(), key).map_err(|cause| {
            ProxyError::UpstreamProtocol {
                backend: backend.clone(),
                endpoint: addr,
                cause,
            }
        })?;
    }
    Ok(response)
}

/// A websocket between its two handshakes and its end: what it holds while open.
struct Relay {
    shared: Arc<Shared>,
    backend: Arc<str>,
    idle: Option<std::time::Duration>,
    /// `downstream.sendTimeout`.
    send: Option<std::time::Duration>,
    /// Counts as a request in flight to the endpoint while open.
    active: ActiveRequest,
    /// Its circuit-breaker slots (a request and a connection) while open.
    admitted: Admitted,
    /// Holds the drain tracker: SIGTERM waits for open websockets (up to the drain timeout).
    open: Option<super::ctx::Held>,
    /// Where the end is reported, for the access log line.
    report: Option<tokio::sync::oneshot::Sender<Option<RelayBytes>>>,
}

impl Relay {
    /// Waits for both sides to be handed over (once the answer is sent downstream), then
    /// relays bytes both ways until either side closes or the idle timeout passes.
    async fn run(self, downstream: OnUpgrade, upstream: OnUpgrade) {
        let Relay {
            shared,
            backend,
            idle,
            send,
            active,
            admitted,
            open,
            report,
        } = self;
        let mut bytes = None;
        match tokio::try_join!(downstream, upstream) {
            Ok((client, server)) => {
                let metrics = &shared.metrics;
                let backend_label = BackendLabel {
                    backend: backend.to_string(),
                };
                let active_gauge = metrics
                    .websockets_active
                    .get_or_create(&backend_label)
                    .clone();
                active_gauge.inc();
                let (client, server) = (TokioIo::new(client), TokioIo::new(server));
                let end = crate::http::relay::relay(client, server, idle, send).await;
                end.count_cut(metrics);
                active_gauge.dec();
                for (direction, bytes) in [("upstream", end.up), ("downstream", end.down)] {
                    metrics
                        .websocket_bytes
                        .get_or_create(&BackendDirectionLabel {
                            backend: backend.to_string(),
                            direction,
                        })
                        .inc_by(bytes);
                }
                tracing::debug!(%backend, endpoint = %active.endpoint().addr, ?end, "websocket closed");
                bytes = Some(RelayBytes {
                    up: end.up,
                    down: end.down,
                    complete: end.complete(),
                });
            }
            Err(e) => tracing::debug!(%backend, error = %e, "websocket upgrade failed"),
        }
        // Only now is the websocket over for the endpoint's count and for draining.
        drop(active);
        drop(admitted);
        drop(open);
        if let Some(report) = report {
            let _ = report.send(bytes);
        }
    }
}
