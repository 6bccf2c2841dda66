//! A TLS passthrough connection through the same phases as every other kind of traffic:
//! destination (its ClientHello's SNI, canonical) → route (TLSRoutes, Passthrough Backends,
//! the outbound policy) → authorize (the source address: the client's TLS is its own) → limit
//! (one request per connection) → admit
//! → pick and connect (`tunnel::open`) → relay → log. Only the relay is its own: the
//! ClientHello already read is sent first, then bytes go both ways untouched; egressd never
//! sees plaintext, and the client verifies the endpoint's own certificate.
//!
//! A refusal is a [`ProxyError`] recorded as an HTTP request's is (`failure`: `/blocked`, the
//! circuit breaker's overflow, …) and logged with the same code; the connection is then closed
//! without a byte, counted in `egressd_tls_passthrough_rejected_total{cause}` under that code.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::ctx::{ConnInfo, RelayBytes, RequestCtx};
use super::destination::Destination;
use super::kind::Kind;
use super::log::Failure;
use crate::http::error::ProxyError;
use crate::snapshot::shared::Shared;
use crate::telemetry::log_limit::limited;
use crate::telemetry::metrics::CauseLabel;

/// A complete ClientHello, as the listener read it.
pub(crate) struct ClientHello {
    /// Its bytes, sent to the endpoint before anything else.
    pub(crate) bytes: Vec<u8>,
    /// Its server name, as the client sent it.
    pub(crate) sni: String,
}

/// When a passthrough connection arrived: its log line's time and duration start there, not
/// when its ClientHello was complete.
pub(crate) struct Arrival {
    pub(crate) time: std::time::SystemTime,
    pub(crate) started: Instant,
}

impl Arrival {
    pub(crate) fn now() -> Self {
        Arrival {
            time: std::time::SystemTime::now(),
            started: Instant::now(),
        }
    }
}

/// Serves one passthrough connection whose ClientHello the listener read (or failed to):
/// every phase, then the relay until either side closes. Never fails: a refusal closes the
/// connection. The access log line is written when the connection ends, also when a drain cuts
/// it (this future is dropped).
pub(crate) async fn serve(
    shared: &Arc<Shared>,
    conn: &ConnInfo,
    arrival: Arrival,
    client: TcpStream,
    hello: Result<ClientHello, ProxyError>,
) {
    let snapshot = shared.snapshot.load_full();
    let ctx = RequestCtx::passthrough(shared, &snapshot, conn, arrival.time, arrival.started);
    let mut passage = Passage {
        ctx,
        status: 0,
        failure: Failure::default(),
        relayed: None,
    };
    let (hello, dest) = match destination(&mut passage.ctx, hello) {
        Ok(found) => found,
        Err(err) => return passage.refused(&err, None),
    };
    let mut client = Some(client);
    match proxy(&mut passage.ctx, &mut client, &hello, &dest).await {
        Ok(relayed) => passage.relayed = Some(relayed),
        Err(err) => passage.refused(&err, Some(dest.host())),
    }
    // Closed only now: a client that sees its connection close finds the refusal counted.
    drop(client);
}

/// Phase "destination" of a passthrough connection: the ClientHello's SNI, canonical.
fn destination(
    ctx: &mut RequestCtx<'_>,
    hello: Result<ClientHello, ProxyError>,
) -> Result<(Vec<u8>, Destination), ProxyError> {
    let hello = hello?;
    let dest = Destination::of_sni(&hello.sni)?;
    if let Some(logged) = &mut ctx.logged {
        logged.authority = dest.host().to_owned();
    }
    Ok((hello.bytes, dest))
}

/// The phases from "route" to "relay".
async fn proxy(
    ctx: &mut RequestCtx<'_>,
    client: &mut Option<TcpStream>,
    hello: &[u8],
    dest: &Destination,
) -> Result<RelayBytes, ProxyError> {
    let kind = Kind::Passthrough;
    let routed = super::route::phase(ctx, dest, None, kind)?;
    if let Some(access) = ctx.snapshot.client_access.as_deref() {
        super::authorize::phase(ctx, access, dest, &routed, kind)?;
    }
    if let Some(rules) = &routed.target.policy.rate_limit {
        let request = super::limit::Request {
            method: "",
            path: "",
            headers: None,
            mcp: None,
        };
        super::limit::phase(ctx, &rules.0, request).await?;
    }
    let admitted = super::admit::phase(&routed.target, kind)?;
    let target = &**routed.target;
    let (mut upstream, active) = super::tunnel::open(ctx, target).await?;
    let addr = active.endpoint().addr;
    upstream
        .write_all(hello)
        .await
        .map_err(|e| ProxyError::UpstreamReset {
            backend: target.backend.label.clone(),
            endpoint: addr,
            cause: format!("closed before the ClientHello was sent: {e}"),
        })?;
    let send = ctx.snapshot.settings.downstream.send_timeout;
    let idle = target.policy.stream_idle_timeout;
    let Some(client) = client.take() else {
        return Err(ProxyError::ClientClosed {
            cause: "the connection was already relayed".into(),
        });
    };
    let end = crate::http::relay::relay(client, upstream, idle, send).await;
    end.count_cut(&ctx.shared.metrics);
    tracing::debug!(listener = %ctx.conn.listener, sni = dest.host(), backend = %target.backend.label, endpoint = %addr, ?end, "passthrough closed");
    // Only now is the connection over for the endpoint's count and the circuit breaker.
    drop(active);
    drop(admitted);
    Ok(RelayBytes {
        up: end.up,
        down: end.down,
        complete: end.complete(),
    })
}

/// A refused connection: recorded as any failure is, counted by its code, and logged at info —
/// unlike a failed TLS handshake on an HTTPS listener, a refused SNI is an egress decision an
/// operator wants to see (the destination is named), but any client can cause one per
/// connection, so the lines are rate-limited and the counter is what counts them all.
fn refuse(ctx: &mut RequestCtx<'_>, err: &ProxyError, sni: Option<&str>) -> Failure {
    super::failure::record(ctx, err);
    let cause = err.code();
    ctx.shared
        .metrics
        .tls_passthrough_rejected
        .get_or_create(&CauseLabel { cause })
        .inc();
    let sni = sni.unwrap_or("-");
    limited!(info, listener = %ctx.conn.listener, client = %ctx.conn.client, sni, cause, "passthrough refused: {err}");
    Failure {
        code: Some(cause),
        cause: err.cause(),
    }
}

/// A passthrough connection on its way: its log line is written when it is dropped, however
/// the connection ended.
struct Passage<'a> {
    ctx: RequestCtx<'a>,
    status: u16,
    failure: Failure,
    relayed: Option<RelayBytes>,
}

impl Passage<'_> {
    /// The connection is refused (by returning, which closes it).
    fn refused(&mut self, err: &ProxyError, sni: Option<&str>) {
        self.status = err.status().as_u16();
        self.failure = refuse(&mut self.ctx, err, sni);
    }
}

impl Drop for Passage<'_> {
    fn drop(&mut self) {
        super::log::connection(&mut self.ctx, self.status, self.failure, self.relayed);
    }
}
