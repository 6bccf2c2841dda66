//! Watching the frames an HTTP/2 server sends, without taking part in the protocol.
//!
//! hyper's HTTP/2 client does not tell its user what the server advertised, yet the pool needs
//! two facts to spread streams over connections the way RFC 9113 asks: the server's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` (§6.5.2; past it, streams would queue inside one
//! connection instead of a new connection being opened) and whether the server sent `GOAWAY`
//! (§6.8; no new stream may be started on that connection). [`FrameWatch`] wraps the stream
//! under hyper and reads the 9-byte frame headers as the bytes go by: frame payloads are
//! skipped, except those of `SETTINGS` frames, which are a few bytes long. This costs a few
//! comparisons per frame and never changes a byte.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::tls::TlsFailure;

/// What the server said about the connection so far.
#[derive(Debug)]
pub(crate) struct PeerSettings {
    max_concurrent_streams: AtomicU32,
    goaway: AtomicBool,
    /// Set with the server's first SETTINGS frame (its connection preface), or when the
    /// connection ended before one arrived (then `settings_received` stays false).
    preface_seen: AtomicBool,
    settings_received: AtomicBool,
    preface: Notify,
    /// The TLS error a read or write met, if one did (a server refusing our certificate).
    tls_failure: OnceLock<TlsFailure>,
}

/// Streams assumed before the server's first SETTINGS frame arrives (RFC 9113 §6.5.2 suggests
/// no less than 100; hyper's client starts from the same number).
pub(crate) const INITIAL_MAX_STREAMS: u32 = 100;

impl Default for PeerSettings {
    fn default() -> Self {
        PeerSettings {
            max_concurrent_streams: AtomicU32::new(INITIAL_MAX_STREAMS),
            goaway: AtomicBool::new(false),
            preface_seen: AtomicBool::new(false),
            settings_received: AtomicBool::new(false),
            preface: Notify::new(),
            tls_failure: OnceLock::new(),
        }
    }
}

impl PeerSettings {
    /// The server's current limit on concurrent streams this client may open.
    pub(crate) fn max_concurrent_streams(&self) -> u32 {
        self.max_concurrent_streams.load(Ordering::Relaxed)
    }

    /// Waits for the server's connection preface (its first SETTINGS frame), so the stream
    /// limit is known before requests are spread over connections.
    /// False if the connection ended (or failed) first.
    pub(crate) async fn preface(&self) -> bool {
        loop {
            let notified = self.preface.notified();
            if self.preface_seen.load(Ordering::Acquire) {
                return self.settings_received.load(Ordering::Acquire);
            }
            notified.await;
        }
    }

    fn end_preface_wait(&self) {
        if !self.preface_seen.swap(true, Ordering::AcqRel) {
            self.preface.notify_waiters();
        }
    }

    /// The TLS error the connection failed with, if it was one.
    pub(crate) fn tls_failure(&self) -> Option<TlsFailure> {
        self.tls_failure.get().copied()
    }

    /// Notes `e` if it carries a TLS error: h2 turns I/O errors into text, so this is where
    /// the cause can still be classified.
    fn note(&self, e: &io::Error) {
        if let Some(tls) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            let _ = self.tls_failure.set(TlsFailure::from_rustls(tls));
        }
    }

    /// Whether the server sent GOAWAY: the connection finishes its streams and takes no more.
    pub(crate) fn goaway(&self) -> bool {
        self.goaway.load(Ordering::Relaxed)
    }
}

const FRAME_HEADER_LEN: usize = 9;
const TYPE_SETTINGS: u8 = 0x4;
const TYPE_GOAWAY: u8 = 0x7;
const FLAG_ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// A SETTINGS frame longer than this (over 100 settings) is not collected; hyper's own
/// parser judges it.
const MAX_SETTINGS_PAYLOAD: usize = 600;

/// The frame scanner: where in the byte stream we are.
#[derive(Debug, Default)]
struct Scanner {
    header: [u8; FRAME_HEADER_LEN],
    /// Bytes of `header` filled so far.
    have: usize,
    /// Payload bytes of the current frame still to come (after a complete header).
    remaining: usize,
    /// The payload of the current SETTINGS frame, while it is being read.
    settings: Option<Vec<u8>>,
}

