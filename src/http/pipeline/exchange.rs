//! Phase "send": one request and its response headers over a pooled or new upstream
//! connection, HTTP/1.1 or HTTP/2 as the Backend port says (or as ALPN chose).
//!
//! What is sent again here, within one attempt, is what the upstream provably did not process:
//! a request hyper hands back unsent (a pooled connection that closed while idle), and, on
//! HTTP/2, a stream the server refused or that was above its GOAWAY's last stream id
//! (`retry::unprocessed` decides), on another connection. Retries of requests that may have
//! reached the application are the retry policy's (`retry`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use http::header::{self};
use http::uri::{Scheme, Uri};
use http::{Request, Response, Version};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::attempt::connect_error;
use super::connection_slot;
use super::retry::unprocessed::{self, Unprocessed};
use crate::http::deadline::Deadline;
use crate::http::error::{Blame, ProxyError};
use crate::snapshot::Target;
use crate::telemetry::error_chain;
use crate::upstream::body::{Lease, RequestBody};
use crate::upstream::breaker::ConnectionSlot;
use crate::upstream::connect::{connect_http, ConnectError, HttpConnection, HttpWire, Transport};
use crate::upstream::h1_conn::H1Conn;
use crate::upstream::h2_pool::{Attempt, Checkout, H2Conn, H2Stream};
use crate::upstream::tls::TlsFailure;
use crate::upstream::Endpoint;

/// Rounds of looking for a free HTTP/2 stream slot before the request is queued on the least
/// busy connection anyway (h2 then holds it until a stream ends), so a burst far above the
/// stream limit does not open connections one after another without end.
const MAX_SLOT_ROUNDS: u32 = 4;
/// Rounds after which a request that found no connection to queue on gives up: every round
/// waits for a connection attempt (its own or another request's), and an upstream whose
/// connections never take a stream must not keep a request going round for ever.
const MAX_ROUNDS: u32 = 2 * MAX_SLOT_ROUNDS;

/// Phase "send": a pooled (or new) connection carries the request; the deadline covers
/// connecting and waiting for the response headers (the Backend's timeouts count from
/// `attempt_started`). `deadline` is when the whole request must
/// be over (request timeout or gRPC deadline). When the request opened a connection,
/// `connected` learns how long that took.
pub(super) async fn send(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    req: Request<RequestBody>,
    deadline: Option<Deadline>,
    attempt_started: Instant,
    connected: &mut Option<Duration>,
) -> Result<(Response<Incoming>, Lease), ProxyError> {
    let client_wait = req.body().client_wait();
    let exchange = exchange(target, endpoint, req, connected);
    let Some(limit) = HeadersLimit::first(target, deadline, attempt_started) else {
        return exchange.await;
    };
    match tokio::time::timeout_at(limit.deadline.at, exchange).await {
        Ok(r) => r,
        Err(_) => {
            let client_slow = client_wait.is_some_and(|w| w.waiting());
            Err(limit.error(target, endpoint, client_slow))
        }
    }
}

/// The limit that ends the wait for the response headers first, which decides the error: the
/// request's deadline or the Backend's request timeout (`upstream_timeout`), or the stream idle
/// timeout (`stream_idle_timeout`).
struct HeadersLimit {
    deadline: Deadline,
    idle: bool,
}

impl HeadersLimit {
    /// The first of the limits that apply (the earlier-named one when two fall together);
    /// the Backend's own timeouts count from `now`.
    fn first(target: &Target, deadline: Option<Deadline>, now: Instant) -> Option<HeadersLimit> {
        let policy = &target.policy;
        let mut first = deadline.map(|deadline| HeadersLimit {
            deadline,
            idle: false,
        });
        let later = [
            (policy.backend_request_timeout, false),
            (policy.stream_idle_timeout, true),
        ];
        for (timeout, idle) in later {
            let Some(timeout) = timeout else { continue };
            let deadline = Deadline::after(now, timeout);
            if first.as_ref().is_none_or(|f| deadline.at < f.deadline.at) {
                first = Some(HeadersLimit { deadline, idle });
            }
        }
        first
    }

