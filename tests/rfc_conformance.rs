//! What egressd does with messages where Envoy, nginx and HAProxy differ from it (issue #31,
//! point 10), each against its RFC: the exact bytes go over a raw TCP socket to egressd on
//! loopback, and the test checks what egressd answers and what the upstream receives.

mod common;

use std::net::SocketAddr;

use common::h2frames::{self, frame, read_frame, END_HEADERS, END_STREAM, HEADERS};
use common::proxy::{
    ip_backend, preamble, raw_error_code as error_code, raw_exchange as raw, route_to, TestProxy,
};
use common::upstream::{read_request_head, RawUpstream, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "svc.test";

/// A proxy whose HTTPRoute sends [`HOST`] to `upstream`.
async fn proxy(upstream: SocketAddr) -> TestProxy {
    let yaml = preamble(None) + &route_to(HOST, "svc") + &ip_backend("svc", upstream, "");
    TestProxy::start(&yaml).await
}

/// The `x-egressd-error` of a raw response, if any.
/// RFC 9112 §6.1: a transfer coding egressd does not implement is 501 (Envoy and nginx say
/// the same), `chunked` twice is 400; neither reaches the upstream. Before, `gzip, chunked`
/// went upstream as a plain chunked body: the coding was dropped and the gzip bytes passed
/// for the content.
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_501_and_chunked_twice_400() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let body = "5\r\nhello\r\n0\r\n\r\n";
    for (codings, status, code) in [
        ("Transfer-Encoding: gzip, chunked\r\n", 501, "not_supported"),
        (
            "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
            501,
            "not_supported",
        ),
        (
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            400,
            "invalid_request",
        ),
        (
            "Transfer-Encoding: chunked, chunked\r\n",
            400,
            "invalid_request",
        ),
    ] {
        let request = format!(
            "POST /upload HTTP/1.1\r\nHost: {HOST}\r\n{codings}Connection: close\r\n\r\n{body}"
        );
        let (got, text) = raw(proxy.http(), request.as_bytes()).await;
        assert_eq!(got, status, "{codings:?}: {text}");
        assert_eq!(error_code(&text), Some(code), "{codings:?}: {text}");
    }
    assert_eq!(upstream.request_count(), 0);
    // The plain chunked request still goes through, body and all.
    let request = format!(
        "POST /upload HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{body}"
    );
    let (got, text) = raw(proxy.http(), request.as_bytes()).await;
    assert_eq!(got, 200, "{text}");
    assert_eq!(upstream.last_request().body_len, 5);
}

/// RFC 9110 §10.1.1: egressd (hyper) answers `Expect: 100-continue` itself when it reads the
/// body, so the upstream is not asked again (Envoy and nginx strip it too). Before, the
/// upstream received the expectation as well.
#[tokio::test]
async fn expect_100_continue_is_answered_by_egressd_and_not_forwarded() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let mut stream = TcpStream::connect(proxy.http()).await.expect("connect");
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    let interim = common::proxy::read_head(&mut stream).await;
    assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").await.expect("write body");
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest).await;
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
    let seen = upstream.last_request();
    assert_eq!(seen.body_len, 5);
    assert_eq!(seen.headers.get("expect"), None, "{:?}", seen.headers);
}

/// RFC 9113 §8.2.3: the `cookie` fields an HTTP/2 client sends separately are one field,
/// joined with `; `, on their way to an HTTP/1.1 upstream. Before, the upstream got two
/// `Cookie` lines. Hand-written frames: HPACK literals, no encoder state.
#[tokio::test]
async fn http2_cookie_fields_reach_an_http1_upstream_as_one_line() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let mut stream = TcpStream::connect(proxy.http()).await.expect("connect");
    let mut block = h2frames::get_block(HOST);
    for cookie in ["a=1", "b=2"] {
        // Literal without indexing, name `cookie` (static index 32: 15 + 17).
        block.extend_from_slice(&[0x0f, 17, cookie.len() as u8]);
        block.extend_from_slice(cookie.as_bytes());
    }
    let mut out = h2frames::PREFACE.to_vec();
    h2frames::empty_settings(&mut out);
    frame(&mut out, HEADERS, END_HEADERS | END_STREAM, 1, &block);
    stream.write_all(&out).await.expect("write frames");
    // Until the response's HEADERS on stream 1.
    loop {
        let frame = read_frame(&mut stream).await.expect("a response");
        if frame.kind == HEADERS && frame.stream == 1 {
            break;
        }
    }
    let seen = upstream.last_request();
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2"]);
}

