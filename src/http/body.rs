//! Body types of the data path. Bodies are streamed frame by frame, never collected.

use std::future::Future;
use std::pin::Pin;

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::http::deadline::Deadline;
use crate::http::grpc::GrpcStatus;
use crate::upstream::body::Lease;
use crate::upstream::endpoint::ActiveRequest;
use crate::upstream::Endpoint;

/// Errors while streaming a response body downstream.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response body egressd sends downstream: its own reply, or an upstream response.
pub(crate) enum ProxyBody {
    Local(Option<Bytes>),
    Upstream(Box<UpstreamBody>),
    /// Any other body streamed as is (e.g. the answer to a declined upgrade, whose connection
    /// is not pooled).
    Stream(Pin<Box<dyn Body<Data = Bytes, Error = BodyError> + Send>>),
}

impl std::fmt::Debug for ProxyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProxyBody::Local(b) => f.debug_tuple("Local").field(b).finish(),
            ProxyBody::Upstream(b) => f.debug_tuple("Upstream").field(b).finish(),
            ProxyBody::Stream(_) => f.write_str("Stream"),
        }
    }
}

impl ProxyBody {
    pub(crate) fn local(bytes: Bytes) -> Self {
        ProxyBody::Local(Some(bytes))
    }

    pub(crate) fn empty() -> Self {
        ProxyBody::Local(None)
    }

    /// The limits an upstream response's body applies while it streams: when the request
    /// must be over, and the stream idle timeout. The task serving the response applies them
    /// too while the client does not read (`listener::sending`), when the body is not asked.
    pub(crate) fn limits(&self) -> (Option<Instant>, Option<Duration>) {
        match self {
            ProxyBody::Upstream(body) => (body.timers.deadline.map(|d| d.at), body.timers.idle),
            ProxyBody::Local(_) | ProxyBody::Stream(_) => (None, None),
        }
    }
}

