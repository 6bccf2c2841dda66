//! Websockets from HTTP/2 clients (RFC 8441 extended CONNECT, over h2c) through egressd to an
//! HTTP/1.1 websocket upstream: egressd routes the CONNECT as the GET it stands for, does the
//! HTTP/1.1 handshake with a key of its own, checks the upstream's answer and answers the
//! client `200`; then messages, pings and closes pass both ways.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::proxy::{collect, ip_backend, preamble, Response, TestProxy};
use common::upstream::{read_request_head, RawUpstream, Upstream};
use common::websocket::EchoServer;
use futures_util::{SinkExt, StreamExt};
use http_body_util::Empty;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const STEP: Duration = Duration::from_secs(10);

/// A Backend `echo` at `upstream` (with `policy` appended to its spec) and a route that
/// matches only `GET /chat` on `ws.test`: an extended CONNECT must be routed as that GET.
fn config(upstream: SocketAddr, policy: &str) -> String {
    preamble(None)
        + &ip_backend("echo", upstream, policy)
        + r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ws}
spec:
  hostnames: [ws.test]
  rules:
  - matches: [{method: GET, path: {type: Exact, value: /chat}}]
    backendRefs: [{name: echo}]
"#
}

/// An HTTP/2 connection to egressd (h2c, prior knowledge).
async fn h2(proxy: &TestProxy) -> SendRequest<Empty<Bytes>> {
    let tcp = TcpStream::connect(proxy.http()).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    send
}

/// `CONNECT` with `:protocol` (RFC 8441 §4) for `uri`, with extra headers.
fn extended_connect(
    protocol: &'static str,
    uri: &str,
    headers: &[(&str, &str)],
) -> http::Request<Empty<Bytes>> {
    let mut request = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(uri)
        .header("sec-websocket-version", "13");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(Empty::new()).unwrap();
    request
        .extensions_mut()
        .insert(hyper::ext::Protocol::from_static(protocol));
    request
}

async fn send(
    send: &mut SendRequest<Empty<Bytes>>,
    request: http::Request<Empty<Bytes>>,
) -> http::Response<hyper::body::Incoming> {
    tokio::time::timeout(STEP, send.send_request(request))
        .await
        .expect("in time")
        .expect("a response")
}

/// Opens a websocket to `ws.test/chat` over HTTP/2; returns egressd's answer's headers and the
/// websocket.
async fn open(
    proxy: &TestProxy,
    headers: &[(&str, &str)],
) -> (
    http::HeaderMap,
    WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
) {
    let mut client = h2(proxy).await;
    let response = send(
        &mut client,
        extended_connect("websocket", "http://ws.test/chat", headers),
    )
    .await;
    assert_eq!(response.status(), 200, "{response:?}");
    let headers = response.headers().clone();
    let upgraded = hyper::upgrade::on(response).await.expect("upgraded stream");
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    (headers, ws)
}

async fn answer(
    send_to: &mut SendRequest<Empty<Bytes>>,
    request: http::Request<Empty<Bytes>>,
) -> Response {
    collect(send(send_to, request).await).await
}

#[tokio::test]
async fn text_binary_ping_and_close_code_pass_through_over_http2() {
    let upstream = EchoServer::start().await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let (headers, mut ws) = open(&proxy, &[]).await;
    for name in ["sec-websocket-accept", "connection", "upgrade"] {
        assert!(
            headers.get(name).is_none(),
            "{name} in the 200: {headers:?}"
        );
    }

    common::websocket::echo_text_binary_ping_and_close(&mut ws).await;
}

#[tokio::test]
async fn upstream_gets_an_http1_upgrade_with_a_fresh_key_and_the_clients_headers() {
    let upstream = EchoServer::start().await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let offered = [
        ("sec-websocket-protocol", "chat, superchat"),
        ("sec-websocket-extensions", "x-test-extension"),
    ];
    let (headers, _ws) = open(&proxy, &offered).await;
    // The subprotocol the upstream picked comes back to the client.
    assert_eq!(headers.get("sec-websocket-protocol").unwrap(), "chat");
    let (_, _second) = open(&proxy, &offered).await;

    let seen = upstream.handshakes();
    assert_eq!(seen.len(), 2);
    // tungstenite accepts only an HTTP/1.1 GET: the handshake succeeding says that much.
    let first = seen[0].headers();
    assert_eq!(seen[0].uri(), "/chat");
    assert_eq!(first.get("host").unwrap(), "ws.test");
    assert_eq!(first.get("upgrade").unwrap(), "websocket");
    assert_eq!(first.get("connection").unwrap(), "upgrade");
    assert_eq!(first.get("sec-websocket-version").unwrap(), "13");
    assert_eq!(
        first.get("sec-websocket-protocol").unwrap(),
        "chat, superchat"
    );
    assert_eq!(
        first.get("sec-websocket-extensions").unwrap(),
        "x-test-extension"
    );
    assert_eq!(first.get("via").unwrap(), "2 egressd");
    let key = |i: usize| seen[i].headers().get("sec-websocket-key").unwrap().clone();
    assert_eq!(key(0).len(), 24, "16 bytes in base64: {:?}", key(0));
    assert_ne!(key(0), key(1), "a fresh key per websocket");
}

