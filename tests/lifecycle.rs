//! The real binary's shutdown: SIGTERM drains (not ready, no new connections, in-flight
//! requests finish) and exits 0; a request stuck past the drain timeout does not keep the
//! process alive.

mod common;

use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use common::binary::{try_get, Egressd, TestConfig, HOST, LISTENER};
use common::upstream::{full, BoxBody, Upstream};
use common::{eventually, poll_within};

const IN_FLIGHT: usize = 3;

/// Writes `config` to a new temp dir and starts egressd on it.
async fn start(config: &TestConfig) -> (tempfile::TempDir, Egressd) {
    let dir = tempfile::tempdir().expect("config dir");
    std::fs::write(dir.path().join("egressd.yaml"), config.yaml()).expect("write config");
    let egressd = Egressd::spawn(dir.path()).await;
    (dir, egressd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_refuses_new_connections_and_finishes_in_flight_requests() {
    const DRAIN: Duration = Duration::from_secs(10);
    // The upstream holds every response until the test opens the gate, so the requests are
    // provably in flight while the drain is checked (instead of racing a fixed delay).
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let upstream = Upstream::start_with(move |_request| {
        let mut gate = gate_rx.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            http::Response::builder()
                .header("x-upstream", "slow")
                .body(full("slow"))
                .unwrap()
        }
    })
    .await;
    let config = TestConfig::new()
        .backend("slow", upstream.addr)
        .route_to("slow")
        .drain_timeout("10s");
    let (_dir, mut egressd) = start(&config).await;
    let listener = egressd.listener_addr(LISTENER).await;

    // Each request on its own connection.
    let requests: Vec<_> = (0..IN_FLIGHT)
        .map(|_| tokio::spawn(try_get(listener, HOST, "/")))
        .collect();
    let upstream_ref = &upstream;
    let arrived = poll_within(Duration::from_secs(5), || async move {
        upstream_ref.request_count() == IN_FLIGHT
    })
    .await
    .is_some();
    assert!(
        arrived,
        "only {} requests reached the upstream",
        upstream.request_count()
    );

    egressd.signal("TERM");
    let terminated = Instant::now();

    // Not ready any more (or the admin server is already gone).
    let egressd_ref = &egressd;
    eventually(
        "/ready still answers 200 after SIGTERM",
        Duration::from_secs(2),
        || async move { egressd_ref.ready().await != Some(http::StatusCode::OK) },
    )
    .await;
    if let Some(status) = egressd.ready().await {
        assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
    }

    // New connections are refused once the listener is closed.
    eventually(
        "the listener still accepts connections after SIGTERM",
        Duration::from_secs(2),
        || async move {
            matches!(
                TcpStream::connect(listener).await,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
            )
        },
    )
    .await;

    // All of that happened while the requests were still waiting for the upstream.
    for request in &requests {
        assert!(
            !request.is_finished(),
            "a request ended before its response"
        );
    }
    gate.send_replace(true);
    for request in requests {
        let response = tokio::time::timeout(Duration::from_secs(5), request)
            .await
            .expect("in-flight request completes after the gate opens")
            .expect("request task")
            .unwrap_or_else(|e| egressd.fail(&format!("in-flight request failed: {e:#}")));
        assert_eq!(response.status, http::StatusCode::OK);
        assert_eq!(response.text(), "slow");
    }

    let exit = egressd
        .wait_exit(DRAIN.saturating_sub(terminated.elapsed()))
        .await;
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
    println!(
        "drained and exited {:?} after SIGTERM",
        terminated.elapsed()
    );
}

#[tokio::test]
async fn sigterm_exits_after_the_drain_timeout_when_a_request_is_stuck() {
    const DRAIN: Duration = Duration::from_secs(1);
    let upstream =
        Upstream::start_with(|_request| std::future::pending::<http::Response<BoxBody>>()).await;
    let config = TestConfig::new()
        .backend("stuck", upstream.addr)
        .route_to("stuck")
        .drain_timeout("1s");
    let (_dir, mut egressd) = start(&config).await;
    let listener = egressd.listener_addr(LISTENER).await;

    let request = tokio::spawn(try_get(listener, HOST, "/"));
    let upstream_ref = &upstream;
    eventually(
        "the request did not reach the upstream",
        Duration::from_secs(5),
        || async move { upstream_ref.request_count() == 1 },
    )
    .await;

    let terminated = Instant::now();
    egressd.signal("TERM");
    let exit = egressd.wait_exit(DRAIN + Duration::from_secs(4)).await;
    let took = terminated.elapsed();
    assert_eq!(exit.code(), Some(0), "exit status {exit}");
    // It did wait for the stuck request, for the drain timeout and not much longer.
    assert!(
        took >= DRAIN,
        "exited after {took:?}, before the drain timeout"
    );
    println!("exited {took:?} after SIGTERM with a request stuck (drain timeout {DRAIN:?})");

    // The stuck request was cut off, not answered.
    let outcome = tokio::time::timeout(Duration::from_secs(5), request)
        .await
        .expect("the stuck request ends when egressd exits")
        .expect("request task");
    if let Ok(response) = outcome {
        assert_ne!(response.status, http::StatusCode::OK, "{response:?}");
    }
}
