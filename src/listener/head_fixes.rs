//! Two things hyper's HTTP/1.1 server writes on its own, made egressd's: its reply to a
//! request head it cannot parse, and the `HTTP/1.0` status line it gives HTTP/1.0 clients.
//!
//! hyper answers a head it cannot parse itself, before any service sees a request: `400` (a
//! bad request line or header, a target `http::Uri` refuses such as `<` in the path or `"` in
//! the query, an unknown version), `431` (a head over `maxRequestHeadersBytes` or
//! `maxRequestHeaders`) or `414`, with no header but `content-length: 0` and `date`
//! (`proto/h1/role.rs` `Server::on_error`), then closes the connection; `http1::Builder` has no
//! hook for it. And its `enforce_version` (`proto/h1/conn.rs`) labels every response to an
//! HTTP/1.0 client `HTTP/1.0`, where RFC 9110 §2.5 has a server answer with its own version.
//! So the connection's writes are watched here:
//!
//! - the first write after egressd handed hyper a response carries that response's head: an
//!   `HTTP/1.0` at its start goes out as `HTTP/1.1` (same length, nothing else changes);
//! - a write that is exactly hyper's parse-error reply, made while no response of egressd's is
//!   due and no request, tunnel or websocket is in flight, is replaced by egressd's local
//!   reply for it (`x-egressd-error`, a body naming the failure), as every local reply is made.
//!
//! Only whole heads of that shape are replaced. An upstream could make the last piece of a
//! response body look exactly like one (the body has ended, so nothing is in flight while that
//! piece is written); the client then gets egressd's `400` where that piece would have been,
//! and the connection closes: nothing the upstream could not have done to its own response.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::watchdog::Activity;

/// An HTTP/1.1 connection's socket, with hyper's parse-error replies made egressd's and its
/// `HTTP/1.0` status lines made `HTTP/1.1`.
#[derive(Debug)]
pub(crate) struct HeadFixes<S> {
    inner: S,
    activity: Arc<Activity>,
    /// Bytes of egressd's that go out before anything else hyper writes, and how much of them
    /// is written: its reply in place of hyper's, or the version of a status line.
    pending: Option<(Vec<u8>, usize)>,
}

/// A status line's version as egressd answers (RFC 9110 §2.5): the highest it speaks.
const HTTP_11: &[u8] = b"HTTP/1.1";

impl<S> HeadFixes<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Self {
        HeadFixes {
            inner,
            activity,
            pending: None,
        }
    }

    /// How many bytes of `bytes`, about to be written, egressd takes in place of hyper:
    /// hyper's parse-error reply (all of it, replaced by egressd's), or the `HTTP/1.0` of a
    /// response head hyper made for an HTTP/1.0 client (8 bytes, replaced by `HTTP/1.1`).
    /// Cheap for everything else: one atomic load, and the first bytes compared only when
    /// they start like a status line.
    fn taken(&mut self, bytes: &[u8]) -> Option<usize> {
        let head_due = self.activity.take_head_due();
        if !bytes.starts_with(b"HTTP/1.") {
            return None;
        }
        if head_due {
            // hyper's `enforce_version` labels a response with an HTTP/1.0 client's version;
            // the framing hyper chose for that client (no chunked coding) is HTTP/1.1 too.
            if bytes.starts_with(b"HTTP/1.0 ") {
                self.pending = Some((HTTP_11.to_vec(), 0));
                return Some(HTTP_11.len());
            }
            return None;
        }
        if self.activity.is_busy() {
            return None;
        }
        let reply = own_reply(bytes)?;
        self.pending = Some((reply, 0));
        Some(bytes.len())
    }
}

/// egressd's reply for `head` when it is one of hyper's parse-error replies.
fn own_reply(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let lines = text.strip_suffix("\r\n\r\n")?;
    let mut lines = lines.split("\r\n");
    let status_line = lines.next()?;
    let (_version, rest) = status_line.split_once(' ')?;
    let (status, _) = rest.split_once(' ')?;
    let (code, message) = match status {
        "400" => ("invalid_request", "invalid request: the request head could not be parsed (its request line, a header line, its HTTP version, or a character its target may not hold, such as `<`, `>` or a backquote in the path or `\"`, `<`, `>` in the query)"),
        "431" => ("request_header_too_large", "the request head is over downstream.maxRequestHeadersBytes or has more than downstream.maxRequestHeaders fields"),
        "414" => ("uri_too_long", "the request target is too long"),
        _ => return None,
    };
    let mut date = None;
    for line in lines {
        let (name, value) = line.split_once(": ")?;
        match name {
            "content-length" if value == "0" => {}
            "connection" if value == "close" || value == "keep-alive" => {}
            "date" => date = Some(value),
            _ => return None,
        }
    }
    let body = format!("egressd: {message}\n");
    let date = date.map(|d| format!("date: {d}\r\n")).unwrap_or_default();
    Some(
        format!(
            "HTTP/1.1 {status_line_rest}\r\n{header}: {code}\r\ncontent-type: text/plain; charset=utf-8\r\ncache-control: no-store\r\nconnection: close\r\ncontent-length: {len}\r\n{date}\r\n{body}",
            status_line_rest = rest,
            header = crate::http::error::ERROR_HEADER,
            len = body.len(),
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for HeadFixes<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> HeadFixes<S> {
    /// Writes what is pending of egressd's bytes, if any.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeadFixes<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(taken) = this.taken(buf) {
            // egressd's bytes go out in their place, before anything else.
            return Poll::Ready(Ok(taken));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        // hyper keeps a head in a buffer of its own, ahead of body pieces: the first slice.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if let Some(taken) = this.taken(first) {
                return Poll::Ready(Ok(taken));
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_parse_error_replies_become_egressds() {
        let date = "date: Sat, 29 Nov 2025 07:00:00 GMT\r\n";
        for (hyper, code) in [
            (format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n"), "invalid_request"),
            (format!("HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n{date}\r\n"), "request_header_too_large"),
            ("HTTP/1.0 414 URI Too Long\r\ncontent-length: 0\r\n\r\n".to_owned(), "uri_too_long"),
        ] {
            let reply = String::from_utf8(own_reply(hyper.as_bytes()).expect(&hyper)).unwrap();
            let status = &hyper.split("\r\n").next().unwrap()[9..];
            assert!(reply.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{reply}");
            assert!(reply.contains(&format!("\r\nx-egressd-error: {code}\r\n")), "{reply}");
            let (head, body) = reply.split_once("\r\n\r\n").unwrap();
            assert!(head.contains(&format!("content-length: {}", body.len())), "{reply}");
            assert!(body.starts_with("egressd: "), "{reply}");
        }
    }

    #[test]
    fn anything_else_is_left_alone() {
        for other in [
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nvia: 1.1 egressd\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 5\r\n\r\n",
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nbody",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
        ] {
            assert_eq!(own_reply(other.as_bytes()), None, "{other:?}");
        }
    }
}
