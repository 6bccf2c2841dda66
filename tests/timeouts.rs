//! Upstream failures and timeouts, each with its own status and `x-egressd-error` code, and
//! timeouts that fire after the response started (the client must see an aborted body).

mod common;

use std::future::pending;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::proxy::{get, ip_backend, preamble, request, ClientBody, Conn, TestProxy};
use common::upstream::{
    dripping_body, full, read_request_head, stalling_body, RawUpstream, Unresponsive, Upstream,
};
use http_body_util::BodyExt;

/// An HTTPRoute for `app.test` to Backend `app`, with optional `timeouts` (a YAML flow map).
fn app_route(timeouts: Option<&str>) -> String {
    let timeouts = timeouts
        .map(|t| format!("    timeouts: {t}\n"))
        .unwrap_or_default();
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: app
spec:
  parentRefs:
  - name: gw
  hostnames: ["app.test"]
  rules:
  - backendRefs:
    - {{group: egressd.dev, kind: Backend, name: app}}
{timeouts}"#
    )
}

/// A config routing `app.test` to `addr`, with the Backend's inline traffic policy `policy`
/// (YAML lines indented for `spec.trafficPolicy`) and route `timeouts`.
fn config(addr: SocketAddr, policy: &str, timeouts: Option<&str>) -> String {
    let extra = if policy.is_empty() {
        String::new()
    } else {
        format!("  trafficPolicy:\n{policy}")
    };
    preamble(None) + &ip_backend("app", addr, &extra) + &app_route(timeouts)
}

/// Asserts a local reply with `status` and `code`.
fn assert_local_reply(response: &common::proxy::Response, status: u16, code: &str) {
    assert_eq!(
        (response.status.as_u16(), response.error_code()),
        (status, Some(code)),
        "body: {}",
        response.text()
    );
}

#[tokio::test]
async fn connect_timeout_gives_504_upstream_connect_timeout() {
    // Filled before the proxy starts: it blocks the test thread briefly.
    let unresponsive = Unresponsive::start();
    let policy = "    timeout:\n      tcp:\n        connectTimeout: 300ms\n";
    let proxy = TestProxy::start(&config(unresponsive.addr, policy, None)).await;

    let started = Instant::now();
    let response = get(proxy.http(), "app.test", "/").await;
    let elapsed = started.elapsed();
    assert_local_reply(&response, 504, "upstream_connect_timeout");
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3),
        "answered after {elapsed:?} with a 300ms connect timeout"
    );
}

#[tokio::test]
async fn connect_timeout_from_a_backend_traffic_policy_applies() {
    let unresponsive = Unresponsive::start();
    let policy = r#"---
apiVersion: egressd.dev/v1alpha1
kind: BackendTrafficPolicy
metadata:
  name: fast-fail
spec:
  targetRefs:
  - {group: egressd.dev, kind: Backend, name: app}
  timeout:
    tcp:
      connectTimeout: 300ms
"#;
    let proxy = TestProxy::start(&(config(unresponsive.addr, "", None) + policy)).await;

    let started = Instant::now();
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 504, "upstream_connect_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn refused_connection_gives_503_upstream_connect_failure() {
    let refusing = common::ports::Refusing::bind();
    let proxy = TestProxy::start(&config(refusing.addr, "", None)).await;
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 503, "upstream_connect_failure");
}

#[tokio::test]
async fn route_request_timeout_gives_504_upstream_timeout() {
    let upstream = Upstream::start_with(|_req| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        http::Response::new(full("late"))
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "", Some("{request: 300ms}"))).await;

    let started = Instant::now();
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 504, "upstream_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        upstream.request_count(),
        1,
        "the request did reach the upstream"
    );
    assert_eq!(failures(&proxy, "upstream_timeout").await, 1.0);
}

/// `egressd_upstream_failures_total` of Backend `app` for `reason`: attempts that failed after
/// connecting, per Backend (what the console's error rate adds to 5xx and connect failures).
async fn failures(proxy: &TestProxy, reason: &str) -> f64 {
    common::outlier::metric(
        proxy,
        &format!(r#"egressd_upstream_failures_total{{backend="default/app",reason="{reason}"}}"#),
    )
    .await
}

#[tokio::test]
async fn route_backend_request_timeout_gives_504_upstream_timeout() {
    let upstream = Upstream::start_with(|_req| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        http::Response::new(full("late"))
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "", Some("{backendRequest: 300ms}"))).await;
    let started = Instant::now();
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 504, "upstream_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn request_within_the_timeout_is_not_cut_short() {
    let upstream = Upstream::start_with(|_req| async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        http::Response::new(full("in time"))
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "", Some("{request: 2s}"))).await;
    let response = get(proxy.http(), "app.test", "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.text(), "in time");
}

#[tokio::test]
async fn upstream_that_never_answers_gives_504_stream_idle_timeout() {
    let upstream = Upstream::start_with(|_req| pending()).await;
    let policy = "    timeout:\n      http:\n        streamIdleTimeout: 300ms\n";
    let proxy = TestProxy::start(&config(upstream.addr, policy, None)).await;

    let started = Instant::now();
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 504, "stream_idle_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(upstream.request_count(), 1);
}