impl Scanner {
    fn scan(&mut self, mut bytes: &[u8], peer: &PeerSettings) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                if let Some(payload) = &mut self.settings {
                    payload.extend_from_slice(&bytes[..n]);
                }
                bytes = &bytes[n..];
                self.remaining -= n;
                if self.remaining == 0 {
                    self.end_of_frame(peer);
                }
                continue;
            }
            let n = (FRAME_HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < FRAME_HEADER_LEN {
                return;
            }
            self.have = 0;
            let h = &self.header;
            let length = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let (kind, flags) = (h[3], h[4]);
            match kind {
                TYPE_SETTINGS if flags & FLAG_ACK == 0 && length <= MAX_SETTINGS_PAYLOAD => {
                    self.settings = Some(Vec::with_capacity(length));
                }
                TYPE_GOAWAY => peer.goaway.store(true, Ordering::Relaxed),
                _ => {}
            }
            self.remaining = length;
            if length == 0 {
                self.end_of_frame(peer);
            }
        }
    }

    fn end_of_frame(&mut self, peer: &PeerSettings) {
        let Some(payload) = self.settings.take() else {
            return;
        };
        // RFC 9113 §6.5.1: a sequence of 16-bit identifiers and 32-bit values.
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            if id == SETTINGS_MAX_CONCURRENT_STREAMS {
                let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                peer.max_concurrent_streams.store(value, Ordering::Relaxed);
            }
        }
        peer.settings_received.store(true, Ordering::Release);
        peer.end_preface_wait();
    }
}

pin_project! {
    /// A connection to an HTTP/2 server whose incoming frames are watched (see the module
    /// documentation). Reads and writes pass through unchanged.
    pub(crate) struct FrameWatch<S> {
        #[pin]
        io: S,
        scanner: Scanner,
        peer: Arc<PeerSettings>,
        // A write failed; its error is returned once the server's reason has been looked
        // for (see `poll_reason`).
        write_failed: Option<io::Error>,
    }
}

impl<S> FrameWatch<S> {
    pub(crate) fn new(io: S) -> (Self, Arc<PeerSettings>) {
        let peer = Arc::new(PeerSettings::default());
        let watch = FrameWatch {
            io,
            scanner: Scanner::default(),
            peer: peer.clone(),
            write_failed: None,
        };
        (watch, peer)
    }
}

impl<S: AsyncRead> AsyncRead for FrameWatch<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let result = this.io.poll_read(cx, buf);
        match &result {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.scanner.scan(&buf.filled()[before..], this.peer);
            }
            // End of stream or an error: nobody should wait for a preface any longer.
            Poll::Ready(end) => {
                if let Err(e) = end {
                    this.peer.note(e);
                }
                this.peer.end_preface_wait();
            }
            Poll::Pending => {}
        }
        result
    }
}

impl<S: AsyncRead + AsyncWrite> FrameWatch<S> {
    /// A write-side operation passed through, until one fails: then the server's reason is
    /// looked for (see `poll_reason`) and returned instead of the bare failure.
    fn writing<T>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let mut this = self.project();
        if this.write_failed.is_none() {
            match op(this.io.as_mut(), cx) {
                Poll::Ready(Err(e)) => *this.write_failed = Some(e),
                other => return other,
            }
        }
        poll_reason(this.io, cx, this.write_failed, this.peer)
    }
}

