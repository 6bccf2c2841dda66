//! What egressd changes on the way through: hop-by-hop headers, Via / X-Forwarded-*, Host,
//! header modifier and URL rewrite filters; plus connection reuse and DNS refresh behaviour.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::dns::TestDns;
use common::eventually;
use common::proxy::{
    fetch, fqdn_backend, get, ip_backend, preamble, request, route_to, ClientBody, Conn, TestProxy,
};
use common::upstream::{full, read_request_head, RawUpstream, Upstream};

const API_HOST: &str = "api.egress.test";

/// An HTTPRoute for `hostname` with one rule: `filters` (YAML list items indented for a rule)
/// and `backend`.
fn route_with_filters(
    name: &str,
    hostname: &str,
    matches: &str,
    filters: &str,
    backend: &str,
) -> String {
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
spec:
  parentRefs:
  - name: gw
  hostnames: ["{hostname}"]
  rules:
  - matches: {matches}
    filters:
{filters}    backendRefs:
    - {{group: egressd.dev, kind: Backend, name: {backend}}}
"#
    )
}

#[tokio::test]
async fn hop_by_hop_headers_are_not_forwarded_in_either_direction() {
    let dns = TestDns::start().await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start_with(|_req| async {
        http::Response::builder()
            .header("connection", "x-resp-hop")
            .header("x-resp-hop", "1")
            .header("keep-alive", "timeout=30")
            .header("proxy-authenticate", "Basic realm=upstream")
            .header("x-resp-keep", "1")
            .body(full("ok"))
            .unwrap()
    })
    .await;
    let port = upstream.addr.port();
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[port], "");
    let proxy = TestProxy::start(&yaml).await;

    let req = request("GET", &format!("{API_HOST}:{port}"), "/")
        .header("connection", "x-listed, x-other-listed")
        .header("x-listed", "1")
        .header("x-other-listed", "1")
        .header("keep-alive", "timeout=5")
        .header("te", "deflate, trailers")
        .header("trailer", "x-checksum")
        .header("upgrade", "h2c")
        .header("proxy-authorization", "Basic c2VjcmV0OnNlY3JldA==")
        .header("proxy-connection", "keep-alive")
        .header("x-keep", "yes")
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 200, "{}", response.text());

    let seen = upstream.last_request();
    for name in [
        "x-listed",
        "x-other-listed",
        "keep-alive",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    ] {
        assert!(
            !seen.headers.contains_key(name),
            "{name} was forwarded: {:?}",
            seen.headers
        );
    }
    // Trailer is end-to-end (RFC 9110 §6.6.2).
    assert_eq!(seen.headers.get("trailer").unwrap(), "x-checksum");
    // TE is hop-by-hop: the client's codings are not forwarded, but since the client takes
    // trailers and egressd relays them, egressd says `TE: trailers` for itself.
    assert_eq!(
        seen.headers.get("te").map(|v| v.to_str().unwrap()),
        Some("trailers")
    );
    // Connection may be re-added by egressd's own client, but never with the client's list.
    for value in seen.headers.get_all("connection") {
        assert!(!value.to_str().unwrap().contains("x-listed"), "{value:?}");
    }
    assert_eq!(seen.headers["x-keep"], "yes");

    assert_eq!(response.header("x-resp-keep"), Some("1"));
    for name in ["x-resp-hop", "keep-alive", "proxy-authenticate"] {
        assert!(response.header(name).is_none(), "{name} reached the client");
    }
}

#[tokio::test]
async fn via_and_x_forwarded_headers_are_appended() {
    let dns = TestDns::start().await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start_with(|_req| async {
        http::Response::builder()
            .header("via", "1.1 origin-cache")
            .body(full("ok"))
            .unwrap()
    })
    .await;
    let port = upstream.addr.port();
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[port], "");
    let proxy = TestProxy::start(&yaml).await;
    let host = format!("{API_HOST}:{port}");

    // A client that already went through another proxy.
    let req = request("GET", &host, "/")
        .header("via", "1.0 corp-proxy")
        .header("x-forwarded-for", "10.1.2.3")
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = upstream.last_request();
    assert_eq!(seen.headers["via"], "1.0 corp-proxy, 1.1 egressd");
    assert_eq!(seen.headers["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(
        response.header("via"),
        Some("1.1 origin-cache, 1.1 egressd")
    );

    // A direct client: egressd starts the lists.
    let response = get(proxy.http(), &host, "/").await;
    assert_eq!(response.status, 200);
    let seen = upstream.last_request();
    assert_eq!(seen.headers["via"], "1.1 egressd");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.version, http::Version::HTTP_11);
}

