//! Outlier detection against real upstreams, with durations scaled down (interval 200 ms,
//! base ejection 400 ms): Envoy's scenarios (`reference/balancing-and-outliers.md` §4) and
//! egressd's own defaults.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::eventually;
use common::outlier::{
    answering, backend, ejected_count, endpoint_state, is_ejected, metric, od_proxy, HOST,
};
use common::ports::shared_port;
use common::proxy::{get, preamble, TestProxy};
use common::upstream::Upstream;

#[tokio::test]
async fn five_gateway_errors_eject_then_the_endpoint_returns_and_a_relapse_lasts_longer() {
    let port = shared_port();
    let bad = answering(1, port, 503).await;
    let good = answering(2, port, 200).await;
    let proxy = od_proxy(&[bad.addr, good.addr], "").await;

    // Round robin alternates; the bad endpoint's 5th 503 ejects it.
    let mut failures = 0;
    for i in 0..10 {
        let r = get(proxy.http(), HOST, &format!("/{i}")).await;
        if r.status != 200 {
            failures += 1;
        }
    }
    assert_eq!(bad.request_count(), 5);
    assert_eq!(
        failures, 5,
        "exactly consecutiveGatewayErrors failures reached clients"
    );
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(state["ejection"]["multiplier"], 1);
    assert_eq!(
        state["ejection"]["lastReason"],
        "consecutive_gateway_errors"
    );
    assert_eq!(
        state["lastFailure"]["detail"], "answered 503 Service Unavailable",
        "{state}"
    );

    // While ejected, everything goes to the good endpoint.
    for i in 0..10 {
        assert_eq!(get(proxy.http(), HOST, &format!("/e{i}")).await.status, 200);
    }
    assert_eq!(bad.request_count(), 5);

    // Back after 400 ms (on a 200 ms tick); five more 503s eject it again, for 2 × 400 ms.
    eventually(
        "unejected after the base ejection time",
        Duration::from_secs(3),
        || async { !is_ejected(&proxy, "127.0.0.1").await },
    )
    .await;
    for i in 0..10 {
        let _ = get(proxy.http(), HOST, &format!("/r{i}")).await;
    }
    assert_eq!(bad.request_count(), 10);
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(state["ejection"]["multiplier"], 2);
    let remaining = state["ejection"]["remainingMs"].as_u64().unwrap();
    assert!(
        remaining > 400 && remaining <= 800,
        "second ejection lasts 800 ms: {remaining} ms left"
    );
}

#[tokio::test]
async fn connect_failures_count_as_gateway_errors() {
    let port = shared_port();
    let good = answering(2, port, 200).await;
    let dead = SocketAddr::new([127, 0, 0, 3].into(), port); // nothing listens there
    let proxy = od_proxy(&[dead, good.addr], "").await;
    let mut refused = 0;
    for i in 0..20 {
        let r = get(proxy.http(), HOST, &format!("/{i}")).await;
        if r.error_code() == Some("upstream_connect_failure") {
            refused += 1;
        }
    }
    assert_eq!(refused, 5);
    let state = endpoint_state(&proxy, "127.0.0.3").await;
    assert_eq!(state["ejection"]["ejected"], true);
    let failure = state["lastFailure"]["detail"].as_str().unwrap();
    assert!(
        failure.starts_with("upstream_connect_failure: "),
        "{failure}"
    );
}

#[tokio::test]
async fn a_500_is_not_a_gateway_error_unless_consecutive_5xx_is_set() {
    let port = shared_port();
    let erring = answering(1, port, 500).await;
    let good = answering(2, port, 200).await;
    let proxy = od_proxy(&[erring.addr, good.addr], "").await;
    for i in 0..20 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    assert_eq!(erring.request_count(), 10, "never ejected by default");
    assert!(!is_ejected(&proxy, "127.0.0.1").await);
    drop(proxy);

    let proxy = od_proxy(&[erring.addr, good.addr], ", consecutive5XxErrors: 5").await;
    for i in 0..20 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    assert_eq!(erring.request_count(), 15, "ejected at the 5th 500");
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["lastReason"], "consecutive_5xx");
}

