//! `CONNECT host:port` tunnels: only to declared TCP ports of Backends (Passthrough or plain
//! TCP); the client's bytes reach the endpoint untouched, so with Passthrough the client
//! verifies the endpoint's own certificate end to end.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::dns::TestDns;
use common::eventually;
use common::proxy::{preamble, TestProxy};
use common::tls::{San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const API: &str = "api.tunnel.test";

fn tcp_backend(name: &str, host: &str, port: u16, tls_mode: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: {name}
spec:
  destination:
    type: FQDN
    fqdn:
      hostname: {host}
      allowedAddresses: [127.0.0.0/8]
    ports:
    - number: {port}
  protocol: TCP
  tls:
    mode: {tls_mode}
"#
    )
}

/// Sends `CONNECT target` on a new connection to `proxy`; returns the status code and, on
/// 200, the connection (now a tunnel).
async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.expect("connect to egressd");
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    // Read the response head byte by byte: nothing after it may be consumed, it belongs to
    // the tunnel.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = stream.read(&mut byte).await.expect("read response head");
        assert_eq!(
            n,
            1,
            "egressd closed before answering CONNECT: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head[9..12].parse().expect("status code");
    (status, head, stream)
}

/// Reads whatever a refused CONNECT carries as its body (the one-line reason).
async fn body_after(head: &str, stream: &mut TcpStream) -> String {
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await.unwrap();
    String::from_utf8(body).unwrap()
}

#[tokio::test]
async fn connect_to_a_passthrough_backend_tunnels_the_clients_own_tls() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("end-to-end");
    let upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    let port = upstream.addr.port();
    let proxy = TestProxy::start(
        &(preamble(Some(dns.addr)) + &tcp_backend("api", API, port, "Passthrough")),
    )
    .await;

    let (status, head, tunnel) = connect(proxy.http(), &format!("{API}:{port}")).await;
    assert_eq!(status, 200, "{head}");

    // TLS between the client and the endpoint: egressd never sees the plaintext, and the client
    // verifies the endpoint's certificate with its own trust store.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(common::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = connector
        .connect(API.try_into().unwrap(), tunnel)
        .await
        .expect("end-to-end TLS handshake through the tunnel");
    let (status, body) = common::tls::get_over(tls, API).await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"api");
    assert_eq!(
        upstream.snis(),
        vec![Some(API.to_owned())],
        "the client's own SNI reached the endpoint"
    );
}

#[tokio::test]
async fn connect_to_a_plain_tcp_backend_relays_bytes() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("plain").await;
    let port = upstream.addr.port();
    let proxy = TestProxy::start(
        &(preamble(Some(dns.addr)) + &tcp_backend("plain", API, port, "InsecureDisable")),
    )
    .await;
    let (status, head, mut tunnel) = connect(proxy.http(), &format!("{API}:{port}")).await;
    assert_eq!(status, 200, "{head}");
    tunnel
        .write_all(
            format!("GET /raw HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = String::new();
    tunnel.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("plain"), "{reply}");
    // Relayed untouched: no Via or X-Forwarded-For was added to the tunnelled request.
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].headers.get("via").is_none());
    assert!(seen[0].headers.get("x-forwarded-for").is_none());
}

#[tokio::test]
async fn connect_to_anything_undeclared_is_refused_with_403() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    dns.set("web.tunnel.test", &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("plain").await;
    let port = upstream.addr.port();
    let web = format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: web
spec:
  destination: {{type: FQDN, fqdn: {{hostname: web.tunnel.test, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {port}}}]}}
  protocol: HTTP11
  tls: {{mode: InsecureDisable}}
"#
    );
    let yaml = preamble(Some(dns.addr)) + &tcp_backend("api", API, port, "Passthrough") + &web;
    let proxy = TestProxy::start(&yaml).await;
    for target in [
        "undeclared.test:443".to_owned(),
        // A declared host, but not on a declared port.
        format!("{API}:1"),
    ] {
        let (status, head, mut stream) = connect(proxy.http(), &target).await;
        assert_eq!(status, 403, "CONNECT {target}: {head}");
        assert!(
            head.contains("x-egressd-error: destination_not_allowed"),
            "{head}"
        );
        let body = body_after(&head, &mut stream).await;
        assert!(
            body.contains(&target),
            "the reason names the target: {body}"
        );
    }
    assert_eq!(upstream.request_count(), 0);

    // A plaintext HTTP Backend's port is no tunnel to the endpoint: egressd serves the
    // requests inside as HTTP itself (docs/interception.md), each through the pipeline.
    let target = format!("web.tunnel.test:{port}");
    let (status, head, mut stream) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "CONNECT {target}: {head}");
    let request = format!("GET /inside HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(upstream.last_request().uri, "/inside");
}

