//! Request heads are bounded and HTTP/1.1 framing is strict (issue #14, point 9): heads over
//! `downstream.maxRequestHeadersBytes` or with more than `maxRequestHeaders` fields are
//! answered 431, targets over `maxRequestUriBytes` 414, methods over `maxRequestMethodBytes`
//! 400, a second `Host` 400 (RFC 9112 §3.2), the same bounds hold for HTTP/2 header blocks,
//! and none of these reaches the upstream. An upstream response framed by both
//! `Transfer-Encoding: chunked` and `Content-Length` is relayed whole, without the length
//! (RFC 9112 §6.3).

mod common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::proxy::{
    get_with_headers, ip_backend, preamble_with, raw_exchange as raw, route_to, Response, TestProxy,
};
use common::upstream::{read_request_head, RawUpstream, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "svc.test";

/// A proxy whose HTTPRoute sends [`HOST`] to `upstream`, with `downstream` (lines indented by
/// four spaces, or empty) as `ProxyConfig.spec.downstream`.
async fn proxy(downstream: &str, upstream: SocketAddr) -> TestProxy {
    let spec = if downstream.is_empty() {
        String::new()
    } else {
        format!("  downstream:\n{downstream}")
    };
    let yaml =
        preamble_with(None, &spec) + &route_to(HOST, "svc") + &ip_backend("svc", upstream, "");
    TestProxy::start(&yaml).await
}

fn local_replies(proxy: &TestProxy, code: &str) -> f64 {
    let series = format!("egressd_local_replies_total{{code=\"{code}\"}} ");
    proxy
        .egressd()
        .shared()
        .metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0.0, |v| v.trim().parse().expect("numeric sample"))
}

/// A request head with `method`, `target` and header `extra` (`name: value\r\n` lines).
fn head(method: &str, target: &str, extra: &str) -> Vec<u8> {
    format!("{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n{extra}Connection: close\r\n\r\n")
        .into_bytes()
}

fn code(response: &Response) -> Option<&str> {
    response.error_code()
}

#[tokio::test]
async fn a_head_over_max_request_headers_bytes_is_answered_431_and_not_forwarded() {
    let upstream = Upstream::start("svc").await;
    let default = proxy("", upstream.addr).await;
    // 50 KB fits the default 60 KiB (Envoy's); 100 KB does not (hyper alone allowed ~400 KiB).
    let fits = "a".repeat(50_000);
    let ok = get_with_headers(default.http(), HOST, "/", &[("x-big", &fits)]).await;
    assert_eq!(ok.status, 200);
    let too_big = format!("x-big: {}\r\n", "a".repeat(100_000));
    let (status, text) = raw(default.http(), &head("GET", "/", &too_big)).await;
    assert_eq!(status, 431, "{text}");
    // Counted once the connection has ended, just after the client saw it close.
    common::eventually(
        "one request_header_too_large local reply counted",
        std::time::Duration::from_secs(5),
        || async { local_replies(&default, "request_header_too_large") == 1.0 },
    )
    .await;

    let small = proxy("    maxRequestHeadersBytes: 8Ki\n", upstream.addr).await;
    let over = format!("x-big: {}\r\n", "a".repeat(10_000));
    let (status, _) = raw(small.http(), &head("GET", "/", &over)).await;
    assert_eq!(status, 431);
    assert_eq!(
        upstream.request_count(),
        1,
        "only the 50 KB request is forwarded"
    );
}

