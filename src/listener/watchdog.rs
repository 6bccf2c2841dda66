//! Closing client connections that do nothing: no complete request head within
//! `headerReadTimeout` of accept, or no request in flight for `idleTimeout`.
//!
//! Requests tell their connection's [`Activity`] when they start (the HTTP server calls the
//! service: the head is complete) and when they end (the response body is dropped: sent, or
//! abandoned). The [`watchdog`] sleeps until the next deadline those imply and checks again
//! when it wakes, so a busy connection costs a timer re-armed once per `idleTimeout`, and a
//! request costs two atomic operations and a clock read.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::http::sending::{BodyLimits, SendWatch};

/// Why the watchdog closed a connection (the `reason` of
/// `egressd_downstream_connection_timeouts_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// No complete request head (or HTTP/2 preface, TLS handshake, ClientHello) within
    /// `headerReadTimeout` of accept.
    HeaderRead,
    /// No request in flight for `idleTimeout`.
    Idle,
}

impl Expiry {
    pub(crate) fn as_str(self) -> &'static str {
        crate::telemetry::metrics::CONNECTION_TIMEOUTS[self as usize]
    }
}

/// What the requests of one connection are doing.
#[derive(Debug)]
pub(crate) struct Activity {
    /// When the connection was accepted; times below are milliseconds since then.
    born: Instant,
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection became idle otherwise), plus one;
    /// 0 while none has.
    idle_since: AtomicU64,
    /// The HTTP/1.1 response being sent (`sending`).
    pub(crate) send: SendWatch,
    /// An HTTP/1.1 response was handed to hyper and its head not written yet
    /// (`head_fixes`).
    head_due: AtomicBool,
}

impl Activity {
    pub(crate) fn new(born: Instant) -> Arc<Self> {
        Arc::new(Activity {
            born,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            send: SendWatch::new(born),
            head_due: AtomicBool::new(false),
        })
    }

    /// When the connection was accepted.
    pub(crate) fn born(&self) -> Instant {
        self.born
    }

    /// Marks the connection idle from now: an HTTP/2 connection after its preface, which
    /// may then wait for its first stream as long as any idle connection.
    pub(crate) fn idle_from_now(&self) {
        self.idle_since
            .store(self.millis_now() + 1, Ordering::Release);
    }

    /// A request has started (its head is complete); it is in flight until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// An HTTP/1.1 response was handed to hyper: the next write carries its head.
    pub(crate) fn head_due(&self) {
        self.head_due.store(true, Ordering::Relaxed);
    }

    /// Whether a response head was due, which the write about to be made carries; not due
    /// any more.
    pub(crate) fn take_head_due(&self) -> bool {
        let due = self.head_due.load(Ordering::Relaxed);
        if due {
            self.head_due.store(false, Ordering::Relaxed);
        }
        due
    }

