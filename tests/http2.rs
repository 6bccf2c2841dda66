//! HTTP/2 through egressd, both ways: HTTP/1.1 clients to HTTP/2 upstreams (h2c and TLS with
//! ALPN), HTTP/2 clients to HTTP/1.1 upstreams, many streams on one upstream connection,
//! trailers, GOAWAY and refused streams.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::h2::{self as h2peer, H2Options, H2Upstream, RefusingUpstream};
use common::proxy::{collect, fetch, get, preamble, request, TestProxy};
use common::tls::{San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::{count_body, full, BoxBody, Upstream};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};

const HOST: &str = "api.h2.test";

/// A Backend `api` with one IP endpoint, `protocol` and a `tls` block (indented YAML lines).
fn backend(addr: SocketAddr, protocol: &str, tls: &str, extra: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: api
spec:
  destination:
    type: IP
    ip:
      endpoints:
      - address: {ip}
    ports:
    - number: {port}
  protocol: {protocol}
  tls:
{tls}
{extra}"#,
        ip = addr.ip(),
        port = addr.port(),
    )
}

const PLAINTEXT: &str = "    mode: InsecureDisable";

fn route() -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: api}}]}}]\n"
    )
}

async fn proxy_to(backend_yaml: &str) -> TestProxy {
    TestProxy::start(&(preamble(None) + backend_yaml + &route())).await
}

/// Answers 200 with the request's version and path in headers and `name` as the body.
async fn echo_version(request: http::Request<Incoming>) -> http::Response<BoxBody> {
    let version = format!("{:?}", request.version());
    let path = request.uri().path().to_owned();
    let _ = count_body(request.into_body()).await;
    http::Response::builder()
        .header("x-version", version)
        .header("x-path", path)
        .body(full("h2 upstream"))
        .unwrap()
}

