//! The send timeout: a response whose bytes wait for a client that does not read them.
//!
//! While a client does not read, hyper stops asking the response body for more (HTTP/1.1:
//! its write buffer is full; HTTP/2: the stream has no flow-control window), so nothing in the
//! body runs: not its stream idle timer, not the request deadline, and the upstream connection
//! it reads from stays taken. Here the task that serves the response watches instead: the body
//! notes each frame it hands over and each time it is asked for the next one ([`SendWatch`]);
//! when the task has nothing to do while a frame waits, a [`SendTimer`] runs until the first
//! of `downstream.sendTimeout` from then, the request's deadline and the Backend's stream idle
//! timeout. If it expires, the task drops what it serves: the HTTP/1.1 connection (its only
//! response), the HTTP/2 stream (reset; the connection's other streams go on), and with it the
//! response body and the upstream connection it held.
//!
//! A stream that is slow because its *upstream* is slow (an SSE stream between events, a long
//! poll) never waits on the client, so only its own timeouts apply to it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::time::{Instant, Sleep};

use crate::telemetry::metrics::ReasonLabel;

/// Which limit cut a response the client was not reading (the `reason` of
/// `egressd_downstream_send_timeouts_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// `downstream.sendTimeout`.
    Send,
    /// The request's deadline (the Backend's `requestTimeout`, or a gRPC client's own).
    Deadline,
    /// The Backend's `streamIdleTimeout`: nothing moved either way.
    StreamIdle,
}

impl Cut {
    pub(crate) fn as_str(self) -> &'static str {
        crate::telemetry::metrics::SEND_TIMEOUTS[self as usize]
    }
}

/// The limits of one response besides the send timeout, as its body knows them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BodyLimits {
    /// When the whole request must be over.
    pub(crate) deadline: Option<Instant>,
    /// The stream idle timeout.
    pub(crate) idle: Option<Duration>,
}

/// What a response body is doing, for the task that serves it: how many frames it has handed
/// over and whether the last one is still waiting for the client, and the body's own limits.
/// One per HTTP/1.1 connection (one response at a time), one per HTTP/2 stream, one per
/// relay's client side.
#[derive(Debug)]
pub(crate) struct SendWatch {
    /// `handed << 1 | waiting`.
    state: AtomicU64,
    base: Instant,
    /// The body's deadline in milliseconds after `base`; `u64::MAX`: none.
    deadline_ms: AtomicU64,
    /// The body's stream idle timeout in milliseconds; `u64::MAX`: none.
    idle_ms: AtomicU64,
}

const NONE: u64 = u64::MAX;

/// Whole milliseconds, without `as_millis`'s 128-bit arithmetic (this runs per response).
fn millis(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
}

impl SendWatch {
    pub(crate) fn new(base: Instant) -> Self {
        SendWatch {
            state: AtomicU64::new(0),
            base,
            deadline_ms: AtomicU64::new(NONE),
            idle_ms: AtomicU64::new(NONE),
        }
    }

    /// A response is handed to the server: its limits. Its head counts as the first frame,
    /// waiting until the server asks for the body (HTTP/2 asks only once the client's window
    /// has room). Returns the count of frames handed, from which the response counts on.
    pub(crate) fn begin(&self, limits: BodyLimits) -> u64 {
        let deadline = limits
            .deadline
            .map_or(NONE, |d| millis(d.saturating_duration_since(self.base)));
        self.deadline_ms.store(deadline, Ordering::Relaxed);
        let idle = limits.idle.map_or(NONE, millis);
        self.idle_ms.store(idle, Ordering::Relaxed);
        let handed = (self.state.load(Ordering::Relaxed) >> 1) + 1;
        self.handed(handed);
        handed
    }

    /// The server asks for more: whatever was handed before has been taken.
    #[inline]
    pub(crate) fn asked(&self, handed: u64) {
        self.state.store(handed << 1, Ordering::Relaxed);
    }

    /// The `handed`-th frame was handed over; it waits until the server asks again.
    #[inline]
    pub(crate) fn handed(&self, handed: u64) {
        self.state.store(handed << 1 | 1, Ordering::Relaxed);
    }

    /// A write the client is not taking: waiting from now unless it already was.
    pub(crate) fn blocked(&self) {
        let state = self.state.load(Ordering::Relaxed);
        if state & 1 == 0 {
            self.state.store((state + 2) | 1, Ordering::Relaxed);
        }
    }

    /// A write went through.
    pub(crate) fn unblocked(&self) {
        self.state.fetch_and(!1, Ordering::Relaxed);
    }

