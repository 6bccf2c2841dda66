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

use tokio::io::AsyncWrite;

use super::watchdog::Activity;

/// What egressd fixes in the writes of one HTTP/1.1 connection (its [`ServedIo`]).
///
/// [`ServedIo`]: super::detect::ServedIo
#[derive(Debug)]
pub(crate) struct HeadFixes {
    activity: Arc<Activity>,
    /// Bytes of egressd's that go out before anything else hyper writes, and how much of them
    /// is written: its reply in place of hyper's, or the version of a status line.
    pending: Option<(Vec<u8>, usize)>,
}

/// A status line's version as egressd answers (RFC 9110 §2.5): the highest it speaks.
const HTTP_11: &[u8] = b"HTTP/1.1";

impl HeadFixes {
    pub(crate) fn new(activity: Arc<Activity>) -> Self {
        HeadFixes {
            activity,
            pending: None,
        }
    }

    /// How many bytes of `bytes`, about to be written, egressd takes in place of hyper:
    /// the `HTTP/1.0` of a response head hyper made for an HTTP/1.0 client (8 bytes, replaced
    /// by `HTTP/1.1`), or hyper's parse-error reply (all of it, replaced by egressd's). Cheap
    /// for everything else: one atomic load and one comparison of the first bytes.
    #[inline]
    pub(crate) fn taken(&mut self, bytes: &[u8]) -> Option<usize> {
        if self.activity.take_head_due() {
            // hyper's `enforce_version` labels a response with an HTTP/1.0 client's version;
            // the framing hyper chose for that client (no chunked coding) is HTTP/1.1 too.
            if bytes.starts_with(b"HTTP/1.0 ") {
                self.pending = Some((HTTP_11.to_vec(), 0));
                return Some(HTTP_11.len());
            }
            return None;
        }
        // Body bytes, mostly.
        if !bytes.starts_with(b"HTTP/1.") {
            return None;
        }
        self.parse_error_reply(bytes)
    }

    /// `Some(bytes.len())` when `bytes` are hyper's parse-error reply, which egressd's then
    /// replaces.
    #[inline(never)]
    fn parse_error_reply(&mut self, bytes: &[u8]) -> Option<usize> {
        if self.activity.is_busy() {
            return None;
        }
        let reply = own_reply(bytes)?;
        self.pending = Some((reply, 0));
        Some(bytes.len())
    }

    /// Writes what is pending of egressd's bytes to `io`, if any: before anything else.
    #[inline]
    pub(crate) fn poll_pending<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending.is_none() {
            return Poll::Ready(Ok(()));
        }
        self.poll_write_pending(io, cx)
    }

    #[inline(never)]
    fn poll_write_pending<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            if *written == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
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
        "400" => (
            "invalid_request",
            "invalid request: the request head could not be parsed (its request line, a \
             header line, its HTTP version, or a character its target may not hold, such as \
             `<`, `>` or a backquote in the path or `\"`, `<`, `>` in the query)",
        ),
        "431" => (
            "request_header_too_large",
            "the request head is over downstream.maxRequestHeadersBytes or has more than \
             downstream.maxRequestHeaders fields",
        ),
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
    let header = crate::http::error::ERROR_HEADER;
    let len = body.len();
    Some(
        format!(
            "HTTP/1.1 {rest}\r\n{header}: {code}\r\ncontent-type: text/plain; charset=utf-8\r\n\
             cache-control: no-store\r\nconnection: close\r\ncontent-length: {len}\r\n\
             {date}\r\n{body}",
        )
        .into_bytes(),
    )
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
