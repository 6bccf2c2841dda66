//! Request paths are normalised before routes match them and before they are forwarded
//! (issue #31, point 7(b); `ProxyConfig.spec.downstream.paths`): `/public/../X`,
//! `/public/%2e%2e/X` and `/public/..%2fX` no longer match `PathPrefix /public` and reach the
//! upstream, which would serve `/X`. The exact bytes go over a raw socket; the test checks what
//! egressd answers and what the upstream receives.

mod common;

use std::net::SocketAddr;

use common::proxy::{
    ip_backend, preamble_with, raw_error_code as error_code, raw_exchange, TestProxy,
};
use common::upstream::Upstream;

const HOST: &str = "svc.test";

/// A proxy whose only route sends `HOST` paths under `/public` to `upstream`, with `paths`
/// (lines indented by six spaces, or empty) as `ProxyConfig.spec.downstream.paths`.
async fn proxy(paths: &str, upstream: SocketAddr) -> TestProxy {
    let spec = if paths.is_empty() {
        String::new()
    } else {
        format!("  downstream:\n    paths:\n{paths}")
    };
    let route = format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: public}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: /public}}}}], backendRefs: [{{name: svc}}]}}]\n"
    );
    let yaml = preamble_with(None, &spec) + &route + &ip_backend("svc", upstream, "");
    TestProxy::start(&yaml).await
}

/// `GET target` written as is on a new connection; the status and the whole answer.
async fn get_raw(addr: SocketAddr, target: &str) -> (u16, String) {
    let request = format!("GET {target} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    raw_exchange(addr, request.as_bytes()).await
}

/// Sends each `(target, status, code)` and checks the answer.
async fn expect(proxy: &TestProxy, cases: &[(&str, u16, Option<&str>)]) {
    for &(target, status, code) in cases {
        let (got, text) = get_raw(proxy.http(), target).await;
        assert_eq!((got, error_code(&text)), (status, code), "{target}: {text}");
    }
}

#[tokio::test]
async fn paths_are_normalised_before_routing_and_forwarded_normalised() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("", upstream.addr).await;
    // Out of the prefix once normalised: no route (the host is declared), nothing upstream.
    expect(
        &proxy,
        &[
            ("/public/../X", 404, Some("no_route")),
            ("/public/%2e%2e/X", 404, Some("no_route")),
            ("/public/.%2E/X", 404, Some("no_route")),
            // Kept encoded slashes would hide `..` from egressd, not from the upstream.
            ("/public/..%2fX", 400, Some("invalid_path")),
            ("/public/..%5CX", 400, Some("invalid_path")),
            ("/public/..\\X", 400, Some("invalid_path")),
            // Above the root, and a `%` that starts no encoding (a double encoding's way in).
            ("/..", 400, Some("invalid_path")),
            ("/public/../../X", 400, Some("invalid_path")),
            ("/public/%%32%65%%32%65/X", 400, Some("invalid_path")),
        ],
    )
    .await;
    assert_eq!(upstream.request_count(), 0);
    // Inside the prefix: forwarded in normal form, the query untouched.
    for (target, forwarded) in [
        ("/public/./a/../b?q=/../x", "/public/b?q=/../x"),
        ("/public/%7Euser/%41", "/public/~user/A"),
        ("/public/group%2fproject", "/public/group%2Fproject"),
        ("/public//a", "/public//a"),
        ("/public/file.txt", "/public/file.txt"),
    ] {
        let (status, text) = get_raw(proxy.http(), target).await;
        assert_eq!(status, 200, "{target}: {text}");
        assert_eq!(upstream.last_request().uri, forwarded, "{target}");
    }
    // In absolute form too.
    let (status, _) = get_raw(proxy.http(), &format!("http://{HOST}/public/%2e%2e/X")).await;
    assert_eq!(status, 404);
    assert_eq!(upstream.request_count(), 5);
}

#[tokio::test]
async fn http2_paths_are_normalised_too() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("", upstream.addr).await;
    let mut sender = common::h2::client(proxy.http()).await;
    for (path, status) in [
        ("/public/../X", 404),
        ("/public/..%2fX", 400),
        ("/public/a/../b", 200),
    ] {
        let request = http::Request::get(format!("http://{HOST}{path}"))
            .body(common::h2::body(""))
            .unwrap();
        let response = sender.send_request(request).await.expect("HTTP/2 response");
        let response = common::proxy::collect(response).await;
        assert_eq!(response.status, status, "{path}");
    }
    assert_eq!(upstream.last_request().uri, "/public/b");
    assert_eq!(upstream.request_count(), 1);
}

#[tokio::test]
async fn escaped_slashes_and_merging_follow_the_settings() {
    let upstream = Upstream::start("svc").await;
    let unescape = proxy(
        "      escapedSlashes: UnescapeAndForward\n      mergeSlashes: true\n",
        upstream.addr,
    )
    .await;
    expect(&unescape, &[("/public/..%2fX", 404, Some("no_route"))]).await;
    for (target, forwarded) in [
        ("/public/group%2Fproject", "/public/group/project"),
        ("//public///a\\b", "/public/a/b"),
    ] {
        let (status, text) = get_raw(unescape.http(), target).await;
        assert_eq!(status, 200, "{target}: {text}");
        assert_eq!(upstream.last_request().uri, forwarded, "{target}");
    }
    let reject = proxy("      escapedSlashes: RejectRequest\n", upstream.addr).await;
    expect(
        &reject,
        &[
            ("/public/group%2Fproject", 400, Some("invalid_path")),
            ("/public/a\\b", 400, Some("invalid_path")),
        ],
    )
    .await;
    assert_eq!(upstream.request_count(), 2);
}

/// `normalize: false` is the old behaviour (paths matched and forwarded as sent), allowed but
/// reported as Degraded.
#[tokio::test]
async fn normalisation_can_be_turned_off_and_is_then_degraded() {
    let upstream = Upstream::start("svc").await;
    let proxy = proxy("      normalize: false\n", upstream.addr).await;
    let (status, _) = get_raw(proxy.http(), "/public/../X").await;
    assert_eq!(status, 200);
    assert_eq!(upstream.last_request().uri, "/public/../X");
    let messages = proxy.egressd().shared().reload_status().messages;
    assert!(
        messages
            .iter()
            .any(|m| format!("{m:?}").contains("paths are not normalised")),
        "{messages:?}"
    );
}
