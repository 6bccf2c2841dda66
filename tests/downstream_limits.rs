//! Log floods are bounded (issue #14, point 12): refused TLS passthrough connections are
//! counted, and the log says so a bounded number of times, then how many it left out.
//!
//! Real sockets against the built binary (`common::binary`), whose log is what is counted.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::binary::Egressd;
use common::proxy::{eventually, ip_backend, route_to};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The host the HTTPRoute of [`binary_config`] serves.
const HOST: &str = "svc.test";

/// How long a test waits for something that should happen within a fraction of it.
const WITHIN: Duration = Duration::from_secs(5);

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
    let reported = eventually(Duration::from_secs(25), || async {
        let mut stream = TcpStream::connect(tls).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        closed_within(&mut stream, WITHIN).await;
        egressd.stderr().contains("similar messages suppressed")
    })
    .await;
    assert!(reported, "no suppressed line:\n{}", egressd.stderr());
}