fn h2_get(path: &str) -> http::Request<h2peer::ClientBody> {
    http::Request::builder()
        .method("GET")
        .uri(format!("http://{HOST}{path}"))
        .body(h2peer::body(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn http1_client_reaches_h2c_backends_by_prior_knowledge() {
    for protocol in ["H2C", "HTTP2", "GRPC"] {
        let upstream = H2Upstream::start(H2Options::default(), echo_version).await;
        let proxy = proxy_to(&backend(upstream.addr, protocol, PLAINTEXT, "")).await;

        let response = get(proxy.http(), HOST, "/hello?x=1").await;
        assert_eq!(response.status, 200, "{protocol}: {}", response.text());
        assert_eq!(response.text(), "h2 upstream");
        assert_eq!(response.header("x-version"), Some("HTTP/2.0"), "{protocol}");

        let seen = upstream.requests();
        assert_eq!(seen.len(), 1);
        // `:scheme`, `:authority` and `:path` (hyper shows them as an absolute URI); the
        // client's Host became `:authority`.
        assert_eq!(
            seen[0].uri,
            format!("http://{HOST}/hello?x=1"),
            "{protocol}"
        );
        assert!(!seen[0].headers.contains_key("connection"));
        assert_eq!(seen[0].headers.get("via").unwrap(), "1.1 egressd");
    }
}

/// A TLS upstream (rcgen CA) offering `alpn`, and the Backend's `tls` block trusting that CA.
async fn tls_upstream(alpn: &[&[u8]]) -> (TlsUpstream, String, TestCa, tempfile::TempDir) {
    let ca = TestCa::new("h2 test CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_pem(dir.path());
    let options = TlsOptions {
        alpn: alpn.iter().map(|p| p.to_vec()).collect(),
        ..TlsOptions::default()
    };
    let upstream = TlsUpstream::start("api", ca.server_cert(&[San::dns(HOST)]), options).await;
    let tls = format!(
        "    mode: Simple\n    sni: {HOST}\n    validation:\n      caCertificateFiles: [\"{}\"]",
        ca_file.display()
    );
    (upstream, tls, ca, dir)
}

#[tokio::test]
async fn http1_client_reaches_an_http2_backend_over_tls_by_alpn() {
    let (upstream, tls, _ca, _dir) = tls_upstream(&[b"h2", b"http/1.1"]).await;
    let proxy = proxy_to(&backend(upstream.addr, "HTTP2", &tls, "")).await;

    for _ in 0..3 {
        let response = get(proxy.http(), HOST, "/").await;
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.text(), "api");
    }
    assert_eq!(upstream.offered_alpns(), vec![vec!["h2".to_owned()]]);
    assert_eq!(upstream.alpns(), vec![Some("h2".to_owned())]);
    assert!(upstream
        .requests()
        .iter()
        .all(|r| r.version == http::Version::HTTP_2));
    // Three requests, one connection: HTTP/2 connections are shared.
    assert_eq!(upstream.handshake_count(), 1);
}

#[tokio::test]
async fn an_http2_backend_whose_server_refuses_h2_is_a_tls_failure() {
    // The server speaks only http/1.1: ALPN `h2` alone cannot be agreed on.
    let (upstream, tls, _ca, _dir) = tls_upstream(&[b"http/1.1"]).await;
    let proxy = proxy_to(&backend(upstream.addr, "HTTP2", &tls, "")).await;
    let response = get(proxy.http(), HOST, "/").await;
    assert_eq!(response.status, 502, "{}", response.text());
    assert_eq!(response.error_code(), Some("upstream_tls_failure"));
}

#[tokio::test]
async fn protocol_http_over_tls_speaks_what_alpn_chose() {
    // A server that takes h2: requests go over HTTP/2.
    let (h2_server, tls, _ca, _dir) = tls_upstream(&[b"h2", b"http/1.1"]).await;
    let proxy = proxy_to(&backend(h2_server.addr, "HTTP", &tls, "")).await;
    for _ in 0..2 {
        assert_eq!(get(proxy.http(), HOST, "/").await.status, 200);
    }
    assert_eq!(
        h2_server.offered_alpns()[0],
        vec!["h2".to_owned(), "http/1.1".to_owned()]
    );
    assert_eq!(h2_server.alpns()[0], Some("h2".to_owned()));
    assert!(h2_server
        .requests()
        .iter()
        .all(|r| r.version == http::Version::HTTP_2));

    // A server that only speaks HTTP/1.1: requests go over pooled HTTP/1.1 connections.
    let (h1_server, tls, _ca, _dir) = tls_upstream(&[b"http/1.1"]).await;
    let proxy = proxy_to(&backend(h1_server.addr, "HTTP", &tls, "")).await;
    for _ in 0..3 {
        assert_eq!(get(proxy.http(), HOST, "/").await.status, 200);
    }
    assert_eq!(h1_server.alpns()[0], Some("http/1.1".to_owned()));
    assert!(h1_server
        .requests()
        .iter()
        .all(|r| r.version == http::Version::HTTP_11));
    assert_eq!(h1_server.handshake_count(), 1, "HTTP/1.1 connection reused");

    // A burst at a fresh endpoint that turns out to speak HTTP/1.1: the requests that waited
    // for the first connection's ALPN take HTTP/1.1 connections of their own.
    let (h1_server, tls, _ca, _dir) = tls_upstream(&[b"http/1.1"]).await;
    let proxy = proxy_to(&backend(h1_server.addr, "HTTP", &tls, "")).await;
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..20 {
        let addr = proxy.http();
        burst.spawn(async move { get(addr, HOST, &format!("/{i}")).await.status });
    }
    while let Some(status) = burst.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    assert_eq!(h1_server.request_count(), 20);
    assert!(h1_server
        .alpns()
        .iter()
        .all(|a| a.as_deref() == Some("http/1.1")));
}

#[tokio::test]
async fn http2_client_reaches_an_http1_backend() {
    let upstream = Upstream::start("h1").await;
    let proxy = proxy_to(&backend(upstream.addr, "HTTP", PLAINTEXT, "")).await;

    let mut client = h2peer::client(proxy.http()).await;
    let response = client.send_request(h2_get("/from-h2")).await.unwrap();
    let response = collect(response).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.text(), "h1");

    let seen = upstream.last_request();
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(seen.uri, "/from-h2");
    // `:authority` became Host.
    assert_eq!(seen.headers.get("host").unwrap(), HOST);
    assert_eq!(seen.headers.get("via").unwrap(), "2 egressd");
}

/// An h2c upstream advertising `max_streams` whose handlers all wait until `n` requests are
/// in flight at once, then answer: a test passes only if the requests really were concurrent.
async fn held_until_all_arrive(n: usize, max_streams: u32) -> H2Upstream {
    let arrived = Arc::new(AtomicUsize::new(0));
    let all_in = Arc::new(tokio::sync::Notify::new());
    H2Upstream::start(
        H2Options {
            max_concurrent_streams: max_streams,
            ..H2Options::default()
        },
        move |request| {
            let (arrived, all_in) = (arrived.clone(), all_in.clone());
            async move {
                let waiting = all_in.notified();
                if arrived.fetch_add(1, Ordering::SeqCst) + 1 == n {
                    all_in.notify_waiters();
                } else {
                    waiting.await;
                }
                echo_version(request).await
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_thousand_concurrent_streams_share_one_upstream_connection() {
    const STREAMS: usize = 1000;
    // Every handler waits until all 1,000 requests are in flight at the upstream at once.
    let upstream = held_until_all_arrive(STREAMS, 2000).await;
    // One client connection carrying all 1,000 streams at once (egressd admits that many).
    let yaml = preamble(None).replace(
        "  accessLog:",
        "  downstream:\n    http2:\n      maxConcurrentStreams: 1000\n  accessLog:",
    ) + &backend(upstream.addr, "H2C", PLAINTEXT, "")
        + &route();
    let proxy = TestProxy::start(&yaml).await;
    let client = h2peer::client(proxy.http()).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let mut client = client.clone();
        calls.spawn(async move {
            let response = client.send_request(h2_get(&format!("/{i}"))).await?;
            let status = response.status();
            response.into_body().collect().await?;
            Ok::<_, hyper::Error>(status)
        });
    }
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        let mut ok = 0;
        while let Some(result) = calls.join_next().await {
            if result.unwrap().unwrap() == 200 {
                ok += 1;
            }
        }
        ok
    })
    .await
    .expect("all streams answered (every one was in flight at once)");
    assert_eq!(outcome, STREAMS);
    assert_eq!(upstream.request_count(), STREAMS);
    assert_eq!(upstream.connection_count(), 1, "one multiplexed connection");
}

#[tokio::test]
async fn a_full_connection_makes_egressd_open_another() {
    // The server admits 10 streams per connection; 30 requests held at once need three.
    const STREAMS: usize = 30;
    let upstream = held_until_all_arrive(STREAMS, 10).await;
    let proxy = proxy_to(&backend(upstream.addr, "H2C", PLAINTEXT, "")).await;
    let client = h2peer::client(proxy.http()).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let mut client = client.clone();
        calls.spawn(async move {
            let response = client.send_request(h2_get(&format!("/{i}"))).await?;
            Ok::<_, hyper::Error>(response.status())
        });
    }
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(result) = calls.join_next().await {
            assert_eq!(result.unwrap().unwrap(), 200);
        }
    })
    .await
    .expect("all 30 in flight at once across connections");
    assert_eq!(upstream.connection_count(), 3);
}

