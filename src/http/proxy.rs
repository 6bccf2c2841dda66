//! The request lifecycle, one function per phase.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Uri};
use http::{Method, Request, Response, Version};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::body::{Lease, ProxyBody, RequestBody, UpstreamBody};
use super::error::{local_reply, ProxyError};
use super::grpc::GrpcCall;
use super::headers::{add_forwarded_for, append_via, client_address_value, strip_hop_by_hop};
use super::router::{RouteEntry, RouteInput};
use super::websocket::Upgrade;
use crate::balance::outlier::Outcome as OutlierOutcome;
use crate::config::wire::enums::Protocol;
use crate::runtime::shared::Shared;
use crate::runtime::snapshot::{Snapshot, Target};
use crate::runtime::undeclared::{Carriage, Refusal};
use crate::telemetry::access_log::{self, AccessRecord};
use crate::telemetry::blocked::Via;
use crate::upstream::connect::ConnectError;
use crate::upstream::endpoint::ActiveRequest;
use crate::upstream::Endpoint;

/// What the proxy knows about the connection a request arrived on.
#[derive(Debug)]
pub struct ConnInfo {
    pub listener: Arc<str>,
    pub client: SocketAddr,
    /// `client`'s address as an `X-Forwarded-For` value, formatted once per connection.
    pub client_header: HeaderValue,
    /// Whether the client connected with TLS (an HTTPS listener): `X-Forwarded-Proto: https`.
    pub tls: bool,
    /// The drain tracker: a CONNECT tunnel outlives its HTTP connection and registers itself,
    /// so SIGTERM waits for it (up to the drain timeout) like for any connection.
    pub tracker: Option<Arc<crate::listener::ConnTracker>>,
    /// The listener's request metrics (looked up once per connection).
    pub stats: Option<Arc<crate::telemetry::metrics::RequestStats>>,
}

impl ConnInfo {
    pub fn new(listener: Arc<str>, client: SocketAddr) -> Self {
        ConnInfo {
            listener,
            client_header: client_address_value(client.ip()),
            client,
            tls: false,
            tracker: None,
            stats: None,
        }
    }
}

/// Where the client wants to go, from the absolute URI or `Host`.
#[derive(Debug)]
pub(super) struct Destination {
    /// The host in canonical form (`upstream::address::canonical_host`), only when that is not
    /// the client's text without its trailing dot (the common case needs no copy).
    canonical: Option<String>,
    port: Option<u16>,
    /// The authority as the client gave it (used as `Host` when not rewritten).
    authority: Authority,
    /// 80 for `http` (and origin-form on plaintext listeners), 443 for `https`.
    scheme_default_port: u16,
}

impl Destination {
    /// Lower-case, without port or trailing dot, IP literals canonical (IPv6 in brackets).
    fn host(&self) -> &str {
        match &self.canonical {
            Some(h) => h,
            None => {
                let raw = self.authority.host();
                raw.strip_suffix('.').unwrap_or(raw)
            }
        }
    }
}

/// The request fields the access log records.
struct LoggedRequest {
    time: std::time::SystemTime,
    method: Method,
    version: Version,
    authority: String,
    path: String,
    bytes_in: Option<u64>,
}

/// What the access log needs to know about how a request went.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) route: Option<Arc<str>>,
    /// The matched route rule (for its metrics).
    pub(super) route_action: Option<Arc<super::router::RouteAction>>,
    pub(super) backend: Option<Arc<str>>,
    pub(super) endpoint: Option<SocketAddr>,
    /// The JSON-RPC method (and tool) of an MCP request, when egressd could see it.
    pub(super) mcp_method: Option<String>,
    pub(super) mcp_tool: Option<String>,
    /// The `x-egressd-error` code of an answer egressd gave itself without failing (a denied
    /// MCP tool call is a JSON-RPC error inside a 200).
    pub(super) local_error: Option<&'static str>,
    /// Times the request went upstream (retries included).
    pub(super) attempts: u32,
    /// From the request's arrival until the last attempt's response headers (measured only
    /// for the access log: a clock read per request otherwise saved).
    pub(super) upstream_ttfb: Option<Duration>,
    /// The last attempt opened a connection, taking this long.
    pub(super) upstream_connect: Option<Duration>,
    /// What TLS with the endpoint settled on (its latest handshake).
    pub(super) upstream_tls: Option<crate::upstream::connect::TlsSummary>,
    pub(super) timed: bool,
    /// The bytes of a request body without a declared length, counted as it is sent (when
    /// `timed`).
    pub(super) bytes_in: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// A CONNECT tunnel's end (bytes client→upstream and back, when it closed cleanly), for
    /// the access log line written when the tunnel closes.
    /// (bytes up, bytes down, closed in order) once a CONNECT tunnel ends.
    pub(super) tunnel_end: Option<tokio::sync::oneshot::Receiver<Option<(u64, u64, bool)>>>,
}

