//! Body types of the data path. Bodies are streamed frame by frame, never collected.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::upstream::endpoint::ActiveRequest;
use crate::upstream::pool::H1Sender;
use crate::upstream::Endpoint;

/// The body sent upstream: the client's request body, streamed.
pub type RequestBody = Incoming;

/// Errors while streaming a response body downstream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response body egressd sends downstream: its own reply, or an upstream response.
#[derive(Debug)]
pub enum ProxyBody {
    Local(Option<Bytes>),
    Upstream(Box<UpstreamBody>),
}

impl ProxyBody {
    pub fn local(bytes: Bytes) -> Self {
        ProxyBody::Local(Some(bytes))
    }

    pub fn empty() -> Self {
        ProxyBody::Local(None)
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Local(bytes) => bytes.is_none(),
            ProxyBody::Upstream(body) => body.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Local(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Local(None) => SizeHint::with_exact(0),
            ProxyBody::Upstream(body) => body.inner.size_hint(),
        }
    }
}

/// Why streaming an upstream response stopped early.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("request timeout of {0:?} reached while streaming the response")]
    Deadline(Duration),
    #[error("upstream sent nothing for {0:?} while streaming the response")]
    Idle(Duration),
}

/// An upstream response body on its way downstream. When it has been read to the end, the
/// connection goes back to the endpoint's pool; if it is dropped early (client gone, timeout,
/// error) the connection is closed instead, because its state is unknown.
#[derive(Debug)]
pub struct UpstreamBody {
    inner: Incoming,
    /// The connection to give back at the end of the body.
    give_back: Option<H1Sender>,
    /// Keeps the endpoint's active-request count up while the response streams.
    active: ActiveRequest,
    idle: Option<IdleTimer>,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
}

#[derive(Debug)]
struct IdleTimer {
    timeout: Duration,
    last_activity: Instant,
    /// Fires at `last_activity + timeout` as it was when last armed; re-armed lazily, so a busy
    /// stream does not touch the timer wheel on every frame.
    sleep: Pin<Box<Sleep>>,
}

impl UpstreamBody {
    /// `deadline` is when the request's timeout expires (with the timeout, for the message).
    pub fn new(
        inner: Incoming,
        sender: H1Sender,
        active: ActiveRequest,
        idle_timeout: Option<Duration>,
        deadline: Option<(Instant, Duration)>,
    ) -> Self {
        let mut body = UpstreamBody {
            inner,
            give_back: Some(sender),
            active,
            idle: idle_timeout.map(|timeout| IdleTimer {
                timeout,
                last_activity: Instant::now(),
                sleep: Box::pin(tokio::time::sleep(timeout)),
            }),
            deadline: deadline
                .map(|(at, timeout)| (Box::pin(tokio::time::sleep_until(at)), timeout)),
        };
        if body.inner.is_end_stream() {
            body.finish();
        }
        body
    }

    fn endpoint(&self) -> &Arc<Endpoint> {
        self.active.endpoint()
    }

    /// The response was read completely: the connection can carry another request.
    fn finish(&mut self) {
        if let Some(sender) = self.give_back.take() {
            self.endpoint().pool.checkin(sender);
        }
        self.idle = None;
        self.deadline = None;
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
        if let Some((sleep, timeout)) = &mut this.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                let timeout = *timeout;
                this.give_back = None;
                return Poll::Ready(Some(Err(StreamError::Deadline(timeout).into())));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(idle) = &mut this.idle {
                    idle.last_activity = Instant::now();
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.give_back = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(idle) = &mut this.idle {
                    loop {
                        if idle.sleep.as_mut().poll(cx).is_pending() {
                            break;
                        }
                        let due = idle.last_activity + idle.timeout;
                        if due <= Instant::now() {
                            let timeout = idle.timeout;
                            this.give_back = None;
                            return Poll::Ready(Some(Err(StreamError::Idle(timeout).into())));
                        }
                        // There was activity since the timer was armed: re-arm and poll again
                        // so the waker is registered.
                        idle.sleep.as_mut().reset(due);
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

use std::future::Future;
