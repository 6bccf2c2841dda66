//! TLS Passthrough listeners: the SNI of the client's ClientHello picks a Passthrough Backend;
//! the TLS bytes reach the endpoint untouched, so the client verifies the endpoint's own
//! certificate. Connections that cannot be routed are closed, with a reason counted.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::dns::TestDns;
use common::proxy::{get, TestProxy};
use common::tls::{passthrough_rejected, San, TestCa, TlsOptions, TlsUpstream};
use common::{eventually, poll_within};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const API: &str = "api.pass.test";

fn config(dns: SocketAddr, upstream_port: u16) -> String {
    format!(
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
  destination: {{type: FQDN, fqdn: {{hostname: {API}, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {upstream_port}}}]}}
  tls: {{mode: Passthrough}}
"#
    )
}

struct Setup {
    _dns: TestDns,
    ca: TestCa,
    upstream: TlsUpstream,
    proxy: TestProxy,
    listener: SocketAddr,
}

async fn setup() -> Setup {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("end-to-end");
    let upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    let proxy = TestProxy::start(&config(dns.addr, upstream.addr.port())).await;
    let listener = proxy.listener("default/edge/tls");
    Setup {
        _dns: dns,
        ca,
        upstream,
        proxy,
        listener,
    }
}

/// Connection closed by egressd without any byte sent back.
async fn assert_closed_silently(mut stream: TcpStream) {
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("egressd closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing may be answered: {:?}", &buf[..n]);
}

