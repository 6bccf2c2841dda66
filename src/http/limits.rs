//! Checks of a request head against `ProxyConfig.spec.downstream` (header count and size,
//! request target and method length) and RFC 9112 §3.2 (one `Host`), before anything is
//! routed or forwarded.
//!
//! For HTTP/1.1, hyper bounds the head while reading it (`maxRequestHeadersBytes`,
//! `maxRequestHeaders`) and answers 431 itself (made egressd's reply by
//! `listener/head_fixes`); the checks here catch what it lets through
//! (long targets and methods) and HTTP/2 requests, whose header block h2 bounds only by
//! `http2.maxHeaderListSize`.

use http::{header, Request, Version};

use crate::snapshot::RequestHeadLimits;

/// A request head over one of the limits, or malformed in a way RFC 9112 says to refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadRejection {
    #[error("request headers are {size} bytes, over the {max}-byte limit (downstream.maxRequestHeadersBytes)")]
    HeadersTooLarge { size: usize, max: usize },
    #[error(
        "request has {count} header fields, over the limit of {max} (downstream.maxRequestHeaders)"
    )]
    TooManyHeaders { count: usize, max: usize },
    #[error(
        "request target is {len} bytes, over the {max}-byte limit (downstream.maxRequestUriBytes)"
    )]
    UriTooLong { len: usize, max: usize },
    #[error("request method is {len} bytes, over the {max}-byte limit (downstream.maxRequestMethodBytes)")]
    MethodTooLong { len: usize, max: usize },
    #[error("request has more than one Host header (RFC 9112 §3.2)")]
    DuplicateHost,
    /// A transfer coding besides `chunked` (hyper checked that `chunked` comes last): egressd
    /// implements none, and removing `chunked` alone would hand the coded bytes on as the body.
    #[error("transfer coding {0:?} is not implemented (RFC 9112 §6.1)")]
    TransferCoding(String),
    #[error("chunked is applied more than once in Transfer-Encoding (RFC 9112 §6.1)")]
    ChunkedTwice,
    /// The path cannot be normalised safely (`downstream.paths`).
    #[error("{0}")]
    Path(#[from] crate::http::path::PathRejection),
}

impl HeadRejection {
    /// The short code of the local reply (`x-egressd-error`).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            HeadRejection::HeadersTooLarge { .. } | HeadRejection::TooManyHeaders { .. } => {
                "request_header_too_large"
            }
            HeadRejection::UriTooLong { .. } => "uri_too_long",
            HeadRejection::MethodTooLong { .. } => "method_too_long",
            HeadRejection::DuplicateHost | HeadRejection::ChunkedTwice => "invalid_request",
            HeadRejection::TransferCoding(_) => "not_supported",
            HeadRejection::Path(_) => "invalid_path",
        }
    }

    pub(crate) fn status(&self) -> http::StatusCode {
        match self {
            HeadRejection::HeadersTooLarge { .. } | HeadRejection::TooManyHeaders { .. } => {
                http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            HeadRejection::UriTooLong { .. } => http::StatusCode::URI_TOO_LONG,
            HeadRejection::MethodTooLong { .. }
            | HeadRejection::DuplicateHost
            | HeadRejection::ChunkedTwice
            | HeadRejection::Path(_) => http::StatusCode::BAD_REQUEST,
            HeadRejection::TransferCoding(_) => http::StatusCode::NOT_IMPLEMENTED,
        }
    }
}

/// Checks `req`'s head. Cheap on the common path: lengths already known, one lookup for
/// `Host`, and a pass over the headers for HTTP/2 only.
pub(crate) fn check_head<B>(
    req: &Request<B>,
    limits: &RequestHeadLimits,
) -> Result<(), HeadRejection> {
    let method = req.method().as_str().len();
    if method > limits.max_method_bytes {
        return Err(HeadRejection::MethodTooLong {
            len: method,
            max: limits.max_method_bytes,
        });
    }
    let uri = target_len(req.uri());
    if uri > limits.max_uri_bytes {
        return Err(HeadRejection::UriTooLong {
            len: uri,
            max: limits.max_uri_bytes,
        });
    }
    let headers = req.headers();
    if headers.len() > limits.max_headers {
        return Err(HeadRejection::TooManyHeaders {
            count: headers.len(),
            max: limits.max_headers,
        });
    }
    // HTTP/1.1 heads were measured byte for byte as they were read; an HTTP/2 header block
    // is measured as the HTTP/1.1 head it stands for, so one limit means one thing.
    if req.version() != Version::HTTP_11 && req.version() != Version::HTTP_10 {
        let size = head_size(req, method, uri);
        if size > limits.max_bytes {
            return Err(HeadRejection::HeadersTooLarge {
                size,
                max: limits.max_bytes,
            });
        }
    }
    if headers.get_all(header::HOST).iter().nth(1).is_some() {
        return Err(HeadRejection::DuplicateHost);
    }
    Ok(())
}

