//! Every kind of traffic passes the same phases. An HTTP request, a websocket, a CONNECT tunnel
//! and a TLS passthrough connection record their attempt alike (connect failures counted for
//! the Backend, which the console's error rate reads; outlier detection; the access log's
//! `attempts`), and are refused alike (`/blocked`, the circuit breaker's overflow, the log
//! line).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::dns::TestDns;
use common::outlier::{answering, endpoint_state, is_ejected, metric, od_proxy, HOST};
use common::ports::Refusing;
use common::proxy::{get, ip_backend, json_lines, preamble, preamble_with, route_to, TestProxy};
use common::tls::{passthrough_rejected, San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::Upstream;
use common::{eventually, poll_within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;

const WS_HOST: &str = "ws.test";
const TUNNEL_HOST: &str = "api.tunnel.test";
const PASS_HOST: &str = "api.pass.test";

/// A plain TCP Backend `name` for `host:port` (CONNECT reaches it), with `extra` in its spec.
fn tcp_backend(name: &str, host: &str, port: u16, extra: &str) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination: {{type: FQDN, fqdn: {{hostname: {host}, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {port}}}]}}\n  protocol: TCP\n  tls: {{mode: InsecureDisable}}\n{extra}"
    )
}

/// A Passthrough Backend `name` for `host` (exact or `*.suffix`) on `port`.
fn passthrough_backend(name: &str, host: &str, port: u16, extra: &str) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination: {{type: FQDN, fqdn: {{hostname: \"{host}\", allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {port}}}]}}\n  tls: {{mode: Passthrough}}\n{extra}"
    )
}

/// A Gateway `edge` with a TLS passthrough listener `tls`.
const PASSTHROUGH_LISTENER: &str = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge}\nspec:\n  listeners:\n  - {name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {mode: Passthrough}}\n";

/// A TLS handshake naming `sni` through the passthrough listener `listener`, trusting `ca`.
async fn passthrough_handshake(
    listener: SocketAddr,
    ca: &TestCa,
    sni: &'static str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = ca.client_config(true);
    let tcp = TcpStream::connect(listener).await.unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(sni.try_into().unwrap(), tcp)
        .await
}

/// A websocket handshake through egressd to `host`: the status of the answer (101 when open).
async fn ws_status(proxy: SocketAddr, host: &str) -> (u16, Option<String>) {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let request =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{host}/chat"))
            .unwrap();
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((_ws, response)) => (response.status().as_u16(), None),
        Err(tungstenite::Error::Http(response)) => (
            response.status().as_u16(),
            response
                .headers()
                .get("x-egressd-error")
                .map(|v| v.to_str().unwrap().to_owned()),
        ),
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

/// `CONNECT target`: the status, the head, and the connection (a tunnel on 200).
async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = common::proxy::read_head(&mut stream).await;
    (head[9..12].parse().unwrap(), head, stream)
}

fn connect_failures(backend: &str) -> String {
    format!(
        r#"egressd_upstream_connect_failures_total{{backend="default/{backend}",reason="upstream_connect_failure"}}"#
    )
}

#[tokio::test]
async fn a_websocket_and_a_tunnel_to_a_refused_endpoint_count_as_connect_failures() {
    let ws_refusing = Refusing::bind();
    let tunnel_refusing = Refusing::bind();
    let dns = TestDns::start().await;
    dns.set(TUNNEL_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let port = tunnel_refusing.addr.port();
    let yaml = preamble(Some(dns.addr))
        + &ip_backend("ws", ws_refusing.addr, "")
        + &route_to(WS_HOST, "ws")
        + &tcp_backend("tunnel", TUNNEL_HOST, port, "");
    let proxy = TestProxy::start(&yaml).await;

    let (status, code) = ws_status(proxy.http(), WS_HOST).await;
    assert_eq!(
        (status, code.as_deref()),
        (503, Some("upstream_connect_failure"))
    );
    let (status, head, _) = connect(proxy.http(), &format!("{TUNNEL_HOST}:{port}")).await;
    assert_eq!(status, 503, "{head}");
    assert!(
        head.contains("x-egressd-error: upstream_connect_failure"),
        "{head}"
    );

    // The series the console's error rate reads (`egressd_upstream_connect_failures_total`).
    assert_eq!(metric(&proxy, &connect_failures("ws")).await, 1.0);
    assert_eq!(metric(&proxy, &connect_failures("tunnel")).await, 1.0);
}

#[tokio::test]
async fn a_websocket_whose_upstream_answers_5xx_to_the_upgrade_counts_for_outlier_detection() {
    let port = common::ports::shared_port();
    let failing = answering(1, port, 503).await;
    let healthy = answering(2, port, 200).await;
    let proxy = od_proxy(&[failing.addr, healthy.addr], "").await;

    // Round robin: the failing endpoint answers every other handshake, 503 each time.
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(ws_status(proxy.http(), HOST).await.0);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 503).count(),
        5,
        "{statuses:?}"
    );
    eventually(
        "five 503s to the upgrade eject the endpoint",
        Duration::from_secs(5),
        || async { is_ejected(&proxy, "127.0.0.1").await },
    )
    .await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert!(
        state.to_string().contains("answered 503"),
        "the endpoint's last failure: {state}"
    );
    // Counted among the Backend's answers (the console's error rate reads them).
    let series = r#"egressd_upstream_responses_total{backend="default/api",class="5xx"}"#;
    assert_eq!(metric(&proxy, series).await, 5.0);
    assert!(!is_ejected(&proxy, "127.0.0.2").await);
}

