//! A reload keeps the state that belongs to unchanged identities: upstream connection pools
//! and resolved DNS names. State whose identity changed starts fresh.

mod common;

use std::net::Ipv4Addr;

use common::dns::TestDns;
use common::ports::{loopback, shared_port};
use common::proxy::{fqdn_backend, get, ip_backend, preamble, TestProxy};
use common::upstream::Upstream;

/// Address of the endpoint group of Backend `name`'s first port in the snapshot serving now:
/// the same address across a reload means the same group (same resolver state) was kept.
fn group_id(proxy: &TestProxy, name: &str) -> usize {
    let snapshot = proxy.egressd().shared().snapshot.load();
    let backend = snapshot
        .backends
        .iter()
        .find(|b| &*b.id.name == name)
        .expect("backend in snapshot");
    std::sync::Arc::as_ptr(&backend.ports[0].endpoints) as usize
}

fn route(host: &str, backend: &str) -> String {
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: route-{backend}
spec:
  hostnames: [{host}]
  rules:
  - backendRefs: [{{name: {backend}}}]
"#
    )
}

#[tokio::test]
async fn upstream_pool_survives_a_reload_that_does_not_touch_the_backend() {
    let a = Upstream::start("a").await;
    let other = Upstream::start("other").await;
    let base = preamble(None) + &ip_backend("a", a.addr, "") + &route("svc.test", "a");
    let proxy = TestProxy::start(&base).await;
    for _ in 0..3 {
        assert_eq!(
            get(proxy.http(), "svc.test", "/").await.upstream(),
            Some("a")
        );
    }
    assert_eq!(
        a.connection_count(),
        1,
        "sequential requests share one pooled connection"
    );

    // An unrelated change: another Backend and route appear.
    let changed = base + &ip_backend("other", other.addr, "") + &route("other.test", "other");
    proxy.rewrite(&changed);
    let before = proxy.generation();
    assert!(proxy.reload().await > before);
    for _ in 0..3 {
        assert_eq!(
            get(proxy.http(), "svc.test", "/").await.upstream(),
            Some("a")
        );
    }
    assert_eq!(
        a.connection_count(),
        1,
        "the pooled connection must survive the reload"
    );
    assert_eq!(a.request_count(), 6);
}

#[tokio::test]
async fn changing_how_a_backend_is_reached_starts_a_fresh_pool() {
    let a = Upstream::start("a").await;
    let base = preamble(None) + &ip_backend("a", a.addr, "") + &route("svc.test", "a");
    let proxy = TestProxy::start(&base).await;
    assert_eq!(
        get(proxy.http(), "svc.test", "/").await.upstream(),
        Some("a")
    );
    assert_eq!(a.connection_count(), 1);

    // protocol HTTP -> HTTP11 changes the transport identity: connections made under the old
    // settings must not be reused.
    let backend = ip_backend("a", a.addr, "").replace("protocol: HTTP\n", "protocol: HTTP11\n");
    proxy.rewrite(&(preamble(None) + &backend + &route("svc.test", "a")));
    proxy.reload().await;
    assert_eq!(
        get(proxy.http(), "svc.test", "/").await.upstream(),
        Some("a")
    );
    assert_eq!(a.connection_count(), 2);
}

#[tokio::test]
async fn resolved_names_survive_a_reload_without_new_queries() {
    let dns = TestDns::start().await;
    let a = Upstream::start("a").await;
    dns.set("api.state.test", &[Ipv4Addr::LOCALHOST], 300);
    let base =
        preamble(Some(dns.addr)) + &fqdn_backend("api", "api.state.test", &[a.addr.port()], "");
    let proxy = TestProxy::start(&base).await;
    assert_eq!(
        get(
            proxy.http(),
            &format!("api.state.test:{}", a.addr.port()),
            "/"
        )
        .await
        .upstream(),
        Some("a")
    );
    let queries = dns.query_count("api.state.test");
    assert!(queries >= 1);
    let group_before = group_id(&proxy, "api");

    let other = Upstream::start("other").await;
    proxy.rewrite(&(base + &ip_backend("other", other.addr, "") + &route("other.test", "other")));
    proxy.reload().await;
    assert_eq!(
        get(
            proxy.http(),
            &format!("api.state.test:{}", a.addr.port()),
            "/"
        )
        .await
        .upstream(),
        Some("a")
    );
    assert_eq!(
        dns.query_count("api.state.test"),
        queries,
        "an unchanged FQDN must not be resolved again on reload"
    );
    assert_eq!(
        group_id(&proxy, "api"),
        group_before,
        "the DNS group must be reused"
    );
    assert_eq!(a.connection_count(), 1);
}

/// A Backend `api` (route `svc.test`) over IP endpoints that share one port, with
/// `traffic_policy` (lines indented by four spaces) as its inline policy.
fn static_backend(endpoints: &[std::net::SocketAddr], traffic_policy: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|a| format!("      - {{address: {}}}\n", a.ip()))
        .collect();
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n  trafficPolicy:\n{traffic_policy}",
        port = endpoints[0].port()
    ) + &route("svc.test", "api")
}

/// An unrelated Backend and route, present or not: a reload that does not touch `api`.
fn unrelated(other: &Upstream, present: bool) -> String {
    if present {
        ip_backend("other", other.addr, "") + &route("other.test", "other")
    } else {
        String::new()
    }
}

