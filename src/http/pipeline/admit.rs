//! Phase "admit": the Backend port's circuit breaker, before any endpoint is bothered. Every
//! request counts against `maxParallelRequests` until its response ends; a websocket, tunnel or
//! passthrough connection counts as one request for as long as it is open, and holds one of
//! `maxConnections` too (its upstream connection is its own, never pooled). At a limit the
//! answer is a fast 503 `overflow`; a relayed connection does not wait for a connection slot
//! (as Envoy's TCP proxy does not): it is turned away at once.

use super::kind::Kind;
use crate::http::error::ProxyError;
use crate::snapshot::Target;
use crate::upstream::breaker::{Admission, ConnectionSlot, Limit};

/// The circuit-breaker slots a request holds; dropping it gives them back.
#[derive(Debug)]
pub(super) struct Admitted {
    pub(super) request: Admission,
    /// Websockets and tunnels: their upstream connection's slot (held, never read).
    _connection: Option<ConnectionSlot>,
}

impl Admitted {
    /// The request's slot alone (an HTTP request's pooled connection has its own).
    pub(super) fn into_request(self) -> Admission {
        self.request
    }
}

/// Phase "admit".
pub(super) fn phase(target: &Target, kind: Kind) -> Result<Admitted, ProxyError> {
    match kind {
        Kind::Request => Ok(Admitted {
            request: request(target)?,
            _connection: None,
        }),
        Kind::Websocket(_) | Kind::Tunnel | Kind::Passthrough => relay(target),
    }
}

/// A relayed connection's slots: a request for as long as it is open, and a connection.
fn relay(target: &Target) -> Result<Admitted, ProxyError> {
    let request = request(target)?;
    let connection = target
        .port
        .endpoints
        .breaker()
        .connection()
        .ok_or_else(|| overflow(target, Limit::Connections))?;
    Ok(Admitted {
        request,
        _connection: Some(connection),
    })
}

fn request(target: &Target) -> Result<Admission, ProxyError> {
    target
        .port
        .endpoints
        .admit()
        .ok_or_else(|| overflow(target, Limit::ParallelRequests))
}

fn overflow(target: &Target, limit: Limit) -> ProxyError {
    ProxyError::Overflow {
        backend: target.backend.label.clone(),
        limit,
        max: target.port.endpoints.breaker().max(limit),
    }
}