impl ProxyBody {
    /// For an upstream's bodiless response whose `Content-Length` must reach an HTTP/1.1
    /// client (a 304): see `UpstreamBody::declared_length`. Not for HTTP/2 clients, which get
    /// the header anyway and, with it, must see END_STREAM on the HEADERS frame.
    pub(crate) fn keep_declared_length(&mut self) {
        if let ProxyBody::Upstream(body) = self {
            body.declared_length = true;
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ProxyBody::Local(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream(body) => Pin::new(&mut **body).poll_frame(cx),
            ProxyBody::Stream(body) => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Local(bytes) => bytes.is_none(),
            ProxyBody::Upstream(body) => body.is_end_stream(),
            ProxyBody::Stream(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Local(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Local(None) => SizeHint::with_exact(0),
            ProxyBody::Upstream(body) => body.size_hint(),
            ProxyBody::Stream(body) => body.size_hint(),
        }
    }
}

/// Why streaming an upstream response stopped early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    #[error("request timeout of {0:?} reached while streaming the response")]
    Deadline(Duration),
    #[error("upstream sent nothing for {0:?} while streaming the response")]
    Idle(Duration),
}

/// An upstream response body on its way downstream. When it has been read to the end, the
/// connection goes back to the endpoint's pool; if it is dropped early (client gone, timeout,
/// error) the connection is closed instead, because its state is unknown.
#[derive(Debug)]
pub(crate) struct UpstreamBody {
    inner: Incoming,
    /// The connection to give back (HTTP/1.1) or stream slot to release (HTTP/2) at the end
    /// of the body. Dropped early, an HTTP/1.1 connection is closed; an HTTP/2 stream is
    /// reset when `inner` is dropped, and its connection carries on.
    lease: Option<Lease>,
    /// Keeps the endpoint's active-request count up while the response streams.
    active: ActiveRequest,
    timers: StreamTimers,
    /// A gRPC call: a limit that ends the response ends it with gRPC status trailers instead
    /// of a reset, so the client learns why (DEADLINE_EXCEEDED, UNAVAILABLE).
    grpc: bool,
    /// The stream was ended by egressd (trailers sent): nothing follows.
    cut: bool,
    /// Never reported as ended or of known size before it is polled: hyper's HTTP/1.1 server
    /// drops the `Content-Length` of a response it knows to be empty, which a 304 keeps
    /// (RFC 9110 §8.6: the length of the representation it stands for).
    declared_length: bool,
    /// The upstream's body failed; reported at the next poll (see `poll_frame`).
    failed: Option<hyper::Error>,
}

/// The stream idle timeout and the request deadline, sharing one timer.
///
/// The timer is created only when the upstream first makes the body wait (a small response
/// that arrives with its headers never touches the timer wheel) and re-armed only when it
/// fires early because there was activity since it was armed, so a busy stream costs one
/// clock read per frame.
#[derive(Debug)]
pub(crate) struct StreamTimers {
    idle: Option<Duration>,
    /// When the whole request must be over.
    deadline: Option<Deadline>,
    last_activity: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl StreamTimers {
    /// `idle`: the stream idle timeout, counted from `last_activity` (when the response
    /// headers came); `deadline`: when the request's timeout expires.
    pub(crate) fn new(
        idle: Option<Duration>,
        deadline: Option<Deadline>,
        last_activity: Instant,
    ) -> Self {
        StreamTimers {
            idle,
            deadline,
            last_activity,
            sleep: None,
        }
    }

    fn is_off(&self) -> bool {
        self.idle.is_none() && self.deadline.is_none()
    }

    /// When the next limit expires, and the error it would be.
    fn next_due(&self) -> Option<(Instant, StreamError)> {
        let idle = self
            .idle
            .map(|t| (self.last_activity + t, StreamError::Idle(t)));
        let deadline = self
            .deadline
            .map(|d| (d.at, StreamError::Deadline(d.timeout)));
        match (idle, deadline) {
            (Some(i), Some(d)) => Some(if d.0 <= i.0 { d } else { i }),
            (i, d) => i.or(d),
        }
    }

    /// Called when the body is waiting for the upstream: Ready(error) if a limit expired,
    /// otherwise the waker is registered for the next one.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<StreamError> {
        loop {
            let Some((due, error)) = self.next_due() else {
                return Poll::Pending;
            };
            if due <= Instant::now() {
                return Poll::Ready(error);
            }
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if sleep.deadline() != due {
                sleep.as_mut().reset(due);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl UpstreamBody {
    pub(crate) fn new(
        inner: Incoming,
        lease: Lease,
        active: ActiveRequest,
        timers: StreamTimers,
    ) -> Self {
        let now = timers.last_activity;
        let mut body = UpstreamBody {
            inner,
            lease: Some(lease),
            active,
            timers,
            grpc: false,
            cut: false,
            declared_length: false,
            failed: None,
        };
        if body.inner.is_end_stream() {
            body.finish(now);
        }
        body
    }

    /// For gRPC calls: end with status trailers when a limit cuts the response.
    pub(crate) fn ending_grpc_calls_with_status(mut self, grpc: bool) -> Self {
        self.grpc = grpc;
        self
    }

    /// What the client gets when a limit ends the response early.
    fn cut_short(&mut self, error: StreamError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.lease = None;
        if !self.grpc {
            return Poll::Ready(Some(Err(error.into())));
        }
        self.cut = true;
        let (status, code) = match error {
            StreamError::Deadline(_) => (GrpcStatus::DeadlineExceeded, "upstream_timeout"),
            StreamError::Idle(_) => (GrpcStatus::Unavailable, "stream_idle_timeout"),
        };
        let trailers =
            crate::http::grpc::ending_trailers(status, code, &format!("egressd: {error}"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn endpoint(&self) -> &Arc<Endpoint> {
        self.active.endpoint()
    }

    /// The response was read completely (`now`): the connection can carry another request.
    fn finish(&mut self, now: Instant) {
        match self.lease.take() {
            Some(Lease::Http1(conn)) => self.endpoint().pool.checkin(conn, now.into_std()),
            // Dropping the slot makes room for another stream.
            Some(Lease::Http2(_)) | None => {}
        }
        self.timers.idle = None;
        self.timers.deadline = None;
        self.timers.sleep = None;
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if this.cut {
            return Poll::Ready(None);
        }
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(e.into())));
        }
        // An HTTP/1.1 connection is driven here, by the task streaming its response (see
        // `upstream::h1_conn`). What the driver has read is waiting in `inner` already (a small
        // body arrives with the head): the driver is polled only when `inner` has nothing, and
        // then registers this task's waker for the socket. So `inner` itself needs no waker:
        // only the driver, polled in this task, fills it.
        let polled = match &mut this.lease {
            Some(Lease::Http1(conn)) => {
                let mut noop = Context::from_waker(Waker::noop());
                match Pin::new(&mut this.inner).poll_frame(&mut noop) {
                    Poll::Pending => {
                        let _ = conn.poll_drive(cx);
                        Pin::new(&mut this.inner).poll_frame(&mut noop)
                    }
                    ready => ready,
                }
            }
            _ => Pin::new(&mut this.inner).poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let ended = this.inner.is_end_stream();
                if this.timers.is_off() && !ended {
                    return Poll::Ready(Some(Ok(frame)));
                }
                // One clock read for the timers and the pool's idle clock.
                let now = Instant::now();
                if !this.timers.is_off() {
                    // A stream that never waits must still end at its deadline.
                    if let Some(deadline) = this.timers.deadline {
                        if now >= deadline.at {
                            return this.cut_short(StreamError::Deadline(deadline.timeout));
                        }
                    }
                    this.timers.last_activity = now;
                }
                if ended {
                    this.finish(now);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // Given one poll later: the bytes already passed down are flushed to the
                // client first (hyper drops what it has buffered when a body fails), so the
                // client sees the head and what came of the body, then the abort. With the
                // connection driven in this task, the data and the failure often come in the
                // same poll.
                this.lease = None;
                this.failed = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(None) => {
                this.finish(Instant::now());
                Poll::Ready(None)
            }
            Poll::Pending => match this.timers.poll_expired(cx) {
                Poll::Ready(error) => this.cut_short(error),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.declared_length && (self.cut || (self.failed.is_none() && self.inner.is_end_stream()))
    }

    fn size_hint(&self) -> SizeHint {
        if self.declared_length {
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}