#[tokio::test]
async fn host_is_rewritten_to_the_backend_hostname_unless_rewrite_authority_is_false() {
    let dns = TestDns::start().await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 60);
    dns.set("raw.egress.test", &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("api").await;
    let port = upstream.addr.port();
    let keep_authority = fqdn_backend("raw", "raw.egress.test", &[port], "").replace(
        "hostname: raw.egress.test",
        "hostname: raw.egress.test\n      rewriteAuthority: false",
    );
    let yaml = preamble(Some(dns.addr))
        + &fqdn_backend("api", API_HOST, &[port], "")
        + &keep_authority
        + &route_with_filters(
            "alias",
            "alias.test",
            "[{path: {type: PathPrefix, value: /}}]",
            "",
            "api",
        )
        + &route_with_filters(
            "rawalias",
            "rawalias.test",
            "[{path: {type: PathPrefix, value: /}}]",
            "",
            "raw",
        );
    // `filters:` with nothing under it is not valid YAML for a list; drop the empty key.
    let yaml = yaml.replace("    filters:\n    backendRefs:", "    backendRefs:");
    let proxy = TestProxy::start(&yaml).await;

    // Through a route with another hostname: Host becomes the Backend's, with its port (not 80).
    let response = get(proxy.http(), "alias.test", "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        upstream.last_request().headers["host"],
        format!("{API_HOST}:{port}").as_str()
    );

    // Implicit route naming no port: the first port, and Host says so.
    let response = get(proxy.http(), API_HOST, "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        upstream.last_request().headers["host"],
        format!("{API_HOST}:{port}").as_str()
    );

    // rewriteAuthority: false keeps what the client sent.
    let response = get(proxy.http(), "rawalias.test", "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(upstream.last_request().headers["host"], "rawalias.test");
    assert_eq!(upstream.request_count(), 3);
}

#[tokio::test]
async fn header_modifier_filters_change_request_and_response_headers() {
    let upstream = Upstream::start_with(|_req| async {
        http::Response::builder()
            .header("x-resp-set", "from-upstream")
            .header("x-resp-add", "from-upstream")
            .header("x-resp-remove", "secret")
            .body(full("ok"))
            .unwrap()
    })
    .await;
    let filters = r#"    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: x-set, value: from-proxy}]
        add: [{name: x-add, value: from-proxy}]
        remove: [x-remove]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set: [{name: x-resp-set, value: from-proxy}]
        add: [{name: x-resp-add, value: from-proxy}]
        remove: [x-resp-remove]
"#;
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_with_filters(
            "mod",
            "app.test",
            "[{path: {type: PathPrefix, value: /}}]",
            filters,
            "app",
        );
    let proxy = TestProxy::start(&yaml).await;

    let req = request("GET", "app.test", "/")
        .header("x-set", "from-client")
        .header("x-add", "from-client")
        .header("x-remove", "gone")
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 200, "{}", response.text());

    let seen = upstream.last_request();
    let all = |name: &str| -> Vec<String> {
        seen.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(all("x-set"), ["from-proxy"]);
    assert_eq!(all("x-add"), ["from-client", "from-proxy"]);
    assert!(all("x-remove").is_empty());
    // Host stays as sent: IP Backends have no hostname to rewrite to.
    assert_eq!(seen.headers["host"], "app.test");

    let resp_all = |name: &str| -> Vec<&str> {
        response
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(resp_all("x-resp-set"), ["from-proxy"]);
    assert_eq!(resp_all("x-resp-add"), ["from-upstream", "from-proxy"]);
    assert!(resp_all("x-resp-remove").is_empty());
}

#[tokio::test]
async fn url_rewrite_replaces_prefix_full_path_and_hostname() {
    let upstream = Upstream::start("app").await;
    let prefix = r#"    - type: URLRewrite
      urlRewrite:
        path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}
"#;
    let to_root = r#"    - type: URLRewrite
      urlRewrite:
        path: {type: ReplacePrefixMatch, replacePrefixMatch: /}
"#;
    let full_path = r#"    - type: URLRewrite
      urlRewrite:
        hostname: rewritten.test
        path: {type: ReplaceFullPath, replaceFullPath: /fixed}
"#;
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_with_filters(
            "prefix",
            "prefix.test",
            "[{path: {type: PathPrefix, value: /old}}]",
            prefix,
            "app",
        )
        + &route_with_filters(
            "root",
            "root.test",
            "[{path: {type: PathPrefix, value: /strip}}]",
            to_root,
            "app",
        )
        + &route_with_filters(
            "full",
            "full.test",
            "[{path: {type: PathPrefix, value: /}}]",
            full_path,
            "app",
        );
    let proxy = TestProxy::start(&yaml).await;

    let cases = [
        ("prefix.test", "/old", "/new", "prefix.test"),
        ("prefix.test", "/old/", "/new/", "prefix.test"),
        ("prefix.test", "/old/x/y?q=1", "/new/x/y?q=1", "prefix.test"),
        ("root.test", "/strip/x", "/x", "root.test"),
        ("root.test", "/strip", "/", "root.test"),
        (
            "full.test",
            "/anything/at/all?k=v",
            "/fixed?k=v",
            "rewritten.test",
        ),
    ];
    for (host, path, want_uri, want_host) in cases {
        let response = get(proxy.http(), host, path).await;
        assert_eq!(response.status, 200, "{host}{path}: {}", response.text());
        let seen = upstream.last_request();
        assert_eq!(seen.uri, want_uri, "{host}{path}");
        assert_eq!(seen.headers["host"], want_host, "{host}{path}");
    }
}

#[tokio::test]
async fn bodiless_responses_keep_both_connections_in_step() {
    // HEAD, 204 and 304 carry no body whatever their headers say; a proxy that framed them
    // wrongly would desynchronise the keep-alive connections and garble the next response.
    let upstream = Upstream::start_with(|req| async move {
        let builder = http::Response::builder();
        match req.uri().path() {
            "/no-content" => builder.status(204).body(full("")),
            "/not-modified" => builder.status(304).header("etag", "\"v1\"").body(full("")),
            _ => builder.header("content-length", "5").body(full(
                if req.method() == http::Method::HEAD {
                    ""
                } else {
                    "hello"
                },
            )),
        }
        .unwrap()
    })
    .await;
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_with_filters(
            "all",
            "app.test",
            "[{path: {type: PathPrefix, value: /}}]",
            "",
            "app",
        );
    let yaml = yaml.replace("    filters:\n    backendRefs:", "    backendRefs:");
    let proxy = TestProxy::start(&yaml).await;

    let mut conn = Conn::open(proxy.http()).await;
    let cases = [
        ("HEAD", "/", 200, ""),
        ("GET", "/", 200, "hello"),
        ("GET", "/no-content", 204, ""),
        ("GET", "/", 200, "hello"),
        ("GET", "/not-modified", 304, ""),
        ("HEAD", "/", 200, ""),
        ("GET", "/", 200, "hello"),
    ];
    for (method, path, status, body) in cases {
        let req = request(method, "app.test", path)
            .body(ClientBody::default())
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(5), conn.fetch(req))
            .await
            .unwrap_or_else(|_| panic!("{method} {path} hung"));
        assert_eq!(
            response.status,
            status,
            "{method} {path}: {}",
            response.text()
        );
        assert_eq!(response.text(), body, "{method} {path}");
    }
    assert_eq!(upstream.request_count(), cases.len());
    assert!(
        upstream.connection_count() <= 2,
        "{}",
        upstream.connection_count()
    );
}