#[tokio::test]
async fn a_tunnels_access_log_line_counts_its_attempt() {
    let dns = TestDns::start().await;
    dns.set(TUNNEL_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let upstream = Upstream::start("plain").await;
    let port = upstream.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = (preamble(Some(dns.addr)) + &tcp_backend("plain", TUNNEL_HOST, port, "")).replace(
        "  accessLog:\n    enabled: false\n",
        &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
    );
    assert!(yaml.contains("access.log"));
    let proxy = TestProxy::start(&yaml).await;
    let (status, head, mut tunnel) = connect(proxy.http(), &format!("{TUNNEL_HOST}:{port}")).await;
    assert_eq!(status, 200, "{head}");
    let request = format!("GET /raw HTTP/1.1\r\nHost: {TUNNEL_HOST}\r\nConnection: close\r\n\r\n");
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    tunnel.read_to_string(&mut reply).await.unwrap();
    drop(tunnel);
    let line = eventually(
        "a line once the tunnel closed",
        Duration::from_secs(5),
        || async { json_lines(&log).into_iter().next() },
    )
    .await;
    assert_eq!(line["method"], "CONNECT");
    assert_eq!(line["attempts"], 1, "{line}");
    assert_eq!(line["endpoint"], upstream.addr.to_string(), "{line}");
}

#[tokio::test]
async fn a_refused_wildcard_sni_on_a_passthrough_listener_is_in_blocked() {
    let ca = TestCa::new("pass");
    let upstream = TlsUpstream::start(
        "db",
        ca.server_cert(&[San::dns("db.pass.localhost")]),
        TlsOptions::default(),
    )
    .await;
    let port = upstream.addr.port();
    let spec = "  deniedHostnames: [\"secret.pass.localhost\"]\n";
    let yaml = preamble_with(None, spec)
        + PASSTHROUGH_LISTENER
        + &passthrough_backend("pass", "*.pass.localhost", port, "");
    let proxy = TestProxy::start(&yaml).await;
    let listener = proxy.listener("default/edge/tls");
    let handshake = |sni: &'static str| passthrough_handshake(listener, &ca, sni);
    handshake("db.pass.localhost")
        .await
        .expect("a host the wildcard covers is relayed");
    assert!(handshake("secret.pass.localhost").await.is_err());
    assert_eq!(
        passthrough_rejected(&proxy, "destination_not_allowed").await,
        1
    );
    let listed = get(proxy.admin, "localhost", "/blocked").await.text();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let entries = listed["blocked"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["host"], "secret.pass.localhost", "{listed}");
    assert_eq!(entries[0]["via"], "tls-passthrough", "{listed}");
    assert_eq!(upstream.snis(), [Some("db.pass.localhost".to_owned())]);
}

#[tokio::test]
async fn a_passthrough_connection_over_max_connections_is_refused_like_a_connect_over_it() {
    let dns = TestDns::start().await;
    dns.set(PASS_HOST, &[Ipv4Addr::LOCALHOST], 60);
    dns.set(TUNNEL_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("overflow");
    let tls_upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns(PASS_HOST)]),
        TlsOptions::default(),
    )
    .await;
    let plain = Upstream::start("plain").await;
    let breaker = "  trafficPolicy: {circuitBreaker: {maxConnections: 1}}\n";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = (preamble(Some(dns.addr))
        + PASSTHROUGH_LISTENER
        + &passthrough_backend("pass", PASS_HOST, tls_upstream.addr.port(), breaker)
        + &tcp_backend("tunnel", TUNNEL_HOST, plain.addr.port(), breaker))
        .replace(
            "  accessLog:\n    enabled: false\n",
            &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
        );
    assert!(yaml.contains("access.log"));
    let proxy = TestProxy::start(&yaml).await;
    let listener = proxy.listener("default/edge/tls");
    let handshake = || passthrough_handshake(listener, &ca, PASS_HOST);

    let held = handshake().await.expect("the first connection is relayed");
    assert!(
        handshake().await.is_err(),
        "the second is over maxConnections"
    );
    let target = format!("{TUNNEL_HOST}:{}", plain.addr.port());
    let (status, head, _tunnel) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "{head}");
    let (status, head, _) = connect(proxy.http(), &target).await;
    assert_eq!(status, 503, "{head}");

    for backend in ["pass", "tunnel"] {
        let series = format!(
            r#"egressd_circuit_breaker_overflows_total{{backend="default/{backend}",reason="max_connections"}}"#
        );
        assert_eq!(metric(&proxy, &series).await, 1.0, "{backend}");
    }
    assert_eq!(passthrough_rejected(&proxy, "overflow").await, 1);
    let refusals = || {
        json_lines(&log)
            .into_iter()
            .filter(|l| l["error"] == "overflow")
            .collect::<Vec<_>>()
    };
    let lines = poll_within(Duration::from_secs(5), || async {
        let lines = refusals();
        (lines.len() == 2).then_some(lines)
    })
    .await
    .unwrap_or_else(|| panic!("two refusals logged: {:?}", json_lines(&log)));
    let passthrough = lines.iter().find(|l| l["method"] == "TLS").unwrap();
    let tunnel = lines.iter().find(|l| l["method"] == "CONNECT").unwrap();
    // The same refusal: what each client was told (a CONNECT's 503 body, a passthrough
    // connection's close) is the only difference.
    for field in [
        "status",
        "error",
        "error_cause",
        "attempts",
        "endpoint",
        "route",
    ] {
        assert_eq!(
            passthrough[field], tunnel[field],
            "{field}: {passthrough} and {tunnel}"
        );
    }
    assert_eq!(passthrough["status"], 503);
    assert_eq!(passthrough["backend"], "default/pass");
    assert_eq!(tunnel["backend"], "default/tunnel");
    drop(held);
}