/// Handles one request: never fails, every failure becomes a local reply.
pub async fn handle(
    shared: Arc<Shared>,
    conn: Arc<ConnInfo>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    shared.metrics.requests.inc();
    let snapshot = shared.snapshot.load_full();
    let mut req = req;
    // egressd's own span, when tracing is configured: the request goes upstream under it.
    let span = snapshot.tracing.as_ref().map(|tracing| {
        let method = req.method().clone();
        let authority = request_authority(&req).to_owned();
        tracing.request_span(
            req.headers_mut(),
            &method,
            &authority,
            &conn.listener,
            conn.client,
        )
    });
    // What the access log (and the span) needs from the request, taken before the request
    // moves on; nothing is copied when both are off.
    let log_request = (shared.access_log.enabled() || span.is_some()).then(|| LoggedRequest {
        time: std::time::SystemTime::now(),
        bytes_in: http_body::Body::size_hint(req.body()).exact(),
        method: req.method().clone(),
        version: req.version(),
        authority: request_authority(&req).to_owned(),
        path: req.uri().path().to_owned(),
    });
    let mut outcome = Outcome {
        timed: log_request.is_some(),
        ..Outcome::default()
    };
    let grpc = super::grpc::call(req.headers());

    let (response, error, error_cause) =
        match proxy(&shared, &snapshot, &conn, req, started, grpc, &mut outcome).await {
            Ok(response) => (response, None, None),
            Err(err) => {
                let code = err.code();
                shared
                    .metrics
                    .local_replies
                    .get_or_create(&crate::telemetry::metrics::CodeLabel { code })
                    .inc();
                if outcome.endpoint.is_none() {
                    outcome.endpoint = err.endpoint();
                }
                if err.status().is_server_error() {
                    tracing::debug!(error = %err, code, "local reply");
                }
                if let ProxyError::Overflow { backend, limit, .. } = &err {
                    shared.metrics.overflow(backend, *limit);
                }
                if let ProxyError::DestinationNotAllowed { host, port, via }
                | ProxyError::DestinationDenied {
                    host, port, via, ..
                } = &err
                {
                    shared.blocked(host, *port, *via);
                }
                // Another port of a declared hostname: declarable by a Backend of its own.
                if let ProxyError::PortNotAllowed { host, port, .. } = &err {
                    shared.blocked(host, *port, Via::Http);
                }
                let cause = err.cause();
                if let Some(cause) = cause {
                    shared
                        .metrics
                        .upstream_tls_failures
                        .get_or_create(&crate::telemetry::metrics::CauseLabel { cause })
                        .inc();
                }
                let reply = match grpc {
                    Some(_) => super::grpc::local_reply(&err),
                    None => local_reply(&err),
                };
                (reply, Some(code), cause)
            }
        };

    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    if let Some(stats) = &conn.stats {
        stats.record(status, elapsed);
    }
    if let Some(action) = &outcome.route_action {
        action.stats(&shared.metrics).record(status, elapsed);
    }
    let Some(logged) = log_request else {
        return Ok(response);
    };
    let record = AccessRecord {
        time: crate::telemetry::time::rfc3339(logged.time),
        client: conn.client,
        listener: conn.listener.to_string(),
        method: logged.method.as_str().to_owned(),
        authority: logged.authority,
        path: logged.path,
        protocol: version_str(logged.version),
        status: response.status().as_u16(),
        error: error.or(outcome.local_error),
        error_cause,
        route: outcome.route.as_deref().map(str::to_owned),
        backend: outcome.backend.as_deref().map(str::to_owned),
        endpoint: outcome.endpoint,
        attempts: outcome.attempts,
        bytes_in: logged.bytes_in,
        bytes_in_counted: outcome.bytes_in.take(),
        bytes_out: 0,
        mcp_method: outcome.mcp_method,
        mcp_tool: outcome.mcp_tool,
        upstream_ttfb_ms: outcome.upstream_ttfb.map(access_log::millis),
        upstream_connect_ms: outcome.upstream_connect.map(access_log::millis),
        upstream_tls: outcome.upstream_tls.map(|t| t.version),
        upstream_alpn: outcome.upstream_tls.and_then(|t| t.alpn),
        headers_ms: access_log::millis(elapsed),
        duration_ms: 0.0,
        complete: false,
    };
    if let Some(end) = outcome.tunnel_end.take() {
        // A tunnel's span ends at the 200; its line waits for the tunnel to close, with the
        // bytes it carried.
        if let Some(span) = span {
            let mut at_200 = record.clone();
            at_200.complete = true;
            span.end(&crate::telemetry::trace::SpanEnd::from(&at_200));
        }
        let shared = shared.clone();
        let mut record = record;
        tokio::spawn(async move {
            let bytes = end.await.ok().flatten();
            record.bytes_in = bytes.map(|(up, _, _)| up);
            record.bytes_out = bytes.map_or(0, |(_, down, _)| down);
            record.complete = bytes.is_some_and(|(_, _, complete)| complete);
            record.duration_ms = access_log::millis(started.elapsed());
            shared.access_log.write(&record);
        });
        return Ok(response);
    }
    Ok(super::logged::log_when_done(
        shared.clone(),
        response,
        record,
        span,
        started,
    ))
}

