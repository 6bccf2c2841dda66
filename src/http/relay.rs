//! The byte relay of tunnels and websockets: after the handshake, bytes go both ways untouched
//! (the client's own TLS to a Passthrough Backend, a plain TCP protocol, websocket frames),
//! until either side closes, nothing moves for the Backend's stream idle timeout, or bytes
//! wait for a client that does not read them for `downstream.sendTimeout` (`sending`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::http::sending::{Cut, SendTimer, SendWatch};

/// How a tunnel ended, with the bytes it carried each way (counted as they passed, so a
/// tunnel cut by a reset or the idle timeout still reports them).
#[derive(Debug)]
pub(crate) struct TunnelEnd {
    pub(crate) how: TunnelClose,
    /// Bytes written to the upstream (client → upstream).
    pub(crate) up: u64,
    /// Bytes written to the client (upstream → client).
    pub(crate) down: u64,
}

/// Why a tunnel ended.
#[derive(Debug)]
#[expect(
    dead_code,
    reason = "the idle time and the error are read through Debug: the debug line of a closed tunnel"
)]
pub(crate) enum TunnelClose {
    /// Both directions finished.
    Closed,
    /// No byte in either direction for this long.
    Idle(Duration),
    /// Bytes waited for the client this long (`downstream.sendTimeout`).
    Send(Duration),
    Error(io::Error),
}

impl TunnelEnd {
    /// Counts a relay cut by the send timeout.
    pub(crate) fn count_cut(&self, metrics: &crate::telemetry::metrics::Metrics) {
        if let TunnelClose::Send(_) = self.how {
            crate::http::sending::count(&metrics.downstream_send_timeouts, Cut::Send);
        }
    }

    /// Whether both sides closed in order.
    pub(crate) fn complete(&self) -> bool {
        matches!(self.how, TunnelClose::Closed)
    }
}

/// Relays between `client` and `upstream` until both directions close, an error, `idle`
/// passes without a byte either way, or bytes wait `send` for the client.
pub(crate) async fn relay<C, U>(
    client: C,
    upstream: U,
    idle: Option<Duration>,
    send: Option<Duration>,
) -> TunnelEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let up = Arc::new(AtomicU64::new(0));
    let sending = send.map(|_| Arc::new(SendWatch::new(start)));
    let mut client = Watched {
        inner: client,
        last: last.clone(),
        written: down.clone(),
        start,
        sending: sending.clone(),
    };
    let mut upstream = Watched {
        inner: upstream,
        last: last.clone(),
        written: up.clone(),
        start,
        sending: None,
    };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    let how = until_closed(
        copy,
        Clocks {
            start,
            last: &last,
            idle,
        },
        sending.as_deref(),
        send,
    )
    .await;
    TunnelEnd {
        how,
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
    }
}

/// When bytes last moved, and the idle timeout.
struct Clocks<'a> {
    start: Instant,
    /// Milliseconds after `start`.
    last: &'a AtomicU64,
    idle: Option<Duration>,
}

impl Clocks<'_> {
    fn idle_due(&self) -> Option<Instant> {
        let last = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.idle.map(|idle| last + idle)
    }
}

/// Drives the copy until it ends or one of the relay's timers runs out.
async fn until_closed<F>(
    copy: F,
    clocks: Clocks<'_>,
    sending: Option<&SendWatch>,
    send: Option<Duration>,
) -> TunnelClose
where
    F: Future<Output = io::Result<(u64, u64)>>,
{
    tokio::pin!(copy);
    let mut send_timer = SendTimer::new(send);
    loop {
        let idle_wait = async {
            match clocks.idle_due() {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        let send_wait = std::future::poll_fn(|cx| match sending {
            Some(watch) => send_timer.poll_expired(watch, cx),
            None => Poll::Pending,
        });
        // The copy first: the send timer must see what the copy's writes just did.
        tokio::select! {
            biased;
            result = &mut copy => {
                return match result {
                    Ok(_) => TunnelClose::Closed,
                    Err(e) => TunnelClose::Error(e),
                };
            }
            _ = idle_wait => {
                if let (Some(due), Some(idle)) = (clocks.idle_due(), clocks.idle) {
                    if due <= Instant::now() {
                        return TunnelClose::Idle(idle);
                    }
                }
                // There was traffic since the timer was set: wait for the new deadline.
            }
            _ = send_wait => {
                return TunnelClose::Send(send.unwrap_or_default());
            }
        }
    }
}

/// A stream that notes when bytes last moved (milliseconds since the tunnel started) and
/// counts the bytes written to it.
struct Watched<S> {
    inner: S,
    last: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    start: Instant,
    /// The client's side: whether bytes wait for it (`sending`).
    sending: Option<Arc<SendWatch>>,
}

impl<S> Watched<S> {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = result {
            if n > 0 {
                self.written.fetch_add(n as u64, Ordering::Relaxed);
                self.touch();
            }
        }
        if let Some(watch) = &self.sending {
            match result {
                Poll::Pending => watch.blocked(),
                Poll::Ready(_) => watch.unblocked(),
            }
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
