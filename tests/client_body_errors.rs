//! A client that breaks or abandons its own request body is the client's problem: it gets 400
//! (malformed) or is logged as `client_closed` (gone), and the endpoint its request was going
//! to is never blamed — no outlier detection, no retry, no ejection.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::outlier::{backend, is_ejected, metric, HOST};
use common::poll_within;
use common::ports::shared_port;
use common::proxy::{get, json_lines, preamble_with, TestProxy};
use common::upstream::{count_body, full, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `raw` to the proxy, closes the sending side when `hang_up`, and returns what came
/// back until the proxy closed (empty when nothing did).
async fn send_raw(proxy: SocketAddr, raw: &[u8], hang_up: bool) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(raw).await.unwrap();
    if hang_up {
        stream.shutdown().await.unwrap();
    }
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut back)).await;
    String::from_utf8_lossy(&back).into_owned()
}

#[tokio::test]
async fn broken_and_abandoned_request_bodies_never_eject_the_endpoint() {
    let port = shared_port();
    let addr = SocketAddr::new([127, 0, 0, 1].into(), port);
    // Reads every body whole before answering, as an application does.
    let upstream = Upstream::start_on_with(
        addr,
        |req: http::Request<hyper::body::Incoming>| async move {
            let status = match count_body(req.into_body()).await {
                Ok(_) => 200,
                Err(_) => 400,
            };
            http::Response::builder()
                .status(status)
                .body(full("read"))
                .unwrap()
        },
    )
    .await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let spec = format!(
        "  accessLog: {{enabled: true, format: JSON, path: {}}}\n",
        log.path().display()
    );
    let mut yaml = preamble_with(None, &spec).replace("  accessLog:\n    enabled: false\n", "");
    // Retries on every trigger egressd has: none may fire for a client's broken body.
    yaml += &backend(&[addr], ", consecutiveGatewayErrors: 3").replace(
        "    loadBalancer: {type: RoundRobin}\n",
        "    loadBalancer: {type: RoundRobin}\n    retry: {numRetries: 2, retryOn: {triggers: [connect-failure, reset, gateway-error]}}\n",
    );
    let proxy = TestProxy::start(&yaml).await;

    for i in 0..10 {
        // A chunk that says 5 bytes and carries 7 before its CRLF (RFC 9112 §7.1).
        let malformed = format!(
            "POST /bad/{i} HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"
        );
        let reply = send_raw(proxy.http(), malformed.as_bytes(), false).await;
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 400"),
            "a malformed body is the client's fault: {reply:?}"
        );
        // Content-Length 100 (read ahead for the retry policy) and 100,000 (streamed
        // upstream as it comes): 5 bytes, then the client hangs up.
        for length in [100, 100_000] {
            let cut = format!(
                "POST /cut/{length}/{i} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {length}\r\n\r\nhello"
            );
            let reply = send_raw(proxy.http(), cut.as_bytes(), true).await;
            assert!(
                !reply.contains(" 502 ") && !reply.contains(" 503 "),
                "never a gateway error: {reply:?}"
            );
        }
    }

    assert!(
        !is_ejected(&proxy, "127.0.0.1").await,
        "the endpoint stays in"
    );
    assert_eq!(
        metric(&proxy, "egressd_outlier_ejections_total{backend=\"Backend default/api\",reason=\"consecutive_gateway_errors\"}").await,
        0.0
    );
    assert_eq!(
        metric(
            &proxy,
            "egressd_upstream_retries_total{backend=\"Backend default/api\"}"
        )
        .await,
        0.0,
        "nothing retried"
    );
    let ok = get(proxy.http(), HOST, "/fine").await;
    assert_eq!(ok.status, 200, "{}", ok.text());

    // The access log says whose fault it was.
    let written = poll_within(Duration::from_secs(5), || async {
        json_lines(log.path()).len() >= 31
    })
    .await
    .is_some();
    assert!(written, "{:?}", json_lines(log.path()));
    let lines = json_lines(log.path());
    let errors = |prefix: &str| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["path"].as_str().unwrap().starts_with(prefix))
            .map(|l| l["error"].clone())
            .collect()
    };
    for error in errors("/bad/") {
        assert_eq!(error, "invalid_request", "{lines:#?}");
    }
    for error in errors("/cut/") {
        assert_eq!(error, "client_closed", "{lines:#?}");
    }
    drop(upstream);
}
