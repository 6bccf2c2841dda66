//! The circuit breaker's slot for a new upstream connection (`maxConnections`), as an exchange
//! waits for it: at the limit a request takes a pooled connection that comes back, or a stream
//! on an existing HTTP/2 connection, or waits (counted against `maxPendingRequests`) for a
//! connection of the group to close; idle connections of other endpoints are closed to make
//! room.

use std::sync::Arc;

use crate::http::error::ProxyError;
use crate::snapshot::Target;
use crate::upstream::breaker::{ConnectionSlot, Limit, PendingSlot};
use crate::upstream::h1_conn::H1Conn;
use crate::upstream::h2_pool::H2Stream;
use crate::upstream::Endpoint;

/// A circuit-breaker slot for a new HTTP/1.1 connection, or (`Err`) a pooled connection (of
/// any worker: better than waiting) that came back while waiting for one. At `maxConnections`
/// the request waits, counted against `maxPendingRequests`, until a connection of this endpoint
/// is checked in or one of the group closes; idle connections of other endpoints are closed to
/// make room.
pub(super) async fn for_http1(
    target: &Target,
    endpoint: &Arc<Endpoint>,
) -> Result<Result<ConnectionSlot, H1Conn>, ProxyError> {
    let breaker = target.port.endpoints.breaker();
    if let Some(slot) = breaker.connection() {
        return Ok(Ok(slot));
    }
    let _pending = pending(target)?;
    let checkin = endpoint.pool.wait_for_checkin();
    loop {
        let closed = breaker.connection_closed();
        let returned = checkin.notified();
        tokio::pin!(closed, returned);
        closed.as_mut().enable();
        returned.as_mut().enable();
        if let Some(conn) = endpoint.pool.checkout_any() {
            return Ok(Err(conn));
        }
        if let Some(slot) = breaker.connection() {
            return Ok(Ok(slot));
        }
        target.port.endpoints.close_an_idle_connection();
        tokio::select! {
            _ = closed => {}
            _ = returned => {}
        }
    }
}

/// A circuit-breaker slot for a new HTTP/2 connection, or (`Err`) a stream on the least busy
/// existing one when the group is at `maxConnections`. With no connection to share, the
/// request waits (counted as pending) for a connection of the group to close.
pub(super) async fn for_http2(
    target: &Target,
    endpoint: &Arc<Endpoint>,
) -> Result<Result<ConnectionSlot, H2Stream>, ProxyError> {
    let breaker = target.port.endpoints.breaker();
    if let Some(slot) = breaker.connection() {
        return Ok(Ok(slot));
    }
    let _pending = pending(target)?;
    loop {
        let closed = breaker.connection_closed();
        tokio::pin!(closed);
        closed.as_mut().enable();
        if let Some(stream) = endpoint.h2().claim_least_busy() {
            return Ok(Err(stream));
        }
        if let Some(slot) = breaker.connection() {
            return Ok(Ok(slot));
        }
        target.port.endpoints.close_an_idle_connection();
        closed.await;
    }
}

fn pending(target: &Target) -> Result<PendingSlot, ProxyError> {
    let breaker = target.port.endpoints.breaker();
    breaker.pending().ok_or_else(|| ProxyError::Overflow {
        backend: target.backend.label.clone(),
        limit: Limit::PendingRequests,
        max: breaker.settings().max_pending_requests,
    })
}