impl<S: AsyncRead + AsyncWrite> AsyncWrite for FrameWatch<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.writing(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.writing(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.writing(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

/// After a write failed: the reason the server gave before closing, if it gave one.
///
/// With TLS 1.3 a server judges the client's certificate (or its absence) after the client's
/// side of the handshake is done, and refuses with an alert while hyper is still writing its
/// preface; the write then fails with a bare reset or broken pipe. The alert waits in the
/// socket: reading finds it, and the TLS error (classified by the caller) replaces the write's.
/// A read that ends any other way (reset, end of stream, a few chunks of data) gives the
/// write's own error back, and so does a write that failed for another reason than the peer
/// closing. The connection is lost either way; only the reason changes.
fn poll_reason<S: AsyncRead, T>(
    mut io: Pin<&mut S>,
    cx: &mut Context<'_>,
    write_failed: &mut Option<io::Error>,
    peer: &PeerSettings,
) -> Poll<io::Result<T>> {
    // Only a peer that closed leaves a reason to read; any other failure is returned as it is
    // (waiting to read from a peer that is still there could wait for ever).
    let closed_by_peer = write_failed.as_ref().is_some_and(|e| {
        matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
        )
    });
    if !closed_by_peer {
        return Poll::Ready(Err(write_failed.take().unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::BrokenPipe, "the connection failed")
        })));
    }
    let mut scratch = [0u8; 512];
    for _ in 0..4 {
        let mut buf = ReadBuf::new(&mut scratch);
        match std::task::ready!(io.as_mut().poll_read(cx, &mut buf)) {
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) => {
                peer.note(&e);
                write_failed.take();
                return Poll::Ready(Err(e));
            }
            Ok(()) if !buf.filled().is_empty() => continue,
            _ => break,
        }
    }
    Poll::Ready(Err(write_failed.take().unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::BrokenPipe, "the connection failed")
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        let mut payload = Vec::new();
        for (id, value) in pairs {
            payload.extend_from_slice(&id.to_be_bytes());
            payload.extend_from_slice(&value.to_be_bytes());
        }
        frame(TYPE_SETTINGS, 0, &payload)
    }

    /// A typical server start: SETTINGS, WINDOW_UPDATE, SETTINGS ACK, HEADERS, DATA.
    fn conversation(max_streams: u32) -> Vec<u8> {
        let mut bytes = settings(&[
            (0x4, 1 << 20),
            (SETTINGS_MAX_CONCURRENT_STREAMS, max_streams),
        ]);
        bytes.extend(frame(0x8, 0, &[0, 0, 0x10, 0]));
        bytes.extend(frame(TYPE_SETTINGS, FLAG_ACK, &[]));
        bytes.extend(frame(0x1, 0x4, &[0x88]));
        bytes.extend(frame(0x0, 0x1, &[7u8; 300]));
        bytes
    }

    #[test]
    fn reads_max_concurrent_streams_from_whole_frames() {
        let peer = PeerSettings::default();
        Scanner::default().scan(&conversation(1000), &peer);
        assert_eq!(peer.max_concurrent_streams(), 1000);
        assert!(!peer.goaway());
    }

    #[test]
    fn reads_frames_split_at_every_byte_boundary() {
        let bytes = conversation(7);
        for split in 1..bytes.len() {
            let peer = PeerSettings::default();
            let mut scanner = Scanner::default();
            scanner.scan(&bytes[..split], &peer);
            scanner.scan(&bytes[split..], &peer);
            assert_eq!(peer.max_concurrent_streams(), 7, "split at {split}");
        }
        // And one byte at a time.
        let peer = PeerSettings::default();
        let mut scanner = Scanner::default();
        for b in &bytes {
            scanner.scan(std::slice::from_ref(b), &peer);
        }
        assert_eq!(peer.max_concurrent_streams(), 7);
    }

    #[test]
    fn later_settings_change_the_limit_and_acks_do_not() {
        let peer = PeerSettings::default();
        let mut scanner = Scanner::default();
        scanner.scan(&conversation(50), &peer);
        scanner.scan(&settings(&[(SETTINGS_MAX_CONCURRENT_STREAMS, 10)]), &peer);
        assert_eq!(peer.max_concurrent_streams(), 10);
        // An ACK with a (malformed) payload is not read as settings.
        let mut ack = settings(&[(SETTINGS_MAX_CONCURRENT_STREAMS, 1)]);
        ack[4] = FLAG_ACK;
        scanner.scan(&ack, &peer);
        assert_eq!(peer.max_concurrent_streams(), 10);
    }

    #[test]
    fn a_settings_frame_without_the_limit_keeps_the_default() {
        let peer = PeerSettings::default();
        Scanner::default().scan(&settings(&[(0x4, 65535)]), &peer);
        assert_eq!(peer.max_concurrent_streams(), INITIAL_MAX_STREAMS);
    }

    #[test]
    fn notices_goaway_after_data() {
        let peer = PeerSettings::default();
        let mut scanner = Scanner::default();
        let mut bytes = conversation(100);
        bytes.extend(frame(TYPE_GOAWAY, 0, &[0, 0, 0, 5, 0, 0, 0, 0]));
        scanner.scan(&bytes[..bytes.len() - 12], &peer);
        assert!(!peer.goaway());
        scanner.scan(&bytes[bytes.len() - 12..], &peer);
        assert!(peer.goaway());
    }
}