/// The authority the client named: the URI's (absolute-form, HTTP/2 `:authority`), else
/// `Host`; empty when neither is there.
fn request_authority<B>(req: &Request<B>) -> &str {
    match req.uri().authority() {
        Some(a) => a.as_str(),
        None => req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default(),
    }
}

async fn proxy(
    shared: &Arc<Shared>,
    snapshot: &Snapshot,
    conn: &ConnInfo,
    req: Request<Incoming>,
    started: Instant,
    grpc: Option<GrpcCall>,
    outcome: &mut Outcome,
) -> Result<Response<ProxyBody>, ProxyError> {
    super::limits::check_head(&req, &snapshot.settings.downstream.head)?;
    let dest = destination(&req, conn.tls)?;
    // A request that keeps coming back (a Backend or destination pointing at egressd itself)
    // is stopped here instead of multiplying until a limit breaks.
    let hops = super::headers::egressd_hops(req.headers());
    if hops >= super::headers::MAX_EGRESSD_HOPS {
        return Err(ProxyError::LoopDetected { hops });
    }
    let router = snapshot
        .routers
        .get(&conn.listener)
        .ok_or(ProxyError::ListenerGone)?;
    // A websocket asked for by HTTP/1.1 `Upgrade` or HTTP/2 extended CONNECT; any other
    // CONNECT is a tunnel to host:port.
    let upgrade = Upgrade::of(&req)?;
    if req.method() == Method::CONNECT && upgrade.is_none() {
        return tunnel(shared, snapshot, router, &dest, req, conn, outcome).await;
    }

    // Route: HTTPRoute rules first, then the implicit route to an FQDN Backend.
    let input = RouteInput {
        host: dest.host(),
        path: req.uri().path(),
        query: req.uri().query(),
        method: Upgrade::routing_method(upgrade, &req),
        headers: req.headers(),
    };
    // A target made for an undeclared destination (AllowAny, AuditOnly) lives here.
    let undeclared;
    let (target, entry): (&Arc<Target>, Option<&RouteEntry>) = match router.route(&input) {
        Some(entry) => {
            outcome.route = Some(entry.action.name.clone());
            outcome.route_action = Some(entry.action.clone());
            // A request of an MCP session goes where the session began.
            let key = &snapshot.mcp_session_key;
            let target = match super::mcp::session_target(key, &req, &entry.action)? {
                Some(target) => target,
                None => entry.action.pick().ok_or_else(|| ProxyError::NoBackend {
                    route: entry.action.name.clone(),
                })?,
            };
            (target, Some(entry))
        }
        None => match router.implicit(dest.host()) {
            Some(implicit) => {
                let target = implicit
                    .target_for(dest.port, dest.scheme_default_port)
                    .ok_or_else(|| ProxyError::PortNotAllowed {
                        host: dest.host().to_owned(),
                        port: dest.port.unwrap_or(dest.scheme_default_port),
                        declared: implicit.declared_ports(),
                    })?;
                (target, None)
            }
            None if router.declares_host(dest.host()) => {
                return Err(ProxyError::NoRoute {
                    host: dest.host().to_owned(),
                    path: input.path.to_owned(),
                })
            }
            None => {
                // The client's scheme decides how an undeclared destination is reached (no
                // Backend says otherwise): `https://` or an HTTPS listener → TLS.
                let carriage = if dest.scheme_default_port == 443 {
                    Carriage::Https
                } else {
                    Carriage::Http
                };
                undeclared = undeclared_target(
                    shared,
                    snapshot,
                    dest.host(),
                    dest.port.unwrap_or(dest.scheme_default_port),
                    Via::Http,
                    carriage,
                )?;
                (&undeclared, None)
            }
        },
    };
    outcome.backend = Some(target.backend.label.clone());

    if let Some(upgrade) = upgrade {
        if target.policy.websocket {
            let result =
                super::websocket::proxy(shared, req, &dest, target, entry, conn, outcome).await;
            // The upgrade's answer (or failure) tells outlier detection about the endpoint.
            let seen = match &result {
                Ok(response) => Some(OutlierOutcome::of_status(response.status().as_u16())),
                Err(e) => e.outlier_outcome(),
            };
            let endpoint = outcome.endpoint.and_then(|addr| {
                let list = target.port.endpoints.list();
                list.endpoints.iter().find(|e| e.addr == addr).cloned()
            });
            if let (Some(seen), Some(endpoint)) = (seen, endpoint) {
                record_outcome(shared, target, &endpoint, seen);
            }
            return result;
        }
        upgrade.refused(target)?;
    }
    // Taken from the client's request, before the headers are rewritten for the upstream.
    let hash = request_hash(target, req.headers(), conn);
    let mut upstream_req = prepare_request(req, &dest, target, entry, conn)?;
    if outcome.timed {
        outcome.bytes_in = upstream_req.body_mut().count_undeclared();
    }
    // Credentials the application never holds (`CredentialInjector` extensions).
    for credential in &target.backend.credentials {
        credential
            .apply(upstream_req.headers_mut())
            .map_err(|reason| ProxyError::CredentialUnavailable {
                backend: target.backend.label.clone(),
                extension: credential.name.clone(),
                reason: reason.to_owned(),
            })?;
    }
    // Phase "mcp": on an MCP Backend's endpoint path, the version check and session affinity.
    let mcp = target
        .port
        .mcp
        .as_deref()
        .filter(|m| m.applies_to(upstream_req.uri()));
    let mcp_post = mcp.is_some() && upstream_req.method() == Method::POST;
    let mut pinned = None;
    if let Some(m) = mcp {
        match super::mcp::inbound(shared, m, target, upstream_req, outcome).await? {
            super::mcp::Inbound::Forward(req, endpoint) => {
                upstream_req = req;
                pinned = endpoint;
            }
            super::mcp::Inbound::Reply(reply) => return Ok(reply),
        }
    }
    // Phase "admit": the circuit breaker, before any endpoint is bothered.
    let admission = target
        .port
        .endpoints
        .admit()
        .ok_or_else(|| ProxyError::Overflow {
            backend: target.backend.label.clone(),
            limit: crate::upstream::breaker::Limit::ParallelRequests,
            max: target
                .port
                .endpoints
                .breaker()
                .settings()
                .max_parallel_requests,
        })?;
    let deadline = request_deadline(target.policy.request_timeout, grpc, started);
    let retry = target.policy.retry.as_ref();
    if let Some(policy) = retry {
        upstream_req =
            super::retry::read_ahead(shared, upstream_req, policy.replay_body_limit).await?;
    }
    let mut retries = 0u32;
    let mut retry_slot = None;
    let mut previous: Option<Arc<Endpoint>> = None;
    loop {
        // A copy to send again, taken only while a retry is possible (see `retry_decision`).
        let replay = retry
            .filter(|r| retries < r.num_retries)
            .and_then(|_| super::exchange::replayable_copy(&upstream_req));
        let endpoint = match &pinned {
            // A session stays where it began, retries included.
            Some(endpoint) => endpoint.clone(),
            None => pick_endpoint_avoiding(target, previous.as_ref(), hash).await?,
        };
        outcome.endpoint = Some(endpoint.addr);
        // Counted from now, not from the response headers: least-request balancing must see
        // the requests still waiting for an answer (a slow endpoint's pile-up is the signal).
        let active = endpoint.start_request();
        let attempt_deadline = match retry.and_then(|r| r.per_try_timeout) {
            Some(t) => {
                let per_try = (Instant::now() + t, t);
                Some(deadline.map_or(per_try, |d| if d.0 <= per_try.0 { d } else { per_try }))
            }
            None => deadline,
        };
        outcome.attempts += 1;
        let sent_at = Instant::now();
        let sent = if outcome.timed {
            // For the access log: whether this attempt opened a connection, and how long that
            // took (boxed: only requests that are logged carry the larger future).
            let new_connection = &super::exchange::NEW_CONNECTION;
            let (sent, connected) =
                Box::pin(new_connection.scope(std::cell::Cell::new(None), async {
                    let sent =
                        super::exchange::send(target, &endpoint, upstream_req, attempt_deadline)
                            .await;
                    (sent, new_connection.with(std::cell::Cell::get))
                }))
                .await;
            outcome.upstream_connect = connected;
            outcome.upstream_tls = endpoint.tls();
            sent
        } else {
            super::exchange::send(target, &endpoint, upstream_req, attempt_deadline).await
        };
        match &sent {
            Ok((response, _)) => target
                .backend
                .stats(&shared.metrics)
                .record(response.status().as_u16(), sent_at.elapsed()),
            Err(
                e @ (ProxyError::ConnectFailure { .. }
                | ProxyError::ConnectTimeout { .. }
                | ProxyError::UpstreamTls { .. }),
            ) => {
                shared
                    .metrics
                    .upstream_connect_failures
                    .get_or_create(&crate::telemetry::metrics::BackendReasonLabel {
                        backend: target.backend.label.to_string(),
                        reason: e.code(),
                    })
                    .inc();
            }
            Err(_) => {}
        }
        if outcome.timed && sent.is_ok() {
            outcome.upstream_ttfb = Some(started.elapsed());
        }
        // Phase "record": outlier detection learns how the endpoint did.
        let recorded = match &sent {
            // An MCP POST's 200 is judged by the JSON-RPC messages in it, once they have
            // passed (`mcp::Verdict`).
            Ok((response, _)) if mcp_post && response.status() == http::StatusCode::OK => None,
            Ok((response, _)) => Some(OutlierOutcome::of_status(response.status().as_u16())),
            Err(e) => e.outlier_outcome(),
        };
        if let Some(r) = recorded {
            record_outcome(shared, target, &endpoint, r);
        }
        match &sent {
            Err(e) if e.endpoint().is_some() => endpoint.note_failure(format!("{}: {e}", e.code())),
            Ok((response, _)) if response.status().is_server_error() => {
                endpoint.note_failure(format!("answered {}", response.status()))
            }
            _ => {}
        }
        // Phase "retry": only what the policy names, and only when it is safe.
        if let (Some(policy), Some(next)) = (retry, replay) {
            let time_left = deadline.is_none_or(|(at, _)| Instant::now() < at);
            let slot = (time_left && super::retry::should_retry(policy, &sent, next.method()))
                .then(|| target.port.endpoints.breaker().admit_retry());
            if let Some(Err(limit)) = slot {
                // The circuit breaker's retry limit: this attempt's answer is final.
                shared.metrics.overflow(&target.backend.label, limit);
            }
            if let Some(Ok(slot)) = slot {
                // Held until the retried attempt has its answer (the next loop round).
                retry_slot = Some(slot);
                retries += 1;
                shared
                    .metrics
                    .retries
                    .get_or_create(&crate::telemetry::metrics::BackendLabel {
                        backend: target.backend.label.to_string(),
                    })
                    .inc();
                tracing::debug!(backend = %target.backend.label, endpoint = %endpoint.addr, retries, "retrying");
                drop(sent);
                drop(active);
                super::retry::back_off(policy, retries).await;
                upstream_req = next;
                previous = Some(endpoint);
                continue;
            }
        }
        drop(retry_slot);
        let (mut response, lease) = sent?;
        let mut deadline = deadline;
        let mut verdict = None;
        if let Some(m) = mcp {
            m.outbound(
                &super::mcp::session_home(target, endpoint.addr),
                response.headers_mut(),
            );
            verdict = (mcp_post && response.status() == http::StatusCode::OK)
                .then(|| super::mcp::Verdict::new(shared, target, &endpoint));
            if let Some(policy) = m
                .tools
                .as_ref()
                .filter(|_| outcome.mcp_method.as_deref() == Some("tools/list"))
            {
                return super::mcp::filtered_tools_list(
                    shared,
                    response,
                    policy,
                    entry,
                    target,
                    endpoint.addr,
                    verdict,
                )
                .await;
            }
            // An MCP event stream lives as long as the session needs it: only the stream
            // idle timeout ends it, not the request timeout.
            if crate::mcp::is_event_stream(response.headers()) {
                deadline = None;
            }
        }
        let response = respond(
            response,
            lease,
            active.holding(admission),
            target,
            entry,
            deadline,
            grpc.is_some(),
        );
        let response = match verdict {
            Some(verdict) => super::mcp::watch_errors(response, verdict),
            None => response,
        };
        return Ok(match mcp {
            Some(m) if m.legacy_sse && crate::mcp::is_event_stream(response.headers()) => {
                super::mcp::announce_through_proxy(response, m, target, endpoint.addr)
            }
            _ => response,
        });
    }
}