#[tokio::test]
async fn max_ejection_percent_caps_ejections_and_always_eject_one_overrides_it() {
    let port = shared_port();
    let a = answering(1, port, 503).await;
    let b = answering(2, port, 503).await;
    let c = answering(3, port, 503).await;
    let addrs = [a.addr, b.addr, c.addr];

    // egressd's defaults (50%, alwaysEjectOneEndpoint): one of three (two would be 66.7%).
    let proxy = od_proxy(&addrs, "").await;
    for i in 0..30 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    assert_eq!(ejected_count(&proxy).await, 1);
    drop(proxy);

    // Envoy's defaults since 1.28 (10%, no forced ejection): three endpoints, none ejected.
    let proxy = od_proxy(
        &addrs,
        ", maxEjectionPercent: 10, alwaysEjectOneEndpoint: false",
    )
    .await;
    for i in 0..30 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    assert_eq!(ejected_count(&proxy).await, 0);
    drop(proxy);

    // 100%: all three.
    let proxy = od_proxy(&addrs, ", maxEjectionPercent: 100").await;
    for i in 0..30 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    assert_eq!(ejected_count(&proxy).await, 3);
}

/// `clients` keep-alive clients sending GETs one after another until stopped (at most 20,000
/// each), counting successes and keeping the failures.
struct SteadyLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    clients: tokio::task::JoinSet<(usize, Vec<String>)>,
}

impl SteadyLoad {
    fn start(addr: SocketAddr, clients: usize) -> SteadyLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut set = tokio::task::JoinSet::new();
        for client in 0..clients {
            let stop = stop.clone();
            set.spawn(async move {
                let mut conn = common::proxy::Conn::open(addr).await;
                let (mut ok, mut failed) = (0usize, Vec::new());
                for i in 0..20_000 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let request = common::proxy::request("GET", HOST, &format!("/{client}/{i}"))
                        .body(Default::default())
                        .unwrap();
                    let response = conn.fetch(request).await;
                    if response.status == 200 {
                        ok += 1;
                    } else {
                        failed.push(format!("{} {}", response.status, response.text()));
                    }
                }
                (ok, failed)
            });
        }
        SteadyLoad { stop, clients: set }
    }

    /// Stops the clients; the requests that succeeded and the failures.
    async fn stop(mut self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (mut ok, mut failed) = (0, Vec::new());
        while let Some(r) = self.clients.join_next().await {
            let (o, f) = r.unwrap();
            ok += o;
            failed.extend(f);
        }
        (ok, failed)
    }
}

/// Once `b` (127.0.0.2) has served some of the load, kills it, waits until it is ejected, and
/// until `a` has served 100 more requests without it.
async fn kill_under_load(proxy: &TestProxy, a: &Upstream, b: Upstream) {
    eventually("50 requests reached b", Duration::from_secs(5), || async {
        b.request_count() >= 50
    })
    .await;
    drop(b);
    eventually(
        "the dead endpoint is ejected",
        Duration::from_secs(5),
        || async { is_ejected(proxy, "127.0.0.2").await },
    )
    .await;
    let a_before = a.request_count();
    eventually(
        "100 more requests reached a",
        Duration::from_secs(5),
        || async { a.request_count() >= a_before + 100 },
    )
    .await;
}

#[tokio::test]
async fn a_killed_endpoint_costs_at_most_a_run_of_errors_and_returns_when_it_recovers() {
    // Three endpoints under steady load from CLIENTS concurrent clients; one is killed. Without
    // retries, the failures clients see are the requests in flight to it when it died plus
    // the run of consecutiveGatewayErrors (5) that ejects it; then none.
    const CLIENTS: usize = 4;
    let port = shared_port();
    let a = answering(1, port, 200).await;
    let b = answering(2, port, 200).await;
    let c = answering(3, port, 200).await;
    let b_addr = b.addr;
    let yaml = preamble(None)
        + &backend(&[a.addr, b.addr, c.addr], "")
            .replace("{type: RoundRobin}", "{type: LeastRequest}");
    let proxy = TestProxy::start(&yaml).await;

    let load = SteadyLoad::start(proxy.http(), CLIENTS);
    kill_under_load(&proxy, &a, b).await;

    // B recovers (same address); after its ejection it gets traffic again.
    let b = Upstream::start_on("b again", b_addr).await;
    eventually(
        "the recovered endpoint is used again",
        Duration::from_secs(5),
        || async { b.request_count() >= 10 },
    )
    .await;
    let (ok, failures) = load.stop().await;
    let failed = failures.len();
    assert!(ok > 300, "steady load: {ok} requests succeeded");
    assert!(
        failed <= 5 + CLIENTS,
        "{failed} failures reached clients (bound: 5 + {CLIENTS} in flight)"
    );
    assert!(failed >= 1, "the kill was noticed");
}