    /// The failure, blamed on whoever caused it (`client_slow`: the upstream was waiting for
    /// the client's request body).
    fn error(&self, target: &Target, endpoint: &Endpoint, client_slow: bool) -> ProxyError {
        let (backend, endpoint, timeout) = (
            target.backend.label.clone(),
            endpoint.addr,
            self.deadline.timeout,
        );
        let blame = if self.deadline.client {
            Blame::ClientDeadline
        } else if client_slow {
            Blame::ClientBody
        } else {
            Blame::Endpoint
        };
        if self.idle {
            ProxyError::StreamIdleTimeout {
                backend,
                endpoint,
                timeout,
                blame,
            }
        } else {
            ProxyError::UpstreamTimeout {
                backend,
                endpoint,
                timeout,
                blame,
            }
        }
    }
}

async fn exchange(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    req: Request<RequestBody>,
    connected: &mut Option<Duration>,
) -> Result<(Response<Incoming>, Lease), ProxyError> {
    match target.port.wire {
        HttpWire::Http1 => exchange_http1(target, endpoint, req, connected).await,
        HttpWire::Negotiated if endpoint.negotiated_http1() => {
            exchange_http1(target, endpoint, req, connected).await
        }
        // Boxed, like every HTTP/2 step the HTTP/1.1 path can reach: an async state machine is
        // as large as its largest branch, and this future is moved several times per request.
        HttpWire::Http2 | HttpWire::Negotiated => {
            Box::pin(exchange_http2(target, endpoint, req, connected)).await
        }
    }
}

/// HTTP/1.1: pooled connections may have been closed by the server while idle; a request that
/// was not sent at all on one is moved to the next, and finally to a new connection.
async fn exchange_http1(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    mut req: Request<RequestBody>,
    connected: &mut Option<Duration>,
) -> Result<(Response<Incoming>, Lease), ProxyError> {
    let backend = &target.backend.label;
    let addr = endpoint.addr;
    loop {
        let slot = match endpoint.pool.checkout() {
            Some(conn) => Err(conn),
            None => connection_slot::for_http1(target, endpoint).await?,
        };
        let (mut conn, fresh) = match slot {
            Err(conn) => (conn, false),
            Ok(slot) => match connect(target, endpoint, slot, connected)
                .await
                .map_err(|e| connect_error(&e, backend, addr))?
            {
                HttpConnection::Http1(conn) => (conn, true),
                // ALPN chose HTTP/2 this time: the connection joins the endpoint's HTTP/2
                // connections, and requests follow it there from now on.
                HttpConnection::Http2(conn) => {
                    endpoint.set_negotiated_http1(false);
                    let stream = endpoint.h2().add(conn);
                    return match stream {
                        Some(stream) => {
                            Box::pin(send_http2_once(target, endpoint, stream, req)).await
                        }
                        None => Box::pin(exchange_http2(target, endpoint, req, connected)).await,
                    };
                }
            },
        };
        if conn.ready().await.is_err() {
            if fresh {
                return Err(ProxyError::UpstreamReset {
                    backend: backend.clone(),
                    endpoint: addr,
                    cause: "connection closed right after it was opened".into(),
                });
            }
            continue;
        }
        match conn.send(req).await {
            Ok(response) => return Ok((response, Lease::Http1(conn))),
            Err(mut e) => match e.take_message() {
                Some(unsent) if !fresh => {
                    req = unsent;
                    continue;
                }
                _ => return Err(upstream_error(target, endpoint, &e.into_error())),
            },
        }
    }
}

/// HTTP/2: a stream slot on a shared connection (see `upstream::h2_pool`). A stream the server
/// did not process (refused, or past its GOAWAY) is sent again on another connection.
async fn exchange_http2(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    mut req: Request<RequestBody>,
    connected: &mut Option<Duration>,
) -> Result<(Response<Incoming>, Lease), ProxyError> {
    let mut refused = 0;
    let mut rounds = 0;
    let mut avoid = None;
    // Every round either ends the request or awaits something (a connection attempt, or the
    // upstream's answer), and the rounds are bounded: `MAX_ROUNDS` for finding a stream,
    // `retry::unprocessed::may_resend` for streams the server did not process.
    loop {
        rounds += 1;
        let stream = match find_stream(target, endpoint, rounds, avoid.as_ref(), connected).await? {
            Found::Stream(stream) => stream,
            Found::LookAgain => continue,
            Found::Http1 => {
                return Box::pin(exchange_http1(target, endpoint, req, connected)).await
            }
            Found::Http1Connection(conn) => {
                return send_http1_once(target, endpoint, conn, req).await
            }
        };
        let replay = unprocessed::refused_retry_copy(&req, refused);
        let failed = match try_send_http2(target, stream, req).await {
            Ok(done) => return Ok(done),
            Err(failed) => failed,
        };
        let why = unprocessed::unprocessed(&failed.error);
        if why == Some(Unprocessed::Refused) {
            failed.stream.refused();
        }
        let again = failed.unsent.or_else(|| why.and(replay));
        match again {
            Some(next) if unprocessed::may_resend(refused) => {
                refused += 1;
                tracing::debug!(endpoint = %endpoint.addr, error = %failed.error, reason = ?why, "the upstream did not process the stream; sending it again on another connection");
                avoid = Some(failed.stream.connection());
                req = next;
            }
            _ => return Err(upstream_error(target, endpoint, &failed.error)),
        }
    }
}

