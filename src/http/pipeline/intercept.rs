//! Tunnels served as HTTP: a `CONNECT` to a declared port that speaks HTTP (route's
//! [`TunnelHttp`]) is answered `200`, and the connection inside the tunnel is served by the
//! listener's own HTTP server (`ConnInfo::nested`), so each request in it passes every phase
//! as if the client had sent it to egressd directly: routing, EgressPolicy with the CONNECT's
//! identity, credentials, MCP, retries, outlier detection, the access log.
//!
//! For a port whose TLS egressd originates, egressd first completes the client's TLS
//! handshake with a certificate for the CONNECT's host (`tlsInterception`). A ClientHello
//! naming another host is refused, and inside the tunnel each request must be for the
//! CONNECT's host and port (`destination`: 421 otherwise), so one tunnel cannot reach
//! another destination (no domain fronting).

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::server::Acceptor;
use rustls::{AlertDescription, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

use super::ctx::{ConnInfo, RequestCtx, TunnelOrigin};
use super::destination::Destination;
use super::route::TunnelHttp;
use crate::http::body::ProxyBody;
use crate::http::error::ProxyError;
use crate::snapshot::shared::Shared;
use crate::telemetry::metrics::{ReasonLabel, TlsLabel};

/// Serves the tunnel `req` asks for as HTTP (see the module docs).
pub(super) async fn phase(
    ctx: &mut RequestCtx<'_>,
    req: Request<Incoming>,
    dest: &Destination,
    how: TunnelHttp,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Some(nested) = ctx.conn.nested.clone() else {
        // Only a connection inside a tunnel has none, and a CONNECT there is refused before.
        return Err(ProxyError::NotSupported(
            "a CONNECT inside a CONNECT tunnel",
        ));
    };
    let host: Box<str> = dest.host().into();
    let port = dest.port_or_default();
    // Made before the `200`: a host egressd cannot make a certificate for is refused while
    // the client can still be told why.
    let tls = match how {
        TunnelHttp::Plain => None,
        TunnelHttp::Intercepted(interceptor) => {
            let config = interceptor.server_config(&host).await.map_err(|e| {
                ProxyError::InterceptionFailed {
                    host: host.to_string(),
                    cause: e.to_string(),
                }
            })?;
            Some(config)
        }
    };
    let info = ConnInfo {
        listener: ctx.conn.listener.clone(),
        client: ctx.conn.client,
        client_header: ctx.conn.client_header.clone(),
        tls: tls.is_some(),
        identity: ctx.conn.identity.clone(),
        tracker: None,
        stats: ctx.conn.stats.clone(),
        tunnel: Some(Box::new(TunnelOrigin {
            host,
            port,
            user: ctx.user.clone(),
        })),
        nested: None,
    };
    let label = TlsLabel {
        tls: if tls.is_some() { "true" } else { "false" },
    };
    ctx.shared
        .metrics
        .intercepted_tunnels
        .get_or_create(&label)
        .inc();
    let handshake_within = ctx.snapshot.settings.downstream.header_read_timeout;
    let shared = ctx.shared.clone();
    // The outer connection is busy, and the drain waits, while the tunnel is open.
    let open = ctx.conn.tracker.clone().map(|t| t.hold());
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let _open = open;
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(e) => return tracing::debug!(error = %e, "CONNECT upgrade failed"),
        };
        let Some(config) = tls else {
            return nested.serve(Box::new(upgraded), info).await;
        };
        let expected = info.tunnel.as_ref().map_or("", |t| &t.host);
        let handshake = handshake(upgraded, config, expected);
        let outcome = match handshake_within {
            Some(limit) => tokio::time::timeout(limit, handshake)
                .await
                .unwrap_or(Err(HandshakeFailure::Timeout)),
            None => handshake.await,
        };
        match outcome {
            Ok(stream) => nested.serve(Box::new(stream), info).await,
            Err(failure) => handshake_failed(&shared, &info, failure),
        }
    });
    Ok(Response::new(ProxyBody::empty()))
}

/// Why the client's side of an intercepted tunnel never got to HTTP.
#[derive(Debug)]
enum HandshakeFailure {
    /// The client refused egressd's certificate (or ended the handshake) with this alert.
    Alert(AlertDescription),
    SniMismatch(String),
    NotTls(String),
    Timeout,
    Closed,
}

impl std::fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeFailure::Alert(alert) => write!(f, "the client sent the TLS alert {alert:?}"),
            HandshakeFailure::SniMismatch(sni) => {
                write!(f, "the ClientHello names {sni}, not the CONNECT's host")
            }
            HandshakeFailure::NotTls(detail) => write!(f, "no TLS handshake: {detail}"),
            HandshakeFailure::Timeout => f.write_str("no handshake within headerReadTimeout"),
            HandshakeFailure::Closed => f.write_str("the client closed the tunnel"),
        }
    }
}

impl HandshakeFailure {
    /// The `reason` of `egressd_interception_handshake_failures_total`.
    fn reason(&self) -> &'static str {
        match self {
            HandshakeFailure::Alert(AlertDescription::UnknownCA) => "unknown_ca",
            HandshakeFailure::Alert(AlertDescription::BadCertificate) => "bad_certificate",
            HandshakeFailure::Alert(AlertDescription::CertificateUnknown) => "certificate_unknown",
            HandshakeFailure::Alert(_) => "other_alert",
            HandshakeFailure::SniMismatch(_) => "sni_mismatch",
            HandshakeFailure::NotTls(_) => "not_tls",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Closed => "closed",
        }
    }
}

/// The client's TLS handshake inside the tunnel: its ClientHello must name the CONNECT's
/// host, or none (clients send none for an IP address).
async fn handshake<S>(
    io: S,
    config: Arc<ServerConfig>,
    expected: &str,
) -> Result<TlsStream<S>, HandshakeFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let start = LazyConfigAcceptor::new(Acceptor::default(), io)
        .await
        .map_err(|e| classify(&e))?;
    if let Some(sni) = start.client_hello().server_name() {
        let sni = sni.trim_end_matches('.');
        if !sni.eq_ignore_ascii_case(expected) {
            return Err(HandshakeFailure::SniMismatch(sni.to_owned()));
        }
    }
    start.into_stream(config).await.map_err(|e| classify(&e))
}

/// What an I/O error from rustls says about the handshake.
fn classify(e: &std::io::Error) -> HandshakeFailure {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        return HandshakeFailure::Closed;
    }
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::AlertReceived(alert)) => HandshakeFailure::Alert(*alert),
        Some(other) => HandshakeFailure::NotTls(other.to_string()),
        None => HandshakeFailure::NotTls(e.to_string()),
    }
}

/// Counts a failed handshake and logs it (rate-limited: clients that pin certificates or do
/// not trust the CA fail on every connection).
fn handshake_failed(shared: &Shared, info: &ConnInfo, failure: HandshakeFailure) {
    let reason = failure.reason();
    shared
        .metrics
        .interception_handshake_failures
        .get_or_create(&ReasonLabel { reason })
        .inc();
    let host = info.tunnel.as_ref().map_or("", |t| &t.host);
    crate::telemetry::log_limit::limited!(
        warn,
        client = %info.client,
        %host,
        reason,
        detail = %failure,
        "intercepted tunnel: the client's TLS handshake failed (unknown_ca or bad_certificate: the client does not trust egressd's interception CA, or pins the host's certificate; see docs/interception.md)"
    );
}