/// Phase "record": outlier detection learns how `endpoint` did.
pub(crate) fn record_outcome(
    shared: &Shared,
    target: &Target,
    endpoint: &Endpoint,
    seen: OutlierOutcome,
) {
    if let Some(d) = target.port.endpoints.record(endpoint, seen) {
        shared.metrics.outlier_detection(&target.backend.label, d);
    }
}

/// Phase "pick endpoint" for a retry: another endpoint than the one that just failed, when
/// the group has one.
async fn pick_endpoint_avoiding(
    target: &Target,
    previous: Option<&Arc<Endpoint>>,
    hash: Option<u64>,
) -> Result<Arc<Endpoint>, ProxyError> {
    let mut endpoint = pick_endpoint(target, hash).await?;
    if let Some(previous) = previous {
        for attempt in 1..=3u64 {
            if !Arc::ptr_eq(&endpoint, previous) {
                break;
            }
            // The same hash would find the same endpoint: move it far away, as Envoy's Maglev
            // does for retries (most bits flipped).
            let moved = hash.map(|h| h ^ (u64::MAX - attempt + 1));
            endpoint = pick_endpoint(target, moved).await?;
        }
    }
    Ok(endpoint)
}

/// The request's consistent-hash key hashed, when the Backend balances by one (nothing is
/// computed for the other balancers).
pub(super) fn request_hash(
    target: &Target,
    headers: &http::HeaderMap,
    conn: &ConnInfo,
) -> Option<u64> {
    target
        .port
        .endpoints
        .hash_key()?
        .hash(headers, conn.client.ip())
}

