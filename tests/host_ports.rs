//! One hostname, several Backends, one per port: the normal way to declare
//! `api.example.com:443` next to `:80`, a Passthrough port next to an HTTP one, and the only
//! way with one-port-per-Backend APIs. The implicit route, `CONNECT` and passthrough SNI
//! routing are keyed by (hostname, port); only the same hostname *and* port twice is a clash.

mod common;

use std::net::{Ipv4Addr, SocketAddr};

use common::dns::TestDns;
use common::grpc::client::{CallOptions, GrpcClient};
use common::grpc::server::{Deadlines, EchoServer};
use common::grpc::EchoRequest;
use common::proxy::{get, get_absolute, TestProxy};
use common::tls::{get_over, San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "multi.ports.test";

/// A ProxyConfig resolving through `dns`, and a Gateway with an HTTP listener and a TLS
/// Passthrough listener (both on ephemeral ports, so no Backend port matches the listener's).
fn preamble(dns: SocketAddr) -> String {
    format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{enabled: false}}
  drain: {{timeout: 1s}}
  dns: {{nameservers: ["{dns}"]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  listeners:
  - {{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}}
  - {{name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {{mode: Passthrough}}}}
"#
    )
}

/// Backend `name` for [`HOST`] on one port, as a newcomer writes it.
fn backend(name: &str, port: u16, protocol: &str, tls: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: {name}}}
spec:
  destination:
    type: FQDN
    fqdn: {{hostname: {HOST}, allowedAddresses: [127.0.0.0/8]}}
    ports: [{{number: {port}}}]
  protocol: {protocol}
  tls: {{mode: {tls}}}
"#
    )
}

/// `CONNECT target`: the status code and, on 200, the connection (now a tunnel).
async fn connect(proxy: SocketAddr, target: &str) -> (u16, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.expect("connect to egressd");
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    // Byte by byte: what follows the head belongs to the tunnel.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "answered");
        head.push(byte[0]);
    }
    let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
    (status, stream)
}

struct Setup {
    _dns: TestDns,
    ca: TestCa,
    a: Upstream,
    b: Upstream,
    secure: TlsUpstream,
    rpc: EchoServer,
    proxy: TestProxy,
}

/// Four Backends for one hostname: two HTTP ports, a Passthrough port and a gRPC port.
async fn setup() -> Setup {
    let dns = TestDns::start().await;
    dns.set(HOST, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("host-ports");
    let a = Upstream::start("a").await;
    let b = Upstream::start("b").await;
    let secure = TlsUpstream::start(
        "secure",
        ca.server_cert(&[San::dns(HOST)]),
        TlsOptions::default(),
    )
    .await;
    let rpc = EchoServer::start(Deadlines::Ignore).await;
    let config = preamble(dns.addr)
        + &backend("web-a", a.addr.port(), "HTTP", "InsecureDisable")
        + &backend("web-b", b.addr.port(), "HTTP", "InsecureDisable")
        + &backend("secure", secure.addr.port(), "TCP", "Passthrough")
        + &backend("rpc", rpc.addr.port(), "GRPC", "InsecureDisable");
    let proxy = TestProxy::start(&config).await;
    Setup {
        _dns: dns,
        ca,
        a,
        b,
        secure,
        rpc,
        proxy,
    }
}

#[tokio::test]
async fn each_backend_of_a_hostname_is_reached_on_its_own_port() {
    let s = setup().await;
    let (a, b) = (s.a.addr.port(), s.b.addr.port());

    // By Host, and in absolute form (HTTP_PROXY clients).
    for (port, name) in [(a, "a"), (b, "b")] {
        let r = get(s.proxy.http(), &format!("{HOST}:{port}"), "/by-host").await;
        assert_eq!(
            (r.status.as_u16(), r.text()),
            (200, name.to_owned()),
            "Host :{port}"
        );
        let r = get_absolute(s.proxy.http(), &format!("http://{HOST}:{port}/absolute")).await;
        assert_eq!(
            (r.status.as_u16(), r.text()),
            (200, name.to_owned()),
            "URI :{port}"
        );
    }
    assert_eq!(s.a.request_count(), 2);
    assert_eq!(s.b.request_count(), 2);

    // gRPC: the `:authority` names the port.
    let mut client =
        GrpcClient::connect(s.proxy.http(), &format!("{HOST}:{}", s.rpc.addr.port())).await;
    let reply = client
        .unary(EchoRequest::new("hello"), &CallOptions::default())
        .await
        .expect("the gRPC Backend answers");
    assert_eq!(reply.get_ref().message, "hello");
    assert_eq!(s.rpc.rpcs().len(), 1);

    // CONNECT to the Passthrough port: the client's own TLS reaches that Backend.
    let (status, tunnel) =
        connect(s.proxy.http(), &format!("{HOST}:{}", s.secure.addr.port())).await;
    assert_eq!(status, 200);
    let tls = tokio_rustls::TlsConnector::from(s.ca.client_config(true))
        .connect(HOST.try_into().unwrap(), tunnel)
        .await
        .expect("TLS through the tunnel");
    let (status, body) = get_over(tls, HOST).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"secure"[..]));

    // Passthrough SNI on the TLS listener: the hostname's Passthrough port.
    let tcp = TcpStream::connect(s.proxy.listener("default/gw/tls"))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(s.ca.client_config(true))
        .connect(HOST.try_into().unwrap(), tcp)
        .await
        .expect("TLS passed through by SNI");
    let (status, body) = get_over(tls, HOST).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"secure"[..]));
    assert_eq!(s.secure.handshake_count(), 2);

    // Nothing is Conflicted: each port has one Backend.
    let status = get(s.proxy.admin, "localhost", "/status").await.text();
    assert!(!status.contains("Conflicted"), "{status}");
}

