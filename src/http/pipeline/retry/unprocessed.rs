//! What the upstream provably did not process, and may therefore be sent again whatever the
//! retry policy says: a stream an HTTP/2 server refused (`REFUSED_STREAM`, RFC 9113 §8.7), or
//! one started after its `GOAWAY` (§6.8). The latter needs the request again, so only
//! requests whose body can be replayed are resent that way, and after a GOAWAY only idempotent
//! ones (a connection torn down after GOAWAY fails its remaining streams with the same error,
//! processed or not). The exchange (`exchange.rs`) asks here; retries of requests that may
//! have reached the application are the policy's (`policy.rs`).

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

/// Whether the server did not process the stream: refused (any method), or past its GOAWAY
/// (idempotent methods only, see the module documentation).
pub(in crate::http::pipeline) fn refused_unprocessed(
    err: &hyper::Error,
    method: Option<&http::Method>,
) -> bool {
    let Some(method) = method else {
        return false;
    };
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return true;
            }
            return h2.is_go_away() && h2.is_remote() && is_idempotent(method);
        }
        source = e.source();
    }
    false
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
