//! Telling HTTP/2 (prior knowledge, or `h2` by ALPN) from HTTP/1.1 by the client's first
//! bytes, and handing those bytes back to the server that then reads the connection.
//!
//! Done here rather than by hyper-util's automatic server so that the read is bounded by
//! `headerReadTimeout` (a client that connects and sends nothing would otherwise hold its
//! socket forever) and so that each protocol gets its own server with its own limits.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::cap::Slot;
use super::head_fixes::HeadFixes;
use super::watchdog::Activity;

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

/// What the client sent before the protocol was known, to be read again by the server.
#[derive(Debug, Default)]
pub(crate) struct Prefix {
    bytes: [u8; 24],
    len: u8,
}

/// Reads until the bytes either differ from the HTTP/2 preface (HTTP/1.1) or are all of it
/// (HTTP/2). Returns `None` if the client closed first. At most 24 bytes are read, so HTTP/1.1
/// requests are never buffered here.
pub(crate) async fn sniff<S>(io: &mut S) -> io::Result<Option<(Protocol, Prefix)>>
where
    S: AsyncRead + Unpin,
{
    let mut prefix = Prefix::default();
    loop {
        let len = usize::from(prefix.len);
        let n = io.read(&mut prefix.bytes[len..]).await?;
        if n == 0 {
            return Ok(None);
        }
        let len = len + n;
        prefix.len = len as u8;
        if prefix.bytes[..len] != PREFACE[..len] {
            return Ok(Some((Protocol::Http1, prefix)));
        }
        if len == PREFACE.len() {
            return Ok(Some((Protocol::Http2, prefix)));
        }
    }
}

/// The client's socket as the HTTP server reads it: the sniffed bytes first, then the
/// socket; on HTTP/1.1 connections, with what hyper writes fixed where it must be
/// (`head_fixes`). Holds the connection's [`Slot`], so the cap counts the socket for as long
/// as it is open, upgrades included.
#[derive(Debug)]
pub(crate) struct ServedIo<S> {
    inner: S,
    prefix: Prefix,
    /// How much of `prefix` was read back already.
    read: u8,
    _slot: Option<Slot>,
    /// On HTTP/1.1 connections, what egressd fixes in what hyper writes (`head_fixes`).
    heads: Option<HeadFixes>,
}

impl<S> ServedIo<S> {
    pub(crate) fn new(inner: S, prefix: Prefix, slot: Option<Slot>) -> Self {
        ServedIo {
            inner,
            prefix,
            read: 0,
            _slot: slot,
            heads: None,
        }
    }

    /// An HTTP/1.1 connection's: hyper's parse-error replies and `HTTP/1.0` status lines are
    /// made egressd's (`head_fixes`).
    pub(crate) fn fixing_heads(mut self, activity: Arc<Activity>) -> Self {
        self.heads = Some(HeadFixes::new(activity));
        self
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ServedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read < this.prefix.len {
            let rest = &this.prefix.bytes[usize::from(this.read)..usize::from(this.prefix.len)];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.read += n as u8;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ServedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(heads) = &mut this.heads {
            ready!(heads.poll_pending(&mut this.inner, cx))?;
            if let Some(taken) = heads.taken(buf) {
                // egressd's bytes go out in their place, before anything else.
                return Poll::Ready(Ok(taken));
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(heads) = &mut this.heads {
            ready!(heads.poll_pending(&mut this.inner, cx))?;
            // hyper keeps a head in a buffer of its own, ahead of body pieces: the first
            // slice.
            if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
                if let Some(taken) = heads.taken(first) {
                    return Poll::Ready(Ok(taken));
                }
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(heads) = &mut this.heads {
            ready!(heads.poll_pending(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(heads) = &mut this.heads {
            ready!(heads.poll_pending(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn detect(chunks: &[&[u8]]) -> Option<(Protocol, Vec<u8>)> {
        let (mut client, mut server) = tokio::io::duplex(64);
        for chunk in chunks {
            client.write_all(chunk).await.unwrap();
        }
        drop(client);
        let (protocol, prefix) = sniff(&mut server).await.unwrap()?;
        let mut io = ServedIo::new(server, prefix, None);
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        Some((protocol, all))
    }

    #[tokio::test]
    async fn http1_is_told_by_its_first_byte_and_every_byte_is_read_again() {
        let request: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            detect(&[request]).await,
            Some((Protocol::Http1, request.to_vec()))
        );
    }

    #[tokio::test]
    async fn a_preface_in_pieces_is_http2() {
        let mut sent = PREFACE.to_vec();
        sent.extend_from_slice(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
        assert_eq!(
            detect(&[&PREFACE[..3], &PREFACE[3..], &sent[24..]]).await,
            Some((Protocol::Http2, sent))
        );
    }

    #[tokio::test]
    async fn a_request_starting_like_the_preface_is_http1() {
        let request: &[u8] = b"PRI /x HTTP/1.1\r\n\r\n";
        assert_eq!(
            detect(&[request]).await,
            Some((Protocol::Http1, request.to_vec()))
        );
    }

    #[tokio::test]
    async fn silence_then_close_is_nothing() {
        assert_eq!(detect(&[]).await, None);
    }
}
