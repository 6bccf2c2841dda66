//! Envoy's outlier-detection and panic scenarios (`reference/balancing-and-outliers.md` §4)
//! that tests/outlier.rs does not cover, against real upstreams with durations scaled down
//! (interval 200 ms, base ejection 400 ms): which detector fires, what it is counted as, and
//! what happens to traffic.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::outlier::{
    answering, backend, ejected_count, endpoint_state, is_ejected, metric, od_proxy, scripted, HOST,
};
use common::ports::shared_port;
use common::proxy::{get, preamble, TestProxy};
use common::upstream::Upstream;
use common::{eventually, poll_within};

fn script(statuses: &[u16]) -> Arc<Mutex<VecDeque<u16>>> {
    Arc::new(Mutex::new(statuses.iter().copied().collect()))
}

fn detections(verdict: &str, reason: &str) -> String {
    format!(
        r#"egressd_outlier_detections_total{{backend="default/api",reason="{reason}",verdict="{verdict}"}}"#
    )
}

/// Sends `n` GETs one after another; returns how many were answered 200.
async fn send(proxy: &TestProxy, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        ok += usize::from(get(proxy.http(), HOST, &format!("/{i}")).await.status == 200);
    }
    ok
}

#[tokio::test]
async fn gateway_errors_eject_while_a_5xx_run_is_only_detected() {
    // OD-gateway (BasicFlowGatewayFailure) with egressd's defaults: 503, 500, 503×5. The 5th
    // response completes a run of five 5xx: detected, not enforced. The 500 reset the gateway
    // run, so the 7th response is the 5th gateway error in a row and ejects.
    let port = shared_port();
    let seq = script(&[503, 500, 503, 503, 503, 503, 503]);
    let a = scripted(1, port, seq.clone()).await;
    let proxy = od_proxy(&[a.addr], "").await;
    assert_eq!(send(&proxy, 5).await, 0);
    assert_eq!(
        metric(&proxy, &detections("not_enforced", "consecutive_5xx")).await,
        1.0
    );
    assert!(!is_ejected(&proxy, "127.0.0.1").await);
    assert_eq!(send(&proxy, 1).await, 0);
    assert!(
        !is_ejected(&proxy, "127.0.0.1").await,
        "6 responses: not yet"
    );
    assert_eq!(send(&proxy, 1).await, 0);
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(
        state["ejection"]["lastReason"],
        "consecutive_gateway_errors"
    );
    assert_eq!(
        metric(
            &proxy,
            r#"egressd_outlier_ejections_total{backend="default/api",reason="consecutive_gateway_errors"}"#
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn with_both_enforced_the_gateway_detector_wins_and_a_500_run_ejects_as_5xx() {
    // OD-gateway-vs-5xx: consecutive5XxErrors set. 503, 200, 503×5: the gateway detector
    // ejects (the 5xx detection of the same response is dropped). After the return:
    // 503, 503, 500, 500, 500: the 5xx run ejects; the gateway run was cut by the 500s.
    let port = shared_port();
    let seq = script(&[503, 200, 503, 503, 503, 503, 503]);
    let a = scripted(1, port, seq.clone()).await;
    let proxy = od_proxy(&[a.addr], ", consecutive5XxErrors: 5").await;
    send(&proxy, 7).await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(
        state["ejection"]["lastReason"],
        "consecutive_gateway_errors"
    );
    assert_eq!(
        metric(&proxy, &detections("ejected", "consecutive_5xx")).await,
        0.0
    );

    eventually(
        "127.0.0.1 back from its ejection",
        Duration::from_secs(3),
        || async { !is_ejected(&proxy, "127.0.0.1").await },
    )
    .await;
    seq.lock().unwrap().extend([503, 503, 500, 500, 500]);
    send(&proxy, 5).await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(state["ejection"]["lastReason"], "consecutive_5xx");
    assert_eq!(state["ejection"]["ejections"], 2);
}

#[tokio::test]
async fn errors_while_ejected_neither_extend_the_ejection_nor_eject_again_on_return() {
    // OD-counters-reset: a lone endpoint (so panic mode keeps sending it traffic while it is
    // ejected) fails throughout its ejection; after it returns, one more failure does not
    // eject it again: a fresh run of five is needed.
    let port = shared_port();
    let a = answering(1, port, 503).await;
    let proxy = od_proxy(&[a.addr], "").await;
    send(&proxy, 5).await;
    assert!(is_ejected(&proxy, "127.0.0.1").await);
    let ejected_at = std::time::Instant::now();
    // 20 more failures while ejected (panic: a lone endpoint still gets traffic).
    send(&proxy, 20).await;
    assert_eq!(
        a.request_count(),
        25,
        "panic mode balances over ejected endpoints"
    );
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejections"], 1);
    assert!(state["ejection"]["remainingMs"].as_u64().unwrap() <= 400);
    eventually(
        "127.0.0.1 back from its ejection",
        Duration::from_secs(3),
        || async { !is_ejected(&proxy, "127.0.0.1").await },
    )
    .await;
    assert!(ejected_at.elapsed() >= Duration::from_millis(400));
    send(&proxy, 4).await;
    assert!(
        !is_ejected(&proxy, "127.0.0.1").await,
        "4 failures after the return do not eject"
    );
    send(&proxy, 1).await;
    assert!(is_ejected(&proxy, "127.0.0.1").await, "the 5th does");
}

#[tokio::test]
async fn split_local_origin_failures_eject_as_their_own_detector() {
    // OD-split: with splitExternalLocalOriginErrors, refused connections feed the
    // local-origin detector, not the gateway one.
    let port = shared_port();
    let good = answering(2, port, 200).await;
    let dead = std::net::SocketAddr::new([127, 0, 0, 3].into(), port);
    let proxy = od_proxy(
        &[dead, good.addr],
        ", splitExternalLocalOriginErrors: true, consecutiveLocalOriginFailures: 3",
    )
    .await;
    send(&proxy, 20).await;
    let state = endpoint_state(&proxy, "127.0.0.3").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(
        state["ejection"]["lastReason"],
        "consecutive_local_origin_failures"
    );
    assert_eq!(
        good.request_count(),
        17,
        "3 failures, then all to the good one"
    );
}

#[tokio::test]
async fn ejections_over_max_ejection_percent_are_counted_not_made() {
    // OD-overflow: 2 endpoints, 60%, no forced ejection: A is ejected (50%), B would make it
    // 100%: detected, counted as over the cap, not ejected.
    let port = shared_port();
    let a = answering(1, port, 503).await;
    let b = answering(2, port, 503).await;
    let proxy = od_proxy(
        &[a.addr, b.addr],
        ", maxEjectionPercent: 60, alwaysEjectOneEndpoint: false",
    )
    .await;
    send(&proxy, 12).await;
    assert_eq!(ejected_count(&proxy).await, 1);
    assert!(
        metric(
            &proxy,
            &detections("over_max_ejection_percent", "consecutive_gateway_errors")
        )
        .await
            >= 1.0
    );
}

/// Sends batches of requests until `ip` is ejected (rate detection judges whole intervals).
async fn load_until_ejected(proxy: &TestProxy, ip: &str) -> bool {
    poll_within(Duration::from_secs(10), || async {
        send(proxy, 30).await;
        is_ejected(proxy, ip).await
    })
    .await
    .is_some()
}

#[tokio::test]
async fn an_endpoint_far_below_the_group_success_rate_is_ejected() {
    // 500s are not gateway errors and consecutive 5xx is not enforced: only the success-rate
    // detector can eject. Rates {0, 100, 100}: mean 66.7, stdev 47.1, threshold (1 stdev)
    // 19.6.
    let port = shared_port();
    let bad = answering(1, port, 500).await;
    let b = answering(2, port, 200).await;
    let c = answering(3, port, 200).await;
    let proxy = od_proxy(
        &[bad.addr, b.addr, c.addr],
        ", successRate: {stdevFactor: 1000, minimumHosts: 3, requestVolume: 5}",
    )
    .await;
    assert!(load_until_ejected(&proxy, "127.0.0.1").await);
    assert_eq!(
        endpoint_state(&proxy, "127.0.0.1").await["ejection"]["lastReason"],
        "success_rate"
    );
    assert!(!is_ejected(&proxy, "127.0.0.2").await && !is_ejected(&proxy, "127.0.0.3").await);
    // Envoy's default stdevFactor 1.9 would not eject at these rates: threshold < 0.
    drop(proxy);
    let proxy = od_proxy(
        &[bad.addr, b.addr, c.addr],
        ", successRate: {minimumHosts: 3, requestVolume: 5}",
    )
    .await;
    send(&proxy, 300).await;
    assert_eq!(ejected_count(&proxy).await, 0);
}

#[tokio::test]
async fn an_endpoint_failing_past_the_failure_percentage_is_ejected() {
    let port = shared_port();
    let bad = answering(1, port, 500).await;
    let good = answering(2, port, 200).await;
    let proxy = od_proxy(
        &[bad.addr, good.addr],
        ", failurePercentage: {threshold: 50, minimumHosts: 2, requestVolume: 5}",
    )
    .await;
    assert!(load_until_ejected(&proxy, "127.0.0.1").await);
    assert_eq!(
        endpoint_state(&proxy, "127.0.0.1").await["ejection"]["lastReason"],
        "failure_percentage"
    );
    assert!(
        metric(
            &proxy,
            r#"egressd_outlier_ejections_total{backend="default/api",reason="failure_percentage"}"#
        )
        .await
            >= 1.0
    );
}

/// Six endpoints (least request, maxEjectionPercent 100, 60 s ejections), the first
/// `failing` answering 503, under traffic until those are ejected.
async fn six_endpoints_with_failing(failing: u8) -> (TestProxy, Vec<Upstream>) {
    let port = shared_port();
    let mut upstreams: Vec<Upstream> = Vec::new();
    for n in 1..=6u8 {
        upstreams.push(answering(n, port, if n <= failing { 503 } else { 200 }).await);
    }
    let addrs: Vec<_> = upstreams.iter().map(|u| u.addr).collect();
    let yaml = (preamble(None) + &backend(&addrs, ", maxEjectionPercent: 100"))
        .replace("{type: RoundRobin}", "{type: LeastRequest}")
        .replace("baseEjectionTime: 400ms", "baseEjectionTime: 60s");
    let proxy = TestProxy::start(&yaml).await;
    eventually(
        "the failing endpoints ejected, and only they",
        Duration::from_secs(5),
        || async {
            send(&proxy, 10).await;
            ejected_count(&proxy).await == usize::from(failing)
        },
    )
    .await;
    (proxy, upstreams)
}

#[tokio::test]
async fn below_the_panic_threshold_picks_ignore_health() {
    // LR-panic (MaxUnhealthyPanic): 6 endpoints. 4 ejected (2 of 6 healthy = 33% < 50%):
    // traffic goes to all 6. 2 ejected (66.7%): only to the healthy 4.
    let (proxy, upstreams) = six_endpoints_with_failing(4).await;
    let before: Vec<usize> = upstreams.iter().map(Upstream::request_count).collect();
    send(&proxy, 120).await;
    for (i, u) in upstreams.iter().enumerate() {
        assert!(
            u.request_count() > before[i],
            "in panic, endpoint {} still gets traffic",
            i + 1
        );
    }
    drop(proxy);

    // Two failing of six: 66.7% healthy, no panic.
    let (proxy, upstreams) = six_endpoints_with_failing(2).await;
    let before: Vec<usize> = upstreams.iter().map(Upstream::request_count).collect();
    assert_eq!(
        send(&proxy, 120).await,
        120,
        "only healthy endpoints answer"
    );
    assert_eq!(upstreams[0].request_count(), before[0]);
    assert_eq!(upstreams[1].request_count(), before[1]);
}

#[tokio::test]
async fn with_panic_off_and_nothing_healthy_requests_get_503_no_healthy_upstream() {
    let port = shared_port();
    let a = answering(1, port, 503).await;
    let yaml = (preamble(None) + &backend(&[a.addr], ""))
        .replace("baseEjectionTime: 400ms", "baseEjectionTime: 60s")
        .replace(
            "    healthCheck:\n",
            "    healthCheck:\n      panicThreshold: 0\n",
        );
    let proxy = TestProxy::start(&yaml).await;
    send(&proxy, 5).await;
    assert!(is_ejected(&proxy, "127.0.0.1").await);
    let r = get(proxy.http(), HOST, "/").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.error_code(), Some("no_healthy_upstream"));
    assert_eq!(a.request_count(), 5);
}

#[tokio::test]
async fn an_endpoint_back_from_ejection_ramps_up_under_slow_start() {
    // Two endpoints, least request, a 2 s window. Once B is past its own slow start (every
    // endpoint starts in one), A fails 5 times and is ejected; back after 400 ms, it gets the
    // slow-start share (10% floor at first), not half the traffic.
    let port = shared_port();
    let seq = script(&[]);
    let a = scripted(1, port, seq.clone()).await;
    let b = answering(2, port, 200).await;
    let yaml = (preamble(None) + &backend(&[a.addr, b.addr], "")).replace(
        "loadBalancer: {type: RoundRobin}",
        "loadBalancer: {type: LeastRequest, slowStart: {window: 2s}}",
    );
    let proxy = TestProxy::start(&yaml).await;
    eventually(
        "127.0.0.2 ready for over 2 s",
        Duration::from_secs(5),
        || async {
            endpoint_state(&proxy, "127.0.0.2").await["readyForMs"]
                .as_u64()
                .unwrap()
                > 2_000
        },
    )
    .await;
    seq.lock().unwrap().extend([503; 5]);
    eventually(
        "127.0.0.1 ejected under traffic",
        Duration::from_secs(5),
        || async {
            send(&proxy, 5).await;
            is_ejected(&proxy, "127.0.0.1").await
        },
    )
    .await;
    eventually(
        "127.0.0.1 back from its ejection",
        Duration::from_secs(3),
        || async { !is_ejected(&proxy, "127.0.0.1").await },
    )
    .await;
    let returning = endpoint_state(&proxy, "127.0.0.1").await["effectiveWeight"]
        .as_f64()
        .unwrap();
    assert!(returning < 1.0, "ramping: effective weight {returning}");
    assert_eq!(
        endpoint_state(&proxy, "127.0.0.2").await["effectiveWeight"],
        1.0
    );
    let before = a.request_count();
    assert_eq!(send(&proxy, 100).await, 100);
    let share = (a.request_count() - before) as f64 / 100.0;
    assert!(
        share > 0.0 && share < 0.35,
        "the returning endpoint got {:.0}% of the traffic",
        share * 100.0
    );
}

#[tokio::test]
async fn timeouts_count_as_gateway_errors() {
    // OD-local-origin mapping: a timeout without a response is a 504 for outlier detection.
    let port = shared_port();
    let hanging = Upstream::start_on_with(
        std::net::SocketAddr::new([127, 0, 0, 1].into(), port),
        |_req| async {
            std::future::pending::<()>().await;
            unreachable!()
        },
    )
    .await;
    let good = answering(2, port, 200).await;
    let yaml = (preamble(None) + &backend(&[hanging.addr, good.addr], "")).replace(
        "    healthCheck:",
        "    timeout: {http: {requestTimeout: 150ms}}\n    healthCheck:",
    );
    let proxy = TestProxy::start(&yaml).await;
    let mut timed_out = 0;
    for i in 0..20 {
        let r = get(proxy.http(), HOST, &format!("/{i}")).await;
        timed_out += usize::from(r.error_code() == Some("upstream_timeout"));
    }
    assert_eq!(timed_out, 5, "five timeouts eject");
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(
        state["ejection"]["lastReason"],
        "consecutive_gateway_errors"
    );
}
