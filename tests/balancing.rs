//! Balancing through egressd against real upstreams: least request steers away from an
//! endpoint whose requests pile up; round robin and random spread by weight.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::proxy::{get, preamble, TestProxy};
use common::upstream::{full, Upstream};

const HOST: &str = "lb.test";

/// A Backend with the given IP endpoints (same port) and a `loadBalancer` section.
fn backend(endpoints: &[(SocketAddr, u32)], load_balancer: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|(a, w)| format!("      - {{address: {}, weight: {w}}}\n", a.ip()))
        .collect();
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n  trafficPolicy:\n    loadBalancer: {load_balancer}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: api}}]}}]\n",
        port = endpoints[0].0.port()
    )
}

/// Two upstreams on 127.0.0.1 and 127.0.0.2 with the same port: `slow` holds every request
/// until the test ends, `fast` answers at once.
async fn slow_and_fast() -> (Upstream, Upstream) {
    let release = Arc::new(tokio::sync::Notify::new());
    let slow = Upstream::start_with(move |_req| {
        let release = release.clone();
        async move {
            release.notified().await;
            http::Response::new(full("slow"))
        }
    })
    .await;
    let fast = Upstream::start_on(
        "fast",
        SocketAddr::new([127, 0, 0, 2].into(), slow.addr.port()),
    )
    .await;
    (slow, fast)
}

#[tokio::test]
async fn least_request_sends_nothing_more_to_an_endpoint_with_a_request_in_flight() {
    let (slow, fast) = slow_and_fast().await;
    let yaml = preamble(None) + &backend(&[(slow.addr, 1), (fast.addr, 1)], "{type: LeastRequest}");
    let proxy = TestProxy::start(&yaml).await;

    // Until one request is held by the slow endpoint (a tie picks at random).
    let mut held = Vec::new();
    for _ in 0..50 {
        let addr = proxy.http();
        held.push(tokio::spawn(async move { get(addr, HOST, "/").await }));
        if common::proxy::eventually(Duration::from_millis(500), || async {
            slow.request_count() + fast.request_count() == held.len()
        })
        .await
            && slow.request_count() == 1
        {
            break;
        }
    }
    assert_eq!(
        slow.request_count(),
        1,
        "one request is held by the slow endpoint"
    );

    // Every later request sees 1 in flight there and 0 at the fast one.
    let before = fast.request_count();
    for i in 0..50 {
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            get(proxy.http(), HOST, &format!("/{i}")),
        )
        .await
        .expect("answered by the fast endpoint");
        assert_eq!(response.text(), "fast");
    }
    assert_eq!(fast.request_count(), before + 50);
    assert_eq!(slow.request_count(), 1);
}

#[tokio::test]
async fn round_robin_and_random_split_by_weight() {
    for lb in [
        "{type: RoundRobin}",
        "{type: Random}",
        "{type: LeastRequest}",
    ] {
        let a = Upstream::start("a").await;
        let b =
            Upstream::start_on("b", SocketAddr::new([127, 0, 0, 2].into(), a.addr.port())).await;
        let yaml = preamble(None) + &backend(&[(a.addr, 1), (b.addr, 3)], lb);
        let proxy = TestProxy::start(&yaml).await;
        let mut conn = common::proxy::Conn::open(proxy.http()).await;
        const N: usize = 400;
        for i in 0..N {
            let request = common::proxy::request("GET", HOST, &format!("/{i}"))
                .body(Default::default())
                .unwrap();
            assert_eq!(conn.fetch(request).await.status, 200);
        }
        let share_b = b.request_count() as f64 / N as f64;
        // RoundRobin is exact; Random and the idle weighted schedule within a few sigma.
        assert!(
            (share_b - 0.75).abs() < 0.08,
            "{lb}: endpoint b (weight 3) got {share_b:.3} of requests"
        );
    }
}

#[tokio::test]
async fn max_parallel_requests_turns_overload_into_immediate_overflow_replies() {
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let slow = Upstream::start_with(move |_req| {
        let release = r.clone();
        async move {
            release.notified().await;
            http::Response::new(full("done"))
        }
    })
    .await;
    let yaml = preamble(None)
        + &backend(
            &[(slow.addr, 1)],
            "{type: LeastRequest}\n    circuitBreaker: {maxParallelRequests: 2}",
        );
    let proxy = TestProxy::start(&yaml).await;

    let held: Vec<_> = (0..2)
        .map(|i| {
            let addr = proxy.http();
            tokio::spawn(async move { get(addr, HOST, &format!("/held{i}")).await })
        })
        .collect();
    assert!(
        common::proxy::eventually(Duration::from_secs(5), || async {
            slow.request_count() == 2
        })
        .await
    );
    // The third is refused at once, without reaching the upstream.
    let refused = tokio::time::timeout(Duration::from_secs(2), get(proxy.http(), HOST, "/third"))
        .await
        .expect("an immediate reply");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.error_code(), Some("overflow"));
    assert_eq!(slow.request_count(), 2);

    // Once the held ones finish, there is room again.
    release.notify_waiters();
    for h in held {
        assert_eq!(h.await.unwrap().text(), "done");
    }
    let again = get(proxy.http(), HOST, "/again");
    release.notify_waiters();
    let pending = tokio::spawn(again);
    assert!(
        common::proxy::eventually(Duration::from_secs(5), || async {
            release.notify_waiters();
            pending.is_finished()
        })
        .await
    );
    assert_eq!(pending.await.unwrap().status, 200);
}
