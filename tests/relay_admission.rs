//! Websockets and tunnels go through the same phases as requests: a websocket upgrade carries
//! the Backend's injected credential, and websockets, CONNECT tunnels and TLS passthrough
//! connections count in the circuit breaker (`maxParallelRequests`, `maxConnections`) for as
//! long as they are open; beyond a limit they are turned away at once and counted.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::dns::TestDns;
use common::eventually;
use common::outlier::metric;
use common::proxy::{ip_backend, preamble, TestProxy};
use common::tls::{passthrough_rejected, San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::Upstream;
use common::websocket::EchoServer;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};

const WS_HOST: &str = "ws.test";
const TUNNEL_HOST: &str = "api.tunnel.test";

fn ws_route() -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: ws}}\nspec:\n  hostnames: [{WS_HOST}]\n  rules: [{{backendRefs: [{{name: echo}}]}}]\n"
    )
}

fn overflows(backend: &str, limit: &str) -> String {
    format!(
        r#"egressd_circuit_breaker_overflows_total{{backend="default/{backend}",reason="{limit}"}}"#
    )
}

/// A websocket handshake through egressd: the open websocket, or the refusal's status and
/// `x-egressd-error`.
async fn open_ws(
    proxy: &TestProxy,
    authorization: Option<&str>,
) -> Result<tokio_tungstenite::WebSocketStream<TcpStream>, (u16, Option<String>)> {
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let mut request =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{WS_HOST}/chat"))
            .unwrap();
    if let Some(value) = authorization {
        request
            .headers_mut()
            .insert("authorization", value.parse().unwrap());
    }
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((ws, response)) => {
            assert_eq!(response.status(), 101);
            Ok(ws)
        }
        Err(tungstenite::Error::Http(response)) => Err((
            response.status().as_u16(),
            response
                .headers()
                .get("x-egressd-error")
                .map(|v| v.to_str().unwrap().to_owned()),
        )),
        Err(other) => panic!("websocket handshake: {other}"),
    }
}

async fn echo(ws: &mut tokio_tungstenite::WebSocketStream<TcpStream>, text: &str) {
    ws.send(Message::text(text.to_owned())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::text(text.to_owned())
    );
}

#[tokio::test]
async fn a_websocket_upgrade_carries_the_backends_credential() {
    // The OpenAI Realtime API case: a `wss` endpoint that wants `Authorization`, which the
    // application never holds.
    let upstream = EchoServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("api.key");
    std::fs::write(&key, "s3cret\n").unwrap();
    let extension = format!(
        "  extensions:\n  - name: api-key\n    type: CredentialInjector\n    config: {{header: Authorization, prefix: \"Bearer \", credential: {{valueFile: {}}}}}\n",
        key.display()
    );
    let proxy = TestProxy::start(
        &(preamble(None) + &ip_backend("echo", upstream.addr, &extension) + &ws_route()),
    )
    .await;

    let mut ws = open_ws(&proxy, Some("Bearer app-token"))
        .await
        .expect("opens");
    echo(&mut ws, "hello").await;
    let handshakes = upstream.handshakes();
    assert_eq!(handshakes.len(), 1);
    let sent: Vec<_> = handshakes[0]
        .headers()
        .get_all("authorization")
        .iter()
        .collect();
    assert_eq!(
        sent,
        ["Bearer s3cret"],
        "the credential replaced the client's"
    );
}

/// egressd with a websocket Backend whose circuit breaker is `breaker`.
async fn ws_setup(breaker: &str) -> (TestProxy, EchoServer) {
    let upstream = EchoServer::start().await;
    let policy = format!("  trafficPolicy: {{circuitBreaker: {{{breaker}}}}}\n");
    let proxy = TestProxy::start(
        &(preamble(None) + &ip_backend("echo", upstream.addr, &policy) + &ws_route()),
    )
    .await;
    (proxy, upstream)
}

/// One websocket open at `limit` 1: the next is refused with 503 `overflow` and counted; once
/// the first closes, a new one opens.
async fn websockets_hold_a_slot_while_open(breaker: &str, limit: &str) {
    let (proxy, upstream) = ws_setup(breaker).await;
    let mut first = open_ws(&proxy, None)
        .await
        .expect("the first websocket opens");
    echo(&mut first, "one").await;

    let refused = open_ws(&proxy, None)
        .await
        .expect_err("the second is refused");
    assert_eq!(refused, (503, Some("overflow".to_owned())));
    assert_eq!(metric(&proxy, &overflows("echo", limit)).await, 1.0);
    assert_eq!(
        upstream.handshakes().len(),
        1,
        "the refused one never reached the upstream"
    );

    // Still open and working: the slot is the first websocket's until it closes.
    echo(&mut first, "still here").await;
    first.close(None).await.unwrap();
    while first.next().await.is_some() {}
    drop(first);
    eventually(
        "the slot came back when the websocket closed",
        Duration::from_secs(5),
        || async { open_ws(&proxy, None).await.is_ok() },
    )
    .await;
}

