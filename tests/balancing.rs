//! Balancing through egressd against real upstreams: least request steers away from an
//! endpoint whose requests pile up; round robin and random spread by weight.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::ports::{loopback, shared_port};
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
    let port = shared_port();
    let slow = Upstream::start_on_with(loopback(1, port), move |_req| {
        let release = release.clone();
        async move {
            release.notified().await;
            http::Response::new(full("slow"))
        }
    })
    .await;
    let fast = Upstream::start_on("fast", loopback(2, port)).await;
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
        if common::poll_within(Duration::from_millis(500), || async {
            slow.request_count() + fast.request_count() == held.len()
        })
        .await
        .is_some()
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
        let port = shared_port();
        let a = Upstream::start_on("a", loopback(1, port)).await;
        let b = Upstream::start_on("b", loopback(2, port)).await;
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
    common::eventually(
        "two requests held by the slow upstream",
        Duration::from_secs(5),
        || async { slow.request_count() == 2 },
    )
    .await;
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
    common::eventually(
        "the pending request finished once released",
        Duration::from_secs(5),
        || async {
            release.notify_waiters();
            pending.is_finished()
        },
    )
    .await;
    assert_eq!(pending.await.unwrap().status, 200);
}

/// Two instances on one host (two local servers, a blue/green pair) are one Backend: each IP
/// endpoint carries its own port. Its identity, connections, outlier state and `/endpoints`
/// entry are its own: the instance that stops answering is ejected, the other keeps serving.
#[tokio::test]
async fn endpoints_with_their_own_ports_are_one_backend_and_ejected_alone() {
    let blue = Upstream::start("blue").await;
    let green = Upstream::start("green").await;
    let refusing = common::ports::Refusing::bind();
    let gone = refusing.addr;
    // The Backend port's number is nobody's: every endpoint names its own.
    let yaml = preamble(None)
        + &format!(
            r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: api}}
spec:
  destination:
    type: IP
    ip:
      endpoints:
      - {{address: 127.0.0.1, port: {blue}}}
      - {{address: 127.0.0.1, port: {green}}}
      - {{address: 127.0.0.1, port: {gone}}}
    ports: [{{number: 9}}]
  tls: {{mode: InsecureDisable}}
  trafficPolicy:
    loadBalancer: {{type: RoundRobin}}
    healthCheck:
      passive: {{consecutiveLocalOriginFailures: 2, interval: 10s, baseEjectionTime: 60s, maxEjectionPercent: 50, splitExternalLocalOriginErrors: true}}
    retry: {{numRetries: 2}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: api}}
spec:
  hostnames: [{HOST}]
  rules: [{{backendRefs: [{{name: api}}]}}]
"#,
            blue = blue.addr.port(),
            green = green.addr.port(),
            gone = gone.port(),
        );
    let proxy = TestProxy::start(&yaml).await;

    let mut bodies = Vec::new();
    for _ in 0..30 {
        let r = get(proxy.http(), HOST, "/").await;
        assert_eq!(r.status, 200, "{}", r.text());
        bodies.push(r.text());
    }
    let blue_count = bodies.iter().filter(|b| *b == "blue").count();
    assert_eq!(
        blue_count + bodies.iter().filter(|b| *b == "green").count(),
        30
    );
    assert!((12..=18).contains(&blue_count), "blue {blue_count} of 30");
    assert_eq!(blue.request_count(), blue_count);

    let endpoints: serde_json::Value =
        serde_json::from_str(&get(proxy.admin, "localhost", "/endpoints").await.text()).unwrap();
    let list = endpoints["backends"][0]["endpoints"]
        .as_array()
        .unwrap()
        .clone();
    let health = |addr: SocketAddr| {
        list.iter()
            .find(|e| e["address"] == addr.to_string())
            .unwrap_or_else(|| panic!("{addr} listed: {list:?}"))["health"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(health(blue.addr), "healthy");
    assert_eq!(health(green.addr), "healthy");
    assert_eq!(health(gone), "ejected");
    assert_eq!(list.len(), 3);
}

/// The default balancer (least request, two choices) through the egressd binary: two equal
/// idle endpoints share sequential requests evenly (ties are broken at random, not by list
/// order).
#[tokio::test]
async fn least_request_splits_sequential_requests_evenly_between_two_endpoints() {
    let port = shared_port();
    let one = Upstream::start_on("one", loopback(1, port)).await;
    let two = Upstream::start_on("two", loopback(2, port)).await;
    let yaml = preamble(None) + &backend(&[(one.addr, 1), (two.addr, 1)], "{type: LeastRequest}");
    let dir = tempfile::tempdir().expect("config dir");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).expect("write config");
    let egressd = common::binary::Egressd::spawn(dir.path()).await;
    let listener = egressd.listener_addr(common::binary::LISTENER).await;
    for _ in 0..400 {
        let r = get(listener, HOST, "/").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let (a, b) = (one.request_count(), two.request_count());
    assert_eq!(a + b, 400);
    // 50/50 ± 8 points.
    assert!((168..=232).contains(&a), "one: {a}, two: {b}");
}