/// RFC 9112 §3.2.3, §3.2.4: a target that is neither a path nor an absolute URI (a bare
/// `host:port` or word, read as authority-form) is for CONNECT only, `*` for OPTIONS only: 400,
/// nothing forwarded. Before, `GET evil.test:8080` went to `evil.test:8080` as `GET /`
/// whatever the `Host`.
#[tokio::test]
async fn a_request_target_of_the_wrong_form_is_400() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    for target in ["evil.test:8080", "noslash", "svc.test", "*"] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
        let (status, text) = raw(proxy.http(), request.as_bytes()).await;
        assert_eq!(status, 400, "{target}: {text}");
        assert_eq!(
            error_code(&text),
            Some("invalid_request"),
            "{target}: {text}"
        );
    }
    assert_eq!(upstream.request_count(), 0);
}

/// RFC 9112 §3, RFC 3986 §2.1: bytes over 0x7F in a request target are not a URI (they are
/// percent-encoded): 400, nothing forwarded. Before, `/caf\xc3\xa9` reached the upstream raw
/// (found by the differential suite, tests/interop/09-differential; HAProxy and Envoy: 400).
#[tokio::test]
async fn a_request_target_with_bytes_outside_ascii_is_400() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    for target in [&b"/caf\xc3\xa9"[..], b"/a?q=\xff", b"/\x80"] {
        let mut request = b"GET ".to_vec();
        request.extend_from_slice(target);
        request.extend_from_slice(
            format!(" HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let (status, text) = raw(proxy.http(), &request).await;
        let shown = String::from_utf8_lossy(target);
        assert_eq!(status, 400, "{shown}: {text}");
        assert_eq!(
            error_code(&text),
            Some("invalid_request"),
            "{shown}: {text}"
        );
    }
    assert_eq!(upstream.request_count(), 0);
}

/// RFC 9110 §7.6.2: TRACE and OPTIONS with `Max-Forwards: 0` are answered by egressd (OPTIONS
/// with `Allow`, TRACE with the request it got, less its credentials and cookies); a larger
/// value reaches the upstream one lower. Before, both went on unchanged (found by the
/// differential suite, tests/interop/09-differential).
#[tokio::test]
async fn max_forwards_is_counted_down_and_zero_is_answered_here() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let options = format!(
        "OPTIONS /a HTTP/1.1\r\nHost: {HOST}\r\nMax-Forwards: 0\r\nConnection: close\r\n\r\n"
    );
    let (status, text) = raw(proxy.http(), options.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.to_ascii_lowercase().contains("\r\nallow: get, head"),
        "{text}"
    );
    let trace = format!(
        "TRACE /a HTTP/1.1\r\nHost: {HOST}\r\nMax-Forwards: 0\r\nAuthorization: Bearer secret\r\nX-Probe: 1\r\nConnection: close\r\n\r\n"
    );
    let (status, text) = raw(proxy.http(), trace.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("message/http"), "{text}");
    assert!(
        text.contains("TRACE /a HTTP/1.1") && text.contains("x-probe: 1"),
        "{text}"
    );
    assert!(
        !text.contains("secret"),
        "credentials are not echoed: {text}"
    );
    assert_eq!(upstream.request_count(), 0);

    let options = format!(
        "OPTIONS /a HTTP/1.1\r\nHost: {HOST}\r\nMax-Forwards: 3\r\nConnection: close\r\n\r\n"
    );
    let (status, text) = raw(proxy.http(), options.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    let seen = upstream.last_request();
    assert_eq!(seen.headers.get("max-forwards").unwrap(), "2");
}

/// `OPTIONS *` (RFC 9112 §3.2.4) is routed as the host's root, so a catch-all route takes it,
/// and it reaches the upstream as `OPTIONS *`. Before, no route matched `*`.
#[tokio::test]
async fn options_asterisk_is_routed_by_a_catch_all_route_and_forwarded_as_is() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let request = format!("OPTIONS * HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    let (status, text) = raw(proxy.http(), request.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    let seen = upstream.last_request();
    assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("OPTIONS", "*"));
}

