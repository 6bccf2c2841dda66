//! Client connections are bounded (issue #14, point 3): at most `downstream.maxConnections`
//! are open at once (more are closed at accept and counted); a connection must deliver its
//! first request head (TLS handshake, HTTP/2 preface and passthrough ClientHello included)
//! within `headerReadTimeout` of accept, and is closed after `idleTimeout` without a request
//! in flight (HTTP/2: GOAWAY). The admin server has the same timeouts and a cap of its own.
//! Out of file descriptors, accepting backs off without flooding the log, and open
//! connections keep being served. Refused TLS passthrough connections are counted, and the
//! log says so a bounded number of times (point 12).
//!
//! Real sockets throughout: in-process proxies (`common::proxy`), and the built binary under a
//! lowered `ulimit -n` (`common::binary`) where the process's descriptors matter.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::binary::{Egressd, KeepAlive};
use common::h2frames::{self, read_until_goaway};
use common::proxy::{get, ip_backend, route_to, sample, TestProxy};
use common::tls::{San, TestCa};
use common::upstream::{full, Upstream};
use common::{eventually, poll_within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The host the HTTPRoute of [`config`] serves.
const HOST: &str = "svc.test";
/// The name on the HTTPS listener's certificate.
const APP: &str = "app.test";

/// How long a test waits for something egressd's timers should do within a fraction of it.
/// Generous: the machine is shared; what matters is that it happens at all, since without the
/// limits it never does (or only after tens of seconds).
const WITHIN: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Setup

/// A proxy with an HTTP (`default/gw/http`), an HTTPS (`default/gw/https`) and a TLS
/// passthrough (`default/gw/tls`) listener, HTTPRoute [`HOST`] → Backend `svc` at `upstream`,
/// and `downstream` (YAML lines indented by four spaces) as `ProxyConfig.spec.downstream`;
/// `admin` (lines indented by four spaces, or empty) as `spec.admin`.
fn config(
    downstream: &str,
    admin: &str,
    upstream: SocketAddr,
    cert: &(PathBuf, PathBuf),
) -> String {
    let admin = if admin.is_empty() {
        String::new()
    } else {
        format!("  admin:\n{admin}")
    };
    let yaml = format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{enabled: false}}
  drain: {{timeout: 1s}}
{admin}  downstream:
{downstream}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  listeners:
  - {{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}}
  - name: https
    address: 127.0.0.1
    port: 0
    protocol: HTTPS
    tls:
      certificateFiles:
      - {{certificateFile: {cert:?}, privateKeyFile: {key:?}}}
  - {{name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {{mode: Passthrough}}}}
"#,
        cert = cert.0.display().to_string(),
        key = cert.1.display().to_string(),
    );
    yaml + &route_to(HOST, "svc") + &ip_backend("svc", upstream, "")
}

struct Setup {
    proxy: TestProxy,
    ca: TestCa,
    cert: (PathBuf, PathBuf),
    upstream: Upstream,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(downstream: &str, admin: &str) -> Setup {
        Self::start_with(downstream, admin, Upstream::start("svc").await).await
    }

    async fn start_with(downstream: &str, admin: &str, upstream: Upstream) -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new("downstream");
        let cert = ca.server_cert(&[San::dns(APP)]).write(dir.path(), "app");
        let proxy = TestProxy::start(&config(downstream, admin, upstream.addr, &cert)).await;
        Setup {
            proxy,
            ca,
            cert,
            upstream,
            _dir: dir,
        }
    }

    fn http(&self) -> SocketAddr {
        self.proxy.listener("default/gw/http")
    }

    fn https(&self) -> SocketAddr {
        self.proxy.listener("default/gw/https")
    }

    fn passthrough(&self) -> SocketAddr {
        self.proxy.listener("default/gw/tls")
    }

    /// Replaces `spec.downstream` and reloads.
    async fn reload(&self, downstream: &str) {
        self.proxy
            .rewrite(&config(downstream, "", self.upstream.addr, &self.cert));
        self.proxy.reload().await;
    }

    /// The sample `series` (name and labels as exported) of the proxy's metrics; 0 when not
    /// exported yet. Read in-process, so that it costs no admin connection.
    fn metric(&self, series: &str) -> f64 {
        self.proxy.metric(series)
    }

    /// A TLS client connection to the HTTPS listener, handshake done.
    async fn tls_connect(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.https()).await.expect("connect");
        tokio_rustls::TlsConnector::from(self.ca.client_config(true))
            .connect(APP.try_into().expect("server name"), tcp)
            .await
            .expect("TLS handshake with the HTTPS listener")
    }
}