#[tokio::test]
async fn sni_routes_the_clients_own_tls_to_the_passthrough_backend() {
    let s = setup().await;
    let tcp = TcpStream::connect(s.listener).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(s.ca.client_config(true))
        .connect(API.try_into().unwrap(), tcp)
        .await
        .expect("the client completes TLS with the endpoint's own certificate");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..2 {
        let response = sender
            .send_request(
                http::Request::get("/")
                    .header("host", API)
                    .body(Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            &response.into_body().collect().await.unwrap().to_bytes()[..],
            b"api"
        );
    }
    assert_eq!(s.upstream.snis(), vec![Some(API.to_owned())]);
    assert_eq!(
        s.upstream.handshake_count(),
        1,
        "one TLS session end to end, two requests on it"
    );
}

#[tokio::test]
async fn client_hello_without_sni_is_closed_and_counted() {
    let s = setup().await;
    let before = passthrough_rejected(&s.proxy, "no_sni").await;
    let tcp = TcpStream::connect(s.listener).await.unwrap();
    let attempt = tokio_rustls::TlsConnector::from(s.ca.client_config(false))
        .connect(API.try_into().unwrap(), tcp)
        .await;
    assert!(attempt.is_err(), "no tunnel without SNI");
    eventually(
        "a passthrough rejection counted as no_sni",
        Duration::from_secs(2),
        || async { passthrough_rejected(&s.proxy, "no_sni").await > before },
    )
    .await;
    assert_eq!(s.upstream.hellos().len(), 0, "nothing reached the endpoint");
}

#[tokio::test]
async fn unknown_sni_is_closed_and_counted() {
    let s = setup().await;
    let before = passthrough_rejected(&s.proxy, "destination_not_allowed").await;
    let tcp = TcpStream::connect(s.listener).await.unwrap();
    let attempt = tokio_rustls::TlsConnector::from(s.ca.client_config(true))
        .connect("elsewhere.pass.test".try_into().unwrap(), tcp)
        .await;
    assert!(attempt.is_err());
    eventually(
        "a passthrough rejection counted as destination_not_allowed",
        Duration::from_secs(2),
        || async { passthrough_rejected(&s.proxy, "destination_not_allowed").await > before },
    )
    .await;
    assert_eq!(s.upstream.hellos().len(), 0);
    // The audit lists it, with the Passthrough Backend that would allow it.
    let listed = get(s.proxy.admin, "localhost", "/blocked").await.text();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let entry = &listed["blocked"][0];
    assert_eq!(entry["host"], "elsewhere.pass.test");
    assert_eq!(entry["via"], "tls-passthrough");
    assert!(entry["backend"]
        .as_str()
        .unwrap()
        .contains("mode: Passthrough"));
}

#[tokio::test]
async fn plaintext_bytes_are_not_tls_and_are_closed() {
    let s = setup().await;
    let before = passthrough_rejected(&s.proxy, "not_tls").await;
    let mut tcp = TcpStream::connect(s.listener).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: api.pass.test\r\n\r\n")
        .await
        .unwrap();
    assert_closed_silently(tcp).await;
    eventually(
        "a passthrough rejection counted as not_tls",
        Duration::from_secs(2),
        || async { passthrough_rejected(&s.proxy, "not_tls").await > before },
    )
    .await;
}

#[tokio::test]
async fn client_hello_trickled_byte_by_byte_still_routes() {
    let s = setup().await;
    // A proxy in the middle: the client's TLS goes through a socket pair we control, so the
    // ClientHello can be delivered to egressd one byte at a time.
    let (client_side, mut relay_side) = tokio::io::duplex(64 * 1024);
    let mut egress = TcpStream::connect(s.listener).await.unwrap();
    let handshake = tokio::spawn({
        let config = s.ca.client_config(true);
        async move {
            tokio_rustls::TlsConnector::from(config)
                .connect(API.try_into().unwrap(), client_side)
                .await
        }
    });
    // Forward the first flight byte by byte, then relay both ways normally.
    let mut first = vec![0u8; 16 * 1024];
    let n = relay_side.read(&mut first).await.unwrap();
    for byte in &first[..n] {
        egress.write_all(std::slice::from_ref(byte)).await.unwrap();
        egress.flush().await.unwrap();
    }
    tokio::spawn(async move {
        let _ = tokio::io::copy_bidirectional(&mut relay_side, &mut egress).await;
    });
    let tls = handshake
        .await
        .unwrap()
        .expect("handshake through a trickled ClientHello");
    assert_eq!(common::tls::get_over(tls, API).await.0, 200);
}

#[tokio::test]
async fn each_connection_gets_an_access_log_line() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("logged");
    let upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = config(dns.addr, upstream.addr.port()).replace(
        "accessLog: {enabled: false}",
        &format!("accessLog: {{path: {}}}", log.display()),
    );
    assert!(yaml.contains("access.log"));
    let proxy = TestProxy::start(&yaml).await;
    let listener = proxy.listener("default/edge/tls");

    // One relayed connection with one request, closed by the client.
    let tcp = TcpStream::connect(listener).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(ca.client_config(true))
        .connect(API.try_into().unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(common::tls::get_over(tls, API).await.0, 200);
    // And one refused by SNI.
    let tcp = TcpStream::connect(listener).await.unwrap();
    let _ = tokio_rustls::TlsConnector::from(ca.client_config(true))
        .connect("elsewhere.pass.test".try_into().unwrap(), tcp)
        .await;

    let lines = || common::proxy::json_lines(&log);
    assert!(
        poll_within(Duration::from_secs(5), || async { lines().len() == 2 })
            .await
            .is_some(),
        "{:?}",
        lines()
    );
    let all = lines();
    let relayed = all.iter().find(|l| l["authority"] == API).unwrap();
    assert_eq!(relayed["method"], "TLS");
    assert_eq!(relayed["protocol"], "passthrough");
    assert_eq!(relayed["listener"], "default/edge/tls");
    assert_eq!(relayed["backend"], "default/api");
    assert_eq!(relayed["endpoint"], upstream.addr.to_string());
    assert_eq!(relayed["complete"], true);
    assert!(relayed["bytes_in"].as_u64().unwrap() > 100, "{relayed}");
    assert!(relayed["bytes_out"].as_u64().unwrap() > 100, "{relayed}");
    assert!(relayed.get("error").is_none(), "{relayed}");
    let refused = all
        .iter()
        .find(|l| l["authority"] == "elsewhere.pass.test")
        .unwrap();
    assert_eq!(refused["error"], "destination_not_allowed");
    assert_eq!(refused["attempts"], 0);
    assert_eq!(refused["complete"], false);
}
