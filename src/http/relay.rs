//! The byte relay of tunnels and websockets: after the handshake, bytes go both ways untouched
//! (the client's own TLS to a Passthrough Backend, a plain TCP protocol, websocket frames),
//! until either side closes or nothing moves for the Backend's stream idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

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
    Error(io::Error),
}

impl TunnelEnd {
    /// Whether both sides closed in order.
    pub(crate) fn complete(&self) -> bool {
        matches!(self.how, TunnelClose::Closed)
    }
}

/// Relays between `client` and `upstream` until both directions close, an error, or `idle`
/// passes without a byte either way.
pub(crate) async fn relay<C, U>(client: C, upstream: U, idle: Option<Duration>) -> TunnelEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    let up = Arc::new(AtomicU64::new(0));
    let mut client = Watched {
        inner: client,
        last: last.clone(),
        written: down.clone(),
        start,
    };
    let mut upstream = Watched {
        inner: upstream,
        last: last.clone(),
        written: up.clone(),
        start,
    };
    let how = {
        let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
        match idle {
            None => match copy.await {
                Ok(_) => TunnelClose::Closed,
                Err(e) => TunnelClose::Error(e),
            },
            Some(idle) => {
                tokio::pin!(copy);
                loop {
                    let due = start + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
                    tokio::select! {
                        result = &mut copy => {
                            break match result {
                                Ok(_) => TunnelClose::Closed,
                                Err(e) => TunnelClose::Error(e),
                            };
                        }
                        _ = tokio::time::sleep_until(due) => {
                            let latest =
                                start + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
                            if latest <= Instant::now() {
                                break TunnelClose::Idle(idle);
                            }
                            // There was traffic since the timer was set: wait for the new
                            // deadline.
                        }
                    }
                }
            }
        }
    };
    TunnelEnd {
        how,
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
    }
}

/// A stream that notes when bytes last moved (milliseconds since the tunnel started) and
/// counts the bytes written to it.
struct Watched<S> {
    inner: S,
    last: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    start: Instant,
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
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