    fn limit_after(&self, ms: &AtomicU64) -> Option<Duration> {
        match ms.load(Ordering::Relaxed) {
            NONE => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// The first limit for a wait that starts at `now`.
    fn first_limit(&self, now: Instant, send: Option<Duration>) -> Option<(Instant, Cut)> {
        let deadline = self
            .limit_after(&self.deadline_ms)
            .map(|d| (self.base + d, Cut::Deadline));
        let idle = self
            .limit_after(&self.idle_ms)
            .map(|i| (now + i, Cut::StreamIdle));
        let send = send.map(|s| (now + s, Cut::Send));
        [send, deadline, idle]
            .into_iter()
            .flatten()
            .min_by_key(|(at, _)| *at)
    }
}

/// Runs while a frame waits for the client (see the module's documentation).
#[derive(Debug)]
pub(crate) struct SendTimer {
    send: Option<Duration>,
    /// The watch's state the timer was armed for.
    armed_for: u64,
    cut: Cut,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl SendTimer {
    /// `send`: `downstream.sendTimeout` (`None`: only the body's own limits apply).
    pub(crate) fn new(send: Option<Duration>) -> Self {
        SendTimer {
            send,
            armed_for: 0,
            cut: Cut::Send,
            sleep: None,
        }
    }

    /// Polled when the serving task has nothing else to do: `Ready` with the limit that
    /// expired while a frame waited for the client all along.
    #[inline]
    pub(crate) fn poll_expired(&mut self, watch: &SendWatch, cx: &mut Context<'_>) -> Poll<Cut> {
        // The common case, inline: nothing waits for the client.
        if watch.state.load(Ordering::Relaxed) & 1 == 0 {
            return Poll::Pending;
        }
        self.poll_waiting(watch, cx)
    }

    #[inline(never)]
    fn poll_waiting(&mut self, watch: &SendWatch, cx: &mut Context<'_>) -> Poll<Cut> {
        loop {
            let state = watch.state.load(Ordering::Relaxed);
            if state & 1 == 0 {
                return Poll::Pending;
            }
            if state != self.armed_for {
                // A new wait: the clock is read once per wait, not per frame.
                let Some((due, cut)) = watch.first_limit(Instant::now(), self.send) else {
                    return Poll::Pending;
                };
                self.armed_for = state;
                self.cut = cut;
                match &mut self.sleep {
                    Some(sleep) => sleep.as_mut().reset(due),
                    None => self.sleep = Some(Box::pin(tokio::time::sleep_until(due))),
                }
            }
            let Some(sleep) = &mut self.sleep else {
                return Poll::Pending;
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if watch.state.load(Ordering::Relaxed) == self.armed_for {
                return Poll::Ready(self.cut);
            }
            // The client took the frame meanwhile; a later wait is timed afresh.
        }
    }
}

tokio::task_local! {
    /// The watch of the HTTP/2 stream being served (see [`StreamExecutor`]).
    static STREAM: Arc<SendWatch>;
}

/// The watch of the HTTP/2 stream whose task this is, if it is one.
pub(crate) fn current_stream() -> Option<Arc<SendWatch>> {
    STREAM.try_with(Arc::clone).ok()
}

/// hyper's executor for HTTP/2 streams: each stream's task is watched (see the module's
/// documentation) and dropped, which resets the stream, when a limit expires while it waits
/// for the client.
#[derive(Clone, Debug)]
pub(crate) struct StreamExecutor {
    pub(crate) send: Option<Duration>,
    pub(crate) cuts: Family<ReasonLabel, Counter>,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let watch = Arc::new(SendWatch::new(Instant::now()));
        let watched = Watched {
            stream: Box::pin(stream),
            timer: SendTimer::new(self.send),
            watch: watch.clone(),
            cuts: self.cuts.clone(),
        };
        tokio::spawn(STREAM.scope(watch, watched));
    }
}

/// An HTTP/2 stream's task, watched.
struct Watched<F> {
    stream: Pin<Box<F>>,
    timer: SendTimer,
    watch: Arc<SendWatch>,
    cuts: Family<ReasonLabel, Counter>,
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.stream.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        match this.timer.poll_expired(&this.watch, cx) {
            Poll::Ready(cut) => {
                count(&this.cuts, cut);
                tracing::debug!(
                    reason = cut.as_str(),
                    "HTTP/2 stream reset: the client did not read its response"
                );
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Counts a response cut because its client did not read it.
pub(crate) fn count(cuts: &Family<ReasonLabel, Counter>, cut: Cut) {
    cuts.get_or_create(&ReasonLabel {
        reason: cut.as_str(),
    })
    .inc();
}