#[tokio::test]
async fn more_header_fields_than_max_request_headers_are_answered_431_over_http1_and_http2() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("    maxRequestHeaders: 20\n", upstream.addr).await;
    let fields: String = (0..30).map(|i| format!("x-field-{i}: {i}\r\n")).collect();
    let (status, text) = raw(proxy.http(), &head("GET", "/", &fields)).await;
    assert_eq!(status, 431, "{text}");

    let mut sender = common::h2::client(proxy.http()).await;
    let mut request = http::Request::get(format!("http://{HOST}/"));
    for i in 0..30 {
        request = request.header(format!("x-field-{i}"), i.to_string());
    }
    let response = sender
        .send_request(request.body(common::h2::body("")).unwrap())
        .await
        .expect("HTTP/2 response");
    let response = common::proxy::collect(response).await;
    assert_eq!(response.status, 431);
    assert_eq!(code(&response), Some("request_header_too_large"));
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn http2_header_blocks_are_held_to_max_request_headers_bytes() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("", upstream.addr).await;
    let mut sender = common::h2::client(proxy.http()).await;
    // Under h2's SETTINGS_MAX_HEADER_LIST_SIZE (64Ki), over the 60 KiB head limit.
    let request = http::Request::get(format!("http://{HOST}/"))
        .header("x-big", "a".repeat(62 * 1024))
        .body(common::h2::body(""))
        .unwrap();
    let response = sender.send_request(request).await.expect("HTTP/2 response");
    let response = common::proxy::collect(response).await;
    assert_eq!(response.status, 431);
    assert_eq!(code(&response), Some("request_header_too_large"));
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn a_method_over_max_request_method_bytes_is_answered_400_and_not_forwarded() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("", upstream.addr).await;
    let (status, text) = raw(proxy.http(), &head(&"M".repeat(1000), "/", "")).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("x-egressd-error: method_too_long"), "{text}");
    // A 100 KB method makes the head too large before it is a method at all.
    let (status, _) = raw(proxy.http(), &head(&"M".repeat(100_000), "/", "")).await;
    assert_eq!(status, 431);
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn a_target_over_max_request_uri_bytes_is_answered_414_over_http1_and_http2() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("    maxRequestUriBytes: 4Ki\n", upstream.addr).await;
    let long = format!("/{}", "p".repeat(5000));
    let (status, text) = raw(proxy.http(), &head("GET", &long, "")).await;
    assert_eq!(status, 414, "{text}");
    assert!(text.contains("x-egressd-error: uri_too_long"), "{text}");

    let mut sender = common::h2::client(proxy.http()).await;
    let request = http::Request::get(format!("http://{HOST}{long}"))
        .body(common::h2::body(""))
        .unwrap();
    let response = sender.send_request(request).await.expect("HTTP/2 response");
    let response = common::proxy::collect(response).await;
    assert_eq!(response.status, 414);
    assert_eq!(code(&response), Some("uri_too_long"));
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn a_request_with_two_host_headers_is_answered_400_and_not_forwarded() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("", upstream.addr).await;
    let (status, text) = raw(proxy.http(), &head("GET", "/", "Host: other.test\r\n")).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("x-egressd-error: invalid_request"), "{text}");
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn an_upstream_response_framed_by_both_transfer_encoding_and_content_length_is_relayed_whole()
{
    let upstream = RawUpstream::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        // Content-Length says 5; the chunked body is 26 bytes.
        let response = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n\
                        1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n";
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.flush().await;
        // Keep the connection until the client is done.
        let mut buf = [0u8; 1024];
        let _ = stream.read(&mut buf).await;
    })
    .await;
    let proxy = proxy("", upstream.addr).await;
    let response = common::proxy::get(proxy.http(), HOST, "/").await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.body,
        Bytes::from_static(b"abcdefghijklmnopqrstuvwxyz")
    );
    assert_eq!(response.header("content-length"), None);
}

/// RFC 9112 §3.2: an HTTP/1.1 request without `Host` is 400, in absolute form and as CONNECT
/// too; HTTP/1.0 may omit it.
#[tokio::test]
async fn an_http11_request_without_host_is_answered_400_even_in_absolute_form() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("", upstream.addr).await;
    for request in [
        format!("GET http://{HOST}/ HTTP/1.1\r\nConnection: close\r\n\r\n"),
        "GET / HTTP/1.1\r\nConnection: close\r\n\r\n".to_owned(),
        format!("CONNECT {HOST}:443 HTTP/1.1\r\nConnection: close\r\n\r\n"),
    ] {
        let (status, text) = raw(proxy.http(), request.as_bytes()).await;
        assert_eq!(status, 400, "{request:?}: {text}");
        assert!(text.contains("x-egressd-error: invalid_request"), "{text}");
    }
    assert_eq!(upstream.request_count(), 0);
    let (status, text) = raw(
        proxy.http(),
        format!("GET http://{HOST}/ HTTP/1.0\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "HTTP/1.0 without Host: {text}");
}
