//! What the upstream provably did not process, and may therefore be sent again whatever the
//! retry policy and the method say: a stream an HTTP/2 server refused (`REFUSED_STREAM`, RFC
//! 9113 §8.7), and one above the last stream id of its `GOAWAY` (§6.8: "the sender ... did
//! not and will not" process it). Either needs the request again, so only requests whose body
//! can be replayed (none, or held for a retry policy) are resent. The exchange
//! (`exchange.rs`) asks here, and sends the request on another connection; retries of
//! requests that may have reached the application are the policy's (`policy.rs`).
//!
//! The `h2` crate tells the two apart from every other failure: a stream above a GOAWAY's last
//! stream id (or one started after it) fails with that GOAWAY as its error, as soon as the
//! frame arrives; a stream at or below it that the connection's end then cuts off fails with
//! the broken connection (an I/O error), never with the GOAWAY.

use std::error::Error as _;

use http::Request;

use crate::upstream::body::RequestBody;

/// How often one request is sent again after the upstream refused it unprocessed.
const MAX_REFUSED_RETRIES: u32 = 3;

/// Whether a request refused `refused` times may be sent once more.
pub(in crate::http::pipeline) fn may_resend(refused: u32) -> bool {
    refused < MAX_REFUSED_RETRIES
}

/// A copy of a body-less request to send again if the server refuses it, taken only while
/// retries are left.
pub(in crate::http::pipeline) fn refused_retry_copy(
    req: &Request<RequestBody>,
    refused: u32,
) -> Option<Request<RequestBody>> {
    if refused >= MAX_REFUSED_RETRIES {
        return None;
    }
    replayable_copy(req)
}

/// A copy of `req` to send again, if its body can be replayed (none, or read ahead).
pub(in crate::http::pipeline) fn replayable_copy(
    req: &Request<RequestBody>,
) -> Option<Request<RequestBody>> {
    let body = match req.body() {
        RequestBody::Empty => RequestBody::Empty,
        RequestBody::Buffered(Some(bytes), held) => {
            RequestBody::Buffered(Some(bytes.clone()), held.clone())
        }
        _ => return None,
    };
    let mut copy = Request::new(body);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    Some(copy)
}

/// How the server said it did not process a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::http::pipeline) enum Unprocessed {
    /// `REFUSED_STREAM`: the connection may go on, with fewer streams at once.
    Refused,
    /// Above the last stream id of the server's `GOAWAY`: the connection takes no new stream.
    PastGoaway,
}

/// Whether (and how) the server said it did not process the stream `err` ended.
pub(in crate::http::pipeline) fn unprocessed(err: &hyper::Error) -> Option<Unprocessed> {
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if !h2.is_remote() {
                return None;
            }
            if h2.is_go_away() {
                return Some(Unprocessed::PastGoaway);
            }
            return (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM))
                .then_some(Unprocessed::Refused);
        }
        source = e.source();
    }
    None
}

/// RFC 9110 §9.2.2.
pub(in crate::http::pipeline) fn is_idempotent(method: &http::Method) -> bool {
    use http::Method;
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}
