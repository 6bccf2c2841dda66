//! Phase "log": the listener's and route's request metrics, and the access log line (and the
//! span's end) — written when the response body has been sent, or for a tunnel when it closes.

use http::Response;

use super::ctx::{RelayBytes, RequestCtx};
use crate::http::body::ProxyBody;
use crate::telemetry::access_log::{self, AccessRecord};

/// How a request ended when egressd answered it itself.
#[derive(Clone, Copy, Default)]
pub(super) struct Failure {
    /// The `x-egressd-error` code.
    pub(super) code: Option<&'static str>,
    /// Its finer cause, where there is one (TLS failures).
    pub(super) cause: Option<&'static str>,
}

/// Phase "log".
pub(super) fn phase(
    mut ctx: RequestCtx<'_>,
    response: Response<ProxyBody>,
    failure: Failure,
) -> Response<ProxyBody> {
    let elapsed = ctx.started.elapsed();
    let status = response.status().as_u16();
    if let Some(stats) = &ctx.conn.stats {
        stats.record(status, elapsed);
    }
    if let Some(action) = &ctx.route {
        action.stats(&ctx.shared.metrics).record(status, elapsed);
    }
    if !ctx.timed() {
        return response;
    }
    let Some(record) = access_record(&mut ctx, status, failure, elapsed) else {
        return response;
    };
    let Some(end) = ctx.relay_end else {
        return super::logged::log_when_done(
            ctx.shared.clone(),
            response,
            record,
            ctx.span,
            ctx.started,
        );
    };
    // A tunnel's span ends at the 200; its line waits for the tunnel to close, with the bytes
    // it carried.
    if let Some(span) = ctx.span {
        let mut at_200 = record.clone();
        at_200.complete = true;
        span.end(&crate::telemetry::trace::SpanEnd::from(&at_200));
    }
    let shared = ctx.shared.clone();
    let started = ctx.started;
    let mut record = record;
    tokio::spawn(async move {
        let bytes = end.await.ok().flatten();
        record.bytes_in = bytes.map(|b| b.up);
        record.bytes_out = bytes.map_or(0, |b| b.down);
        record.complete = bytes.is_some_and(|b| b.complete);
        record.duration_ms = access_log::millis(started.elapsed());
        shared.access_log.write(&record);
    });
    response
}

/// Phase "log" of a TLS passthrough connection, once it has ended (relayed, refused, or cut by
/// a drain): its access log line, with what the relay carried. `status` is 0 for a relayed
/// connection (no HTTP exchange happened), and for a refused one the status egressd answers a
/// CONNECT refused for the same reason with, so a refusal reads the same for both kinds.
pub(super) fn connection(
    ctx: &mut RequestCtx<'_>,
    status: u16,
    failure: Failure,
    relayed: Option<RelayBytes>,
) {
    let elapsed = ctx.started.elapsed();
    let Some(mut record) = access_record(ctx, status, failure, elapsed) else {
        return;
    };
    record.bytes_in = relayed.map(|b| b.up);
    record.bytes_out = relayed.map_or(0, |b| b.down);
    record.complete = relayed.is_some_and(|b| b.complete);
    record.duration_ms = access_log::millis(elapsed);
    ctx.shared.access_log.write(&record);
}

/// The access log line as far as the request's head and answer tell it (bytes out, duration
/// and completeness come when the exchange ends); `None` when nothing is logged.
fn access_record(
    ctx: &mut RequestCtx<'_>,
    status: u16,
    failure: Failure,
    elapsed: std::time::Duration,
) -> Option<AccessRecord> {
    let logged = ctx.logged.take()?;
    Some(AccessRecord {
        time: crate::telemetry::time::rfc3339(logged.time),
        client: ctx.conn.client,
        client_identity: ctx.conn.identity.as_ref().map(|i| i.shown()),
        proxy_user: ctx.user.as_deref().map(access_log::clipped),
        listener: ctx.conn.listener.to_string(),
        intercepted: ctx.conn.tunnel.is_some(),
        method: logged.method.as_str().to_owned(),
        authority: logged.authority,
        path: logged.path,
        protocol: logged.protocol.as_str(),
        status,
        error: failure.code.or(ctx.local_error),
        error_cause: failure.cause,
        route: ctx.route.as_ref().map(|r| r.name.to_string()),
        backend: ctx.backend.as_deref().map(str::to_owned),
        endpoint: ctx.upstream.endpoint,
        attempts: ctx.upstream.attempts,
        bytes_in: logged.bytes_in,
        bytes_in_counted: ctx.bytes_in.take(),
        bytes_out: 0,
        mcp_method: ctx.mcp_method.take(),
        mcp_tool: ctx.mcp_tool.take(),
        rate_limit: ctx.rate_limit.take(),
        upstream_ttfb_ms: ctx.upstream.ttfb.map(access_log::millis),
        upstream_connect_ms: ctx.upstream.connect.map(access_log::millis),
        upstream_tls: ctx.upstream.tls.map(|t| t.version),
        upstream_alpn: ctx.upstream.tls.and_then(|t| t.alpn),
        headers_ms: access_log::millis(elapsed),
        duration_ms: 0.0,
        complete: false,
    })
}