/// A websocket's upstream that answers the handshake with bytes that are no HTTP response is
/// named for what it did, as an HTTP request's would be (`upstream_protocol_error`, not a
/// reset), and it is the endpoint's last failure.
#[tokio::test]
async fn a_websocket_upstream_answering_garbage_is_a_protocol_error_like_a_requests() {
    use common::upstream::{read_request_head, RawUpstream};
    let liar = RawUpstream::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n").await;
        let mut rest = [0u8; 64];
        let _ = stream.read(&mut rest).await;
    })
    .await;
    let yaml = preamble(None) + &ip_backend("liar", liar.addr, "") + &route_to(WS_HOST, "liar");
    let proxy = TestProxy::start(&yaml).await;
    let (status, code) = ws_status(proxy.http(), WS_HOST).await;
    assert_eq!(
        (status, code.as_deref()),
        (502, Some("upstream_protocol_error"))
    );
    let plain = get(proxy.http(), WS_HOST, "/").await;
    assert_eq!(
        plain.error_code(),
        Some("upstream_protocol_error"),
        "{}",
        plain.text()
    );
    let series = r#"egressd_upstream_failures_total{backend="default/liar",reason="upstream_protocol_error"}"#;
    assert_eq!(metric(&proxy, series).await, 2.0);
}