/// An upstream that answers every request on its connection with `response` (keep-alive).
async fn answering(response: &'static [u8]) -> RawUpstream {
    RawUpstream::start(move |mut stream| async move {
        while !read_request_head(&mut stream).await.is_empty() {
            if stream.write_all(response).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// RFC 9110 §8.6: a 304 may carry the `Content-Length` of the representation it stands for,
/// and it reaches the client. Before, hyper dropped it because the body is empty.
#[tokio::test]
async fn a_304_keeps_its_content_length() {
    let upstream =
        answering(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\nETag: \"v1\"\r\n\r\n")
            .await;
    let proxy = proxy(upstream.addr).await;
    let request = format!(
        "GET /r HTTP/1.1\r\nHost: {HOST}\r\nIf-None-Match: \"v1\"\r\nConnection: close\r\n\r\n"
    );
    let (status, text) = raw(proxy.http(), request.as_bytes()).await;
    assert_eq!(status, 304, "{text}");
    assert!(text.contains("content-length: 1234\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\n"), "no body after a 304: {text:?}");
    // HTTP/2 clients too (HEADERS without END_STREAM, then an empty end).
    let mut sender = common::h2::client(proxy.http()).await;
    let request = http::Request::get(format!("http://{HOST}/r"))
        .body(common::h2::body(""))
        .unwrap();
    let response = sender.send_request(request).await.expect("HTTP/2 response");
    let response = common::proxy::collect(response).await;
    assert_eq!(response.status, 304);
    assert_eq!(response.header("content-length"), Some("1234"));
    assert!(response.body.is_empty());
}

/// A reason phrase with non-ASCII bytes (obs-text, RFC 9112 §4), which hyper's parser gives
/// as empty, reaches the client as the code's standard phrase. Before, it was sent empty.
#[tokio::test]
async fn a_non_ascii_reason_phrase_becomes_the_standard_one() {
    let upstream = answering(b"HTTP/1.1 200 Bien re\xe7u\r\nContent-Length: 2\r\n\r\nok").await;
    let proxy = proxy(upstream.addr).await;
    let request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    let (status, text) = raw(proxy.http(), request.as_bytes()).await;
    assert_eq!(status, 200);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:?}");
}

/// Every local reply carries its code: the heads hyper refuses itself before egressd sees a
/// request (characters `http::Uri` does not take in a path or query, a bad header line, a
/// head over `maxRequestHeadersBytes`) get egressd's reply, `x-egressd-error` and a body,
/// instead of hyper's bare status. Before, they had no code.
#[tokio::test]
async fn heads_hyper_refuses_get_egressds_reply_with_its_code() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let big = format!("x-big: {}\r\n", "a".repeat(70_000));
    for (target, extra, status, code) in [
        ("/q?a=\"x\"", "", 400, "invalid_request"),
        ("/q?a=<x>", "", 400, "invalid_request"),
        ("/p<x>", "", 400, "invalid_request"),
        ("/p`x`", "", 400, "invalid_request"),
        ("/", "bad header\r\n", 400, "invalid_request"),
        ("/", big.as_str(), 431, "request_header_too_large"),
    ] {
        let request =
            format!("GET {target} HTTP/1.1\r\nHost: {HOST}\r\n{extra}Connection: close\r\n\r\n");
        let (got, text) = raw(proxy.http(), request.as_bytes()).await;
        assert_eq!(got, status, "{target}: {text}");
        assert_eq!(error_code(&text), Some(code), "{target}: {text}");
        let (_, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(body.starts_with("egressd: "), "{target}: {text}");
    }
    assert_eq!(upstream.request_count(), 0);
    // Keep-alive: a good request, then a bad one on the same connection.
    let mut stream = TcpStream::connect(proxy.http()).await.expect("connect");
    let two = format!(
        "GET /ok HTTP/1.1\r\nHost: {HOST}\r\n\r\nGET /p<x> HTTP/1.1\r\nHost: {HOST}\r\n\r\n"
    );
    stream.write_all(two.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let second = &answer[answer.find("HTTP/1.1 400").expect("a 400 after the 200")..];
    assert_eq!(error_code(second), Some("invalid_request"), "{answer}");
}

/// RFC 9110 §2.5: an HTTP/1.0 request is answered with egressd's own version, `HTTP/1.1`
/// (the framing stays one an HTTP/1.0 client reads: a length, or the connection's end).
/// Before, hyper labelled the response `HTTP/1.0`.
#[tokio::test]
async fn an_http10_request_is_answered_with_an_http11_status_line() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy(upstream.addr).await;
    let request = format!("GET /old HTTP/1.0\r\nHost: {HOST}\r\n\r\n");
    let (status, text) = raw(proxy.http(), request.as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nsvc"), "{text}");
    // egressd's own replies too.
    let request = "GET /old HTTP/1.0\r\nHost: undeclared.test\r\n\r\n";
    let (status, text) = raw(proxy.http(), request.as_bytes()).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
}
