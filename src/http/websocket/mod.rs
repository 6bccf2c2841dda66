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
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::body::ProxyBody;
use super::error::ProxyError;
use super::proxy::{
    clean_response_headers, connect_error, error_chain, pick_endpoint, prepare_request,
    request_hash, ConnInfo, Destination, Outcome,
};
use super::router::RouteEntry;
use crate::runtime::shared::Shared;
use crate::runtime::snapshot::Target;
use crate::telemetry::metrics::{BackendDirectionLabel, BackendLabel};
use crate::upstream::connect::connect_http1_upgradable;
use crate::upstream::endpoint::ActiveRequest;

/// How a client asks for a websocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// HTTP/1.1 `GET` with `Connection: upgrade` and `Upgrade: websocket` (RFC 6455 §4.1).
    Http1,
    /// HTTP/2 `CONNECT` with `:protocol: websocket` (RFC 8441 §4).
    ExtendedConnect,
}

impl Upgrade {
    /// Whether `req` asks for a websocket, and how. An extended CONNECT for any other protocol
    /// is refused: it is no tunnel to `host:port`, and egressd knows no other protocol.
    pub fn of(req: &Request<Incoming>) -> Result<Option<Upgrade>, ProxyError> {
        if req.method() == Method::CONNECT {
            return match req.extensions().get::<hyper::ext::Protocol>() {
                None => Ok(None),
                Some(p) if p.as_str().eq_ignore_ascii_case("websocket") => {
                    Ok(Some(Upgrade::ExtendedConnect))
                }
                Some(_) => Err(ProxyError::NotSupported(
                    "extended CONNECT for a protocol other than websocket",
                )),
            };
        }
        let http1 = req.method() == Method::GET
            && req.version() == Version::HTTP_11
            // Upgrade first: most requests have none, so one lookup settles it.
            && has_token(req.headers(), header::UPGRADE, "websocket")
            && has_token(req.headers(), header::CONNECTION, "upgrade");
        Ok(http1.then_some(Upgrade::Http1))
    }

    /// The method `req` is routed by: an extended CONNECT routes as the `GET` of the HTTP/1.1
    /// handshake it stands for (RFC 8441 §5), so routes and method matches treat websockets
    /// alike whatever the client's HTTP version.
    pub fn routing_method(upgrade: Option<Upgrade>, req: &Request<Incoming>) -> &Method {
        static GET: Method = Method::GET;
        match upgrade {
            Some(Upgrade::ExtendedConnect) => &GET,
            _ => req.method(),
        }
    }

    /// What happens when the policy turns websockets off (`httpUpgrade` without websocket):
    /// an HTTP/1.1 upgrade goes on as the plain `GET` it also is (its upgrade headers are
    /// removed); an extended CONNECT has no plain form (RFC 8441 has no fallback), so it is
    /// refused with 403 `upgrade_not_allowed`.
    pub fn refused(self, target: &Target) -> Result<(), ProxyError> {
        match self {
            Upgrade::Http1 => Ok(()),
            Upgrade::ExtendedConnect => Err(ProxyError::UpgradeNotAllowed {
                backend: target.backend.label.clone(),
            }),
        }
    }
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

/// Proxies a websocket request (either kind, see [`Upgrade::of`]).
pub(super) async fn proxy(
    shared: &Arc<Shared>,
    mut req: Request<Incoming>,
    dest: &Destination,
    target: &Arc<Target>,
    entry: Option<&RouteEntry>,
    conn: &ConnInfo,
    outcome: &mut Outcome,
) -> Result<Response<ProxyBody>, ProxyError> {
    let upgrade = if req.method() == Method::CONNECT {
        Upgrade::ExtendedConnect
    } else {
        Upgrade::Http1
    };
    let downstream = hyper::upgrade::on(&mut req);
    // RFC 8441 §5: the CONNECT stands for the GET of an HTTP/1.1 handshake, to the same
    // authority and path.
    *req.method_mut() = Method::GET;
    let hash = request_hash(target, req.headers(), conn);
    let mut upstream_req = prepare_request(req, dest, target, entry, conn)?;
    // prepare_request removed the hop-by-hop headers; these two are the point of the request.
    set_upgrade_headers(upstream_req.headers_mut());
    // An HTTP/1.1 client's own key goes through (the client checks the answer); an HTTP/2
    // client sends none, so egressd makes one and checks the answer itself.
    let key = (upgrade == Upgrade::ExtendedConnect).then(handshake::new_key);
    if key.is_some() {
        // The CONNECT stream's DATA frames are the websocket itself (taken by the upgrade);
        // the GET that stands for it has no body.
        *upstream_req.body_mut() = crate::http::body::RequestBody::Empty;
    }
    if let Some(key) = &key {
        upstream_req
            .headers_mut()
            .insert(handshake::SEC_WEBSOCKET_KEY, key.clone());
    }

    let endpoint = pick_endpoint(target, hash).await?;
    outcome.endpoint = Some(endpoint.addr);
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

    let protocol_error = |cause: String| ProxyError::UpstreamProtocol {
        backend: backend.clone(),
        endpoint: addr,
        cause,
    };
    let status = response.status();
    let switched = status == StatusCode::SWITCHING_PROTOCOLS;
    if let (Some(key), true) = (&key, switched) {
        handshake::check_switch(response.headers(), key).map_err(protocol_error)?;
    }
    if upgrade == Upgrade::ExtendedConnect && status.is_success() {
        // A 2xx to a CONNECT tells the client its websocket is open: an upstream that ignored
        // the upgrade and answered e.g. 200 with a page must not look like one.
        return Err(protocol_error(format!(
            "answered the websocket upgrade with {status}, not 101"
        )));
    }
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
    match upgrade {
        Upgrade::Http1 => set_upgrade_headers(&mut parts.headers),
        Upgrade::ExtendedConnect => {
            handshake::into_extended_connect_answer(&mut parts.status, &mut parts.headers);
        }
    }

    let relay = Relay {
        shared: shared.clone(),
        backend: backend.clone(),
        idle: target.policy.stream_idle_timeout,
        active: endpoint.start_request(),
        open: conn.tracker.as_ref().map(|t| t.enter()),
    };
    tokio::spawn(relay.run(downstream, upstream));
    Ok(Response::from_parts(parts, ProxyBody::empty()))
}

/// A websocket between its two handshakes and its end: what it holds while open.
struct Relay {
    shared: Arc<Shared>,
    backend: Arc<str>,
    idle: Option<std::time::Duration>,
    /// Counts as a request in flight to the endpoint while open.
    active: ActiveRequest,
    /// Holds the drain tracker: SIGTERM waits for open websockets (up to the drain timeout).
    open: Option<crate::listener::ConnGuard>,
}

impl Relay {
    /// Waits for both sides to be handed over (once the answer is sent downstream), then
    /// relays bytes both ways until either side closes or the idle timeout passes.
    async fn run(self, downstream: OnUpgrade, upstream: OnUpgrade) {
        let Relay {
            shared,
            backend,
            idle,
            active,
            open,
        } = self;
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
                let end =
                    super::tunnel::relay(TokioIo::new(client), TokioIo::new(server), idle).await;
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
            }
            Err(e) => tracing::debug!(%backend, error = %e, "websocket upgrade failed"),
        }
        // Only now is the websocket over for the endpoint's count and for draining.
        drop(active);
        drop(open);
    }
}
