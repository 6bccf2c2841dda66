//! gRPC awareness: which requests are gRPC calls, their `grpc-timeout`, and local replies in
//! the form gRPC clients understand (a status in `grpc-status`/`grpc-message`, never a text
//! body they would fail to decode).
//!
//! References: gRPC over HTTP/2 (PROTOCOL-HTTP2.md in the gRPC repository) for the header
//! grammar and the trailers-only reply; the gRPC status codes document for their meaning.

use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use super::body::ProxyBody;
use super::error::{ProxyError, ERROR_HEADER};

/// gRPC status codes egressd answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum GrpcStatus {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

impl GrpcStatus {
    fn value(self) -> HeaderValue {
        HeaderValue::from(self as u16)
    }
}

/// A gRPC call's properties that change how egressd treats it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GrpcCall {
    /// `grpc-timeout`: the client's deadline, which bounds the whole call here too.
    pub(crate) timeout: Option<Duration>,
}

/// `Some` when the request is a gRPC call (`content-type: application/grpc[+proto|;…]`).
pub(crate) fn call(headers: &HeaderMap) -> Option<GrpcCall> {
    let content_type = headers.get(CONTENT_TYPE)?.as_bytes();
    let grpc = content_type
        .get(..16)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"application/grpc"))
        && matches!(content_type.get(16), None | Some(b'+' | b';'));
    grpc.then(|| GrpcCall {
        timeout: headers
            .get("grpc-timeout")
            .and_then(|v| parse_timeout(v.as_bytes())),
    })
}

/// `grpc-timeout`: at most 8 digits and a unit (H, M, S, m, u, n). Anything else is ignored,
/// as if no deadline had been sent.
pub(crate) fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The reply to a gRPC call that failed here: HTTP 200 with the status in the headers and no
/// body ("trailers-only", which gRPC clients read as the call's final status), plus the usual
/// `x-egressd-error`.
pub(crate) fn local_reply(err: &ProxyError) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::empty());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let class = err.class();
    headers.insert("grpc-status", class.grpc.value());
    headers.insert("grpc-message", message(&format!("egressd: {err}")));
    headers.insert(ERROR_HEADER, HeaderValue::from_static(class.code));
    crate::http::error::rate_limit_headers(err, headers);
    response
}

/// Trailers that end a gRPC response egressd had to cut short (the deadline passed while the
/// response streamed): the client gets a status, not a reset stream.
pub(crate) fn ending_trailers(status: GrpcStatus, code: &'static str, text: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", status.value());
    trailers.insert("grpc-message", message(text));
    trailers.insert(ERROR_HEADER, HeaderValue::from_static(code));
    trailers
}

/// `grpc-message` is percent-encoded UTF-8: bytes outside printable ASCII, and `%`, as `%XX`.
fn message(text: &str) -> HeaderValue {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static("egressd error"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_in_every_unit() {
        assert_eq!(parse_timeout(b"200m"), Some(Duration::from_millis(200)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"5n"), Some(Duration::from_nanos(5)));
    }

    #[test]
    fn malformed_timeouts_are_ignored() {
        for bad in [
            &b""[..],
            b"m",
            b"123",
            b"123456789m",
            b"12x",
            b"-1S",
            b"1.5S",
            b"1 S",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn grpc_content_types_are_recognised() {
        let call_of = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            h.insert("grpc-timeout", HeaderValue::from_static("1S"));
            call(&h)
        };
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC;x=1",
        ] {
            assert_eq!(
                call_of(ct).unwrap().timeout,
                Some(Duration::from_secs(1)),
                "{ct}"
            );
        }
        for ct in [
            "application/grpc-web",
            "application/json",
            "application/grp",
        ] {
            assert!(call_of(ct).is_none(), "{ct}");
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            message("a 100% é\n").to_str().unwrap(),
            "a 100%25 %C3%A9%0A"
        );
    }

    #[test]
    fn local_replies_are_trailers_only_with_status() {
        let err = ProxyError::DestinationNotAllowed {
            host: "x.test".into(),
            port: 80,
            via: crate::telemetry::blocked::Via::Http,
        };
        let reply = local_reply(&err);
        assert_eq!(reply.status(), 200);
        assert_eq!(reply.headers()["grpc-status"], "7");
        assert_eq!(reply.headers()["content-type"], "application/grpc");
        assert_eq!(reply.headers()[ERROR_HEADER], "destination_not_allowed");
        assert!(reply.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains("x.test"));
    }
}