#[tokio::test]
async fn upstream_closing_without_an_answer_gives_502_upstream_reset() {
    let upstream = RawUpstream::start(|mut stream| async move {
        read_request_head(&mut stream).await;
        drop(stream);
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "", None)).await;
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 502, "upstream_reset");
    assert!(upstream.connection_count() >= 1);
    // Counted (once per attempt: a reset may be retried), and nothing as another reason.
    let resets = failures(&proxy, "upstream_reset").await;
    assert!(
        resets >= 1.0 && resets <= upstream.connection_count() as f64,
        "{resets} resets counted"
    );
    assert_eq!(failures(&proxy, "upstream_timeout").await, 0.0);
}

#[tokio::test]
async fn upstream_sending_garbage_gives_502_upstream_protocol_error() {
    let upstream = RawUpstream::start(|mut stream| async move {
        use tokio::io::AsyncWriteExt;
        read_request_head(&mut stream).await;
        let _ = stream.write_all(b"this is not HTTP\r\n\r\n").await;
        let _ = stream.shutdown().await;
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "", None)).await;
    let response = get(proxy.http(), "app.test", "/").await;
    assert_local_reply(&response, 502, "upstream_protocol_error");
    assert_eq!(failures(&proxy, "upstream_protocol_error").await, 1.0);
}

/// Sends a GET to `app.test` and returns (status, how the body ended, time to body end). The
/// body read is bounded so a proxy that hangs fails the test instead of blocking it.
async fn body_outcome(proxy: &TestProxy) -> (u16, Result<usize, String>, Duration) {
    let mut conn = Conn::open(proxy.http()).await;
    let req = request("GET", "app.test", "/")
        .body(ClientBody::default())
        .unwrap();
    let started = Instant::now();
    let response = conn.send(req).await.expect("response head");
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .expect("the body neither ended nor failed within 10s");
    let outcome = body.map(|b| b.to_bytes().len()).map_err(|e| e.to_string());
    (status, outcome, started.elapsed())
}

#[tokio::test]
async fn stream_idle_timeout_mid_body_aborts_a_chunked_response() {
    // Headers and a first chunk, then silence: no Content-Length, so only an abort (not a
    // clean last chunk) tells the client the body is incomplete.
    let upstream =
        Upstream::start_with(|_req| async { http::Response::new(stalling_body(b"partial")) }).await;
    let policy = "    timeout:\n      http:\n        streamIdleTimeout: 300ms\n";
    let proxy = TestProxy::start(&config(upstream.addr, policy, None)).await;

    let (status, outcome, elapsed) = body_outcome(&proxy).await;
    assert_eq!(status, 200, "headers were already on their way");
    assert!(
        outcome.is_err(),
        "body ended cleanly with {outcome:?} bytes"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[tokio::test]
async fn stream_idle_timeout_mid_body_aborts_a_response_with_content_length() {
    let upstream = Upstream::start_with(|_req| async {
        http::Response::builder()
            .header("content-length", "1000")
            .body(stalling_body(b"partial"))
            .unwrap()
    })
    .await;
    let policy = "    timeout:\n      http:\n        streamIdleTimeout: 300ms\n";
    let proxy = TestProxy::start(&config(upstream.addr, policy, None)).await;

    let (status, outcome, elapsed) = body_outcome(&proxy).await;
    assert_eq!(status, 200);
    assert!(
        outcome.is_err(),
        "body ended cleanly with {outcome:?} bytes"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[tokio::test]
async fn request_timeout_also_bounds_a_slowly_dripping_body() {
    // A chunk every 50ms keeps the stream from ever being idle; the 500ms request timeout
    // (which covers the whole exchange) must still end it.
    let upstream = Upstream::start_with(|_req| async {
        http::Response::new(dripping_body(b".", Duration::from_millis(50)))
    })
    .await;
    let policy = "    timeout:\n      http:\n        streamIdleTimeout: 300ms\n";
    let proxy = TestProxy::start(&config(upstream.addr, policy, Some("{request: 500ms}"))).await;

    let (status, outcome, elapsed) = body_outcome(&proxy).await;
    assert_eq!(status, 200);
    assert!(
        outcome.is_err(),
        "body ended cleanly with {outcome:?} bytes"
    );
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn upstream_closing_mid_body_aborts_the_downstream_response() {
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let upstream = RawUpstream::start(move |mut stream| {
        let nth = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            use tokio::io::AsyncWriteExt;
            read_request_head(&mut stream).await;
            let answer: &[u8] = if nth == 0 {
                // Closing after this leaves 987 promised bytes unsent.
                b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\nonly a little"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
            };
            let _ = stream.write_all(answer).await;
        }
    })
    .await;
    let proxy = TestProxy::start(&config(upstream.addr, "", None)).await;
    let (status, outcome, _) = body_outcome(&proxy).await;
    assert_eq!(status, 200);
    assert!(
        outcome.is_err(),
        "body ended cleanly with {outcome:?} bytes"
    );

    // The broken connection is not reused: the next request opens a new one and succeeds.
    let response = get(proxy.http(), "app.test", "/").await;
    assert_eq!(
        response.status,
        200,
        "{:?} {}",
        response.error_code(),
        response.text()
    );
    assert_eq!(response.text(), "ok");
    assert_eq!(upstream.connection_count(), 2);
}
