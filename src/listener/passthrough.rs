//! TLS Passthrough listeners: read the ClientHello's SNI without terminating TLS, pick the
//! Passthrough Backend it names, and relay the client's bytes (starting with the ClientHello
//! itself) to an endpoint. egressd never sees plaintext; the client verifies the endpoint's
//! own certificate.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::sni::{peek_client_hello, Peek, MAX_HELLO};
use crate::http::pipeline::ConnInfo;
use crate::snapshot::router::SniDecision;
use crate::snapshot::shared::Shared;
use crate::snapshot::undeclared::{Carriage, Refusal};
use crate::telemetry::log_limit::limited;

/// The port an SNI nothing declares is reached on (AllowAny, AuditOnly) and suggested for in
/// `/blocked`.
const UNDECLARED_PORT: u16 = 443;

/// Serves one connection; every refusal closes it with a counted reason (and a logged one,
/// within the log's rate limit). The ClientHello must be complete by `hello_deadline`
/// (`headerReadTimeout` after accept).
pub(super) async fn serve(
    mut client: TcpStream,
    info: &ConnInfo,
    shared: &Shared,
    hello_deadline: Option<Instant>,
) {
    let mut passage = Passage::new(shared, info);
    let mut hello = Vec::with_capacity(1024);
    let sni = match super::conn::within(hello_deadline, read_hello(&mut client, &mut hello)).await {
        None => {
            super::conn::timed_out(shared, info, super::watchdog::Expiry::HeaderRead);
            return refuse(
                &mut passage,
                "client_hello_timeout",
                "no ClientHello in time",
                None,
            );
        }
        Some(Err(reason)) => return refuse(&mut passage, "not_tls", reason, None),
        Some(Ok(None)) => {
            return refuse(
                &mut passage,
                "no_sni",
                "ClientHello without SNI: nothing to route by",
                None,
            )
        }
        // Canonical before routing or recording: an SNI that is no host name is refused
        // without a trace in `/blocked`, and an address literal in any spelling is one address.
        Some(Ok(Some(sni))) => match crate::upstream::address::canonical_host(&sni) {
            Ok(host) => host.into_owned(),
            Err(e) => return refuse(&mut passage, "invalid_sni", &e.to_string(), None),
        },
    };
    passage.sni = Some(sni.clone());
    let snapshot = shared.snapshot.load_full();
    let decision = snapshot
        .sni_routers
        .get(&info.listener)
        .map_or(SniDecision::NotAllowed, |router| router.route(&sni));
    // A target made for an undeclared SNI (AllowAny, AuditOnly) lives here.
    let undeclared;
    // A wildcard Backend's template, made concrete for this SNI, lives here.
    let concrete;
    let target = match decision {
        SniDecision::Target(template) => {
            match crate::snapshot::wildcard::concrete(template, &sni) {
                Ok(made) => {
                    concrete = made;
                    &*concrete
                }
                Err(e) => {
                    return refuse(
                        &mut passage,
                        "destination_not_allowed",
                        &e.to_string(),
                        Some(&sni),
                    )
                }
            }
        }
        SniDecision::NoBackend(route) => {
            let why = format!("{} has no backend with a non-zero weight", route.name);
            return refuse(&mut passage, "no_backend", &why, Some(&sni));
        }
        SniDecision::NotAllowed => {
            // The destination port is not in the ClientHello: TLS's own 443 is assumed (the
            // listener's port is often another, e.g. 8443 behind a Service).
            let via = crate::telemetry::blocked::Via::TlsPassthrough;
            let made = match &snapshot.undeclared {
                None => Err(Refusal::NotAllowed),
                Some(u) => u.target(&sni, UNDECLARED_PORT, Carriage::Tcp).inspect(|_| {
                    if u.audits() {
                        shared.audited(&sni, UNDECLARED_PORT, via);
                    }
                }),
            };
            match made {
                Ok(target) => {
                    undeclared = target;
                    &undeclared
                }
                Err(refusal) => {
                    shared.blocked(&sni, UNDECLARED_PORT, via);
                    let why = match refusal {
                        Refusal::NotAllowed => {
                            "no TLSRoute or Passthrough Backend for this SNI".to_owned()
                        }
                        other => other.to_string(),
                    };
                    return refuse(&mut passage, "destination_not_allowed", &why, Some(&sni));
                }
            }
        }
    };
    passage.backend = Some(target.backend.label.clone());
    // Only the source address is known here: the client's TLS is its own, not egressd's.
    if let Some(access) = &snapshot.client_access {
        let client = crate::policy::identity::Client {
            addr: info.client.ip(),
            tls: None,
            user: None,
        };
        let via = crate::telemetry::blocked::Via::TlsPassthrough;
        let port = target.port.number;
        if let Err(refused) = shared.judge_client(access, target, &client, (&sni, port, via)) {
            return refuse(
                &mut passage,
                "client_not_allowed",
                &refused.reason,
                Some(&sni),
            );
        }
    }
    // A passthrough connection is a tunnel: one request and one connection of the Backend's
    // circuit breaker for as long as it is open.
    let admitted = match crate::http::pipeline::admit_relay(target) {
        Ok(admitted) => admitted,
        Err(err) => {
            if let crate::http::error::ProxyError::Overflow { backend, limit, .. } = &err {
                shared.metrics.overflow(backend, limit.as_str());
            }
            return refuse(&mut passage, "overflow", &err.to_string(), Some(&sni));
        }
    };
    let group = &target.port.endpoints;
    if !group.is_resolved() {
        group.wait_resolved(target.policy.connect_timeout).await;
    }
    // Only the client's address can be hashed here (the bytes are the client's own TLS).
    let hash = group
        .hash_key()
        .and_then(|k| k.hash_connection(info.client.ip()));
    let Some(endpoint) = group.pick(hash) else {
        let list = group.list();
        if list.address_denied {
            let why = list.last_error.as_deref().unwrap_or_default();
            return refuse(&mut passage, "destination_address_denied", why, Some(&sni));
        }
        return refuse(
            &mut passage,
            "no_healthy_upstream",
            "the Backend has no endpoint",
            Some(&sni),
        );
    };
    passage.endpoint = Some(endpoint.addr);
    let active = endpoint.start_request();
    let connected = crate::http::pipeline::tunnel::connect(shared, target, &endpoint).await;
    let mut upstream = match connected {
        Ok(stream) => stream,
        Err(e) => {
            limited!(info, listener = %info.listener, client = %info.client, sni, backend = %target.backend.label, error = %e, "passthrough: upstream connect failed");
            shared
                .metrics
                .tls_passthrough_rejected
                .get_or_create(&crate::telemetry::metrics::CauseLabel {
                    cause: "upstream_connect_failure",
                })
                .inc();
            passage.error = Some("upstream_connect_failure");
            return;
        }
    };
    if upstream.write_all(&hello).await.is_err() {
        return;
    }
    let end = crate::http::relay::relay(client, upstream, target.policy.stream_idle_timeout).await;
    tracing::debug!(listener = %info.listener, sni, backend = %target.backend.label, endpoint = %endpoint.addr, ?end, "passthrough closed");
    passage.bytes = Some((end.up, end.down));
    passage.complete = end.complete();
    drop(active);
    drop(admitted);
}

