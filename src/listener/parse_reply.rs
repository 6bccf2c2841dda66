//! egressd's own reply instead of the bare one hyper writes for an HTTP/1.1 request head it
//! cannot parse.
//!
//! hyper answers such a head itself, before any service sees a request: `400` (a bad request
//! line or header, a target `http::Uri` refuses such as `<` in the path or `"` in the query,
//! an unknown version), `431` (a head over `maxRequestHeadersBytes` or `maxRequestHeaders`) or
//! `414`, with no header but `content-length: 0` and `date` (`proto/h1/role.rs`
//! `Server::on_error`), then closes the connection. `http1::Builder` has no hook for it. So
//! the connection's writes are watched here: a write that is exactly such a reply, made while
//! no response of egressd's is due and no request, tunnel or websocket is in flight, is
//! replaced by egressd's local reply for it (`x-egressd-error`, a body naming the failure), as
//! every other local reply is made.
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

/// An HTTP/1.1 connection's socket, with hyper's parse-error replies made egressd's.
#[derive(Debug)]
pub(crate) struct OwnParseErrors<S> {
    inner: S,
    activity: Arc<Activity>,
    /// egressd's reply, once hyper wrote its own, and how much of it is written.
    reply: Option<(Vec<u8>, usize)>,
}

impl<S> OwnParseErrors<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Self {
        OwnParseErrors {
            inner,
            activity,
            reply: None,
        }
    }

    /// Whether `bytes`, about to be written, are hyper's parse-error reply (then replaced, and
    /// `true`). Cheap for everything else: the first bytes of a response head are compared
    /// only when no response is due, and body bytes rarely start with `HTTP/1.`.
    fn replaced(&mut self, bytes: &[u8]) -> bool {
        if self.activity.take_head_due() || self.reply.is_some() || !bytes.starts_with(b"HTTP/1.") {
            return false;
        }
        if self.activity.is_busy() {
            return false;
        }
        match own_reply(bytes) {
            Some(reply) => {
                self.reply = Some((reply, 0));
                true
            }
            None => false,
        }
    }
}

/// egressd's reply for `head` when it is one of hyper's parse-error replies.
fn own_reply(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let lines = text.strip_suffix("\r\n\r\n")?;
    let mut lines = lines.split("\r\n");
    let status_line = lines.next()?;
    let (version, rest) = status_line.split_once(' ')?;
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
            "{version} {status_line_rest}\r\n{header}: {code}\r\ncontent-type: text/plain; charset=utf-8\r\ncache-control: no-store\r\nconnection: close\r\ncontent-length: {len}\r\n{date}\r\n{body}",
            status_line_rest = rest,
            header = crate::http::error::ERROR_HEADER,
            len = body.len(),
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for OwnParseErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> OwnParseErrors<S> {
    /// Writes what is left of egressd's reply, if any.
    fn poll_reply(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((reply, written)) = &mut self.reply {
            if *written == reply.len() {
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &reply[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for OwnParseErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replaced(buf) {
            // Taken: egressd's reply goes out instead, at the flush that follows.
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // hyper keeps a head in a buffer of its own, ahead of body pieces: the first slice.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if this.replaced(first) {
                return Poll::Ready(Ok(first.len()));
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_reply(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_reply(cx))?;
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
            let status_line = hyper.split("\r\n").next().unwrap();
            assert!(reply.starts_with(&format!("{status_line}\r\n")), "{reply}");
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