#[tokio::test]
async fn websockets_count_in_max_parallel_requests() {
    websockets_hold_a_slot_while_open("maxParallelRequests: 1", "max_parallel_requests").await;
}

#[tokio::test]
async fn websockets_count_in_max_connections() {
    websockets_hold_a_slot_while_open("maxConnections: 1", "max_connections").await;
}

fn tcp_backend(port: u16, breaker: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: plain
spec:
  destination:
    type: FQDN
    fqdn:
      hostname: {TUNNEL_HOST}
      allowedAddresses: [127.0.0.0/8]
    ports:
    - number: {port}
  protocol: TCP
  tls:
    mode: InsecureDisable
  trafficPolicy:
    circuitBreaker: {{{breaker}}}
"#
    )
}

/// `CONNECT target`: the status, the head, and the connection (a tunnel on 200).
async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = stream.read(&mut byte).await.unwrap();
        assert_eq!(
            n,
            1,
            "closed before answering: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    (head[9..12].parse().unwrap(), head, stream)
}

/// One GET through an open tunnel, on a connection the upstream keeps open.
async fn get_through(tunnel: &mut TcpStream) {
    let request = format!("GET /raw HTTP/1.1\r\nHost: {TUNNEL_HOST}\r\n\r\n");
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let mut reply = vec![0u8; 1024];
    let n = tunnel.read(&mut reply).await.unwrap();
    assert!(
        reply[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&reply[..n])
    );
}

async fn tunnels_hold_a_slot_while_open(breaker: &str, limit: &str) {
    let dns = TestDns::start().await;
    dns.set(TUNNEL_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("plain").await;
    let port = upstream.addr.port();
    let proxy = TestProxy::start(&(preamble(Some(dns.addr)) + &tcp_backend(port, breaker))).await;
    let target = format!("{TUNNEL_HOST}:{port}");

    let (status, head, mut first) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "{head}");
    get_through(&mut first).await;

    let (status, head, _refused) = connect(proxy.http(), &target).await;
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("x-egressd-error: overflow"), "{head}");
    assert_eq!(metric(&proxy, &overflows("plain", limit)).await, 1.0);

    get_through(&mut first).await;
    drop(first);
    eventually(
        "the slot came back when the tunnel closed",
        Duration::from_secs(5),
        || async { connect(proxy.http(), &target).await.0 == 200 },
    )
    .await;
}

#[tokio::test]
async fn connect_tunnels_count_in_max_connections() {
    tunnels_hold_a_slot_while_open("maxConnections: 1", "max_connections").await;
}

#[tokio::test]
async fn connect_tunnels_count_in_max_parallel_requests() {
    tunnels_hold_a_slot_while_open("maxParallelRequests: 1", "max_parallel_requests").await;
}

#[tokio::test]
async fn tls_passthrough_connections_count_in_max_connections() {
    const API: &str = "api.pass.test";
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("end-to-end");
    let upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    let config = format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{enabled: false}}
  dns: {{nameservers: ["{dns}"]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge}}
spec:
  listeners:
  - {{name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {{mode: Passthrough}}}}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: api}}
spec:
  destination: {{type: FQDN, fqdn: {{hostname: {API}, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {port}}}]}}
  tls: {{mode: Passthrough}}
  trafficPolicy: {{circuitBreaker: {{maxConnections: 1}}}}
"#,
        dns = dns.addr,
        port = upstream.addr.port(),
    );
    let proxy = TestProxy::start(&config).await;
    let listener = proxy.listener("default/edge/tls");
    let handshake = || async {
        let tcp = TcpStream::connect(listener).await.unwrap();
        tokio_rustls::TlsConnector::from(ca.client_config(true))
            .connect(API.try_into().unwrap(), tcp)
            .await
    };

    let first = handshake()
        .await
        .expect("the first connection reaches the endpoint");
    let refused = handshake().await;
    assert!(
        refused.is_err(),
        "the second is closed before TLS completes"
    );
    assert_eq!(passthrough_rejected(&proxy, "overflow").await, 1);
    assert_eq!(
        metric(&proxy, &overflows("api", "max_connections")).await,
        1.0
    );

    drop(first);
    eventually(
        "the slot came back when the connection closed",
        Duration::from_secs(5),
        || async { handshake().await.is_ok() },
    )
    .await;
}
