//! Active health checks against real upstreams on 127.0.0.x (one shared ephemeral port), with
//! intervals scaled down to 100–400 ms. Progress is observed through `/endpoints`, `/metrics`
//! and traffic, polled with deadlines; nothing waits a fixed time.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::eventually;
use common::outlier::endpoint_state;
use common::ports::shared_port;
use common::proxy::{get, preamble, TestProxy};
use common::upstream::{full, Upstream};
use tokio::time::Instant;

const HOST: &str = "hc.test";

/// A Backend `api` over `endpoints` (round robin) with `healthCheck: {active: .., passive: ..}`.
fn backend(endpoints: &[SocketAddr], active: &str, passive: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|a| format!("      - {{address: {}}}\n", a.ip()))
        .collect();
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n  trafficPolicy:\n    loadBalancer: {{type: RoundRobin}}\n    healthCheck:\n      active: {active}\n      passive: {passive}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: api}}]}}]\n",
        port = endpoints[0].port()
    )
}

/// An upstream on 127.0.0.`n`:`port` whose `/healthz` and other paths answer with statuses
/// the test switches, recording when each check arrived.
struct Switchable {
    upstream: Upstream,
    health: Arc<AtomicU16>,
    traffic: Arc<AtomicU16>,
    checks: Arc<Mutex<Vec<Instant>>>,
}

impl Switchable {
    async fn start(n: u8, port: u16) -> Switchable {
        let health = Arc::new(AtomicU16::new(200));
        let traffic = Arc::new(AtomicU16::new(200));
        let checks = Arc::new(Mutex::new(Vec::new()));
        let (h, t, c) = (health.clone(), traffic.clone(), checks.clone());
        let addr = SocketAddr::new([127, 0, 0, n].into(), port);
        let upstream = Upstream::start_on_with(addr, move |req| {
            let status = if req.uri().path() == "/healthz" {
                c.lock().unwrap().push(Instant::now());
                h.load(Ordering::SeqCst)
            } else {
                t.load(Ordering::SeqCst)
            };
            async move {
                http::Response::builder()
                    .status(status)
                    .body(full(status.to_string()))
                    .unwrap()
            }
        })
        .await;
        Switchable {
            upstream,
            health,
            traffic,
            checks,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.upstream.addr
    }

    fn check_count(&self) -> usize {
        self.checks.lock().unwrap().len()
    }

    /// Requests other than health checks.
    fn traffic_count(&self) -> usize {
        self.upstream
            .requests()
            .iter()
            .filter(|r| r.uri != "/healthz")
            .count()
    }
}

async fn active_state(proxy: &TestProxy, ip: &str) -> String {
    endpoint_state(proxy, ip).await["activeHealth"]["state"]
        .as_str()
        .unwrap_or("none")
        .to_owned()
}

/// The value of one Prometheus series from `/metrics` (0 when absent).
async fn metric(proxy: &TestProxy, series: &str) -> f64 {
    let body = get(proxy.admin, "localhost", "/metrics").await.text();
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

const WITHIN: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_endpoint_failing_http_checks_gets_no_traffic_until_it_passes_again() {
    let port = shared_port();
    let a = Switchable::start(1, port).await;
    let b = Switchable::start(2, port).await;
    let active = "{type: HTTP, interval: 100ms, timeout: 500ms, unhealthyThreshold: 2, healthyThreshold: 2, http: {path: /healthz}}";
    let proxy =
        TestProxy::start(&(preamble(None) + &backend(&[a.addr(), b.addr()], active, "{}"))).await;
    eventually("checked and healthy", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "healthy"
    })
    .await;

    a.health.store(503, Ordering::SeqCst);
    let checks_before = a.check_count();
    eventually("unhealthy after two failed checks", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "unhealthy"
    })
    .await;
    assert!(
        a.check_count() >= checks_before + 2,
        "unhealthyThreshold 2 needs two failed checks"
    );
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["health"], "unhealthy", "{state}");
    assert!(
        state["activeHealth"]["lastFailure"]
            .as_str()
            .unwrap()
            .contains("503"),
        "{state}"
    );
    assert!(state["activeHealth"]["lastCheck"].is_string(), "{state}");

    let a_traffic = a.traffic_count();
    for i in 0..10 {
        assert_eq!(get(proxy.http(), HOST, &format!("/{i}")).await.status, 200);
    }
    assert_eq!(a.traffic_count(), a_traffic, "no traffic while unhealthy");
    assert!(b.traffic_count() >= 10);
    assert!(
        metric(
            &proxy,
            r#"egressd_health_checks_total{backend="default/api",result="fail"}"#
        )
        .await
            >= 2.0
    );

    // Passing again: back after two passes, and balanced over again.
    a.health.store(200, Ordering::SeqCst);
    eventually("healthy again", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "healthy"
    })
    .await;
    eventually("traffic reaches it again", WITHIN, || async {
        let _ = get(proxy.http(), HOST, "/again").await;
        a.traffic_count() > a_traffic
    })
    .await;
    assert!(
        metric(
            &proxy,
            r#"egressd_health_checks_total{backend="default/api",result="pass"}"#
        )
        .await
            >= 2.0
    );
}