/// RFC 9112 §6.1, for an HTTP/1.1 request whose body has no known length (hyper took it as
/// chunked because `chunked` is the last coding; only then is there a `Transfer-Encoding` to
/// look at): anything before `chunked` is a coding egressd does not implement (501, as Envoy
/// and nginx answer), or `chunked` again (400). Empty list elements are allowed by the list
/// syntax (RFC 9110 §5.6.1) and ignored.
pub(crate) fn check_transfer_codings(headers: &http::HeaderMap) -> Result<(), HeadRejection> {
    let mut lines = headers.get_all(header::TRANSFER_ENCODING).iter();
    // The common case, one line saying `chunked`, costs one comparison.
    if let (Some(only), None) = (lines.next(), lines.next()) {
        if only.as_bytes().eq_ignore_ascii_case(b"chunked") {
            return Ok(());
        }
    }
    let mut chunked = 0;
    for line in headers.get_all(header::TRANSFER_ENCODING) {
        let text = String::from_utf8_lossy(line.as_bytes());
        for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                let name = coding.split(';').next().unwrap_or(coding).trim_end();
                return Err(HeadRejection::TransferCoding(
                    name.chars().take(64).collect(),
                ));
            }
            chunked += 1;
        }
    }
    if chunked > 1 {
        return Err(HeadRejection::ChunkedTwice);
    }
    Ok(())
}

/// The request target's length as the client wrote it (absolute-form or origin-form).
fn target_len(uri: &http::Uri) -> usize {
    let scheme = uri.scheme_str().map_or(0, |s| s.len() + "://".len());
    let authority = uri.authority().map_or(0, |a| a.as_str().len());
    let path = uri.path_and_query().map_or(0, |p| p.as_str().len());
    scheme + authority + path
}

/// The size of `req`'s head written as HTTP/1.1: `METHOD target HTTP/1.1\r\n`, then
/// `name: value\r\n` per field, then `\r\n`.
fn head_size<B>(req: &Request<B>, method: usize, target: usize) -> usize {
    let request_line = method + 1 + target + " HTTP/1.1\r\n".len();
    let fields: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
        .sum();
    request_line + fields + 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestHeadLimits {
        RequestHeadLimits {
            max_bytes: 200,
            max_headers: 3,
            max_uri_bytes: 40,
            max_method_bytes: 8,
        }
    }

    fn request(version: Version) -> http::request::Builder {
        Request::builder()
            .version(version)
            .uri("/ok")
            .header("host", "a.test")
    }

    #[test]
    fn an_ordinary_request_passes() {
        let req = request(Version::HTTP_11).body(()).unwrap();
        assert_eq!(check_head(&req, &limits()), Ok(()));
    }

    #[test]
    fn each_bound_has_its_status_and_code() {
        let long_method = request(Version::HTTP_11)
            .method("VERYLONGMETHOD")
            .body(())
            .unwrap();
        let e = check_head(&long_method, &limits()).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (400, "method_too_long"));

        let long_uri = request(Version::HTTP_11)
            .uri(format!("http://a.test/{}", "x".repeat(40)))
            .body(())
            .unwrap();
        let e = check_head(&long_uri, &limits()).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (414, "uri_too_long"));

        let many = request(Version::HTTP_2)
            .header("a", "1")
            .header("b", "2")
            .header("c", "3")
            .body(())
            .unwrap();
        let e = check_head(&many, &limits()).unwrap_err();
        assert_eq!(
            (e.status().as_u16(), e.code()),
            (431, "request_header_too_large")
        );

        let big = request(Version::HTTP_2)
            .header("cookie", "c".repeat(200))
            .body(())
            .unwrap();
        assert!(matches!(
            check_head(&big, &limits()),
            Err(HeadRejection::HeadersTooLarge { .. })
        ));

        let two_hosts = request(Version::HTTP_11)
            .header("host", "b.test")
            .body(())
            .unwrap();
        let e = check_head(&two_hosts, &limits()).unwrap_err();
        assert_eq!((e.status().as_u16(), e.code()), (400, "invalid_request"));
    }

    #[test]
    fn transfer_codings_besides_one_final_chunked_are_refused() {
        let with = |lines: &[&str]| {
            let mut headers = http::HeaderMap::new();
            for line in lines {
                headers.append(header::TRANSFER_ENCODING, line.parse().unwrap());
            }
            check_transfer_codings(&headers).map_err(|e| (e.status().as_u16(), e.code()))
        };
        assert_eq!(with(&["chunked"]), Ok(()));
        assert_eq!(with(&["Chunked"]), Ok(()));
        assert_eq!(with(&[", chunked"]), Ok(()));
        assert_eq!(with(&["gzip, chunked"]), Err((501, "not_supported")));
        assert_eq!(with(&["gzip", "chunked"]), Err((501, "not_supported")));
        assert_eq!(with(&["chunked", "chunked"]), Err((400, "invalid_request")));
        assert_eq!(with(&["chunked, chunked"]), Err((400, "invalid_request")));
    }
}