fn refused(reason: &str) -> String {
    format!("egressd_downstream_connections_refused_total{{reason=\"{reason}\"}}")
}

fn timeouts(reason: &str) -> String {
    format!("egressd_downstream_connection_timeouts_total{{reason=\"{reason}\"}}")
}

/// Whether the peer closes `io` within `limit` (whatever it sends before that is read and
/// dropped).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(io: &mut S, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, io.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Whether `stream` is still open with nothing to read (not closed by the peer).
fn still_open(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(stream.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// A plain `GET /` for [`HOST`] on a new connection: the status, or `None` when the
/// connection was closed without an answer.
async fn try_get(addr: SocketAddr) -> Option<http::StatusCode> {
    common::binary::try_get(addr, HOST, "/")
        .await
        .ok()
        .map(|r| r.status)
}

// ---------------------------------------------------------------------------------------------
// headerReadTimeout

#[tokio::test]
async fn a_socket_that_sends_nothing_or_part_of_a_preface_is_closed_after_header_read_timeout() {
    let setup = Setup::start("    headerReadTimeout: 300ms\n", "").await;
    let mut silent = TcpStream::connect(setup.http()).await.unwrap();
    // Protocol detection waits for bytes that could still be the HTTP/2 preface.
    let mut half_preface = TcpStream::connect(setup.http()).await.unwrap();
    half_preface
        .write_all(&h2frames::PREFACE[..10])
        .await
        .unwrap();
    assert!(
        closed_within(&mut silent, WITHIN).await,
        "a silent connection was not closed"
    );
    assert!(
        closed_within(&mut half_preface, WITHIN).await,
        "a connection stuck in its HTTP/2 preface was not closed"
    );
    assert_eq!(setup.metric(&timeouts("header_read_timeout")), 2.0);
    // The listener serves as before.
    assert_eq!(get(setup.http(), HOST, "/").await.status, 200);
}

#[tokio::test]
async fn a_request_head_trickled_past_header_read_timeout_is_closed() {
    let setup = Setup::start("    headerReadTimeout: 500ms\n", "").await;
    let mut stream = TcpStream::connect(setup.http()).await.unwrap();
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n").as_bytes())
        .await
        .unwrap();
    // One header line every 100 ms: each read is quick, the head never ends.
    let started = Instant::now();
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        for i in 0.. {
            let line = format!("x-slow-{i}: 1\r\n");
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(
        closed_within(&mut read, WITHIN).await,
        "a trickled head was not cut off"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    trickle.abort();
    assert_eq!(setup.upstream.request_count(), 0);
}

#[tokio::test]
async fn a_tls_client_silent_before_or_after_its_handshake_is_closed_after_header_read_timeout() {
    let setup = Setup::start("    headerReadTimeout: 300ms\n", "").await;
    let mut no_hello = TcpStream::connect(setup.https()).await.unwrap();
    let mut after_handshake = setup.tls_connect().await;
    assert!(
        closed_within(&mut no_hello, WITHIN).await,
        "a client that never started its handshake was not closed"
    );
    assert!(
        closed_within(&mut after_handshake, WITHIN).await,
        "a client silent after its handshake was not closed"
    );
    assert_eq!(setup.metric(&timeouts("header_read_timeout")), 2.0);
}

#[tokio::test]
async fn a_passthrough_client_that_sends_no_client_hello_is_closed_after_header_read_timeout() {
    let setup = Setup::start("    headerReadTimeout: 300ms\n", "").await;
    let mut silent = TcpStream::connect(setup.passthrough()).await.unwrap();
    assert!(closed_within(&mut silent, WITHIN).await);
    assert_eq!(
        setup.metric("egressd_tls_passthrough_rejected_total{cause=\"client_hello_timeout\"}"),
        1.0
    );
    assert_eq!(setup.metric(&timeouts("header_read_timeout")), 1.0);
}

// ---------------------------------------------------------------------------------------------
// idleTimeout

#[tokio::test]
async fn keep_alive_outlives_header_read_timeout_and_slow_responses_outlive_idle_timeout_then_idle_closes(
) {
    let upstream = Upstream::start_with(|request| async move {
        if request.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_millis(800)).await;
        }
        http::Response::new(full("done"))
    })
    .await;
    let downstream = "    headerReadTimeout: 200ms\n    idleTimeout: 400ms\n";
    let setup = Setup::start_with(downstream, "", upstream).await;
    let mut conn = KeepAlive::connect(setup.http()).await.unwrap();
    assert_eq!(conn.get(HOST, "/").await.unwrap().status, 200);
    // Longer than headerReadTimeout, shorter than idleTimeout: a keep-alive pause.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A response slower than idleTimeout: a request in flight is not idleness.
    let slow = conn
        .get(HOST, "/slow")
        .await
        .expect("slow response on the same connection");
    assert_eq!(slow.body, Bytes::from_static(b"done"));
    assert_eq!(setup.upstream.connection_count(), 1);
    // Then nothing: the connection is closed after idleTimeout.
    eventually(
        "the idle keep-alive connection was not closed",
        WITHIN,
        || async { setup.metric(&timeouts("idle_timeout")) >= 1.0 },
    )
    .await;
    assert!(conn.get(HOST, "/").await.is_err());
    assert_eq!(setup.metric(&timeouts("idle_timeout")), 1.0);
    assert_eq!(setup.metric(&timeouts("header_read_timeout")), 0.0);
}

#[tokio::test]
async fn an_http2_connection_without_streams_is_sent_goaway_after_idle_timeout() {
    let setup = Setup::start("    headerReadTimeout: 200ms\n    idleTimeout: 400ms\n", "").await;
    let mut stream = TcpStream::connect(setup.http()).await.unwrap();
    let mut hello = h2frames::PREFACE.to_vec();
    h2frames::empty_settings(&mut hello);
    stream.write_all(&hello).await.unwrap();
    let started = Instant::now();
    let (goaway, _) = read_until_goaway(&mut stream, WITHIN).await;
    let goaway = goaway.expect("GOAWAY on an idle HTTP/2 connection");
    assert_eq!(goaway.error_code(), Some(0), "GOAWAY NO_ERROR");
    // Past headerReadTimeout: after the preface only idleTimeout applies.
    assert!(started.elapsed() >= Duration::from_millis(350));
    assert!(closed_within(&mut stream, Duration::from_secs(10)).await);
    assert_eq!(setup.metric(&timeouts("idle_timeout")), 1.0);
}

#[tokio::test]
async fn an_http2_stream_slower_than_idle_timeout_completes_then_the_idle_connection_goes_away() {
    let upstream = Upstream::start_with(|_| async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        http::Response::new(full("done"))
    })
    .await;
    let setup = Setup::start_with("    idleTimeout: 300ms\n", "", upstream).await;
    let mut sender = common::h2::client(setup.http()).await;
    let request = http::Request::get(format!("http://{HOST}/"))
        .body(common::h2::body(""))
        .unwrap();
    let response = sender.send_request(request).await.expect("response");
    let response = common::proxy::collect(response).await;
    assert_eq!(response.body, Bytes::from_static(b"done"));
    eventually("the idle HTTP/2 connection was not closed", WITHIN, || {
        let closed = sender.is_closed();
        async move { closed }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// maxConnections

#[tokio::test]
async fn connections_over_max_connections_are_closed_at_once_and_counted_until_one_closes() {
    let setup = Setup::start("    maxConnections: 2\n", "").await;
    let first = TcpStream::connect(setup.http()).await.unwrap();
    let _second = TcpStream::connect(setup.http()).await.unwrap();
    // Accepted in order: the two are counted before the third arrives.
    let mut third = TcpStream::connect(setup.http()).await.unwrap();
    assert!(
        closed_within(&mut third, WITHIN).await,
        "a connection over the cap was accepted"
    );
    assert_eq!(setup.metric(&refused("max_connections")), 1.0);
    assert!(try_get(setup.http()).await.is_none());
    // A closed connection frees its slot for the next client. Waiting on the gauge rather
    // than retrying requests: a retry that races the close would be refused and counted.
    drop(first);
    eventually("no slot came free", WITHIN, || async {
        setup.metric("egressd_downstream_connections_active") <= 1.0
    })
    .await;
    assert!(
        try_get(setup.http()).await.is_some(),
        "a freed slot was not reused"
    );
    assert_eq!(setup.metric(&refused("max_connections")), 2.0);
}

#[tokio::test]
async fn tls_passthrough_and_https_connections_count_against_max_connections() {
    let setup = Setup::start("    maxConnections: 2\n", "").await;
    let passthrough = TcpStream::connect(setup.passthrough()).await.unwrap();
    let _https = setup.tls_connect().await;
    eventually(
        "a new connection refused and counted as max_connections",
        WITHIN,
        || async {
            try_get(setup.http()).await.is_none()
                && setup.metric(&refused("max_connections")) >= 1.0
        },
    )
    .await;
    drop(passthrough);
    eventually("a new connection served again", WITHIN, || async {
        try_get(setup.http()).await.is_some()
    })
    .await;
}

/// A raw TCP server echoing what it reads, for tunnels.
async fn echo_upstream() -> common::upstream::RawUpstream {
    common::upstream::RawUpstream::start(|mut stream| async move {
        let mut buf = [0u8; 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// A proxy as [`config`] with `downstream`, letting `CONNECT` reach undeclared destinations,
/// loopback included (the echo server).
async fn tunnel_proxy(downstream: &str) -> (TestProxy, Upstream, tempfile::TempDir) {
    let upstream = Upstream::start("svc").await;
    let dir = tempfile::tempdir().unwrap();
    let cert = TestCa::new("tunnel")
        .server_cert(&[San::dns(APP)])
        .write(dir.path(), "app");
    let yaml = config(downstream, "", upstream.addr, &cert).replace(
        "  accessLog:",
        "  outboundPolicy: AllowAny\n  undeclaredDestinations: {deniedAddresses: []}\n  accessLog:",
    );
    (TestProxy::start(&yaml).await, upstream, dir)
}

#[tokio::test]
async fn a_connect_tunnel_keeps_its_slot_after_the_upgrade() {
    let echo = echo_upstream().await;
    let (proxy, _upstream, _dir) = tunnel_proxy("    maxConnections: 1\n").await;
    let http = proxy.listener("default/gw/http");
    let mut tunnel = TcpStream::connect(http).await.unwrap();
    let target = format!("127.0.0.1:{}", echo.addr.port());
    tunnel
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 1024];
    let n = tunnel.read(&mut head).await.unwrap();
    assert!(
        String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"),
        "CONNECT answered {:?}",
        String::from_utf8_lossy(&head[..n])
    );
    tunnel.write_all(b"ping").await.unwrap();
    let n = tunnel.read(&mut head).await.unwrap();
    assert_eq!(&head[..n], b"ping");
    // The upgraded socket still holds the only slot.
    assert!(try_get(http).await.is_none());
    drop(tunnel);
    eventually("a new connection served again", WITHIN, || async {
        try_get(http).await.is_some()
    })
    .await;
}

#[tokio::test]
async fn an_http2_connection_carrying_only_a_tunnel_is_not_idle() {
    let echo = echo_upstream().await;
    let (proxy, _upstream, _dir) = tunnel_proxy("    idleTimeout: 300ms\n").await;
    let mut sender = common::h2::client(proxy.listener("default/gw/http")).await;
    let request = http::Request::connect(format!("127.0.0.1:{}", echo.addr.port()))
        .body(common::h2::body(""))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .expect("CONNECT response");
    assert_eq!(response.status(), 200);
    let mut tunnel =
        hyper_util::rt::TokioIo::new(hyper::upgrade::on(response).await.expect("tunnel stream"));
    let mut buf = [0u8; 16];
    tunnel.write_all(b"one").await.unwrap();
    tunnel.read_exact(&mut buf[..3]).await.unwrap();
    // Silent for longer than idleTimeout and the grace after a GOAWAY together: the tunnel's
    // stream is a request in flight, so the connection is not idle.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    tunnel.write_all(b"two").await.unwrap();
    let read = tokio::time::timeout(WITHIN, tunnel.read_exact(&mut buf[..3])).await;
    assert!(matches!(read, Ok(Ok(3))), "the tunnel was cut: {read:?}");
    assert_eq!(&buf[..3], b"two");
    assert_eq!(proxy_metric(&proxy, &timeouts("idle_timeout")), 0.0);
    // Once the tunnel closes, the connection is idle like any other.
    drop(tunnel);
    eventually("the HTTP/2 connection is closed once idle", WITHIN, || {
        let closed = sender.is_closed();
        async move { closed }
    })
    .await;
}

fn proxy_metric(proxy: &TestProxy, series: &str) -> f64 {
    proxy.metric(series)
}

// ---------------------------------------------------------------------------------------------
// Reload

#[tokio::test]
async fn a_reload_applies_new_timeouts_and_caps_to_new_connections_only() {
    let setup = Setup::start("    headerReadTimeout: 30s\n", "").await;
    let old = TcpStream::connect(setup.http()).await.unwrap();
    // Accepted under the old settings before the reload.
    eventually(
        "a downstream connection counted as active",
        WITHIN,
        || async { setup.metric("egressd_downstream_connections_active") >= 1.0 },
    )
    .await;
    setup
        .reload("    headerReadTimeout: 300ms\n    maxConnections: 3\n")
        .await;
    let mut new = TcpStream::connect(setup.http()).await.unwrap();
    assert!(
        closed_within(&mut new, WITHIN).await,
        "a connection accepted after the reload kept the old headerReadTimeout"
    );
    assert!(
        still_open(&old),
        "the reload cut a connection accepted before it"
    );
    // The new cap: `old` and two more fill it; the next is refused.
    let _a = TcpStream::connect(setup.http()).await.unwrap();
    let _b = TcpStream::connect(setup.http()).await.unwrap();
    let mut over = TcpStream::connect(setup.http()).await.unwrap();
    assert!(closed_within(&mut over, WITHIN).await);
    assert_eq!(setup.metric(&refused("max_connections")), 1.0);
}

// ---------------------------------------------------------------------------------------------
// Admin server

#[tokio::test]
async fn the_admin_server_caps_its_connections_and_closes_silent_ones() {
    let setup = Setup::start("    headerReadTimeout: 300ms\n", "    maxConnections: 2\n").await;
    let admin = setup.proxy.admin;
    let mut silent = TcpStream::connect(admin).await.unwrap();
    let mut other = TcpStream::connect(admin).await.unwrap();
    assert!(
        closed_within(&mut silent, WITHIN).await,
        "a silent admin connection was not closed"
    );
    assert!(closed_within(&mut other, WITHIN).await);
    eventually("/ready answers 200", WITHIN, || async {
        common::binary::try_get(admin, "localhost", "/ready")
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
}

#[tokio::test]
async fn probes_get_through_a_flood_of_silent_admin_connections() {
    // The default cap (32) and headerReadTimeout (10s): 40 silent sockets would keep every
    // probe out for 10 s at a time; instead each new connection closes the oldest idle one.
    let setup = Setup::start("    maxConnections: 1000\n", "").await;
    let admin = setup.proxy.admin;
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(admin).await.unwrap());
    }
    for probe in 0..40 {
        let answer = common::binary::try_get(admin, "localhost", "/healthz").await;
        assert!(
            answer.as_ref().is_ok_and(|r| r.status == 200),
            "probe {probe} failed: {answer:?}"
        );
    }
    assert!(setup.metric(&refused("admin_idle_evicted")) >= 1.0);
    assert_eq!(setup.metric(&refused("admin_max_connections")), 0.0);
    drop(silent);
}

// ---------------------------------------------------------------------------------------------
// Validation

#[test]
fn downstream_limit_mistakes_are_errors_at_their_values() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/invalid/downstream-limits-mistakes");
    let validation = egressd::commands::validate(&[dir]);
    assert!(!validation.ok);
    let report = validation.report;
    for expected in [
        "spec.downstream.maxConnections",
        "maxConnections must be at least 1",
        "spec.downstream.maxRequestHeadersBytes",
        "maxRequestHeadersBytes 100 is out of range (1024 to 4294967295 bytes)",
        "spec.downstream.maxRequestHeaders",
        "spec.admin.maxConnections",
        "spec.downstream.idleTimeout",
        "idleTimeout 0s turns the timeout off",
    ] {
        assert!(report.contains(expected), "no {expected:?} in:\n{report}");
    }
}

// ---------------------------------------------------------------------------------------------
// The binary, under a lowered descriptor limit

/// A config for the binary: ProxyConfig with `downstream` (lines indented by four spaces, or
/// empty for none),
/// Gateway `gw` with listeners `http` and `tls` (passthrough), HTTPRoute [`HOST`] → `svc`.
fn binary_config(dir: &std::path::Path, downstream: &str, upstream: SocketAddr) {
    let downstream = if downstream.is_empty() {
        String::new()
    } else {
        format!("  downstream:\n{downstream}")
    };
    let yaml = format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{enabled: false}}
  drain: {{timeout: 1s}}
{downstream}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  listeners:
  - {{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}}
  - {{name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {{mode: Passthrough}}}}
"#
    ) + &route_to(HOST, "svc")
        + &ip_backend("svc", upstream, "");
    std::fs::write(dir.join("egressd.yaml"), yaml).expect("write config");
}

/// `/metrics` on an admin connection opened beforehand: out of descriptors, egressd cannot
/// accept a new one.
async fn metric_over(admin: &mut KeepAlive, series: &str) -> f64 {
    let text = admin
        .get("localhost", "/metrics")
        .await
        .expect("metrics")
        .text();
    sample(&text, series)
}

/// Polls [`metric_over`] until `series` reaches `wanted` or `within` passes; the last value.
async fn metric_reaches(admin: &mut KeepAlive, series: &str, wanted: f64, within: Duration) -> f64 {
    // Each check borrows the connection anew.
    let admin = tokio::sync::Mutex::new(admin);
    let last = std::cell::Cell::new(0.0);
    // Reached or not: the caller asserts on the value.
    poll_within(within, || async {
        let value = metric_over(*admin.lock().await, series).await;
        last.set(value);
        value >= wanted
    })
    .await;
    last.get()
}

/// `count` connections that say nothing, held open by the test.
async fn silent_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        held.push(
            TcpStream::connect(addr)
                .await
                .expect("connect (the backlog holds it)"),
        );
    }
    held
}

#[tokio::test]
async fn silent_sockets_under_a_low_descriptor_limit_meet_the_default_cap_not_emfile() {
    let upstream = Upstream::start("svc").await;
    let dir = tempfile::tempdir().unwrap();
    binary_config(dir.path(), "    headerReadTimeout: 2s\n", upstream.addr);
    let egressd = Egressd::spawn_with_open_files(dir.path(), &[], 256).await;
    let http = egressd.listener_addr("default/gw/http").await;
    let mut admin = KeepAlive::connect(egressd.admin()).await.unwrap();

    // 300 silent sockets against 256 descriptors: the default cap (half of what is left
    // after a reserve, 96 here) takes some, the rest are closed at once.
    let _held = silent_connections(http, 300).await;
    let wanted = 300.0 - 96.0;
    let refused_now = metric_reaches(&mut admin, &refused("max_connections"), wanted, WITHIN).await;
    assert!(refused_now >= wanted, "refused {refused_now} of 300");
    assert_eq!(
        metric_over(&mut admin, "egressd_downstream_accept_errors_total").await,
        0.0,
        "accept ran out of descriptors"
    );
    // Once headerReadTimeout closes the silent ones, clients are served again (while the
    // test still holds its ends of all 300).
    eventually(
        "no request served after the silent connections timed out",
        Duration::from_secs(15),
        || async { try_get(http).await == Some(http::StatusCode::OK) },
    )
    .await;
}

#[tokio::test]
async fn out_of_descriptors_accept_backs_off_without_a_log_flood_and_open_connections_are_served() {
    let upstream = Upstream::start("svc").await;
    let dir = tempfile::tempdir().unwrap();
    // A cap above what the descriptors allow, so that accept itself fails.
    binary_config(
        dir.path(),
        "    maxConnections: 5000\n    headerReadTimeout: 60s\n",
        upstream.addr,
    );
    let egressd = Egressd::spawn_with_open_files(dir.path(), &["--log-rate-limit", "3"], 256).await;
    let http = egressd.listener_addr("default/gw/http").await;
    let mut admin = KeepAlive::connect(egressd.admin()).await.unwrap();
    let mut client = KeepAlive::connect(http).await.unwrap();
    // Warms the upstream pool, so that the next request on `client` needs no new descriptor.
    assert_eq!(client.get(HOST, "/").await.unwrap().status, 200);

    let held = silent_connections(http, 300).await;
    let wanted = 12.0;
    let errors = "egressd_downstream_accept_errors_total";
    let failures = metric_reaches(&mut admin, errors, wanted, Duration::from_secs(20)).await;
    assert!(failures >= wanted, "only {failures} failed accepts");
    // Open connections are served meanwhile.
    assert_eq!(client.get(HOST, "/").await.unwrap().status, 200);
    let lines = egressd
        .stderr()
        .lines()
        .filter(|l| l.contains("accept failed"))
        .count();
    // At most 3 lines per 10 s window; the failures may straddle two windows.
    assert!(
        lines <= 6 && (lines as f64) < failures,
        "{lines} log lines for {failures} failed accepts:\n{}",
        egressd.stderr()
    );
    // Descriptors come back: the backlog is accepted and new clients are served.
    drop(held);
    eventually(
        "nothing served after descriptors came back",
        Duration::from_secs(15),
        || async { try_get(http).await == Some(http::StatusCode::OK) },
    )
    .await;
}

#[tokio::test]
async fn a_flood_of_refused_passthrough_connections_is_counted_whole_and_logged_a_bounded_number_of_times(
) {
    let upstream = Upstream::start("svc").await;
    let dir = tempfile::tempdir().unwrap();
    binary_config(dir.path(), "", upstream.addr);
    let egressd = Egressd::spawn(dir.path()).await;
    let tls = egressd.listener_addr("default/gw/tls").await;
    let not_tls = "egressd_tls_passthrough_rejected_total{cause=\"not_tls\"}";
    let flood = 200;
    for _ in 0..flood {
        let mut stream = TcpStream::connect(tls).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert!(closed_within(&mut stream, WITHIN).await);
    }
    assert_eq!(egressd.metric(not_tls).await, f64::from(flood));
    let logged = |text: &str| {
        text.lines()
            .filter(|l| l.contains("passthrough refused"))
            .count()
    };
    let lines = logged(&egressd.stderr());
    // 10 lines per 10 s window by default; the flood may straddle two windows.
    assert!(
        (1..=20).contains(&lines),
        "{lines} log lines for {flood} refusals"
    );
    // Once a window has passed, the next refusal is logged with how many were left out.
    let reported = poll_within(Duration::from_secs(25), || async {
        let mut stream = TcpStream::connect(tls).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        closed_within(&mut stream, WITHIN).await;
        egressd.stderr().contains("similar messages suppressed")
    })
    .await
    .is_some();
    assert!(reported, "no suppressed line:\n{}", egressd.stderr());
}