/// What one round of looking for an HTTP/2 stream found.
enum Found {
    Stream(H2Stream),
    /// Nothing yet (a connection came up full, another request's connect finished): look
    /// again.
    LookAgain,
    /// ALPN chose HTTP/1.1 for this endpoint: the request takes the HTTP/1.1 path.
    Http1,
    /// ALPN chose HTTP/1.1 on the connection this round opened: the request goes on it.
    Http1Connection(H1Conn),
}

/// Round `round` of looking for a stream: a free slot, or another request's connect to wait
/// for, or a connection to open (past `MAX_SLOT_ROUNDS`, the least busy connection's queue).
/// `avoid`: the connection that did not process this request last time.
async fn find_stream(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    round: u32,
    avoid: Option<&Weak<H2Conn>>,
    connected: &mut Option<Duration>,
) -> Result<Found, ProxyError> {
    let mut checkout = endpoint.h2().checkout(avoid);
    if round > MAX_SLOT_ROUNDS && !matches!(checkout, Checkout::Stream(_)) {
        checkout = match endpoint.h2().claim_least_busy() {
            Some(stream) => Checkout::Stream(stream),
            None if round > MAX_ROUNDS => {
                return Err(ProxyError::UpstreamReset {
                    backend: target.backend.label.clone(),
                    endpoint: endpoint.addr,
                    cause: format!(
                        "no HTTP/2 connection took the request after {MAX_ROUNDS} attempts (GOAWAY, or no stream allowed)"
                    ),
                });
            }
            None => checkout,
        };
    }
    match checkout {
        Checkout::Stream(stream) => Ok(Found::Stream(stream)),
        Checkout::Wait(mut attempt) => {
            // Another request is connecting: share its outcome.
            let _ = attempt.wait_for(|a| !matches!(a, Attempt::Pending)).await;
            if let Attempt::Failed(e) = &*attempt.borrow() {
                return Err(connect_error(e, &target.backend.label, endpoint.addr));
            }
            // ALPN came out HTTP/1.1 for the connection waited for: this request takes the
            // HTTP/1.1 path too, instead of opening connections one at a time here.
            if target.port.wire == HttpWire::Negotiated && endpoint.negotiated_http1() {
                return Ok(Found::Http1);
            }
            Ok(Found::LookAgain)
        }
        Checkout::Connect(ticket) => match connection_slot::for_http2(target, endpoint).await? {
            // At maxConnections: share the least busy connection (the stream waits inside it
            // for a free slot).
            Err(stream) => Ok(Found::Stream(stream)),
            Ok(slot) => match connect(target, endpoint, slot, connected).await {
                Err(e) => {
                    let e = Arc::new(e);
                    ticket.finish(Attempt::Failed(e.clone()));
                    Err(connect_error(&e, &target.backend.label, endpoint.addr))
                }
                Ok(HttpConnection::Http2(conn)) => {
                    let stream = endpoint.h2().add(conn);
                    ticket.finish(Attempt::Done);
                    Ok(stream.map_or(Found::LookAgain, Found::Stream))
                }
                // ALPN chose HTTP/1.1: remember it, and let waiters look again (they will take
                // the HTTP/1.1 path).
                Ok(HttpConnection::Http1(conn)) => {
                    endpoint.set_negotiated_http1(true);
                    ticket.finish(Attempt::Done);
                    Ok(Found::Http1Connection(conn))
                }
            },
        },
    }
}

async fn send_http2_once(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    stream: H2Stream,
    req: Request<RequestBody>,
) -> Result<(Response<Incoming>, Lease), ProxyError> {
    try_send_http2(target, stream, req)
        .await
        .map_err(|failed| upstream_error(target, endpoint, &failed.error))
}