#[tokio::test]
async fn a_closed_port_fails_tcp_checks_and_traffic_goes_to_the_others() {
    let port = shared_port();
    let a = Upstream::start_on("a", SocketAddr::new([127, 0, 0, 1].into(), port)).await;
    let b = Upstream::start_on("b", SocketAddr::new([127, 0, 0, 2].into(), port)).await;
    let active = "{type: TCP, interval: 100ms, timeout: 500ms, unhealthyThreshold: 1}";
    // Passive detection off: only the active check may take the endpoint out.
    let proxy = TestProxy::start(
        &(preamble(None) + &backend(&[a.addr, b.addr], active, "{consecutiveGatewayErrors: 0}")),
    )
    .await;
    eventually("127.0.0.1 checked healthy", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "healthy"
    })
    .await;
    drop(a);
    eventually("the closed port fails its check", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "unhealthy"
    })
    .await;
    let b_before = b.request_count();
    for i in 0..10 {
        let r = get(proxy.http(), HOST, &format!("/{i}")).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(b.request_count(), b_before + 10, "all traffic to b");
}

/// OD-HC-uneject (`reference/balancing-and-outliers.md` §4, scenario 14).
#[tokio::test]
async fn a_passing_check_ends_an_outlier_ejection_at_once_unless_turned_off() {
    let port = shared_port();
    let a = Switchable::start(1, port).await;
    let b = Switchable::start(2, port).await;
    let passive = "{interval: 100ms, baseEjectionTime: 60s}";
    let active = "{type: HTTP, interval: 150ms, timeout: 500ms, http: {path: /healthz}}";
    a.traffic.store(503, Ordering::SeqCst);
    let proxy =
        TestProxy::start(&(preamble(None) + &backend(&[a.addr(), b.addr()], active, passive)))
            .await;
    // Five 503s on real requests eject a (round robin: every other request).
    for i in 0..10 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejections"], 1, "{state}");
    a.traffic.store(200, Ordering::SeqCst);
    // Its health check passes: back well before the 60 s ejection ends.
    eventually("unejected by a passing check", WITHIN, || async {
        endpoint_state(&proxy, "127.0.0.1").await["ejection"]["ejected"] == false
    })
    .await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(
        state["ejection"]["multiplier"], 1,
        "multiplier kept: {state}"
    );
    let before = a.traffic_count();
    eventually("back in rotation", WITHIN, || async {
        let _ = get(proxy.http(), HOST, "/back").await;
        a.traffic_count() > before
    })
    .await;
    drop(proxy);

    // With unejectOnPass: false it stays ejected while its checks pass.
    a.traffic.store(503, Ordering::SeqCst);
    let active = "{type: HTTP, interval: 150ms, timeout: 500ms, unejectOnPass: false, http: {path: /healthz}}";
    let proxy =
        TestProxy::start(&(preamble(None) + &backend(&[a.addr(), b.addr()], active, passive)))
            .await;
    for i in 0..10 {
        let _ = get(proxy.http(), HOST, &format!("/{i}")).await;
    }
    assert_eq!(
        endpoint_state(&proxy, "127.0.0.1").await["ejection"]["ejected"],
        true
    );
    let checks = a.check_count();
    eventually("checks go on", WITHIN, || async {
        a.check_count() >= checks + 3
    })
    .await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["ejection"]["ejected"], true, "{state}");
    assert_eq!(state["activeHealth"]["lastResult"], "pass", "{state}");
}

