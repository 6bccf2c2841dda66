//! Phase "route": which Backend port serves the request. HTTPRoute rules first (an MCP
//! session's requests go to the backendRef that issued it, else the rule's weights decide),
//! then the implicit route to a Backend declaring the host, then the outbound policy for a
//! destination nothing declares. A CONNECT tunnel routes by host and declared TCP port, a TLS
//! passthrough connection by its SNI (TLSRoutes, then Passthrough Backends); both fall back on
//! the outbound policy too.

use std::borrow::Cow;
use std::sync::Arc;

use http::Request;
use hyper::body::Incoming;

use super::ctx::RequestCtx;
use super::destination::Destination;
use super::kind::{Kind, Upgrade};
use crate::http::error::ProxyError;
use crate::snapshot::router::{HttpRouter, RouteEntry, RouteInput, SniDecision};
use crate::snapshot::undeclared::{Carriage, Refusal};
use crate::snapshot::{wildcard, Target};
use crate::telemetry::blocked::Via;
use crate::upstream::connect::Transport;

/// Where phase "route" sends a request.
pub(super) struct Routed<'s> {
    /// Borrowed from the config generation, or made for an undeclared destination (AllowAny,
    /// AuditOnly) and owned here.
    pub(super) target: Cow<'s, Arc<Target>>,
    /// The HTTPRoute rule that matched, if one did.
    pub(super) entry: Option<&'s RouteEntry>,
}

/// Phase "route". `req`: the HTTP request, for the kinds that have one (a passthrough
/// connection has none).
pub(super) fn phase<'s>(
    ctx: &mut RequestCtx<'s>,
    dest: &Destination,
    req: Option<&Request<Incoming>>,
    kind: Kind,
) -> Result<Routed<'s>, ProxyError> {
    let routed = match (kind, req) {
        (Kind::Passthrough, _) => sni(ctx, dest)?,
        (Kind::Tunnel, _) => tunnel(ctx, http_router(ctx)?, dest)?,
        (Kind::Request | Kind::Websocket(_), Some(req)) => {
            request(ctx, http_router(ctx)?, dest, req, kind)?
        }
        (Kind::Request | Kind::Websocket(_), None) => {
            return Err(ProxyError::InvalidRequest("no request to route".into()))
        }
    };
    if ctx.timed() {
        // For the access log line and the span only.
        ctx.backend = Some(routed.target.backend.label.clone());
    }
    Ok(routed)
}

/// The routes of the listener the request came on.
#[inline]
fn http_router<'s>(ctx: &RequestCtx<'s>) -> Result<&'s HttpRouter, ProxyError> {
    ctx.snapshot
        .routers
        .get(&ctx.conn.listener)
        .map(|router| &**router)
        .ok_or(ProxyError::ListenerGone)
}

/// An HTTP request or websocket upgrade.
fn request<'s, B>(
    ctx: &mut RequestCtx<'s>,
    router: &'s HttpRouter,
    dest: &Destination,
    req: &Request<B>,
    kind: Kind,
) -> Result<Routed<'s>, ProxyError> {
    let path = match req.uri().path() {
        // `OPTIONS *` asks about the server as a whole (RFC 9112 §3.2.4): routed as its root,
        // so that a catch-all route takes it; it is forwarded as `*`.
        "*" => "/",
        path => path,
    };
    let input = RouteInput {
        host: dest.host(),
        path,
        query: req.uri().query(),
        method: Upgrade::routing_method(kind.upgrade(), req),
        headers: req.headers(),
    };
    if let Some(entry) = router.route(&input) {
        ctx.route = Some(entry.action.clone());
        // A request of an MCP session goes where the session began.
        let key = &ctx.snapshot.mcp_session_key;
        let target = match super::mcp::session_target(key, req, &entry.action)? {
            Some(target) => target,
            None => entry.action.pick().ok_or_else(|| ProxyError::NoBackend {
                route: entry.action.name.clone(),
            })?,
        };
        return Ok(Routed {
            target: concrete(target, dest, Via::Http)?,
            entry: Some(entry),
        });
    }
    if let Some(implicit) = router.implicit(dest.host()) {
        let target = implicit
            .target_for(dest.port, dest.scheme_default_port)
            .ok_or_else(|| ProxyError::PortNotAllowed {
                host: dest.host().to_owned(),
                port: dest.port_or_default(),
                declared: implicit.declared_ports(),
            })?;
        return Ok(Routed {
            target: concrete(target, dest, Via::Http)?,
            entry: None,
        });
    }
    if router.declares_host(dest.host()) {
        return Err(ProxyError::NoRoute {
            host: dest.host().to_owned(),
            path: input.path.to_owned(),
        });
    }
    // The client's scheme decides how an undeclared destination is reached (no Backend says
    // otherwise): `https://` or an HTTPS listener → TLS.
    let carriage = if dest.scheme_default_port == 443 {
        Carriage::Https
    } else {
        Carriage::Http
    };
    let target = undeclared(
        ctx,
        dest.host(),
        dest.port_or_default(),
        Via::Http,
        carriage,
    )?;
    Ok(Routed {
        target: Cow::Owned(target),
        entry: None,
    })
}

