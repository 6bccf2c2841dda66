//! Phase "pick and connect": an endpoint picked, and an [`Attempt`] at it recorded the same
//! way for every kind of traffic — an HTTP request's (each retry one more, `retry`), a
//! websocket's handshake, a tunnel's connection: in flight to the endpoint from its start,
//! then its outcome counted for the Backend (answers, connect failures, failures after
//! connecting), told to outlier detection, and kept as the endpoint's last failure.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Response;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::ctx::RequestCtx;
use crate::balance::outlier::Outcome as OutlierOutcome;
use crate::http::error::ProxyError;
use crate::snapshot::shared::Shared;
use crate::snapshot::Target;
use crate::upstream::body::Lease;
use crate::upstream::connect::ConnectError;
use crate::upstream::endpoint::ActiveRequest;
use crate::upstream::Endpoint;

/// One attempt at an endpoint, the same for every kind of traffic: from its start it counts
/// as in flight to the endpoint (least-request balancing must see the requests still waiting
/// for an answer: a slow endpoint's pile-up is the signal) and in the log's `attempts`; once
/// its outcome is known it is recorded, once: the Backend's metrics, outlier detection, the
/// endpoint's last failure.
pub(super) struct Attempt {
    active: ActiveRequest,
    at: Instant,
}

/// What an attempt came to.
#[derive(Clone, Copy)]
pub(super) enum Outcome<'e> {
    /// The upstream answered: an HTTP response, or a websocket handshake's answer.
    Answered(http::StatusCode),
    /// An MCP POST's 200: judged by the JSON-RPC messages in it once they have passed
    /// (`mcp::Verdict`), not here.
    AnsweredJudgedLater(http::StatusCode),
    /// A tunnel's connection is open: the only signal a tunnel gives about its endpoint.
    Connected,
    Failed(&'e ProxyError),
}

impl<'e> Outcome<'e> {
    /// An HTTP exchange's outcome; `mcp_post`: its 200 is judged later.
    #[inline]
    pub(super) fn of_exchange(
        sent: &'e Result<(Response<Incoming>, Lease), ProxyError>,
        mcp_post: bool,
    ) -> Self {
        match sent {
            Ok((response, _)) if mcp_post && response.status() == http::StatusCode::OK => {
                Outcome::AnsweredJudgedLater(response.status())
            }
            Ok((response, _)) => Outcome::Answered(response.status()),
            Err(e) => Outcome::Failed(e),
        }
    }
}

impl Attempt {
    /// An attempt at `endpoint` starts now.
    #[inline]
    pub(super) fn start(ctx: &mut RequestCtx<'_>, endpoint: &Arc<Endpoint>) -> Self {
        ctx.upstream.endpoint = Some(endpoint.addr);
        ctx.upstream.attempts += 1;
        Attempt {
            active: endpoint.start_request(),
            at: Instant::now(),
        }
    }

    /// When the attempt started: the clock read once for everything the attempt times.
    pub(super) fn started(&self) -> Instant {
        self.at
    }

    /// The attempt is over (at `ended`, read once by the caller for all it times): recorded.
    /// What it carries stays in flight (the request, the websocket, the tunnel) until the
    /// returned guard is dropped.
    #[inline(always)]
    pub(super) fn finish(
        self,
        shared: &Shared,
        target: &Target,
        outcome: Outcome<'_>,
        ended: Instant,
    ) -> ActiveRequest {
        let took = ended.saturating_duration_since(self.at);
        let endpoint = &**self.active.endpoint();
        let stats = target.backend.stats(&shared.metrics);
        let seen = match outcome {
            Outcome::Answered(status) => {
                stats.responses.record(status.as_u16(), took);
                Some(OutlierOutcome::of_status(status.as_u16()))
            }
            Outcome::AnsweredJudgedLater(status) => {
                stats.responses.record(status.as_u16(), took);
                None
            }
            Outcome::Connected => Some(OutlierOutcome::Success),
            Outcome::Failed(e) => {
                if e.class().connect_failure {
                    stats.connect_failed(e.code());
                } else {
                    stats.failed(e.code());
                }
                e.outlier_outcome()
            }
        };
        if let Some(seen) = seen {
            record(shared, target, endpoint, seen);
        }
        match outcome {
            Outcome::Failed(e) if e.charged_endpoint().is_some() => {
                endpoint.note_failure(format!("{}: {e}", e.code()))
            }
            Outcome::Answered(status) if status.is_server_error() => {
                endpoint.note_failure(format!("answered {status}"))
            }
            _ => {}
        }
        self.active
    }
}

/// Outlier detection learns how `endpoint` did.
pub(crate) fn record(shared: &Shared, target: &Target, endpoint: &Endpoint, seen: OutlierOutcome) {
    if let Some(d) = target.port.endpoints.record(endpoint, seen) {
        shared
            .metrics
            .outlier_detection(&target.backend.label, d.into());
    }
}

/// Picks an endpoint. A DNS Backend that has not resolved yet is waited for (bounded by the
/// connect timeout) rather than failed. `hash`: the request's consistent-hash key hashed (see
/// [`request_hash`]).
pub(crate) async fn pick(target: &Target, hash: Option<u64>) -> Result<Arc<Endpoint>, ProxyError> {
    let group = &target.port.endpoints;
    if !group.is_resolved() {
        group.wait_resolved(target.policy.connect_timeout).await;
    }
    group.pick(hash).ok_or_else(|| {
        let list = group.list();
        if list.address_denied {
            return ProxyError::DestinationAddressDenied {
                backend: target.backend.label.clone(),
                detail: list.last_error.clone().unwrap_or_default(),
            };
        }
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

/// The reply for a failed connection attempt.
pub(crate) fn connect_error(
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
        ConnectError::Io { source, .. } => ProxyError::ConnectFailure {
            backend: backend.clone(),
            endpoint,
            cause: source.to_string(),
        },
        other => ProxyError::ConnectFailure {
            backend: backend.clone(),
            endpoint,
            cause: other.to_string(),
        },
    }
}