/// Reads the request body and its trailers, and answers with a body and trailers of its own.
async fn trailer_echo(request: http::Request<Incoming>) -> http::Response<BoxBody> {
    let collected = request.into_body().collect().await.unwrap();
    let request_trailer = collected
        .trailers()
        .and_then(|t| t.get("x-request-checksum"))
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_else(|| "missing".to_owned());
    let body_len = collected.to_bytes().len();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-response-checksum", "abc123".parse().unwrap());
    trailers.insert("x-saw-request-trailer", request_trailer.parse().unwrap());
    let frames = vec![
        Ok::<_, std::io::Error>(Frame::data(Bytes::from(format!("got {body_len} bytes")))),
        Ok(Frame::trailers(trailers)),
    ];
    // HTTP/1.1 clients get only the trailer fields announced here (hyper's encoder, and RFC
    // 9110 §6.6.2's SHOULD); HTTP/2 clients get every one.
    http::Response::builder()
        .header("trailer", "x-response-checksum, x-saw-request-trailer")
        .body(http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap()
}

#[tokio::test]
async fn trailers_round_trip_between_http2_client_and_http2_backend() {
    let upstream = H2Upstream::start(H2Options::default(), trailer_echo).await;
    let proxy = proxy_to(&backend(upstream.addr, "H2C", PLAINTEXT, "")).await;

    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-request-checksum", "r-42".parse().unwrap());
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{HOST}/upload"))
        .body(h2peer::body_with_trailers(b"payload", trailers))
        .unwrap();
    let mut client = h2peer::client(proxy.http()).await;
    let response = client.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("response trailers");
    assert_eq!(collected.to_bytes(), "got 7 bytes");
    assert_eq!(trailers.get("x-response-checksum").unwrap(), "abc123");
    assert_eq!(trailers.get("x-saw-request-trailer").unwrap(), "r-42");
}

#[tokio::test]
async fn trailers_reach_an_http1_client_that_accepts_them() {
    let upstream = H2Upstream::start(H2Options::default(), trailer_echo).await;
    let proxy = proxy_to(&backend(upstream.addr, "H2C", PLAINTEXT, "")).await;

    let request = request("POST", HOST, "/upload")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from_static(b"12345")))
        .unwrap();
    let mut conn = common::proxy::Conn::open(proxy.http()).await;
    let response = conn.send(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("chunked trailers");
    assert_eq!(collected.to_bytes(), "got 5 bytes");
    assert_eq!(trailers.get("x-response-checksum").unwrap(), "abc123");
    // The upstream saw `te: trailers` (it is what HTTP/2 allows, RFC 9113 §8.2.2).
    assert_eq!(
        upstream.requests()[0].headers.get("te").unwrap(),
        "trailers"
    );
}