/// The access log line of one passthrough connection, written when it is dropped: after the
/// relay ends, on a refusal, or when a drain cuts the connection. No HTTP exchange happened,
/// so `method` is `TLS`, `protocol` `passthrough`, `status` 0; `authority` is the SNI.
struct Passage<'a> {
    shared: &'a Shared,
    info: &'a ConnInfo,
    time: std::time::SystemTime,
    started: std::time::Instant,
    sni: Option<String>,
    error: Option<&'static str>,
    backend: Option<std::sync::Arc<str>>,
    endpoint: Option<std::net::SocketAddr>,
    /// Bytes client → upstream and upstream → client, when the relay closed cleanly.
    bytes: Option<(u64, u64)>,
    complete: bool,
}

impl<'a> Passage<'a> {
    fn new(shared: &'a Shared, info: &'a ConnInfo) -> Self {
        Passage {
            shared,
            info,
            time: std::time::SystemTime::now(),
            started: std::time::Instant::now(),
            sni: None,
            error: None,
            backend: None,
            endpoint: None,
            bytes: None,
            complete: false,
        }
    }
}

impl Drop for Passage<'_> {
    fn drop(&mut self) {
        if !self.shared.access_log.enabled() {
            return;
        }
        let duration = crate::telemetry::access_log::millis(self.started.elapsed());
        let record = crate::telemetry::access_log::AccessRecord {
            time: crate::telemetry::time::rfc3339(self.time),
            client: self.info.client,
            client_identity: None,
            proxy_user: None,
            listener: self.info.listener.to_string(),
            method: "TLS".to_owned(),
            authority: self.sni.take().unwrap_or_default(),
            path: String::new(),
            protocol: "passthrough",
            status: 0,
            error: self.error,
            error_cause: None,
            route: None,
            backend: self.backend.as_deref().map(str::to_owned),
            endpoint: self.endpoint,
            attempts: u32::from(self.endpoint.is_some()),
            bytes_in: self.bytes.map(|(up, _)| up),
            bytes_in_counted: None,
            bytes_out: self.bytes.map_or(0, |(_, down)| down),
            mcp_method: None,
            mcp_tool: None,
            upstream_ttfb_ms: None,
            upstream_connect_ms: None,
            upstream_tls: None,
            upstream_alpn: None,
            headers_ms: 0.0,
            duration_ms: duration,
            complete: self.complete,
        };
        self.shared.access_log.write(&record);
    }
}

/// Reads until the ClientHello is complete; returns its SNI.
async fn read_hello(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<String>, &'static str> {
    loop {
        match peek_client_hello(buf) {
            Peek::Hello(sni) => return Ok(sni),
            Peek::Invalid(reason) => return Err(reason),
            Peek::NeedMore => {}
        }
        if buf.len() > MAX_HELLO + 16 * 1024 {
            return Err("ClientHello too large");
        }
        let mut chunk = [0u8; 4096];
        match client.read(&mut chunk).await {
            Ok(0) => return Err("connection closed before the ClientHello was complete"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err("read error before the ClientHello was complete"),
        }
    }
}

/// Closes the connection (by returning), counting why and logging it. Logged at info: unlike
/// a failed TLS handshake on an HTTPS listener, a refused SNI is an egress decision an
/// operator wants to see (the destination is named); but any client can cause one per
/// connection, so the lines are rate-limited and the counter is what counts them all.
fn refuse(passage: &mut Passage<'_>, cause: &'static str, why: &str, sni: Option<&str>) {
    passage.error = Some(cause);
    let (shared, info) = (passage.shared, passage.info);
    shared
        .metrics
        .tls_passthrough_rejected
        .get_or_create(&crate::telemetry::metrics::CauseLabel { cause })
        .inc();
    limited!(info, listener = %info.listener, client = %info.client, sni = sni.unwrap_or("-"), cause, "passthrough refused: {why}");
}
