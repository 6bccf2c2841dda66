//! Websocket upgrades through egressd (HTTP/1.1 `Upgrade: websocket` to an HTTP/1.1 upstream),
//! with tokio-tungstenite on both ends: messages both ways, ping/pong, close codes, large
//! messages, and a websocket that stays open across reloads.

mod common;

use std::net::SocketAddr;

use common::proxy::{ip_backend, preamble, TestProxy};
use common::websocket::EchoServer;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

fn route(host: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: ws}}\nspec:\n  hostnames: [{host}]\n  rules: [{{backendRefs: [{{name: echo}}]}}]\n"
    )
}

async fn open(proxy: &TestProxy) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let (ws, response) = tokio_tungstenite::client_async("ws://ws.test/chat", stream)
        .await
        .expect("websocket handshake through egressd");
    assert_eq!(response.status(), 101);
    ws
}

/// egressd with a route for `ws.test` to an echo server (dropping the server stops it).
async fn setup() -> (TestProxy, EchoServer) {
    let upstream = EchoServer::start().await;
    let proxy = TestProxy::start(
        &(preamble(None) + &ip_backend("echo", upstream.addr, "") + &route("ws.test")),
    )
    .await;
    (proxy, upstream)
}

#[tokio::test]
async fn text_binary_ping_and_close_code_pass_through() {
    let (proxy, _upstream) = setup().await;
    let mut ws = open(&proxy).await;

    common::websocket::echo_text_binary_ping_and_close(&mut ws).await;
}

#[tokio::test]
async fn websocket_stays_open_across_ten_reloads() {
    let (proxy, _upstream) = setup().await;
    let mut ws = open(&proxy).await;
    for i in 0..10 {
        let before = proxy.generation();
        assert!(proxy.reload().await > before);
        let text = format!("after reload {i}");
        ws.send(Message::text(text.clone())).await.unwrap();
        assert_eq!(ws.next().await.unwrap().unwrap(), Message::text(text));
    }
}

#[tokio::test]
async fn declined_upgrade_is_an_ordinary_response() {
    // An upstream that answers every upgrade with 403.
    let upstream = common::upstream::Upstream::start_with(|_req| async {
        http::Response::builder()
            .status(403)
            .body(common::upstream::full("no websockets here"))
            .unwrap()
    })
    .await;
    let proxy = TestProxy::start(
        &(preamble(None) + &ip_backend("echo", upstream.addr, "") + &route("ws.test")),
    )
    .await;
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let err = tokio_tungstenite::client_async("ws://ws.test/chat", stream)
        .await
        .expect_err("the upstream declined");
    match err {
        tokio_tungstenite::tungstenite::Error::Http(response) => {
            assert_eq!(response.status(), 403);
        }
        other => panic!("expected an HTTP error response, got {other:?}"),
    }
    // The upgrade headers reached the upstream.
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers.get("upgrade").unwrap(), "websocket");
}

/// A websocket echo server behind TLS (`wss`), with a certificate for 127.0.0.1 from `ca`.
async fn tls_echo_server(ca: &common::tls::TestCa) -> SocketAddr {
    let cert = ca.server_cert(&[common::tls::San::ip("127.0.0.1")]);
    let config = rustls::ServerConfig::builder_with_provider(common::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(cert.cert_chain(), cert.private_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn wss_backend_gets_the_websocket_over_verified_tls() {
    let ca = common::tls::TestCa::new("wss");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_pem(dir.path());
    let upstream = tls_echo_server(&ca).await;
    let backend = format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: echo}}
spec:
  destination: {{type: IP, ip: {{endpoints: [{{address: 127.0.0.1}}]}}, ports: [{{number: {port}}}]}}
  protocol: HTTP11
  tls:
    mode: Simple
    validation: {{caCertificateFiles: ["{ca}"]}}
"#,
        port = upstream.port(),
        ca = ca_file.display()
    );
    let proxy = TestProxy::start(&(preamble(None) + &backend + &route("ws.test"))).await;
    // The client speaks plain ws to egressd; egressd speaks wss to the upstream.
    let mut ws = open(&proxy).await;
    ws.send(Message::text("over tls")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("over tls"));
}

#[tokio::test]
async fn http_upgrade_policy_without_websocket_refuses_the_upgrade() {
    let upstream = common::upstream::Upstream::start("plain").await;
    let backend = ip_backend(
        "echo",
        upstream.addr,
        "  trafficPolicy:\n    httpUpgrade: []\n",
    );
    let proxy = TestProxy::start(&(preamble(None) + &backend + &route("ws.test"))).await;
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let err = tokio_tungstenite::client_async("ws://ws.test/chat", stream)
        .await
        .expect_err("upgrades are refused by policy");
    match err {
        tokio_tungstenite::tungstenite::Error::Http(response) => assert_eq!(response.status(), 200),
        other => panic!("expected the plain HTTP answer, got {other:?}"),
    }
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].headers.get("upgrade").is_none(),
        "the upgrade must not reach the upstream"
    );
}

/// A sample of `/metrics` by exact series name.
async fn metric(proxy: &TestProxy, series: &str) -> Option<f64> {
    let text = common::proxy::get(proxy.admin, "127.0.0.1", "/metrics")
        .await
        .text();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map(|v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn open_websockets_and_their_bytes_are_counted_per_backend() {
    let (proxy, _upstream) = setup().await;
    let active = "egressd_websockets_active{backend=\"default/echo\"}";
    let mut ws = open(&proxy).await;
    ws.send(Message::text("count me")).await.unwrap();
    ws.next().await.unwrap().unwrap();
    common::eventually(
        "one active websocket counted",
        std::time::Duration::from_secs(2),
        || async { metric(&proxy, active).await == Some(1.0) },
    )
    .await;
    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    // The server closed its TCP side after the close handshake; the client now closes its own.
    drop(ws);
    common::eventually(
        "no active websocket counted",
        std::time::Duration::from_secs(2),
        || async { metric(&proxy, active).await == Some(0.0) },
    )
    .await;
    let up = metric(
        &proxy,
        "egressd_websocket_bytes_total{backend=\"default/echo\",direction=\"upstream\"}",
    )
    .await;
    assert!(up.is_some_and(|b| b > 0.0), "bytes counted: {up:?}");
}