#[tokio::test]
async fn goaway_under_load_loses_no_request() {
    // Every upstream connection is shut down gracefully (GOAWAY) after 50 requests.
    let upstream = H2Upstream::start(
        H2Options {
            goaway_after: Some(50),
            ..H2Options::default()
        },
        echo_version,
    )
    .await;
    let proxy = proxy_to(&backend(upstream.addr, "H2C", PLAINTEXT, "")).await;

    const CLIENTS: usize = 20;
    const PER_CLIENT: usize = 50;
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let addr = proxy.http();
        clients.spawn(async move {
            let mut conn = common::proxy::Conn::open(addr).await;
            let mut failures = Vec::new();
            for i in 0..PER_CLIENT {
                let response = conn
                    .fetch(
                        request("GET", HOST, &format!("/{c}/{i}"))
                            .body(Default::default())
                            .unwrap(),
                    )
                    .await;
                if response.status != 200 {
                    failures.push(format!("{} {}", response.status, response.text()));
                }
            }
            failures
        });
    }
    let mut failures = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(result) = clients.join_next().await {
            failures.extend(result.unwrap());
        }
    })
    .await
    .expect("load finished");
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        upstream.goaway_count() >= 10,
        "the server sent GOAWAY on {} connections",
        upstream.goaway_count()
    );
}

#[tokio::test]
async fn refused_streams_are_sent_again() {
    let upstream = RefusingUpstream::start().await;
    let proxy = proxy_to(&backend(upstream.addr, "H2C", PLAINTEXT, "")).await;
    for i in 0..10 {
        let response = get(proxy.http(), HOST, &format!("/{i}")).await;
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.text(), "ok");
    }
    assert_eq!(upstream.served(), 10);
    assert!(upstream.refused() >= 5, "refused {}", upstream.refused());
}

#[tokio::test]
async fn an_h2c_backend_that_speaks_http1_is_a_protocol_error() {
    let upstream = Upstream::start("h1 only").await;
    let proxy = proxy_to(&backend(upstream.addr, "H2C", PLAINTEXT, "")).await;
    let response = fetch(
        proxy.http(),
        request("GET", HOST, "/").body(Default::default()).unwrap(),
    )
    .await;
    assert_eq!(response.status, 502, "{}", response.text());
    assert_eq!(response.error_code(), Some("upstream_protocol_error"));
}

