//! Circuit breakers (`circuitBreaker`) against real upstreams: connections, waiting requests
//! and retries past their limits are turned away at once with 503 `overflow` (or, for retries,
//! the failed attempt's answer), and counted by limit.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::outlier::{answering, backend, metric, HOST};
use common::ports::shared_port;
use common::proxy::{get, preamble, Response, TestProxy};
use common::upstream::{full, Upstream};
use common::{eventually, poll_within};
use tokio::sync::Semaphore;

/// `backend(..)` (round robin, outlier detection that never ejects) with more sections.
fn with_sections(endpoints: &[SocketAddr], sections: &str) -> String {
    preamble(None)
        + &backend(endpoints, ", consecutiveGatewayErrors: 0")
            .replace("    healthCheck:", &format!("{sections}\n    healthCheck:"))
}

/// An upstream on 127.0.0.`n`:`port` whose answers wait for a permit of `gate`.
async fn gated(n: u8, port: u16, gate: Arc<Semaphore>) -> Upstream {
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    Upstream::start_on_with(addr, move |_req| {
        let gate = gate.clone();
        async move {
            gate.acquire().await.unwrap().forget();
            http::Response::new(full("done"))
        }
    })
    .await
}

fn overflows(limit: &str) -> String {
    format!(r#"egressd_circuit_breaker_overflows_total{{backend="default/api",reason="{limit}"}}"#)
}

fn spawn_get(proxy: &TestProxy, path: &str) -> tokio::task::JoinHandle<Response> {
    let (addr, path) = (proxy.http(), path.to_owned());
    tokio::spawn(async move { get(addr, HOST, &path).await })
}

#[tokio::test]
async fn at_max_connections_requests_wait_up_to_max_pending_and_the_rest_overflow() {
    // CB-pending: one connection allowed, one request may wait for it; the third is refused
    // at once. The waiting one is served on the same connection when the first ends.
    let gate = Arc::new(Semaphore::new(0));
    let port = shared_port();
    let slow = gated(1, port, gate.clone()).await;
    let proxy = TestProxy::start(&with_sections(
        &[slow.addr],
        "    circuitBreaker: {maxConnections: 1, maxPendingRequests: 1}",
    ))
    .await;

    let first = spawn_get(&proxy, "/first");
    eventually(
        "one request held by the slow upstream",
        Duration::from_secs(5),
        || async { slow.request_count() == 1 },
    )
    .await;
    let waiting = spawn_get(&proxy, "/waiting");
    eventually(
        "the second request waits for the connection",
        Duration::from_secs(5),
        || async {
            let body = get(proxy.admin, "localhost", "/endpoints").await.body;
            let all: serde_json::Value = serde_json::from_slice(&body).unwrap();
            all["backends"][0]["circuitBreaker"]["pendingRequests"] == 1
        },
    )
    .await;
    let refused = tokio::time::timeout(Duration::from_secs(2), get(proxy.http(), HOST, "/third"))
        .await
        .expect("an immediate reply");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.error_code(), Some("overflow"));
    assert!(
        refused.text().contains("maxPendingRequests"),
        "{}",
        refused.text()
    );
    assert_eq!(slow.request_count(), 1, "nothing more reached the upstream");

    gate.add_permits(2);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(waiting.await.unwrap().status, 200);
    assert_eq!(slow.request_count(), 2);
    assert_eq!(slow.connection_count(), 1, "both on the one connection");
    assert_eq!(
        metric(&proxy, &overflows("max_pending_requests")).await,
        1.0
    );
}

