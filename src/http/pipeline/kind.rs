//! The kinds of traffic, and how a request asks for a websocket. Every kind passes the same
//! phases; the kind decides how a request is routed (by request, by `host:port`, by SNI),
//! admitted and relayed.

use http::header;
use http::{Method, Request, Version};

use crate::http::error::ProxyError;
use crate::snapshot::Target;

/// The kind of traffic: every kind passes the same phases, and differs in how it is routed
/// (by request, by `host:port`, by SNI) and relayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// An HTTP request and its response.
    Request,
    /// A websocket, by HTTP/1.1 `Upgrade` or HTTP/2 extended CONNECT.
    Websocket(Upgrade),
    /// `CONNECT host:port`.
    Tunnel,
    /// A connection to a TLS passthrough listener, routed by its ClientHello's SNI.
    Passthrough,
}

impl Kind {
    pub(super) fn of<B>(req: &Request<B>) -> Result<Kind, ProxyError> {
        Ok(match Upgrade::of(req)? {
            Some(upgrade) => Kind::Websocket(upgrade),
            None if req.method() == Method::CONNECT => Kind::Tunnel,
            None => Kind::Request,
        })
    }

    pub(super) fn upgrade(self) -> Option<Upgrade> {
        match self {
            Kind::Websocket(upgrade) => Some(upgrade),
            _ => None,
        }
    }

    /// How the destination was asked for, as `/blocked` and the policy logs say it.
    pub(super) fn via(self) -> crate::telemetry::blocked::Via {
        use crate::telemetry::blocked::Via;
        match self {
            Kind::Request | Kind::Websocket(_) => Via::Http,
            Kind::Tunnel => Via::Connect,
            Kind::Passthrough => Via::TlsPassthrough,
        }
    }

    /// A websocket to a Backend that turns them off goes on as the plain GET it also is, or
    /// is refused (see [`Upgrade::refused`]).
    pub(super) fn allowed_by(self, target: &crate::snapshot::Target) -> Result<Kind, ProxyError> {
        match self {
            Kind::Websocket(upgrade) if !target.policy.websocket => {
                upgrade.refused(target)?;
                Ok(Kind::Request)
            }
            kind => Ok(kind),
        }
    }
}

/// How a client asks for a websocket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upgrade {
    /// HTTP/1.1 `GET` with `Connection: upgrade` and `Upgrade: websocket` (RFC 6455 §4.1).
    Http1,
    /// HTTP/2 `CONNECT` with `:protocol: websocket` (RFC 8441 §4).
    ExtendedConnect,
}

impl Upgrade {
    /// Whether `req` asks for a websocket, and how. An extended CONNECT for any other protocol
    /// is refused: it is no tunnel to `host:port`, and egressd knows no other protocol.
    pub(crate) fn of<B>(req: &Request<B>) -> Result<Option<Upgrade>, ProxyError> {
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
            // hyper gives every HTTP/1.1 request with an `Upgrade` header an `OnUpgrade`
            // (and without one the connection cannot be taken over anyway): most requests
            // carry no extensions, so this settles them without a header lookup.
            && req.extensions().get::<hyper::upgrade::OnUpgrade>().is_some()
            && has_token(req.headers(), header::UPGRADE, "websocket")
            && has_token(req.headers(), header::CONNECTION, "upgrade");
        Ok(http1.then_some(Upgrade::Http1))
    }

    /// The method `req` is routed by: an extended CONNECT routes as the `GET` of the HTTP/1.1
    /// handshake it stands for (RFC 8441 §5), so routes and method matches treat websockets
    /// alike whatever the client's HTTP version.
    pub(crate) fn routing_method<B>(upgrade: Option<Upgrade>, req: &Request<B>) -> &Method {
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
    pub(crate) fn refused(self, target: &Target) -> Result<(), ProxyError> {
        match self {
            Upgrade::Http1 => Ok(()),
            Upgrade::ExtendedConnect => Err(ProxyError::UpgradeNotAllowed {
                backend: target.backend.label.clone(),
            }),
        }
    }
}

pub(super) fn has_token(headers: &http::HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}