/// A TCP relay to `target` that can be frozen: bytes stop moving both ways while the sockets
/// stay open, as behind a NAT that dropped its mapping or a host that vanished.
struct FreezableRelay {
    addr: SocketAddr,
    frozen: Arc<std::sync::atomic::AtomicBool>,
    accept: tokio::task::JoinHandle<()>,
}

impl FreezableRelay {
    async fn start(target: SocketAddr) -> FreezableRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = frozen.clone();
        let accept = tokio::spawn(async move {
            let mut relays = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                relays.spawn(pump(client_read, server_write, f.clone()));
                relays.spawn(pump(server_read, client_write, f.clone()));
            }
        });
        FreezableRelay {
            addr,
            frozen,
            accept,
        }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

impl Drop for FreezableRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        if frozen.load(Ordering::SeqCst) {
            // Hold everything, close nothing.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn keepalive_pings_end_a_connection_whose_peer_went_silent() {
    // The upstream holds every response; the connection then goes silent. With PINGs every
    // 200 ms answered within 300 ms, egressd gives up on the connection in about half a
    // second; without them the request would wait for the 5-minute stream idle timeout.
    let upstream = H2Upstream::start(H2Options::default(), |_request| async {
        std::future::pending::<()>().await;
        unreachable!()
    })
    .await;
    let relay = FreezableRelay::start(upstream.addr).await;
    let keepalive = "  trafficPolicy:\n    http2:\n      connectionKeepalive: {interval: 200ms, timeout: 300ms}\n";
    let proxy = proxy_to(&backend(relay.addr, "H2C", PLAINTEXT, keepalive)).await;

    let addr = proxy.http();
    let call = tokio::spawn(async move { get(addr, HOST, "/held").await });
    common::eventually(
        "the request reached the upstream",
        Duration::from_secs(5),
        || async { upstream.request_count() == 1 },
    )
    .await;
    relay.freeze();
    let response = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("egressd noticed the dead connection")
        .unwrap();
    assert_eq!(response.status, 502, "{}", response.text());
    assert_eq!(response.error_code(), Some("upstream_reset"));
}

/// An h2c gRPC upstream: the first call of each path fails UNAVAILABLE (trailers-only), the
/// next one succeeds (trailers-only OK).
async fn unavailable_once() -> H2Upstream {
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    H2Upstream::start(H2Options::default(), move |request| {
        let first = seen.lock().unwrap().insert(request.uri().path().to_owned());
        async move {
            let _ = count_body(request.into_body()).await;
            http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", if first { "14" } else { "0" })
                .body(full(Bytes::new()))
                .unwrap()
        }
    })
    .await
}

/// A unary call with a body of known length (so it can be replayed); its `grpc-status`.
async fn grpc_call(proxy: &TestProxy, path: &str) -> Option<String> {
    let mut client = h2peer::client(proxy.http()).await;
    let message = Bytes::from_static(b"\0\0\0\0\x02hi");
    let request = http::Request::post(format!("http://{HOST}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("content-length", message.len())
        .body(h2peer::body(message))
        .unwrap();
    let response = client.send_request(request).await.unwrap();
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_grpc_status_named_in_retry_on_is_retried() {
    let upstream = unavailable_once().await;
    let retry = "  trafficPolicy:\n    retry: {numRetries: 1, retryOn: {triggers: [unavailable]}, perRetry: {backOff: {baseInterval: 1ms, maxInterval: 2ms}}}\n";
    let proxy = proxy_to(&backend(upstream.addr, "GRPC", PLAINTEXT, retry)).await;
    let status = grpc_call(&proxy, "/svc/Retried").await;
    assert_eq!(status.as_deref(), Some("0"), "UNAVAILABLE was retried");
    assert_eq!(upstream.request_count(), 2);
    drop(proxy);

    // Without the trigger (the default triggers name no gRPC status), the error stands.
    let upstream = unavailable_once().await;
    let proxy = proxy_to(&backend(
        upstream.addr,
        "GRPC",
        PLAINTEXT,
        "  trafficPolicy:\n    retry: {numRetries: 1}\n",
    ))
    .await;
    let status = grpc_call(&proxy, "/svc/NotRetried").await;
    assert_eq!(status.as_deref(), Some("14"));
    assert_eq!(upstream.request_count(), 1);
}
