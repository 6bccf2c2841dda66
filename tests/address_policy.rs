//! Undeclared destinations (`AllowAny`, `AuditOnly`) are judged on the canonical address:
//! `::ffff:127.0.0.1` is 127.0.0.1, whether it comes as an absolute URI, a `Host`, a
//! `CONNECT` target or a DNS answer, so egressd's own admin port stays out of reach. Every
//! non-public address is refused by default; `allowedAddresses` opens one explicitly.
//!
//! Only loopback is ever a target here: the IPv4-mapped spellings are loopback to the kernel
//! too. Spellings that are not (NAT64 `64:ff9b::/96`, IPv4-compatible `::a.b.c.d`) are
//! covered by the unit tests of `upstream::address`, which open no socket.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::dns::TestDns;
use common::proxy::{get, get_absolute, preamble_with, request, ClientBody, TestProxy};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Spellings of 127.0.0.1 as an IPv6 literal that the kernel connects to loopback.
const MAPPED_LOOPBACK: [&str; 3] = [
    "[::ffff:127.0.0.1]",
    "[::FFFF:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
];

/// `CONNECT target`: the status line's code.
async fn connect_status(proxy: SocketAddr, target: &str) -> u16 {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

/// The admin server's log filter, asked directly.
async fn log_filter(proxy: &TestProxy) -> String {
    get(proxy.admin, "localhost", "/logging").await.text()
}

#[tokio::test]
async fn the_admin_port_is_out_of_reach_in_every_spelling_of_loopback() {
    let dns = TestDns::start().await;
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    dns.set_ips("admin.mapped.test", &[mapped], 60);
    let spec = "  outboundPolicy: AllowAny\n";
    let proxy = TestProxy::start(&preamble_with(Some(dns.addr), spec)).await;
    let admin = proxy.admin.port();
    let filter_before = log_filter(&proxy).await;

    for host in MAPPED_LOOPBACK {
        // Absolute URI (HTTP_PROXY clients).
        let r = get_absolute(proxy.http(), &format!("http://{host}:{admin}/config")).await;
        assert_eq!(r.status, 403, "{host}: {}", r.text());
        assert_eq!(r.error_code(), Some("destination_not_allowed"), "{host}");
        assert!(
            r.text().contains("127.0.0.1"),
            "named canonically: {}",
            r.text()
        );

        // Host header.
        let r = get(proxy.http(), &format!("{host}:{admin}"), "/config").await;
        assert_eq!(r.status, 403, "{host} by Host: {}", r.text());

        // CONNECT.
        assert_eq!(
            connect_status(proxy.http(), &format!("{host}:{admin}")).await,
            403,
            "{host} by CONNECT"
        );

        // A write: the admin's log filter must not change.
        let post = request("POST", &format!("{host}:{admin}"), "/logging?level=trace")
            .uri(format!("http://{host}:{admin}/logging?level=trace"))
            .body(ClientBody::default())
            .unwrap();
        let r = common::proxy::fetch(proxy.http(), post).await;
        assert_eq!(r.status, 403, "{host} POST: {}", r.text());
    }

    // A DNS name whose only answer (AAAA) is mapped loopback has no usable address.
    let r = get_absolute(
        proxy.http(),
        &format!("http://admin.mapped.test:{admin}/config"),
    )
    .await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.error_code(), Some("destination_address_denied"));
    assert!(
        r.text().contains("127.0.0.1 (not a public address)"),
        "{}",
        r.text()
    );

    assert_eq!(
        log_filter(&proxy).await,
        filter_before,
        "the log level did not change"
    );
}

#[tokio::test]
async fn allowed_addresses_open_a_non_public_network_in_every_spelling() {
    let upstream = Upstream::start("inside").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    dns.set_ips("inside.mapped.test", &[mapped], 60);

    // By default loopback is not public: refused.
    let spec = "  outboundPolicy: AllowAny\n";
    let proxy = TestProxy::start(&preamble_with(Some(dns.addr), spec)).await;
    let r = get_absolute(proxy.http(), &format!("http://127.0.0.1:{port}/")).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("allowedAddresses"), "{}", r.text());
    drop(proxy);

    // Opened by allowedAddresses, written as a mapped network: both spellings reach it.
    let spec = "  outboundPolicy: AllowAny\n  undeclaredDestinations: {allowedAddresses: [\"::ffff:127.0.0.0/104\"]}\n";
    let proxy = TestProxy::start(&preamble_with(Some(dns.addr), spec)).await;
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://inside.mapped.test:{port}/"),
    ] {
        let r = get_absolute(proxy.http(), &url).await;
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        assert_eq!(r.upstream(), Some("inside"), "{url}");
    }
    assert_eq!(upstream.request_count(), 3);
}

/// A minimal TLS 1.2 ClientHello naming `sni` (RFC 5246 §7.4.1.2, RFC 6066 §3), written by
/// hand: TLS libraries refuse to send names such as `2130706433`, which is the point.
fn client_hello(sni: &str) -> Vec<u8> {
    let name = sni.as_bytes();
    let mut server_name = vec![0u8]; // host_name
    server_name.extend_from_slice(&(name.len() as u16).to_be_bytes());
    server_name.extend_from_slice(name);
    let mut list = (server_name.len() as u16).to_be_bytes().to_vec();
    list.extend_from_slice(&server_name);
    let mut extensions = vec![0u8, 0]; // server_name
    extensions.extend_from_slice(&(list.len() as u16).to_be_bytes());
    extensions.extend_from_slice(&list);
    let mut hello = vec![3u8, 3]; // TLS 1.2
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.push(0); // no session id
    hello.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
    hello.extend_from_slice(&[1, 0]); // null compression
    hello.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    hello.extend_from_slice(&extensions);
    let mut handshake = vec![1u8]; // client_hello
    handshake.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&hello);
    let mut record = vec![0x16u8, 3, 1];
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

/// Sends a ClientHello naming `sni` to the passthrough listener and waits until egressd
/// closes the connection (it refuses before any upstream could answer).
async fn hello_with_sni(proxy: SocketAddr, sni: &str) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(&client_hello(sni)).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tcp.read_to_end(&mut rest),
    )
    .await;
}

#[tokio::test]
async fn a_passthrough_sni_is_judged_in_canonical_form() {
    let dns = TestDns::start().await;
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    dns.set_ips("sni.mapped.test", &[mapped], 60);
    let spec = "  outboundPolicy: AuditOnly\n";
    let yaml = preamble_with(Some(dns.addr), spec)
        + "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge}\nspec:\n  listeners:\n  - {name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {mode: Passthrough}}\n";
    let proxy = TestProxy::start(&yaml).await;
    let edge = proxy.listener("default/edge/tls");

    // A number inet_aton reads as 127.0.0.1 is no host name: refused, not recorded.
    hello_with_sni(edge, "2130706433").await;
    // A name whose only answer is mapped loopback has no usable address.
    hello_with_sni(edge, "sni.mapped.test").await;

    let metric =
        |cause: &str| format!("egressd_tls_passthrough_rejected_total{{cause=\"{cause}\"}}");
    let counted = common::poll_within(std::time::Duration::from_secs(5), || async {
        common::outlier::metric(&proxy, &metric("invalid_sni")).await == 1.0
            && common::outlier::metric(&proxy, &metric("destination_address_denied")).await == 1.0
    })
    .await
    .is_some();
    assert!(
        counted,
        "{}",
        get(proxy.admin, "localhost", "/metrics").await.text()
    );
    let blocked = get(proxy.admin, "localhost", "/blocked").await.text();
    assert!(!blocked.contains("2130706433"), "{blocked}");
}
