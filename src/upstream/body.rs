//! The body a request carries upstream ([`RequestBody`]), and what a response holds on to while
//! it streams ([`Lease`]): the types the connection pools and the request path share.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::h1_conn::H1Conn;
use super::h2_pool::H2Stream;
use crate::bounded::budget::Reservation;

/// An error reading the client's request body: it broke the protocol, or the client went
/// away (or stopped sending) before it ended. Kept apart from upstream errors all the way up,
/// so that a client can never make an endpoint look broken (outlier detection, retries).
#[derive(Debug, thiserror::Error)]
#[error("client request body: {0}")]
pub(crate) struct ClientBodyError(#[source] pub(crate) hyper::Error);

impl ClientBodyError {
    /// The client sent something that is not HTTP (a bad chunk), rather than leaving early.
    /// hyper reports a bad chunk as an `InvalidData` I/O error of the body; an early end as
    /// an incomplete message or a reset connection.
    pub(crate) fn is_malformed(&self) -> bool {
        if self.0.is_parse() {
            return true;
        }
        let mut source = std::error::Error::source(&self.0);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
                );
            }
            source = e.source();
        }
        false
    }

    /// hyper's own words, for the reply and the log.
    pub(crate) fn cause(&self) -> String {
        crate::telemetry::error_chain(&self.0)
    }
}

/// The body sent upstream.
#[derive(Debug)]
pub(crate) enum RequestBody {
    /// The client's request body, streamed; with a counter of its bytes when the access log
    /// must say how long a body without a declared length was, and whether the upstream is
    /// waiting for the client's next bytes ([`ClientWait`]).
    Client(Incoming, Option<Arc<AtomicU64>>, ClientWait),
    /// No body: a request without one can be sent again as is (a stream refused by an
    /// HTTP/2 server, a connection that went away before the request was written).
    Empty,
    /// A body read whole: ahead so the request can be retried (`retry.replayBodyLimit`), or
    /// for MCP inspection. The `Option` empties as it is sent, and a copy is taken before each
    /// attempt. The reservation of the buffer budget (`bounded::budget`) is shared by the copies
    /// and given back when the last one is gone, when the bytes are.
    Buffered(Option<Bytes>, Option<Arc<Reservation>>),
}

impl RequestBody {
    /// The client's body; `Empty` when it has already ended (nothing to stream).
    pub(crate) fn from_client(body: Incoming) -> Self {
        if body.is_end_stream() {
            RequestBody::Empty
        } else {
            RequestBody::Client(body, None, ClientWait::default())
        }
    }

    /// Starts counting the bytes of a client body whose length was not declared (chunked,
    /// HTTP/2 without `content-length`); the counter, if one was started.
    pub(crate) fn count_undeclared(&mut self) -> Option<Arc<AtomicU64>> {
        match self {
            RequestBody::Client(body, counter @ None, _) if body.size_hint().exact().is_none() => {
                Some(counter.insert(Arc::default()).clone())
            }
            _ => None,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match self.get_mut() {
            RequestBody::Client(body, counter, wait) => {
                let polled = Pin::new(body).poll_frame(cx).map_err(ClientBodyError);
                wait.0.store(polled.is_pending(), Ordering::Relaxed);
                if let (Some(counter), Poll::Ready(Some(Ok(frame)))) = (counter, &polled) {
                    if let Some(data) = frame.data_ref() {
                        counter.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                }
                polled
            }
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Buffered(bytes, _) => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Client(body, ..) => body.is_end_stream(),
            RequestBody::Empty => true,
            RequestBody::Buffered(bytes, _) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Client(body, ..) => body.size_hint(),
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Buffered(bytes, _) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

/// Whether the upstream is waiting for the client: the last poll of the client's body found
/// nothing yet. A timeout then is the client's slowness, not the endpoint's
/// (`http::error::Blame`); a body the upstream does not read is never polled, so its wait
/// stays the endpoint's.
#[derive(Clone, Debug, Default)]
pub(crate) struct ClientWait(Arc<AtomicBool>);

impl ClientWait {
    pub(crate) fn waiting(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl RequestBody {
    /// The client body's [`ClientWait`], for a streamed client body.
    pub(crate) fn client_wait(&self) -> Option<ClientWait> {
        match self {
            RequestBody::Client(_, _, wait) => Some(wait.clone()),
            _ => None,
        }
    }
}

/// What an upstream response holds on to while it streams: the HTTP/1.1 connection to give
/// back to the pool at the end, or the HTTP/2 stream slot to release.
#[derive(Debug)]
#[expect(
    dead_code,
    reason = "held, never read: dropping the lease gives the connection or stream slot back"
)]
pub(crate) enum Lease {
    Http1(H1Conn),
    Http2(H2Stream),
}