#[tokio::test]
async fn drain_waits_for_an_open_tunnel() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("plain").await;
    let port = upstream.addr.port();
    // preamble() sets a 1 s drain timeout; the tunnel closes well within it.
    let proxy = TestProxy::start(
        &(preamble(Some(dns.addr)) + &tcp_backend("plain", API, port, "InsecureDisable")),
    )
    .await;
    let (status, head, mut tunnel) = connect(proxy.http(), &format!("{API}:{port}")).await;
    assert_eq!(status, 200, "{head}");

    let listener = proxy.http();
    let shutdown = tokio::spawn(proxy.shutdown());
    // Draining has begun once the listener refuses new connections.
    common::eventually(
        "the listener refuses connections",
        std::time::Duration::from_secs(5),
        || async { TcpStream::connect(listener).await.is_err() },
    )
    .await;
    // The open tunnel holds the drain (bounded look: the drain timeout is 1 s).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !shutdown.is_finished(),
        "the drain must wait for the open tunnel"
    );
    // The tunnel keeps relaying while the proxy drains...
    tunnel
        .write_all(
            format!("GET /during-drain HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut reply = String::new();
    tunnel.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    drop(tunnel);
    // ...and the drain counts it: it ends cleanly once the tunnel has closed.
    assert!(
        shutdown.await.unwrap(),
        "drain must finish cleanly after the tunnel closed"
    );
}

#[tokio::test]
async fn an_unreachable_tunnel_endpoint_is_ejected_and_tunnels_go_to_the_other() {
    // Tunnels feed outlier detection with what they see: whether the endpoint could be
    // reached. 127.0.0.2 refuses; after 5 refusals it is ejected.
    let port = common::ports::shared_port();
    let up = Upstream::start_on("up", SocketAddr::new([127, 0, 0, 1].into(), port)).await;
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)], 60);
    let proxy = TestProxy::start(
        &(preamble(Some(dns.addr)) + &tcp_backend("plain", API, port, "InsecureDisable")),
    )
    .await;
    let mut refused = 0;
    for _ in 0..30 {
        let (status, _, _) = connect(proxy.http(), &format!("{API}:{port}")).await;
        refused += usize::from(status != 200);
    }
    assert_eq!(refused, 5, "a run of 5 refusals ejects the endpoint");
    let endpoints = common::proxy::get(proxy.admin, "localhost", "/endpoints")
        .await
        .text();
    assert!(
        endpoints.contains("consecutive_gateway_errors"),
        "{endpoints}"
    );
    drop(up);
}

/// A tunnel's access log line is written when it closes, with the bytes each way.
#[tokio::test]
async fn a_tunnel_is_logged_when_it_closes_with_its_bytes() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("plain").await;
    let port = upstream.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = (preamble(Some(dns.addr)) + &tcp_backend("plain", API, port, "InsecureDisable"))
        .replace(
            "  accessLog:\n    enabled: false\n",
            &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
        );
    assert!(yaml.contains("access.log"));
    let proxy = TestProxy::start(&yaml).await;
    let (status, head, mut tunnel) = connect(proxy.http(), &format!("{API}:{port}")).await;
    assert_eq!(status, 200, "{head}");
    let request = format!("GET /raw HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n");
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    tunnel.read_to_string(&mut reply).await.unwrap();
    drop(tunnel);
    let line = || -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(&log).ok()?;
        serde_json::from_str(text.lines().next()?).ok()
    };
    eventually(
        "a line once the tunnel closed",
        Duration::from_secs(5),
        || async { line().is_some() },
    )
    .await;
    let line = line().unwrap();
    assert_eq!(line["method"], "CONNECT");
    assert_eq!(line["status"], 200);
    assert_eq!(line["bytes_in"], request.len());
    assert_eq!(line["bytes_out"], reply.len());
    assert_eq!(line["complete"], true);
    assert_eq!(line["backend"], "default/plain");
}

/// A tunnel the client ends with a reset after 5 MB still logs the bytes that went through
/// (counted as they pass), marked incomplete.
#[tokio::test]
async fn a_tunnel_cut_by_a_reset_is_logged_with_the_bytes_it_carried() {
    let dns = TestDns::start().await;
    dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
    // A TCP sink that counts what it reads.
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = received.clone();
    tokio::spawn(async move {
        let (mut stream, _) = sink.accept().await.unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = (preamble(Some(dns.addr)) + &tcp_backend("sink", API, port, "InsecureDisable"))
        .replace(
            "  accessLog:\n    enabled: false\n",
            &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
        );
    let proxy = TestProxy::start(&yaml).await;
    let (status, head, mut tunnel) = connect(proxy.http(), &format!("{API}:{port}")).await;
    assert_eq!(status, 200, "{head}");
    const SENT: usize = 5 * 1024 * 1024;
    tunnel.write_all(&vec![7u8; SENT]).await.unwrap();
    eventually(
        "the sink got everything",
        Duration::from_secs(10),
        || async { received.load(std::sync::atomic::Ordering::Relaxed) == SENT },
    )
    .await;
    // SO_LINGER 0: close sends RST instead of FIN.
    tunnel.set_zero_linger().unwrap();
    drop(tunnel);
    let line = || -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(&log).ok()?;
        serde_json::from_str(text.lines().next()?).ok()
    };
    eventually(
        "a line once the tunnel was cut",
        Duration::from_secs(5),
        || async { line().is_some() },
    )
    .await;
    let line = line().unwrap();
    assert_eq!(line["method"], "CONNECT");
    assert_eq!(line["bytes_in"], SENT, "{line}");
    assert_eq!(line["bytes_out"], 0, "{line}");
    assert_eq!(line["complete"], false, "{line}");
}