/// When the whole exchange must be over, and the timeout that says so: the request timeout,
/// or a gRPC client's own deadline (`grpc-timeout`) when that comes first.
fn request_deadline(
    request_timeout: Option<Duration>,
    grpc: Option<GrpcCall>,
    started: Instant,
) -> Option<(Instant, Duration)> {
    let shortest = match (request_timeout, grpc.and_then(|g| g.timeout)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    shortest.map(|t| (started + t, t))
}

/// Phase "destination": the host and port the client asked for.
/// `tls`: the request arrived on an HTTPS listener, so a `Host` without a port means 443.
fn destination(req: &Request<Incoming>, tls: bool) -> Result<Destination, ProxyError> {
    // RFC 9112 §3.2: a server answers 400 to any HTTP/1.1 request without Host, absolute-form
    // and CONNECT included (HTTP/1.0 may omit it; HTTP/2 has `:authority`).
    if req.version() == http::Version::HTTP_11 && !req.headers().contains_key(header::HOST) {
        return Err(ProxyError::InvalidRequest(
            "an HTTP/1.1 request needs a Host header".into(),
        ));
    }
    let uri = req.uri();
    // Absolute-form (forward proxy) and HTTP/2 requests carry the authority in the URI; RFC
    // 9112 §3.2.2 says a proxy then ignores Host.
    let (authority, default_port) = match uri.authority() {
        Some(a) => (
            a.clone(),
            if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            },
        ),
        None => {
            let host = req.headers().get(header::HOST).ok_or_else(|| {
                ProxyError::InvalidRequest("no Host header and no absolute URI".into())
            })?;
            let authority = host
                .to_str()
                .ok()
                .and_then(|h| h.parse::<Authority>().ok())
                .ok_or_else(|| ProxyError::InvalidRequest("malformed Host header".into()))?;
            (authority, if tls { 443 } else { 80 })
        }
    };
    if authority.as_str().contains('@') {
        return Err(ProxyError::InvalidRequest(
            "userinfo in the request authority is not allowed".into(),
        ));
    }
    // Checked and canonicalised before anything routes, records or judges it: a host that is
    // no host name or IP literal never reaches a table, and every spelling of an address is
    // one address.
    let raw = authority.host();
    let canonical = match crate::upstream::address::canonical_host(raw) {
        Ok(std::borrow::Cow::Borrowed(_)) => None,
        Ok(std::borrow::Cow::Owned(host)) => Some(host),
        Err(e) => return Err(ProxyError::InvalidRequest(format!("invalid host: {e}"))),
    };
    Ok(Destination {
        canonical,
        port: authority.port_u16(),
        authority,
        scheme_default_port: default_port,
    })
}