#[tokio::test]
async fn the_checks_of_a_group_are_spread_over_the_interval() {
    let port = shared_port();
    let mut upstreams = Vec::new();
    for n in 1..=4 {
        upstreams.push(Switchable::start(n, port).await);
    }
    let addrs: Vec<SocketAddr> = upstreams.iter().map(Switchable::addr).collect();
    let active = "{type: HTTP, interval: 400ms, timeout: 300ms, http: {path: /healthz}}";
    let _proxy = TestProxy::start(&(preamble(None) + &backend(&addrs, active, "{}"))).await;
    eventually("every endpoint checked", WITHIN, || async {
        upstreams.iter().all(|u| u.check_count() >= 1)
    })
    .await;
    let firsts: Vec<Instant> = upstreams
        .iter()
        .map(|u| u.checks.lock().unwrap()[0])
        .collect();
    let earliest = firsts.iter().min().unwrap();
    let latest = firsts.iter().max().unwrap();
    // Spread evenly, the first checks are 100 ms apart (300 ms from first to last); fired all
    // at once they would be within a few ms. 100 ms leaves room for a loaded machine.
    assert!(
        latest.duration_since(*earliest) >= Duration::from_millis(100),
        "first checks within {:?} of each other",
        latest.duration_since(*earliest)
    );
}

#[tokio::test]
async fn health_survives_a_reload_and_the_new_checker_carries_on() {
    let port = shared_port();
    let a = Switchable::start(1, port).await;
    let b = Switchable::start(2, port).await;
    a.health.store(503, Ordering::SeqCst);
    let active = "{type: HTTP, interval: 100ms, timeout: 500ms, unhealthyThreshold: 2, healthyThreshold: 3, http: {path: /healthz}}";
    let yaml = preamble(None) + &backend(&[a.addr(), b.addr()], active, "{}");
    let proxy = TestProxy::start(&yaml).await;
    eventually("127.0.0.1 checked unhealthy", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "unhealthy"
    })
    .await;

    // Another config with the same Backend: the endpoint keeps its health.
    proxy.rewrite(&(yaml.clone() + "# reloaded\n"));
    proxy.reload().await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    assert_eq!(state["activeHealth"]["state"], "unhealthy", "{state}");
    let a_traffic = a.traffic_count();
    for i in 0..6 {
        assert_eq!(get(proxy.http(), HOST, &format!("/{i}")).await.status, 200);
    }
    assert_eq!(a.traffic_count(), a_traffic, "still out of rotation");

    // The new config's checker brings it back.
    a.health.store(200, Ordering::SeqCst);
    eventually(
        "healthy after healthyThreshold passes under the new config",
        WITHIN,
        || async { active_state(&proxy, "127.0.0.1").await == "healthy" },
    )
    .await;
    let metric = metric(
        &proxy,
        r#"egressd_health_checks_total{backend="default/api",result="pass"}"#,
    )
    .await;
    assert!(metric >= 3.0, "{metric} passes counted");
}

