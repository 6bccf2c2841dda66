//! The process-wide budget for bodies egressd holds in memory.
//!
//! egressd streams bodies, except where a feature needs one whole: the tool policy and
//! inspection of MCP requests (up to 4 MiB each), the `tools/list` answer it filters, and a
//! request body read ahead so a retry can send it again (`replayBodyLimit`). Each of those is
//! bounded per request, but a client can open many requests and hold back their last byte;
//! without a budget, 40 such MCP POSTs held 167 MB. Every buffered byte is reserved here
//! first (`ProxyConfig.spec.bufferedBodies.budget`, 32 MiB by default). When the budget is
//! spent, what can go on without the buffer does (a retry read-ahead is skipped: the request
//! streams and is not retried; an MCP request without a tool policy passes uninspected), and
//! what cannot is refused with 503 `overflow`. A body egressd buffers must also arrive within
//! `bufferedBodies.readTimeout`, so a reservation is never held by a silent client for long.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

use super::error::ProxyError;
use crate::bounded::budget::Reservation;
use crate::snapshot::shared::Shared;
use crate::upstream::body::{ClientBodyError, RequestBody};

/// Why a body could not be buffered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BufferError<E> {
    #[error("the body is over {0} bytes")]
    TooLarge(u64),
    #[error("the budget for buffered bodies is spent")]
    Overflow,
    #[error("the body did not arrive whole within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Body(E),
}

/// Reads `body` whole, at most `limit` bytes, each byte reserved in `reservation` as it
/// arrives, within `timeout`.
pub(crate) async fn collect<B>(
    body: B,
    limit: u64,
    reservation: &mut Reservation,
    timeout: Duration,
) -> Result<Bytes, BufferError<B::Error>>
where
    B: Body<Data = Bytes> + Unpin,
{
    match tokio::time::timeout(timeout, collect_frames(body, limit, reservation)).await {
        Ok(result) => result,
        Err(_) => Err(BufferError::Timeout(timeout)),
    }
}

async fn collect_frames<B>(
    mut body: B,
    limit: u64,
    reservation: &mut Reservation,
) -> Result<Bytes, BufferError<B::Error>>
where
    B: Body<Data = Bytes> + Unpin,
{
    // A declared length is reserved up front: one allocation of exactly that size. Growing
    // by doubling held up to twice the body while it arrived (the old buffer and the new,
    // whose pages the allocator keeps a while after the free): 4 MiB bodies held side by
    // side took RSS well past the budget (tests/body_budget.rs).
    let declared = reservation.held().min(limit);
    let mut out = BytesMut::with_capacity(usize::try_from(declared).unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BufferError::Body)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers of a request egressd buffers are not kept
        };
        let len = data.len() as u64;
        if out.len() as u64 + len > limit {
            return Err(BufferError::TooLarge(limit));
        }
        // What is already reserved (a declared length) is not taken twice.
        let needed = (out.len() as u64 + len).saturating_sub(reservation.held());
        if needed > 0 && !reservation.grow(needed) {
            return Err(BufferError::Overflow);
        }
        out.extend_from_slice(&data);
    }
    Ok(out.freeze())
}

/// What [`buffer_request_body`] did.
pub(crate) enum Buffered {
    /// Read whole: a `RequestBody::Buffered` holding its reservation.
    Whole(RequestBody),
    /// The budget had no room for the declared length: the body is untouched, to stream on
    /// (or be refused) as the caller's policy says.
    NoRoom(RequestBody),
}

/// Reads a client's request body whole, at most `limit` bytes, within
/// `bufferedBodies.readTimeout`, reserving its bytes in the process-wide budget: a declared
/// length up front (nothing read when it does not fit), an unknown one as bytes arrive.
pub(crate) async fn buffer_request_body(
    shared: &Shared,
    body: RequestBody,
    limit: u64,
) -> Result<Buffered, BufferError<ClientBodyError>> {
    let settings = shared.snapshot.load().settings.buffered_bodies;
    let mut reservation = shared.buffered_bodies.reservation(settings.budget);
    if let Some(len) = body.size_hint().exact() {
        if len > limit {
            return Err(BufferError::TooLarge(limit));
        }
        if !reservation.grow(len) {
            shared.metrics.buffered_body_overflow("no_room");
            return Ok(Buffered::NoRoom(body));
        }
    }
    match collect(body, limit, &mut reservation, settings.read_timeout).await {
        Ok(bytes) => Ok(Buffered::Whole(RequestBody::Buffered(
            Some(bytes),
            Some(Arc::new(reservation)),
        ))),
        Err(BufferError::Overflow) => {
            shared.metrics.buffered_body_overflow("refused");
            Err(BufferError::Overflow)
        }
        Err(e) => Err(e),
    }
}

impl BufferError<ClientBodyError> {
    /// The local reply for a body that could not be buffered (`TooLarge` is the caller's to
    /// word: what the limit is for).
    pub(crate) fn into_proxy_error(self, shared: &Shared) -> ProxyError {
        match self {
            BufferError::Overflow => ProxyError::BufferOverflow {
                budget: shared.snapshot.load().settings.buffered_bodies.budget,
            },
            BufferError::Timeout(timeout) => ProxyError::BodyTimeout { timeout },
            BufferError::TooLarge(limit) => {
                ProxyError::InvalidRequest(format!("request body over {limit} bytes"))
            }
            BufferError::Body(e) => ProxyError::from_client_body(&e)
                .unwrap_or_else(|| ProxyError::InvalidRequest(format!("request body: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::budget::BufferBudget;

    #[tokio::test]
    async fn collecting_reserves_as_bytes_arrive() {
        let pool = Arc::new(BufferBudget::default());
        let body = http_body_util::Full::new(Bytes::from(vec![7u8; 50]));
        let mut r = pool.reservation(100);
        let got = collect(body, 64, &mut r, Duration::from_secs(1)).await;
        assert_eq!(got.unwrap().len(), 50);
        assert_eq!(pool.used(), 50);

        let body = http_body_util::Full::new(Bytes::from(vec![7u8; 60]));
        let mut over = pool.reservation(100);
        let got = collect(body, 64, &mut over, Duration::from_secs(1)).await;
        assert!(matches!(got, Err(BufferError::Overflow)));
        drop(over);
        assert_eq!(pool.used(), 50, "nothing kept by a refused body");

        let body = http_body_util::Full::new(Bytes::from(vec![7u8; 70]));
        let mut big = pool.reservation(1000);
        let got = collect(body, 64, &mut big, Duration::from_secs(1)).await;
        assert!(matches!(got, Err(BufferError::TooLarge(64))));
    }
}