/// `CONNECT host:port`: only to a declared TCP port of a Backend (Passthrough or plain TCP);
/// the client's bytes then go to the endpoint untouched (for Passthrough, the client's own TLS
/// with the endpoint's own certificate).
async fn tunnel(
    shared: &Shared,
    snapshot: &Snapshot,
    router: &crate::http::router::HttpRouter,
    dest: &Destination,
    req: Request<Incoming>,
    conn: &ConnInfo,
    outcome: &mut Outcome,
) -> Result<Response<ProxyBody>, ProxyError> {
    let port = dest.port.ok_or_else(|| {
        ProxyError::InvalidRequest("CONNECT needs host:port as its target".into())
    })?;
    let undeclared;
    let target = match router.tunnel(dest.host(), port) {
        Some(target) => target,
        // A host a route or Backend declares keeps its own rules (no tunnel to it unless a
        // TCP port says so), whatever the outbound policy.
        None if snapshot.undeclared.is_some()
            && (router.declares_host(dest.host()) || router.implicit(dest.host()).is_some()) =>
        {
            return Err(ProxyError::DestinationDenied {
                host: dest.host().to_owned(),
                port,
                via: Via::Connect,
                reason: Refusal::Declared,
            });
        }
        None => {
            undeclared = undeclared_target(
                shared,
                snapshot,
                dest.host(),
                port,
                Via::Connect,
                Carriage::Tcp,
            )?;
            &undeclared
        }
    };
    outcome.backend = Some(target.backend.label.clone());
    // A tunnel has no request headers of its own to hash: only SourceIP applies.
    let hash = target
        .port
        .endpoints
        .hash_key()
        .and_then(|k| k.hash_connection(conn.client.ip()));
    let endpoint = pick_endpoint(target, hash).await?;
    outcome.endpoint = Some(endpoint.addr);
    let backend = &target.backend.label;
    let upstream = super::tunnel::connect_upstream(shared, target, &endpoint)
        .await
        .map_err(|e| connect_error(&e, backend, endpoint.addr))?;
    let idle = target.policy.stream_idle_timeout;
    let active = endpoint.start_request();
    let open = conn.tracker.as_ref().map(|t| t.enter());
    let on_upgrade = hyper::upgrade::on(req);
    let label = backend.clone();
    let report = outcome.timed.then(|| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        outcome.tunnel_end = Some(rx);
        tx
    });
    tokio::spawn(async move {
        let mut bytes = None;
        match on_upgrade.await {
            Ok(upgraded) => {
                let end = super::tunnel::relay(TokioIo::new(upgraded), upstream, idle).await;
                bytes = Some((end.up, end.down, end.complete()));
                tracing::debug!(backend = %label, endpoint = %active.endpoint().addr, ?end, "tunnel closed");
            }
            Err(e) => tracing::debug!(backend = %label, error = %e, "CONNECT upgrade failed"),
        }
        drop(active);
        drop(open);
        if let Some(report) = report {
            let _ = report.send(bytes);
        }
    });
    Ok(Response::new(ProxyBody::empty()))
}