#[tokio::test]
async fn an_idle_connection_to_another_endpoint_gives_its_slot_to_a_waiting_request() {
    // maxConnections 1 over two endpoints: after A's request, A's idle pooled connection holds
    // the only slot; a request picked for B closes it and proceeds.
    let port = shared_port();
    let a = answering(1, port, 200).await;
    let b = answering(2, port, 200).await;
    let proxy = TestProxy::start(&with_sections(
        &[a.addr, b.addr],
        "    circuitBreaker: {maxConnections: 1}",
    ))
    .await;
    for i in 0..6 {
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            get(proxy.http(), HOST, &format!("/{i}")),
        )
        .await
        .expect("not stuck behind an idle connection");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!((a.request_count(), b.request_count()), (3, 3));
    // Every switch of endpoint needed a new connection: one open at a time.
    assert_eq!(a.connection_count() + b.connection_count(), 6);
}

/// An upstream on 127.0.0.`n`:`port`: the first request for a path gets 503 at once, a second
/// one (the retry) waits for a permit of `gate` and gets 200.
async fn fails_once_then_waits(n: u8, port: u16, gate: Arc<Semaphore>) -> Upstream {
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    Upstream::start_on_with(addr, move |req: http::Request<hyper::body::Incoming>| {
        let first = seen.lock().unwrap().insert(req.uri().path().to_owned());
        let gate = gate.clone();
        async move {
            if first {
                return http::Response::builder()
                    .status(503)
                    .body(full("first attempt"))
                    .unwrap();
            }
            gate.acquire().await.unwrap().forget();
            http::Response::new(full("retried"))
        }
    })
    .await
}

/// Five concurrent requests whose first attempts fail: `admitted` retries go ahead (and wait
/// at the upstream), the others end with the first attempt's 503.
async fn retries_past_the_limit_are_not_sent(circuit_breaker: &str, limit: &str, admitted: usize) {
    let gate = Arc::new(Semaphore::new(0));
    let port = shared_port();
    let up = fails_once_then_waits(1, port, gate.clone()).await;
    let proxy = TestProxy::start(&with_sections(
        &[up.addr],
        &format!(
            "    retry: {{numRetries: 1, perRetry: {{backOff: {{baseInterval: 1ms, maxInterval: 2ms}}}}}}\n    circuitBreaker: {circuit_breaker}"
        ),
    ))
    .await;
    let requests: Vec<_> = (0..5)
        .map(|i| spawn_get(&proxy, &format!("/{i}")))
        .collect();
    // Every first attempt, and the admitted retries, reach the upstream.
    assert!(
        poll_within(Duration::from_secs(5), || async {
            up.request_count() == 5 + admitted
        })
        .await
        .is_some(),
        "{} requests reached the upstream",
        up.request_count()
    );
    eventually(
        "the retries over the limit were not sent: their requests ended",
        Duration::from_secs(5),
        || async { requests.iter().filter(|r| r.is_finished()).count() == 5 - admitted },
    )
    .await;
    gate.add_permits(admitted);
    let mut statuses = Vec::new();
    for r in requests {
        let r = r.await.unwrap();
        statuses.push((r.status, r.text()));
    }
    let retried = statuses.iter().filter(|(s, t)| *s == 200 && t == "retried");
    assert_eq!(retried.count(), admitted, "{statuses:?}");
    let first = statuses
        .iter()
        .filter(|(s, t)| *s == 503 && t == "first attempt");
    assert_eq!(first.count(), 5 - admitted, "{statuses:?}");
    assert_eq!(up.request_count(), 5 + admitted);
    assert_eq!(
        metric(&proxy, &overflows(limit)).await,
        (5 - admitted) as f64
    );
}

#[tokio::test]
async fn max_parallel_retries_bounds_retries_in_progress() {
    retries_past_the_limit_are_not_sent("{maxParallelRetries: 2}", "max_parallel_retries", 2).await;
}

#[tokio::test]
async fn a_retry_budget_replaces_max_parallel_retries() {
    // 5 requests in flight: 20% is 1, minRetryConcurrency 1 → one retry at a time, although
    // maxParallelRetries would allow 4.
    retries_past_the_limit_are_not_sent(
        "{maxParallelRetries: 4, retryBudget: {percent: 20, minRetryConcurrency: 1}}",
        "retry_budget",
        1,
    )
    .await;
}