#[tokio::test]
async fn sequential_requests_reuse_pooled_upstream_connections() {
    let upstream = Upstream::start("app").await;
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_with_filters(
            "all",
            "app.test",
            "[{path: {type: PathPrefix, value: /}}]",
            "",
            "app",
        );
    let yaml = yaml.replace("    filters:\n    backendRefs:", "    backendRefs:");
    let proxy = TestProxy::start(&yaml).await;

    // Ten requests each on a new client connection, then ten on one: pooling is per endpoint,
    // not per client connection.
    for _ in 0..10 {
        let response = get(proxy.http(), "app.test", "/").await;
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let mut conn = Conn::open(proxy.http()).await;
    for _ in 0..10 {
        let req = request("POST", "app.test", "/")
            .body(ClientBody::from("x".repeat(1000)))
            .unwrap();
        let response = conn.fetch(req).await;
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert_eq!(upstream.request_count(), 20);
    assert!(
        upstream.connection_count() <= 2,
        "20 sequential requests used {} upstream connections",
        upstream.connection_count()
    );
}

#[tokio::test]
async fn pooled_connection_closed_by_the_upstream_is_not_used_again() {
    // Each connection answers one request with keep-alive implied, then the server closes it,
    // as servers with short idle timeouts do.
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let closed_by_server = closed.clone();
    let upstream = RawUpstream::start(move |mut stream| {
        let closed = closed_by_server.clone();
        async move {
            use tokio::io::AsyncWriteExt;
            read_request_head(&mut stream).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
            drop(stream);
            closed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    })
    .await;
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_with_filters(
            "all",
            "app.test",
            "[{path: {type: PathPrefix, value: /}}]",
            "",
            "app",
        );
    let yaml = yaml.replace("    filters:\n    backendRefs:", "    backendRefs:");
    let proxy = TestProxy::start(&yaml).await;

    for i in 1..=3 {
        let response = get(proxy.http(), "app.test", "/").await;
        assert_eq!(
            response.status,
            200,
            "request {i}: {:?} {}",
            response.error_code(),
            response.text()
        );
        assert_eq!(response.text(), "ok");
        // Wait for the server side of the close before the next request.
        eventually(
            &format!("upstream did not close connection {i}"),
            Duration::from_secs(5),
            || {
                let closed = closed.clone();
                async move { closed.load(std::sync::atomic::Ordering::SeqCst) >= i }
            },
        )
        .await;
    }
    assert_eq!(upstream.connection_count(), 3);
}

#[tokio::test]
async fn a_connection_answered_before_its_request_body_ended_is_not_reused() {
    // The upstream refuses an upload on sight (413, keep-alive implied) without reading its
    // body, and answers anything else with 200. The uploading client then stalls, its body
    // unfinished: that connection is still owed the rest of the body and cannot carry the
    // next request, which must not wait for it.
    let upstream = RawUpstream::start(|mut stream| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let head = read_request_head(&mut stream).await;
        let answer: &[u8] = if head.starts_with(b"POST") {
            b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 4\r\n\r\nbig!"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        };
        let _ = stream.write_all(answer).await;
        // Keeps the connection open, reading what comes, until egressd closes it.
        let mut sink = [0u8; 4096];
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
    let yaml =
        preamble(None) + &ip_backend("app", upstream.addr, "") + &route_to("app.test", "app");
    let proxy = TestProxy::start(&yaml).await;

    let mut uploader = tokio::net::TcpStream::connect(proxy.http()).await.unwrap();
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        uploader
            .write_all(b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100000\r\n\r\nfirst bytes")
            .await
            .unwrap();
        let mut reply = Vec::new();
        let mut buf = [0u8; 1024];
        while !reply.windows(4).any(|w| w == b"big!") {
            match tokio::time::timeout(Duration::from_secs(5), uploader.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => reply.extend_from_slice(&buf[..n]),
                other => panic!("no 413 for the upload: {other:?} after {reply:?}"),
            }
        }
        assert!(
            reply.starts_with(b"HTTP/1.1 413"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
    // The uploader stays connected with its body unfinished.
    let next = tokio::time::timeout(Duration::from_secs(5), get(proxy.http(), "app.test", "/"))
        .await
        .expect("the next request waited for the stalled upload's connection");
    assert_eq!(next.status, 200, "{:?} {}", next.error_code(), next.text());
    assert_eq!(next.text(), "ok");
    drop(uploader);
}

#[tokio::test]
async fn fqdn_backend_that_never_resolved_answers_503_no_healthy_upstream() {
    let dns = TestDns::start().await;
    // Nothing set: the server answers NXDOMAIN.
    let policy = "  trafficPolicy:\n    timeout:\n      tcp:\n        connectTimeout: 500ms\n";
    let yaml =
        preamble(Some(dns.addr)) + &fqdn_backend("missing", "missing.egress.test", &[8080], policy);
    let proxy = TestProxy::start(&yaml).await;

    let response = get(proxy.http(), "missing.egress.test:8080", "/").await;
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(response.error_code(), Some("no_healthy_upstream"));
    assert!(response.text().contains("missing"), "{}", response.text());
    assert!(dns.query_count("missing.egress.test") >= 1);
}

#[tokio::test]
async fn fqdn_backend_keeps_its_last_good_addresses_while_dns_fails() {
    let dns = TestDns::start().await;
    // A 1s TTL makes egressd re-resolve (and see the failures) within the test.
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 1);
    let upstream = Upstream::start("api").await;
    let port = upstream.addr.port();
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[port], "");
    let proxy = TestProxy::start(&yaml).await;
    let host = format!("{API_HOST}:{port}");

    let response = get(proxy.http(), &host, "/").await;
    assert_eq!(response.status, 200, "{}", response.text());

    dns.set_failing(true);
    let before = dns.query_count(API_HOST);
    // Wait until egressd has re-resolved at least twice against the failing server (the
    // resolver may retry a SERVFAIL, so two queries might be one attempt; three is safe).
    eventually(
        "egressd did not re-resolve after the TTL ran out",
        Duration::from_secs(15),
        || async { dns.query_count(API_HOST) >= before + 3 },
    )
    .await;

    for _ in 0..3 {
        let response = get(proxy.http(), &host, "/").await;
        assert_eq!(
            response.status,
            200,
            "{:?} {}",
            response.error_code(),
            response.text()
        );
        assert_eq!(response.upstream(), Some("api"));
    }
}

#[tokio::test]
async fn fqdn_backend_follows_a_changed_address_after_the_ttl() {
    let dns = TestDns::start().await;
    let port = common::ports::shared_port();
    let first = Upstream::start_on("first", (Ipv4Addr::LOCALHOST, port).into()).await;
    // The same port on another loopback address stands for the host's new address.
    let moved: SocketAddr = (Ipv4Addr::new(127, 0, 0, 2), port).into();
    let second = Upstream::start_on("second", moved).await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 1);
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[port], "");
    let proxy = TestProxy::start(&yaml).await;
    let host = format!("{API_HOST}:{port}");

    let response = get(proxy.http(), &host, "/").await;
    assert_eq!(response.upstream(), Some("first"), "{}", response.text());

    dns.set(API_HOST, &[Ipv4Addr::new(127, 0, 0, 2)], 1);
    eventually(
        "still not routed to the new address 10s after a 1s TTL",
        Duration::from_secs(10),
        || async { get(proxy.http(), &host, "/").await.upstream() == Some("second") },
    )
    .await;
    // Once moved, it stays moved: the old address is no longer an endpoint.
    let before = first.request_count();
    for _ in 0..5 {
        let response = get(proxy.http(), &host, "/").await;
        assert_eq!(response.upstream(), Some("second"));
    }
    assert_eq!(first.request_count(), before);
    assert!(second.request_count() >= 6);
}

/// W3C trace context passes through untouched, so the upstream's spans join the client's
/// trace (egressd adds no span of its own in this build).
#[tokio::test]
async fn trace_context_headers_pass_through_unchanged() {
    let upstream = Upstream::start("app").await;
    let yaml =
        preamble(None) + &ip_backend("app", upstream.addr, "") + &route_to("app.test", "app");
    let proxy = TestProxy::start(&yaml).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tracestate = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
    let req = request("GET", "app.test", "/")
        .header("traceparent", traceparent)
        .header("tracestate", tracestate)
        .header("baggage", "userId=alice")
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = upstream.last_request().headers;
    assert_eq!(seen["traceparent"], traceparent);
    assert_eq!(seen["tracestate"], tracestate);
    assert_eq!(seen["baggage"], "userId=alice");
}
