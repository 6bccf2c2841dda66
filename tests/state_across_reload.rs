//! A reload keeps the state that belongs to unchanged identities: upstream connection pools
//! and resolved DNS names. State whose identity changed starts fresh.

mod common;

use std::net::Ipv4Addr;

use common::dns::TestDns;
use common::proxy::{fqdn_backend, get, ip_backend, preamble, TestProxy};
use common::upstream::Upstream;

/// Address of the endpoint group of Backend `name`'s first port in the snapshot serving now:
/// the same address across a reload means the same group (same resolver state) was kept.
fn group_id(proxy: &TestProxy, name: &str) -> usize {
    let snapshot = proxy.egressd().shared().snapshot.load();
    let backend = snapshot
        .backends
        .iter()
        .find(|b| b.id.name == name)
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