/// A destination nothing declares: 403 under `RegistryOnly`; under `AllowAny` and `AuditOnly`
/// the target made for it, unless something denies it (`AuditOnly` records the use in
/// `/blocked` as audited).
fn undeclared_target(
    shared: &Shared,
    snapshot: &Snapshot,
    host: &str,
    port: u16,
    via: Via,
    carriage: Carriage,
) -> Result<Arc<Target>, ProxyError> {
    let Some(undeclared) = &snapshot.undeclared else {
        return Err(ProxyError::DestinationNotAllowed {
            host: host.to_owned(),
            port,
            via,
        });
    };
    match undeclared.target(host, port, carriage) {
        Ok(target) => {
            if undeclared.audits() {
                shared.audited(host, port, via);
            }
            Ok(target)
        }
        Err(reason) => Err(ProxyError::DestinationDenied {
            host: host.to_owned(),
            port,
            via,
            reason,
        }),
    }
}

/// Phase "prepare": the request as it goes upstream (origin-form, HTTP/1.1, filtered headers).
pub(super) fn prepare_request(
    req: Request<Incoming>,
    dest: &Destination,
    target: &Target,
    entry: Option<&RouteEntry>,
    conn: &ConnInfo,
) -> Result<Request<RequestBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    let filters = entry.map(|e| &e.action.filters);

    // Origin-form URI, with the path rewritten if a filter says so.
    let path = parts.uri.path();
    let new_path = match (filters.and_then(|f| f.rewrite_path.as_ref()), entry) {
        (Some(rewrite), Some(entry)) => Some(rewrite.apply(path, &entry.matcher.path)),
        _ => None,
    };
    let path_and_query = match (new_path, parts.uri.query()) {
        (None, _) => parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
        (Some(p), None) => PathAndQuery::try_from(p)
            .map_err(|e| ProxyError::InvalidRequest(format!("rewritten path: {e}")))?,
        (Some(p), Some(q)) => PathAndQuery::try_from(format!("{p}?{q}"))
            .map_err(|e| ProxyError::InvalidRequest(format!("rewritten path: {e}")))?,
    };
    parts.uri = Uri::from(path_and_query);
    let client_version = parts.version;
    parts.version = Version::HTTP_11;

    let headers = &mut parts.headers;
    // HTTP/2 clients always take trailers; HTTP/1.1 clients say so with `TE: trailers`.
    // gRPC needs them whatever the client says.
    let te_trailers = strip_hop_by_hop(headers);
    let trailers =
        te_trailers || client_version == Version::HTTP_2 || target.port.protocol == Protocol::Grpc;
    if trailers {
        headers.insert(header::TE, super::exchange::trailers_te());
    }
    let host = filters
        .and_then(|f| f.rewrite_host.clone())
        .or_else(|| {
            target
                .rewrite_authority
                .then(|| target.port.authority.clone())
                .flatten()
        })
        .map_or_else(|| HeaderValue::from_str(dest.authority.as_str()), Ok)
        .map_err(|_| ProxyError::InvalidRequest("authority is not a valid Host value".into()))?;
    headers.insert(header::HOST, host);
    append_via(headers, client_version);
    add_forwarded_for(
        headers,
        &conn.client_header,
        if conn.tls { "https" } else { "http" },
    );
    if let Some(f) = filters {
        f.request_headers.apply(headers);
    }
    Ok(Request::from_parts(parts, RequestBody::from_client(body)))
}