#[tokio::test]
async fn circuit_breaker_counts_survive_an_unrelated_reload() {
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    let slow = Upstream::start_with(move |_| {
        let held = held.clone();
        async move {
            held.notified().await;
            http::Response::new(common::upstream::full("slow"))
        }
    })
    .await;
    let other = Upstream::start("other").await;
    let base = preamble(None)
        + &static_backend(
            &[slow.addr],
            "    circuitBreaker: {maxParallelRequests: 2}\n",
        );
    let proxy = TestProxy::start(&base).await;
    let group_before = group_id(&proxy, "api");

    let addr = proxy.http();
    let in_flight: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "svc.test", "/").await }))
        .collect();
    common::eventually(
        "two requests held by the slow upstream",
        std::time::Duration::from_secs(5),
        || async { slow.request_count() == 2 },
    )
    .await;

    proxy.rewrite(&(base + &unrelated(&other, true)));
    proxy.reload().await;
    let r = get(proxy.http(), "svc.test", "/").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.error_code(), Some("overflow"));
    assert_eq!(group_id(&proxy, "api"), group_before, "the same group");

    release.notify_waiters();
    for request in in_flight {
        assert_eq!(request.await.unwrap().status, 200);
    }
    assert_eq!(slow.request_count(), 2);
}

#[tokio::test]
async fn round_robin_keeps_its_turn_across_reloads() {
    let port = shared_port();
    let a = Upstream::start_on("a", loopback(1, port)).await;
    let b = Upstream::start_on("b", loopback(2, port)).await;
    let other = Upstream::start("other").await;
    let base = preamble(None)
        + &static_backend(&[a.addr, b.addr], "    loadBalancer: {type: RoundRobin}\n");
    let proxy = TestProxy::start(&base).await;
    let mut seen = Vec::new();
    for i in 0..10 {
        seen.push(get(proxy.http(), "svc.test", "/").await.text());
        proxy.rewrite(&(base.clone() + &unrelated(&other, i % 2 == 0)));
        proxy.reload().await;
    }
    // Strict turns: a reload does not start the rotation over at a random place.
    assert!(seen.windows(2).all(|w| w[0] != w[1]), "{seen:?}");
}

#[tokio::test]
async fn a_reload_that_adds_an_endpoint_keeps_the_others_and_their_slow_start() {
    let port = shared_port();
    let a = Upstream::start_on("a", loopback(1, port)).await;
    let b = Upstream::start_on("b", loopback(2, port)).await;
    let policy = "    loadBalancer: {type: LeastRequest, slowStart: {window: 60s}}\n";
    let proxy = TestProxy::start(&(preamble(None) + &static_backend(&[a.addr], policy))).await;
    let group_before = group_id(&proxy, "api");
    let ready_for = |endpoints: &serde_json::Value, addr: std::net::SocketAddr| {
        endpoints["backends"][0]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["address"] == addr.to_string())
            .unwrap_or_else(|| panic!("{addr} in {endpoints}"))["readyForMs"]
            .as_u64()
            .unwrap()
    };
    // Until `a` has been ready for a while (no sleep: polled).
    common::eventually(
        "a ready for 300 ms or more",
        std::time::Duration::from_secs(5),
        || async {
            let e = get(proxy.admin, "localhost", "/endpoints").await.text();
            ready_for(&serde_json::from_str(&e).unwrap(), a.addr) >= 300
        },
    )
    .await;

    proxy.rewrite(&(preamble(None) + &static_backend(&[a.addr, b.addr], policy)));
    proxy.reload().await;
    let endpoints: serde_json::Value =
        serde_json::from_str(&get(proxy.admin, "localhost", "/endpoints").await.text()).unwrap();
    assert!(ready_for(&endpoints, a.addr) >= 300, "{endpoints}");
    assert!(ready_for(&endpoints, b.addr) < 300, "{endpoints}");
    assert_eq!(
        group_id(&proxy, "api"),
        group_before,
        "the same group, new addresses"
    );
}

#[tokio::test]
async fn an_unhealthy_endpoint_is_never_picked_across_a_reload() {
    let port = shared_port();
    let sick = Upstream::start_on_with(loopback(1, port), |_| async {
        let mut response = http::Response::new(common::upstream::full("sick"));
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        response
    })
    .await;
    let a = Upstream::start_on("a", loopback(2, port)).await;
    let other = Upstream::start("other").await;
    // `sick` fails every check: unhealthy after its first.
    let policy = "    loadBalancer: {type: RoundRobin}\n    healthCheck:\n      panicThreshold: 0\n      active: {type: HTTP, interval: 100ms, unhealthyThreshold: 1, http: {path: /healthz}}\n";
    let base = preamble(None) + &static_backend(&[sick.addr, a.addr], policy);
    let proxy = TestProxy::start(&base).await;
    common::eventually(
        "an endpoint checked unhealthy",
        std::time::Duration::from_secs(5),
        || async {
            get(proxy.admin, "localhost", "/endpoints")
                .await
                .text()
                .contains("\"unhealthy\"")
        },
    )
    .await;
    let traffic = |u: &Upstream| u.requests().iter().filter(|r| r.uri != "/healthz").count();
    for present in [true, false, true] {
        proxy.rewrite(&(base.clone() + &unrelated(&other, present)));
        proxy.reload().await;
        for _ in 0..10 {
            assert_eq!(get(proxy.http(), "svc.test", "/").await.text(), "a");
        }
    }
    assert_eq!(traffic(&sick), 0, "no request reached it");
    assert_eq!(traffic(&a), 30);
}