    /// Whether a request (or a tunnel or websocket) is in flight.
    pub(crate) fn is_busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    fn millis_now(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn at(&self, millis: u64) -> Instant {
        self.born + Duration::from_millis(millis)
    }
}

/// One request in flight; dropped with its response body.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    /// Its response was handed to hyper (see [`Activity::head_due`]).
    pub(crate) fn head_due(&self) {
        self.0.head_due();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The time first, then the count: whoever sees the count at 0 sees this time too.
        self.0
            .idle_since
            .store(self.0.millis_now() + 1, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Resolves when the connection has done nothing for too long: no request head by
/// `first_deadline` (unless it became idle otherwise, see [`Activity::idle_from_now`]), or no
/// request in flight for `idle`. Never resolves when the timeout that applies is off.
pub(crate) async fn watchdog(
    activity: &Activity,
    first_deadline: Option<Instant>,
    idle: Option<Duration>,
) -> Expiry {
    let mut wake = match activity.idle_since.load(Ordering::Acquire) {
        0 => first_deadline,
        since => idle.map(|idle| activity.at(since - 1) + idle),
    };
    loop {
        match wake {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
        let now = Instant::now();
        if activity.in_flight.load(Ordering::Acquire) > 0 {
            // Busy: look again after a whole idle period, the soonest it could expire.
            wake = idle.map(|idle| now + idle);
            continue;
        }
        let since = activity.idle_since.load(Ordering::Acquire);
        if since == 0 {
            // Still no complete request head since accept, and the deadline is past.
            return Expiry::HeaderRead;
        }
        let Some(idle) = idle else {
            wake = None;
            continue;
        };
        let deadline = activity.at(since - 1) + idle;
        if deadline <= now {
            return Expiry::Idle;
        }
        wake = Some(deadline);
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request [`InFlight`] until it is dropped, and tells
    /// the [`SendWatch`] of its connection (HTTP/1.1) or stream (HTTP/2) what it hands over.
    pub(crate) struct Tracked<B> {
        #[pin]
        body: B,
        in_flight: InFlight,
        stream: Option<Arc<SendWatch>>,
        handed: u64,
    }

    impl<B> PinnedDrop for Tracked<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            watch_of(this.stream, this.in_flight).asked(*this.handed);
        }
    }
}

impl<B> Tracked<B> {
    /// `stream`: the HTTP/2 stream's watch (`sending::current_stream`), else the
    /// connection's is used; `limits`: the body's own.
    pub(crate) fn new(
        body: B,
        in_flight: InFlight,
        stream: Option<Arc<SendWatch>>,
        limits: BodyLimits,
    ) -> Self {
        let handed = watch_of(&stream, &in_flight).begin(limits);
        Tracked {
            body,
            in_flight,
            stream,
            handed,
        }
    }
}

fn watch_of<'w>(stream: &'w Option<Arc<SendWatch>>, in_flight: &'w InFlight) -> &'w SendWatch {
    match stream {
        Some(watch) => watch,
        None => &in_flight.0.send,
    }
}

impl<B> Body for Tracked<B>
where
    B: Body,
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let watch = watch_of(this.stream, this.in_flight);
        watch.asked(*this.handed);
        let polled = this.body.poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            *this.handed += 1;
            watch.handed(*this.handed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    //! Real time, scaled down to milliseconds (the crate's tokio has no paused clock).
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn no_request_head_in_time_is_a_header_read_timeout() {
        let born = Instant::now();
        let activity = Activity::new(born);
        let expiry = watchdog(&activity, Some(born + 50 * MS), Some(60 * MS * 1000)).await;
        assert_eq!(expiry, Expiry::HeaderRead);
        assert!(born.elapsed() >= 50 * MS);
    }

    #[tokio::test]
    async fn a_long_request_is_never_idle_and_idleness_counts_from_its_end() {
        let born = Instant::now();
        let activity = Activity::new(born);
        let request = activity.begin();
        let watch = tokio::spawn({
            let activity = activity.clone();
            async move { watchdog(&activity, Some(born + 10 * MS), Some(40 * MS)).await }
        });
        // The request outlasts the head deadline and several idle periods.
        tokio::time::sleep(200 * MS).await;
        assert!(!watch.is_finished());
        let ended = Instant::now();
        drop(request);
        assert_eq!(watch.await.unwrap(), Expiry::Idle);
        assert!(ended.elapsed() >= 40 * MS);
    }

    #[tokio::test]
    async fn an_http2_connection_is_idle_from_its_preface() {
        let born = Instant::now();
        let activity = Activity::new(born);
        activity.idle_from_now();
        // The head deadline no longer applies; the idle timeout does.
        let expiry = watchdog(&activity, Some(born + MS), Some(30 * MS)).await;
        assert_eq!(expiry, Expiry::Idle);
        assert!(born.elapsed() >= 30 * MS);
    }

    #[tokio::test]
    async fn off_timeouts_never_expire() {
        let born = Instant::now();
        let activity = Activity::new(born);
        drop(activity.begin());
        let expired =
            tokio::time::timeout(200 * MS, watchdog(&activity, Some(born + MS), None)).await;
        assert!(expired.is_err());
    }
}