/// `CONNECT host:port`: only to a declared TCP port of a Backend (Passthrough or plain TCP),
/// or as the outbound policy allows for a host nothing declares.
fn tunnel<'s>(
    ctx: &RequestCtx<'s>,
    router: &'s HttpRouter,
    dest: &Destination,
) -> Result<Routed<'s>, ProxyError> {
    let port = dest.port.ok_or_else(|| {
        ProxyError::InvalidRequest("CONNECT needs host:port as its target".into())
    })?;
    if let Some(target) = router.tunnel(dest.host(), port) {
        return Ok(Routed {
            target: concrete(target, dest, Via::Connect)?,
            entry: None,
        });
    }
    // A host a route or Backend declares keeps its own rules (no tunnel to it unless a TCP
    // port says so), whatever the outbound policy.
    if ctx.snapshot.undeclared.is_some()
        && (router.declares_host(dest.host()) || router.implicit(dest.host()).is_some())
    {
        return Err(ProxyError::DestinationDenied {
            host: dest.host().to_owned(),
            port,
            via: Via::Connect,
            reason: Refusal::Declared,
        });
    }
    let target = undeclared(ctx, dest.host(), port, Via::Connect, Carriage::Tcp)?;
    Ok(Routed {
        target: Cow::Owned(target),
        entry: None,
    })
}

/// How the requests inside a CONNECT tunnel to a port that serves HTTP are served: through
/// the pipeline, as if sent to egressd directly.
pub(super) enum TunnelHttp {
    /// A plaintext port (`CONNECT host:80` from clients such as Node's undici for `http://`).
    Plain,
    /// A port whose TLS egressd originates: the client's TLS is terminated with a certificate
    /// for the host (`tlsInterception`).
    Intercepted(Arc<crate::interception::Interceptor>),
}

/// Whether `CONNECT host:port` is to a declared port that serves HTTP — a Backend port of the
/// host that is not TCP, or 443/80 of a host an HTTPRoute names — and so is served as HTTP
/// inside the tunnel; `None` for every other CONNECT (routed as a tunnel). A port whose TLS
/// egressd originates is refused unless `tlsInterception` is set and the port allows it: a
/// tunnel would bypass it.
pub(super) fn tunnel_http(
    ctx: &RequestCtx<'_>,
    dest: &Destination,
) -> Result<Option<TunnelHttp>, ProxyError> {
    let router = http_router(ctx)?;
    let Some(port) = dest.port else {
        return Ok(None);
    };
    let host = dest.host();
    if router.tunnel(host, port).is_some() {
        return Ok(None);
    }
    let interception = ctx.snapshot.interception.as_ref();
    if let Some(target) = router.implicit(host).and_then(|i| i.target_on(port)) {
        return match (&target.port.transport, interception) {
            (Transport::Plain, _) => Ok(Some(TunnelHttp::Plain)),
            (Transport::Tls(_), Some(i)) if target.port.interception => {
                Ok(Some(TunnelHttp::Intercepted(i.clone())))
            }
            (Transport::Tls(_), _) => Err(ProxyError::ConnectToOriginatingPort {
                host: host.to_owned(),
                port,
                backend: target.backend.label.clone(),
            }),
        };
    }
    if router.declares_host(host) {
        return Ok(match (port, interception) {
            (80, _) => Some(TunnelHttp::Plain),
            (443, Some(i)) => Some(TunnelHttp::Intercepted(i.clone())),
            _ => None,
        });
    }
    Ok(None)
}

/// A TLS passthrough connection, by its SNI. The destination port is not in the ClientHello:
/// TLS's own 443 is assumed for the outbound policy and `/blocked` (the listener's port is often
/// another, e.g. 8443 behind a Service).
fn sni<'s>(ctx: &RequestCtx<'s>, dest: &Destination) -> Result<Routed<'s>, ProxyError> {
    let decision = ctx
        .snapshot
        .sni_routers
        .get(&ctx.conn.listener)
        .map_or(SniDecision::NotAllowed, |router| router.route(dest.host()));
    let target = match decision {
        SniDecision::Target(target) => concrete(target, dest, Via::TlsPassthrough)?,
        SniDecision::NoBackend(route) => {
            return Err(ProxyError::NoBackend {
                route: route.name.clone(),
            })
        }
        SniDecision::NotAllowed => Cow::Owned(undeclared(
            ctx,
            dest.host(),
            dest.port_or_default(),
            Via::TlsPassthrough,
            Carriage::Tcp,
        )?),
    };
    Ok(Routed {
        target,
        entry: None,
    })
}

/// The routed target, made concrete for the request's host when it belongs to a wildcard
/// Backend (`*.example.com`).
fn concrete<'s>(
    target: &'s Arc<Target>,
    dest: &Destination,
    via: Via,
) -> Result<Cow<'s, Arc<Target>>, ProxyError> {
    wildcard::concrete(target, dest.host())
        .map_err(|refused| denied(dest.host(), dest.port_or_default(), via, refused.into()))
}

/// A destination refused by a rule (403), or one whose name egressd cannot look up now
/// (503 `dns_rate_limited`).
fn denied(host: &str, port: u16, via: Via, reason: Refusal) -> ProxyError {
    if reason.is_lookups_busy() {
        return ProxyError::DnsRateLimited {
            host: host.to_owned(),
        };
    }
    ProxyError::DestinationDenied {
        host: host.to_owned(),
        port,
        via,
        reason,
    }
}

/// A destination nothing declares: 403 under `RegistryOnly`; under `AllowAny` and `AuditOnly`
/// the target made for it, unless something denies it (`AuditOnly` records the use in
/// `/blocked` as audited).
fn undeclared(
    ctx: &RequestCtx<'_>,
    host: &str,
    port: u16,
    via: Via,
    carriage: Carriage,
) -> Result<Arc<Target>, ProxyError> {
    let Some(undeclared) = &ctx.snapshot.undeclared else {
        return Err(ProxyError::DestinationNotAllowed {
            host: host.to_owned(),
            port,
            via,
        });
    };
    match undeclared.target(host, port, carriage) {
        Ok(target) => {
            if undeclared.audits() {
                ctx.shared.audited(host, port, via);
            }
            Ok(target)
        }
        Err(reason) => Err(denied(host, port, via, reason)),
    }
}