/// `backend(..)` with a `retry` section.
fn with_retry(yaml: String, retry: &str) -> String {
    yaml.replace(
        "    healthCheck:",
        &format!("    retry: {retry}\n    healthCheck:"),
    )
}

#[tokio::test]
async fn with_retries_a_killed_endpoint_costs_clients_nothing() {
    const CLIENTS: usize = 4;
    let port = shared_port();
    let a = answering(1, port, 200).await;
    let b = answering(2, port, 200).await;
    let c = answering(3, port, 200).await;
    let yaml = preamble(None)
        + &with_retry(
            backend(&[a.addr, b.addr, c.addr], "")
                .replace("{type: RoundRobin}", "{type: LeastRequest}"),
            "{numRetries: 2}",
        );
    let proxy = TestProxy::start(&yaml).await;

    let load = SteadyLoad::start(proxy.http(), CLIENTS);
    kill_under_load(&proxy, &a, b).await;
    let (ok, failed) = load.stop().await;
    assert!(ok > 300, "steady load: {ok} requests succeeded");
    assert!(failed.is_empty(), "{} failed: {:?}", failed.len(), failed);
}

#[tokio::test]
async fn a_503_is_retried_on_another_endpoint_but_a_post_with_a_body_is_not() {
    let port = shared_port();
    let bad = answering(1, port, 503).await;
    let good = answering(2, port, 200).await;
    let yaml = preamble(None)
        + &with_retry(
            backend(&[bad.addr, good.addr], ", consecutiveGatewayErrors: 0"),
            "{numRetries: 1, perRetry: {backOff: {baseInterval: 1ms, maxInterval: 2ms}}}",
        );
    let proxy = TestProxy::start(&yaml).await;
    for i in 0..10 {
        let r = get(proxy.http(), HOST, &format!("/{i}")).await;
        assert_eq!(
            r.status,
            200,
            "GET retried on the other endpoint: {}",
            r.text()
        );
    }
    assert!(
        metric(
            &proxy,
            r#"egressd_upstream_retries_total{backend="default/api"}"#
        )
        .await
            >= 3.0
    );
    // Round robin kept sending first attempts there: each of those was retried elsewhere.
    assert!(
        bad.request_count() >= 3,
        "the 503 endpoint was tried {} times",
        bad.request_count()
    );

    // A POST is not idempotent: after a 503 it may have been processed, so it is not retried.
    let mut saw_503 = false;
    for i in 0..4 {
        let request = common::proxy::request("POST", HOST, &format!("/p{i}"))
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"order",
            )))
            .unwrap();
        let response = common::proxy::fetch(proxy.http(), request).await;
        saw_503 |= response.status == 503;
    }
    assert!(saw_503, "a POST is not retried after a 503");
}

#[tokio::test]
async fn a_put_body_is_read_ahead_and_sent_again_intact() {
    let port = shared_port();
    let bad = answering(1, port, 503).await;
    let good = Upstream::start_on("good", SocketAddr::new([127, 0, 0, 2].into(), port)).await;
    let yaml = preamble(None)
        + &with_retry(
            backend(&[bad.addr, good.addr], ", consecutiveGatewayErrors: 0"),
            "{numRetries: 1, perRetry: {backOff: {baseInterval: 1ms, maxInterval: 2ms}}}",
        );
    let proxy = TestProxy::start(&yaml).await;
    let body = vec![b'x'; 10_000];
    for i in 0..6 {
        let request = common::proxy::request("PUT", HOST, &format!("/doc{i}"))
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        let response = common::proxy::fetch(proxy.http(), request).await;
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert!(bad.request_count() >= 2, "some first attempts failed");
    assert!(
        good.requests().iter().all(|r| r.body_len == 10_000),
        "bodies arrive whole"
    );
    assert_eq!(good.request_count(), 6);
}

#[tokio::test]
async fn an_httproute_retry_maps_onto_the_retry_policy() {
    let port = shared_port();
    let bad = answering(1, port, 503).await;
    let good = answering(2, port, 200).await;
    let yaml = preamble(None)
        + &backend(&[bad.addr, good.addr], ", consecutiveGatewayErrors: 0").replace(
            "rules: [{backendRefs: [{name: api}]}]",
            "rules: [{backendRefs: [{name: api}], retry: {attempts: 1, codes: [503], backoff: 1ms}}]",
        );
    let proxy = TestProxy::start(&yaml).await;
    for i in 0..10 {
        let r = get(proxy.http(), HOST, &format!("/{i}")).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(bad.request_count() >= 3);
}