async fn send_http1_once(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    mut conn: H1Conn,
    req: Request<RequestBody>,
) -> Result<(Response<Incoming>, Lease), ProxyError> {
    let sent = match conn.ready().await {
        Ok(()) => conn.send(req).await.map_err(|e| e.into_error()),
        Err(e) => Err(e),
    };
    match sent {
        Ok(response) => Ok((response, Lease::Http1(conn))),
        Err(e) => Err(upstream_error(target, endpoint, &e)),
    }
}

/// A request that failed on an HTTP/2 stream.
struct FailedStream {
    error: hyper::Error,
    /// The request, if hyper never sent it.
    unsent: Option<Request<RequestBody>>,
    /// The slot it had (given back when this is dropped).
    stream: H2Stream,
}

/// Sends on an HTTP/2 stream slot.
async fn try_send_http2(
    target: &Target,
    stream: H2Stream,
    mut req: Request<RequestBody>,
) -> Result<(Response<Incoming>, Lease), FailedStream> {
    to_http2_form(&mut req, &target.port.transport);
    let mut sender = stream.sender();
    match sender.try_send_request(req).await {
        Ok(response) => Ok((response, Lease::Http2(stream))),
        Err(mut e) => {
            let unsent = e.take_message();
            Err(FailedStream {
                error: e.into_error(),
                unsent,
                stream,
            })
        }
    }
}

/// A new connection to `endpoint`; `connected` learns how long opening it took.
async fn connect(
    target: &Target,
    endpoint: &Arc<Endpoint>,
    slot: ConnectionSlot,
    connected: &mut Option<Duration>,
) -> Result<HttpConnection, ConnectError> {
    let port = &target.port;
    let started = Instant::now();
    // Boxed: TCP, TLS and HTTP/1.1 or HTTP/2 handshake futures are large, and a request that
    // finds a pooled connection (the common case) should not carry their space around.
    let (connection, tls) = Box::pin(connect_http(
        endpoint.addr,
        target.policy.connect_timeout,
        &port.transport,
        port.wire,
        &port.http2,
        Some(slot),
        port.tcp_keepalive.as_ref(),
    ))
    .await?;
    endpoint.note_connection(tls);
    *connected = Some(started.elapsed());
    Ok(connection)
}

/// HTTP/2 carries the target in `:scheme`/`:authority`/`:path` (RFC 9113 §8.3.1), which
/// hyper takes from an absolute URI; `Host` becomes `:authority`.
fn to_http2_form(req: &mut Request<RequestBody>, transport: &Transport) {
    if req.version() == Version::HTTP_2 {
        return; // already converted (a retry)
    }
    *req.version_mut() = Version::HTTP_2;
    let host = req.headers_mut().remove(header::HOST);
    let scheme = match transport {
        Transport::Plain => Scheme::HTTP,
        Transport::Tls(_) => Scheme::HTTPS,
    };
    let mut parts = req.uri().clone().into_parts();
    parts.scheme = Some(scheme);
    if let Some(authority) = host
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse().ok())
    {
        parts.authority = Some(authority);
    }
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    match Uri::from_parts(parts) {
        Ok(uri) => *req.uri_mut() = uri,
        // No authority could be formed: keep Host, and let hyper report what it misses.
        Err(_) => {
            if let Some(host) = host {
                req.headers_mut().insert(header::HOST, host);
            }
        }
    }
}

/// The reply for a request that failed after a connection was there.
pub(super) fn upstream_error(
    target: &Target,
    endpoint: &Endpoint,
    err: &hyper::Error,
) -> ProxyError {
    // The client's body failed, not the upstream: never blamed on the endpoint.
    if let Some(client) = ProxyError::from_client_body(err) {
        return client;
    }
    let backend = target.backend.label.clone();
    let addr = endpoint.addr;
    let cause = error_chain(err);
    // With TLS 1.3 the server judges our certificate after our side of the handshake is done:
    // its refusal arrives with the first request.
    if let Some(failure) = TlsFailure::from_error_chain(err) {
        return ProxyError::UpstreamTls {
            backend,
            endpoint: addr,
            failure,
            detail: cause,
        };
    }
    if err.is_parse() || err.is_parse_status() {
        ProxyError::UpstreamProtocol {
            backend,
            endpoint: addr,
            cause,
        }
    } else {
        ProxyError::UpstreamReset {
            backend,
            endpoint: addr,
            cause,
        }
    }
}