#[tokio::test]
async fn each_port_keeps_its_kind_and_an_undeclared_port_names_every_declared_one() {
    let s = setup().await;
    let (a, b, secure) = (s.a.addr.port(), s.b.addr.port(), s.secure.addr.port());

    // A CONNECT to a plaintext HTTP port is served as HTTP by egressd (not relayed to the
    // endpoint: docs/interception.md), and a Passthrough port is not an HTTP destination.
    let (status, _) = connect(s.proxy.http(), &format!("{HOST}:{a}")).await;
    assert_eq!(status, 200, "CONNECT to an HTTP port");
    let r = get(s.proxy.http(), &format!("{HOST}:{secure}"), "/").await;
    assert_eq!(r.status, 403, "HTTP to a Passthrough port: {}", r.text());

    // A port nobody declares: 403, naming the ports that are.
    let refusing = common::ports::Refusing::bind();
    let closed = refusing.addr.port();
    let r = get(s.proxy.http(), &format!("{HOST}:{closed}"), "/").await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error_code(), Some("destination_not_allowed"));
    let text = r.text();
    for declared in [
        format!("{a} (Backend default/web-a)"),
        format!("{b} (Backend default/web-b)"),
    ] {
        assert!(text.contains(&declared), "{declared} in {text}");
    }
    // ... and /blocked suggests a Backend of its own for it, which is now a valid config.
    let blocked: serde_json::Value =
        serde_json::from_str(&get(s.proxy.admin, "localhost", "/blocked").await.text()).unwrap();
    let entry = blocked["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["host"] == HOST && b["port"] == closed)
        .unwrap_or_else(|| panic!("{HOST}:{closed} listed: {blocked}"));
    assert!(
        entry["backend"]
            .as_str()
            .unwrap()
            .contains(&format!("ports: [{{number: {closed}}}]")),
        "{entry}"
    );
    assert_eq!(s.a.request_count() + s.b.request_count(), 0);
}

#[tokio::test]
async fn the_same_hostname_and_port_twice_is_conflicted_and_the_other_ports_stay_reachable() {
    let dns = TestDns::start().await;
    dns.set(HOST, &[Ipv4Addr::LOCALHOST], 60);
    let a = Upstream::start("a").await;
    let b = Upstream::start("b").await;
    // `first` declares A; `second` declares A too (it loses it) and B (it keeps it).
    let second = format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: second}}
spec:
  destination:
    type: FQDN
    fqdn: {{hostname: {HOST}, allowedAddresses: [127.0.0.0/8]}}
    ports: [{{number: {}}}, {{number: {}}}]
  tls: {{mode: InsecureDisable}}