#[tokio::test]
async fn extended_connect_is_routed_as_its_get() {
    let upstream = EchoServer::start().await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let mut client = h2(&proxy).await;
    // The route matches only GET /chat: another path of the same host has no route.
    let other = answer(
        &mut client,
        extended_connect("websocket", "http://ws.test/elsewhere", &[]),
    )
    .await;
    assert_eq!(other.status, 404);
    assert_eq!(other.error_code(), Some("no_route"));
    assert!(upstream.handshakes().is_empty());
}

#[tokio::test]
async fn declined_upgrade_is_passed_back_with_its_status() {
    let upstream = Upstream::start_with(|_req| async {
        http::Response::builder()
            .status(403)
            .body(common::upstream::full("no websockets here"))
            .unwrap()
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let mut client = h2(&proxy).await;
    let response = answer(
        &mut client,
        extended_connect("websocket", "http://ws.test/chat", &[]),
    )
    .await;
    assert_eq!(response.status, 403);
    assert_eq!(response.text(), "no websockets here");
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, http::Method::GET);
    assert_eq!(seen[0].version, http::Version::HTTP_11);
    assert_eq!(seen[0].headers.get("upgrade").unwrap(), "websocket");
    assert!(seen[0].headers.contains_key("sec-websocket-key"));
}

#[tokio::test]
async fn upstream_that_ignores_the_upgrade_is_a_bad_gateway() {
    // A 200 page: passed on, it would tell the HTTP/2 client its websocket is open.
    let upstream = Upstream::start("plain").await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let mut client = h2(&proxy).await;
    let response = answer(
        &mut client,
        extended_connect("websocket", "http://ws.test/chat", &[]),
    )
    .await;
    assert_eq!(response.status, 502);
    assert_eq!(response.error_code(), Some("upstream_protocol_error"));
    assert!(response.text().contains("not 101"), "{}", response.text());
}

#[tokio::test]
async fn wrong_sec_websocket_accept_is_a_bad_gateway() {
    let upstream = RawUpstream::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        let _ = stream
            .write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                  Connection: Upgrade\r\nSec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n",
            )
            .await;
        // Keep the connection open: egressd must refuse on the header alone.
        let mut rest = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut rest).await;
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let mut client = h2(&proxy).await;
    let response = answer(
        &mut client,
        extended_connect("websocket", "http://ws.test/chat", &[]),
    )
    .await;
    assert_eq!(response.status, 502);
    assert_eq!(response.error_code(), Some("upstream_protocol_error"));
    assert!(
        response.text().contains("Sec-WebSocket-Accept"),
        "{}",
        response.text()
    );
}

#[tokio::test]
async fn http_upgrade_policy_without_websocket_refuses_extended_connect() {
    let upstream = Upstream::start("plain").await;
    let proxy = TestProxy::start(&config(
        upstream.addr,
        "  trafficPolicy:\n    httpUpgrade: []\n",
    ))
    .await;
    let mut client = h2(&proxy).await;
    let response = answer(
        &mut client,
        extended_connect("websocket", "http://ws.test/chat", &[]),
    )
    .await;
    assert_eq!(response.status, 403);
    assert_eq!(response.error_code(), Some("upgrade_not_allowed"));
    assert_eq!(upstream.request_count(), 0, "nothing reaches the upstream");
}

#[tokio::test]
async fn extended_connect_for_another_protocol_is_not_supported() {
    let upstream = Upstream::start("plain").await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let mut client = h2(&proxy).await;
    let response = answer(
        &mut client,
        extended_connect("connect-udp", "http://ws.test/chat", &[]),
    )
    .await;
    assert_eq!(response.status, 501);
    assert_eq!(response.error_code(), Some("not_supported"));
    assert_eq!(upstream.request_count(), 0);
}

/// A sample of `/metrics` by exact series name.
async fn metric(proxy: &TestProxy, series: &str) -> Option<f64> {
    let text = common::proxy::get(proxy.admin, "127.0.0.1", "/metrics")
        .await
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
}

/// The relay is the HTTP/1.1 websockets' own: counted per backend, and untouched by reloads.
#[tokio::test]
async fn http2_websocket_is_counted_and_survives_a_reload() {
    let upstream = EchoServer::start().await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let active = "egressd_websockets_active{backend=\"default/echo\"}";
    let (_, mut ws) = open(&proxy, &[]).await;
    ws.send(Message::text("before")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("before"));
    common::eventually("one active websocket counted", STEP, || async {
        metric(&proxy, active).await == Some(1.0)
    })
    .await;

    proxy.reload().await;
    ws.send(Message::text("after")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("after"));

    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    drop(ws);
    common::eventually("no active websocket counted", STEP, || async {
        metric(&proxy, active).await == Some(0.0)
    })
    .await;
    let up = metric(
        &proxy,
        "egressd_websocket_bytes_total{backend=\"default/echo\",direction=\"upstream\"}",
    )
    .await;
    assert!(up.is_some_and(|b| b > 0.0), "bytes counted: {up:?}");
}