/// A websocket's access log line is written when it closes, like a tunnel's: with the bytes
/// each way and its one attempt.
#[tokio::test]
async fn a_websockets_access_log_line_is_written_when_it_closes_with_its_bytes() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let echo = common::websocket::EchoServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = (preamble(None) + &ip_backend("echo", echo.addr, "") + &route_to(WS_HOST, "echo"))
        .replace(
            "  accessLog:\n    enabled: false\n",
            &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
        );
    assert!(yaml.contains("access.log"));
    let proxy = TestProxy::start(&yaml).await;
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let request =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{WS_HOST}/chat"))
            .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    ws.send(Message::text("hello through egressd"))
        .await
        .unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed, Message::text("hello through egressd"));
    // Open: no line yet (it is written at the close, with the bytes).
    assert!(json_lines(&log).is_empty(), "{:?}", json_lines(&log));
    ws.close(None).await.unwrap();
    while ws.next().await.is_some() {}
    drop(ws);
    let line = eventually(
        "a line once the websocket closed",
        Duration::from_secs(5),
        || async { json_lines(&log).into_iter().next() },
    )
    .await;
    assert_eq!(line["method"], "GET", "{line}");
    assert_eq!(line["status"], 101, "{line}");
    assert_eq!(line["attempts"], 1, "{line}");
    assert_eq!(line["endpoint"], echo.addr.to_string(), "{line}");
    assert!(line["bytes_in"].as_u64().unwrap() > 20, "{line}");
    assert!(line["bytes_out"].as_u64().unwrap() > 20, "{line}");
}

/// A rate limit counts every kind once, when it opens: the second websocket, `CONNECT` and
/// passthrough connection over a limit of one an hour are refused (429 `rate_limited`, a
/// closed connection), while the first of each stays open.
#[tokio::test]
async fn a_websocket_a_tunnel_and_a_passthrough_connection_each_count_once_against_a_rate_limit() {
    let dns = TestDns::start().await;
    dns.set(PASS_HOST, &[Ipv4Addr::LOCALHOST], 60);
    dns.set(TUNNEL_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let ca = TestCa::new("limits");
    let tls_upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns(PASS_HOST)]),
        TlsOptions::default(),
    )
    .await;
    let plain = Upstream::start("plain").await;
    let echo = common::websocket::EchoServer::start().await;
    let limit = "  trafficPolicy: {rateLimit: {local: {rules: [{name: one, limit: {requests: 1, unit: Hour}}]}}}\n";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = (preamble(Some(dns.addr))
        + PASSTHROUGH_LISTENER
        + &passthrough_backend("pass", PASS_HOST, tls_upstream.addr.port(), limit)
        + &tcp_backend("tunnel", TUNNEL_HOST, plain.addr.port(), limit)
        + &ip_backend("echo", echo.addr, limit)
        + &route_to(WS_HOST, "echo"))
        .replace(
            "  accessLog:\n    enabled: false\n",
            &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
        );
    let proxy = TestProxy::start(&yaml).await;

    // Websockets: the first opens, the second is refused before any upstream sees it.
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let request =
        tungstenite::client::IntoClientRequest::into_client_request(format!("ws://{WS_HOST}/chat"))
            .unwrap();
    let (_open_ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .expect("the first websocket opens");
    let (status, code) = ws_status(proxy.http(), WS_HOST).await;
    assert_eq!((status, code.as_deref()), (429, Some("rate_limited")));

    // CONNECT: the same.
    let target = format!("{TUNNEL_HOST}:{}", plain.addr.port());
    let (status, head, _tunnel) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "{head}");
    let (status, head, _) = connect(proxy.http(), &target).await;
    assert_eq!(status, 429, "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");

    // Passthrough: the second connection is closed without a byte.
    let listener = proxy.listener("default/edge/tls");
    let handshake = || passthrough_handshake(listener, &ca, PASS_HOST);
    let _held = handshake().await.expect("the first connection is relayed");
    assert!(handshake().await.is_err(), "the second is over the limit");
    assert_eq!(passthrough_rejected(&proxy, "rate_limited").await, 1);

    for backend in ["pass", "tunnel", "echo"] {
        let series = |decision: &str| {
            format!("egressd_ratelimit_decisions_total{{policy=\"Backend default/{backend}\",rule=\"one\",decision=\"{decision}\"}}")
        };
        assert_eq!(metric(&proxy, &series("allowed")).await, 1.0, "{backend}");
        assert_eq!(metric(&proxy, &series("limited")).await, 1.0, "{backend}");
    }
    let lines = poll_within(Duration::from_secs(5), || async {
        let lines: Vec<_> = json_lines(&log)
            .into_iter()
            .filter(|l| l["error"] == "rate_limited")
            .collect();
        (lines.len() == 3).then_some(lines)
    })
    .await
    .unwrap_or_else(|| panic!("three refusals logged: {:?}", json_lines(&log)));
    for method in ["GET", "CONNECT", "TLS"] {
        let line = lines.iter().find(|l| l["method"] == method).unwrap();
        assert_eq!(line["status"], 429, "{line}");
        assert!(
            line["rate_limit"]
                .as_str()
                .unwrap()
                .starts_with("limited Backend default/"),
            "{line}"
        );
    }
}