"#,
        a.addr.port(),
        b.addr.port()
    );
    let config =
        preamble(dns.addr) + &backend("first", a.addr.port(), "HTTP", "InsecureDisable") + &second;
    let proxy = TestProxy::start(&config).await;

    let status = get(proxy.admin, "localhost", "/status").await.text();
    let clash = format!(
        "`{HOST}:{}` is also declared by Backend default/first",
        a.addr.port()
    );
    assert!(status.contains(&clash), "{status}");
    assert!(
        !status.contains(&format!("{HOST}:{}` is also", b.addr.port())),
        "{status}"
    );

    for (upstream, name) in [(&a, "a"), (&b, "b")] {
        let r = get(
            proxy.http(),
            &format!("{HOST}:{}", upstream.addr.port()),
            "/",
        )
        .await;
        assert_eq!((r.status.as_u16(), r.text()), (200, name.to_owned()));
    }
    // Port A went to `first`, the winner: its request metrics say so.
    let metrics = get(proxy.admin, "localhost", "/metrics").await.text();
    let served = |backend: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with("egressd_upstream_responses_total{") && l.contains(backend))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum::<f64>()
    };
    assert_eq!(served("backend=\"default/first\""), 1.0, "{metrics}");
    assert_eq!(served("backend=\"default/second\""), 1.0, "{metrics}");
}

/// Requests each Backend served, by its `namespace/name`, from the response metrics.
async fn served_by(proxy: &TestProxy, backend: &str) -> f64 {
    let metrics = get(proxy.admin, "localhost", "/metrics").await.text();
    let label = format!("backend=\"{backend}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("egressd_upstream_responses_total{") && l.contains(&label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// On a shared gateway a team adds a Backend for a host and port another team's Backend
/// already serves, under a name that sorts first: the port stays with the Backend that held
/// it, reload after reload, and the newcomer is `Conflicted`, naming both. With
/// `strict: true` in the ProxyConfig the same change is refused.
#[tokio::test]
async fn a_newcomer_for_a_held_port_does_not_take_it_over_and_strict_refuses_it() {
    let dns = TestDns::start().await;
    dns.set(HOST, &[Ipv4Addr::LOCALHOST], 60);
    let up = Upstream::start("up").await;
    let port = up.addr.port();
    let owner = backend("zz-payments", port, "HTTP", "InsecureDisable");
    let proxy = TestProxy::start(&(preamble(dns.addr) + &owner)).await;
    let host = format!("{HOST}:{port}");
    assert_eq!(get(proxy.http(), &host, "/").await.status, 200);

    let newcomer = backend("aa-intruder", port, "HTTP", "InsecureDisable");
    proxy.rewrite(&(preamble(dns.addr) + &newcomer + &owner));
    proxy.reload().await;
    // And once more, unchanged: the port is still held.
    proxy.reload().await;
    for _ in 0..3 {
        assert_eq!(get(proxy.http(), &host, "/").await.status, 200);
    }
    assert_eq!(served_by(&proxy, "default/zz-payments").await, 4.0);
    assert_eq!(served_by(&proxy, "default/aa-intruder").await, 0.0);
    let status = get(proxy.admin, "localhost", "/status").await.text();
    let clash = format!(
        "`{host}` is also declared by Backend default/zz-payments, which held it before this \
         Backend appeared and keeps it; Backend default/aa-intruder serves nothing on that port"
    );
    assert!(status.contains(&clash), "{status}");

    // Strict: the same config is refused, the serving one goes on.
    let strict = preamble(dns.addr).replacen(
        "  accessLog: {enabled: false}\n",
        "  accessLog: {enabled: false}\n  strict: true\n",
        1,
    );
    let serving = proxy.generation();
    proxy.rewrite(&(strict + &newcomer + &owner));
    let refused = proxy
        .egressd()
        .reload()
        .await
        .expect_err("strict refuses a warning");
    assert!(
        refused
            .to_string()
            .contains(&format!("error(s); still serving generation {serving}")),
        "{refused}: {:?}",
        proxy.egressd().shared().reload_status().messages
    );
    let messages = proxy.egressd().shared().reload_status().messages;
    assert!(
        messages
            .iter()
            .any(|m| m.contains("error: Backend default/aa-intruder")
                && m.contains("(an error under ProxyConfig `strict: true`)")),
        "{messages:?}"
    );
    assert_eq!(get(proxy.http(), &host, "/").await.status, 200);
    assert_eq!(served_by(&proxy, "default/zz-payments").await, 5.0);
}