/// Phase "pick endpoint". A DNS Backend that has not resolved yet is waited for (bounded by the
/// connect timeout) rather than failed.
/// `hash`: the request's consistent-hash key hashed (see [`request_hash`]).
pub(super) async fn pick_endpoint(
    target: &Target,
    hash: Option<u64>,
) -> Result<Arc<Endpoint>, ProxyError> {
    let group = &target.port.endpoints;
    if !group.is_resolved() {
        group.wait_resolved(target.policy.connect_timeout).await;
    }
    group.pick(hash).ok_or_else(|| {
        let list = group.list();
        let detail = match &list.last_error {
            Some(e) => format!(": {e}"),
            None if !list.resolved => ": DNS resolution has not finished".to_owned(),
            None => String::new(),
        };
        ProxyError::NoHealthyUpstream {
            backend: target.backend.label.clone(),
            detail,
        }
    })
}

/// Phase "respond": headers cleaned and filtered, body streamed with the remaining timeouts.
fn respond(
    response: Response<Incoming>,
    lease: Lease,
    active: ActiveRequest,
    target: &Target,
    entry: Option<&RouteEntry>,
    deadline: Option<(Instant, Duration)>,
    grpc: bool,
) -> Response<ProxyBody> {
    let (mut parts, body) = response.into_parts();
    clean_response_headers(&mut parts, entry);
    let body = UpstreamBody::new(
        body,
        lease,
        active,
        target.policy.stream_idle_timeout,
        deadline,
    )
    .ending_grpc_calls_with_status(grpc);
    parts.version = Version::HTTP_11;
    Response::from_parts(parts, ProxyBody::Upstream(Box::new(body)))
}

pub(super) fn connect_cause(e: &ConnectError) -> String {
    match e {
        ConnectError::Io { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

fn version_str(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// What every upstream response goes through on its way down: hop-by-hop headers removed,
/// `Via` added, the route's ResponseHeaderModifier applied.
pub(super) fn clean_response_headers(
    parts: &mut http::response::Parts,
    entry: Option<&RouteEntry>,
) {
    strip_hop_by_hop(&mut parts.headers);
    append_via(&mut parts.headers, parts.version);
    if let Some(entry) = entry {
        entry
            .action
            .filters
            .response_headers
            .apply(&mut parts.headers);
    }
}

/// The reply for a failed connection attempt.
pub(super) fn connect_error(
    e: &ConnectError,
    backend: &Arc<str>,
    endpoint: SocketAddr,
) -> ProxyError {
    match e {
        ConnectError::Timeout { timeout, .. } => ProxyError::ConnectTimeout {
            backend: backend.clone(),
            endpoint,
            timeout: *timeout,
        },
        ConnectError::Tls {
            failure, detail, ..
        } => ProxyError::UpstreamTls {
            backend: backend.clone(),
            endpoint,
            failure: *failure,
            detail: detail.clone(),
        },
        ConnectError::NotHttp2 { .. } => ProxyError::UpstreamProtocol {
            backend: backend.clone(),
            endpoint,
            cause: e.to_string(),
        },
        other => ProxyError::ConnectFailure {
            backend: backend.clone(),
            endpoint,
            cause: connect_cause(other),
        },
    }
}