#[tokio::test]
async fn addresses_a_dns_refresh_adds_are_checked() {
    let port = shared_port();
    let a = Switchable::start(1, port).await;
    let b = Switchable::start(2, port).await;
    let dns = common::dns::TestDns::start().await;
    dns.set("api.hc.test", &[[127, 0, 0, 1].into()], 1);
    let yaml = preamble(Some(dns.addr))
        + &common::proxy::fqdn_backend(
            "api",
            "api.hc.test",
            &[port],
            "  trafficPolicy:\n    healthCheck:\n      active: {type: HTTP, interval: 100ms, timeout: 500ms, http: {path: /healthz}}\n",
        );
    let proxy = TestProxy::start(&yaml).await;
    eventually("a checked at least once", WITHIN, || async {
        a.check_count() >= 1
    })
    .await;
    dns.set(
        "api.hc.test",
        &[[127, 0, 0, 1].into(), [127, 0, 0, 2].into()],
        1,
    );
    eventually("the new address is checked", WITHIN, || async {
        b.check_count() >= 1
    })
    .await;
    let recorded = b
        .upstream
        .requests()
        .into_iter()
        .find(|r| r.uri == "/healthz")
        .expect("check recorded");
    assert_eq!(
        recorded.headers.get(http::header::HOST).unwrap(),
        &format!("api.hc.test:{port}"),
        "Host is the Backend's hostname"
    );
    eventually("127.0.0.2 checked healthy", WITHIN, || async {
        active_state(&proxy, "127.0.0.2").await == "healthy"
    })
    .await;
}

#[tokio::test]
async fn http_checks_use_the_backend_tls_settings_and_http2() {
    use common::tls::{San, TestCa, TlsOptions, TlsUpstream};
    let dns = common::dns::TestDns::start().await;
    dns.set("api.hc.test", &[[127, 0, 0, 1].into()], 60);
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("trusted");
    let ca_file = ca.write_pem(dir.path());
    let upstream = TlsUpstream::start(
        "api",
        ca.server_cert(&[San::dns("api.hc.test")]),
        TlsOptions::default(),
    )
    .await;
    let backend = |ca: &std::path::Path| {
        format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: api.hc.test, allowedAddresses: [127.0.0.0/8]}}\n    ports: [{{number: {port}}}]\n  tls:\n    mode: Simple\n    validation: {{caCertificateFiles: [\"{ca}\"]}}\n  trafficPolicy:\n    healthCheck:\n      active: {{type: HTTP, interval: 100ms, timeout: 1s, unhealthyThreshold: 1, http: {{path: /healthz}}}}\n",
            port = upstream.addr.port(),
            ca = ca.display()
        )
    };
    let proxy = TestProxy::start(&(preamble(Some(dns.addr)) + &backend(&ca_file))).await;
    eventually("the check passes over verified TLS", WITHIN, || async {
        endpoint_state(&proxy, "127.0.0.1").await["activeHealth"]["lastResult"] == "pass"
    })
    .await;
    let check = upstream
        .requests()
        .into_iter()
        .find(|r| r.uri.ends_with("/healthz"))
        .expect("check reached the upstream");
    assert_eq!(check.version, http::Version::HTTP_2, "ALPN chose h2");
    assert!(
        upstream
            .snis()
            .iter()
            .all(|s| s.as_deref() == Some("api.hc.test")),
        "SNI from the Backend"
    );
    drop(proxy);

    // A CA that did not sign the upstream's certificate: the check fails, naming why.
    let stranger = TestCa::new("stranger");
    let stranger_file = dir.path().join("stranger.pem");
    std::fs::write(&stranger_file, stranger.pem()).unwrap();
    let proxy = TestProxy::start(&(preamble(Some(dns.addr)) + &backend(&stranger_file))).await;
    eventually("127.0.0.1 checked unhealthy", WITHIN, || async {
        active_state(&proxy, "127.0.0.1").await == "unhealthy"
    })
    .await;
    let state = endpoint_state(&proxy, "127.0.0.1").await;
    let failure = state["activeHealth"]["lastFailure"].as_str().unwrap();
    assert!(failure.contains("unknown_ca"), "{failure}");
}
