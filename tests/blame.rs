//! A failure is charged to an endpoint only when the endpoint caused it (issue #31, point 2):
//! a client's own deadline (`grpc-timeout`), a client's slow upload that runs into the stream
//! idle timeout, and a client that leaves early never count for outlier detection, however
//! often they happen; the endpoint's own timeouts still do.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::outlier::{backend, HOST};
use common::ports::shared_port;
use common::proxy::{get, get_with_headers, preamble, TestProxy};
use common::upstream::{count_body, full, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Two upstreams on 127.0.0.2 and .3 that answer `/slow` after two seconds, and read the
/// whole request body before answering anything else.
async fn upstreams() -> Vec<Upstream> {
    let port = shared_port();
    let mut all = Vec::new();
    for n in [2, 3] {
        let addr = SocketAddr::new([127, 0, 0, n].into(), port);
        all.push(
            Upstream::start_on_with(addr, |req| async move {
                if req.uri().path() == "/slow" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let _ = count_body(req.into_body()).await;
                http::Response::new(full("ok"))
            })
            .await,
        );
    }
    all
}

/// egressd over `upstreams`: two consecutive gateway errors eject an endpoint; `policy`
/// (lines indented for `spec.trafficPolicy`) added to the Backend.
async fn proxy(upstreams: &[Upstream], policy: &str) -> TestProxy {
    let addrs: Vec<SocketAddr> = upstreams.iter().map(|u| u.addr).collect();
    let backend = backend(&addrs, ", consecutiveGatewayErrors: 2")
        .replace("    healthCheck:", &format!("{policy}    healthCheck:"));
    TestProxy::start(&(preamble(None) + &backend)).await
}

/// Ejections so far, every reason.
async fn ejections(proxy: &TestProxy) -> f64 {
    let text = get(proxy.admin, "localhost", "/metrics").await.text();
    text.lines()
        .filter(|l| l.starts_with("egressd_outlier_ejections_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_client_deadline_shorter_than_the_backend_timeout_never_ejects() {
    let upstreams = upstreams().await;
    let proxy = proxy(&upstreams, "").await;
    let grpc = [
        ("content-type", "application/grpc"),
        ("grpc-timeout", "100m"),
    ];
    for _ in 0..6 {
        let response = get_with_headers(proxy.http(), HOST, "/slow", &grpc).await;
        assert_eq!(
            response.error_code(),
            Some("upstream_timeout"),
            "{}",
            response.text()
        );
    }
    assert_eq!(
        ejections(&proxy).await,
        0.0,
        "the client's deadline ejected an endpoint"
    );
}

#[tokio::test]
async fn the_endpoint_own_timeouts_still_eject() {
    // The control for the test above: the same slow answers, timed by the Backend.
    let upstreams = upstreams().await;
    let policy = "    timeout:\n      http:\n        streamIdleTimeout: 100ms\n";
    let proxy = proxy(&upstreams, policy).await;
    for _ in 0..6 {
        let response = get(proxy.http(), HOST, "/slow").await;
        assert_eq!(
            response.error_code(),
            Some("stream_idle_timeout"),
            "{}",
            response.text()
        );
    }
    assert!(
        ejections(&proxy).await >= 1.0,
        "the endpoints' own timeouts ejected none"
    );
}

#[tokio::test]
async fn slow_uploads_that_run_into_the_stream_idle_timeout_never_eject() {
    let upstreams = upstreams().await;
    let policy = "    timeout:\n      http:\n        streamIdleTimeout: 300ms\n";
    let proxy = proxy(&upstreams, policy).await;
    for _ in 0..6 {
        // 10 of the 100 bytes announced, then nothing: the upstream waits for the rest.
        let mut stream = TcpStream::connect(proxy.http()).await.unwrap();
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 100\r\n\r\n0123456789"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
                .await
                .expect("an answer within the stream idle timeout")
                .unwrap();
            assert!(n > 0, "closed without an answer");
            answer.extend_from_slice(&buf[..n]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.contains("x-egressd-error: stream_idle_timeout"),
            "{answer}"
        );
    }
    assert_eq!(
        ejections(&proxy).await,
        0.0,
        "slow uploads ejected an endpoint"
    );
}
