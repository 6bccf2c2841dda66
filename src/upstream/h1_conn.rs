//! An HTTP/1.1 connection to an upstream, driven by the task that uses it.
//!
//! hyper's client connection comes in two halves: a `SendRequest` handle and the `Connection`
//! future that does the I/O. Spawned as a task of its own (the usual way), the connection makes
//! every request cross tasks twice — the request into the connection task's channel, the
//! response head back through a oneshot, each body chunk through another channel — and every
//! crossing is a wake-up and one more task to schedule. Here both halves stay together, and
//! whoever uses the connection polls its driver: the request's task while it waits for the
//! response head ([`H1Conn::send`]), the response body while it streams (`http::body`), the
//! pool when it looks at an idle one (checkout, checkin, the periodic sweep). An idle
//! connection in the pool is polled by nobody: a close by the server is noticed the next time
//! the pool looks at it.
//!
//! The channels are still there (they are inside hyper), but both ends are in one task, so
//! what they carry is read in the same poll that wrote it: the receiving ends are polled with
//! a waker that does nothing, because only the driver, polled with the task's own waker just
//! before, can fill them.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::client::conn::TrySendError;

use super::body::RequestBody;
use super::breaker::ConnectionSlot;

/// A handle that sends requests on a connection whose driver runs as a task of its own.
pub(crate) type H1Sender = SendRequest<RequestBody>;

/// The I/O half of a connection: hyper's `Connection`, whatever the stream under it.
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// An HTTP/1.1 connection: the handle that takes requests and the driver that moves its bytes.
pub(crate) struct H1Conn {
    sender: SendRequest<RequestBody>,
    /// `None` once the connection has closed.
    driver: Option<Driver>,
    addr: SocketAddr,
    /// The circuit breaker's count of open connections, held until the connection closes.
    slot: Option<ConnectionSlot>,
    /// The runtime whose I/O driver the socket is registered with: it reports the socket's
    /// readiness, so a connection used from another worker's task is woken across threads,
    /// and only when that worker looks at its I/O. The pool hands a connection to tasks of
    /// its own runtime first.
    home: Option<tokio::runtime::Id>,
}

/// The runtime the calling task runs on (none outside one).
pub(crate) fn current_runtime() -> Option<tokio::runtime::Id> {
    tokio::runtime::Handle::try_current().ok().map(|h| h.id())
}

impl std::fmt::Debug for H1Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Conn")
            .field("addr", &self.addr)
            .field("open", &self.driver.is_some())
            .finish()
    }
}

impl H1Conn {
    pub(crate) fn new<F>(
        sender: SendRequest<RequestBody>,
        driver: F,
        addr: SocketAddr,
        slot: Option<ConnectionSlot>,
    ) -> Self
    where
        F: Future<Output = hyper::Result<()>> + Send + 'static,
    {
        H1Conn {
            sender,
            driver: Some(Box::pin(driver)),
            addr,
            slot,
            home: current_runtime(),
        }
    }

    /// Moves the connection's bytes as far as they go now. Ready once the connection has
    /// closed: its socket and circuit-breaker slot are given up then, and every request or
    /// response still waiting on it gets hyper's error.
    pub(crate) fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(driver) = &mut self.driver else {
            return Poll::Ready(());
        };
        let Poll::Ready(result) = driver.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        if let Err(e) = result {
            tracing::debug!(addr = %self.addr, error = %e, "upstream connection closed with error");
        }
        self.driver = None;
        self.slot = None;
        Poll::Ready(())
    }

    /// Whether the connection can take a request right now: open, and hyper done with the
    /// previous exchange. `look` polls the driver once first (waking nobody), so that a close
    /// by the server, or the end of the previous exchange, is seen.
    fn can_take_request(&mut self, look: bool) -> bool {
        if look {
            let _ = self.poll_drive(&mut Context::from_waker(Waker::noop()));
        }
        self.driver.is_some() && self.sender.is_ready()
    }

    /// Whether an idle connection can carry the next request: not closed by the server since
    /// it was last used (the driver is polled once to see it).
    pub(crate) fn is_reusable(&mut self) -> bool {
        self.can_take_request(true)
    }

    /// Whether a connection whose response has just been read can go back to the pool. Usually
    /// hyper saw the end of the exchange while reading the response; only when it did not is
    /// the driver polled again (a request body still being sent is not waited for).
    pub(crate) fn is_done(&mut self) -> bool {
        self.can_take_request(false) || self.can_take_request(true)
    }

    /// The runtime the connection's socket belongs to.
    pub(crate) fn home(&self) -> Option<tokio::runtime::Id> {
        self.home
    }

    /// Waits until the connection can take a request: a new one until hyper has started, a
    /// pooled one (checked at checkout) at once.
    pub(crate) async fn ready(&mut self) -> hyper::Result<()> {
        if self.can_take_request(false) {
            return Ok(());
        }
        poll_fn(|cx| {
            let _ = self.poll_drive(cx);
            self.sender.poll_ready(cx)
        })
        .await
    }

    /// Sends `req` and drives the connection until the response head has arrived (the body
    /// comes as the response is read, see `http::body`). A request hyper never wrote comes
    /// back with the error.
    pub(crate) async fn send(
        &mut self,
        req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, TrySendError<Request<RequestBody>>> {
        // Unconstrained by tokio's cooperative budget: a budget-exhausted oneshot would wake
        // the waker it is given to be polled again, and that waker does nothing (see below).
        // The driver, polled with the task's waker, still counts against the budget.
        let response = tokio::task::unconstrained(self.sender.try_send_request(req));
        let mut response = std::pin::pin!(response);
        poll_fn(|cx| {
            let _ = self.poll_drive(cx);
            // Only the driver, just polled with this task's waker, fills the response's
            // oneshot (or drops it, closing): registering this task there too would only wake
            // it a second time for the same event.
            response
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
        })
        .await
    }

    /// Hands the driver to a task of its own: for a connection whose requests are sent and
    /// whose responses are read by code that does not drive it (active health checks).
    pub(crate) fn spawn(mut self) -> SendRequest<RequestBody> {
        if let Some(driver) = self.driver.take() {
            let (addr, slot) = (self.addr, self.slot.take());
            tokio::spawn(async move {
                if let Err(e) = driver.await {
                    tracing::debug!(%addr, error = %e, "upstream connection closed with error");
                }
                drop(slot);
            });
        }
        self.sender
    }
}
