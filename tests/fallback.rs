//! `fallback: true` Backends: among a route's backendRefs, used only while no primary Backend
//! has a healthy endpoint (all ejected or failing active checks), and left again when one
//! recovers.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::eventually;
use common::outlier::{answering, HOST};
use common::ports::shared_port;
use common::proxy::{get, preamble, TestProxy};
use common::upstream::Upstream;

fn backend(name: &str, addr: SocketAddr, fallback: bool) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination:\n    type: IP\n    ip: {{endpoints: [{{address: {ip}}}]}}\n    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n  fallback: {fallback}\n  trafficPolicy:\n    healthCheck:\n      passive: {{interval: 100ms, baseEjectionTime: 300ms}}\n",
        ip = addr.ip(),
        port = addr.port()
    )
}

fn route(refs: &[&str]) -> String {
    let refs: Vec<String> = refs.iter().map(|r| format!("{{name: {r}}}")).collect();
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{}]}}]\n",
        refs.join(", ")
    )
}

async fn send(proxy: &TestProxy, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for i in 0..n {
        statuses.push(
            get(proxy.http(), HOST, &format!("/{i}"))
                .await
                .status
                .as_u16(),
        );
    }
    statuses
}

#[tokio::test]
async fn traffic_moves_to_the_fallback_while_the_primary_is_down_and_back_after() {
    let port = shared_port();
    let primary = answering(1, port, 200).await;
    let spare = answering(2, port, 200).await;
    let primary_addr = primary.addr;
    let yaml = preamble(None)
        + &backend("primary", primary.addr, false)
        + &backend("spare", spare.addr, true)
        + &route(&["primary", "spare"]);
    let proxy = TestProxy::start(&yaml).await;

    assert!(send(&proxy, 20).await.iter().all(|s| *s == 200));
    assert_eq!(primary.request_count(), 20);
    assert_eq!(
        spare.request_count(),
        0,
        "the fallback is idle while the primary is healthy"
    );

    // The primary dies: its 5 connect failures eject it, then the fallback takes over.
    drop(primary);
    let statuses = send(&proxy, 25).await;
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert_eq!(failed, 5, "{statuses:?}");
    assert_eq!(spare.request_count(), 20);

    // The primary comes back: once its ejection ends, traffic returns to it.
    let primary = Upstream::start_on("primary again", primary_addr).await;
    eventually(
        "requests reach the primary again",
        Duration::from_secs(5),
        || async {
            send(&proxy, 5).await;
            primary.request_count() > 0
        },
    )
    .await;
    let spare_before = spare.request_count();
    assert!(send(&proxy, 10).await.iter().all(|s| *s == 200));
    assert_eq!(spare.request_count(), spare_before, "back on the primary");
}

#[tokio::test]
async fn a_rule_of_fallbacks_only_uses_them_as_primaries() {
    let port = shared_port();
    let spare = answering(2, port, 200).await;
    let yaml = preamble(None) + &backend("spare", spare.addr, true) + &route(&["spare"]);
    let proxy = TestProxy::start(&yaml).await;
    assert!(send(&proxy, 5).await.iter().all(|s| *s == 200));
    assert_eq!(spare.request_count(), 5);
}

#[tokio::test]
async fn a_lower_priority_endpoint_takes_traffic_only_while_the_first_level_is_down() {
    // Endpoint priorities inside one Backend: 127.0.0.2 (priority 1) idles while 127.0.0.1
    // (priority 0) is healthy, takes over while it is ejected, and idles again after.
    let port = shared_port();
    let first = answering(1, port, 200).await;
    let standby = answering(2, port, 200).await;
    let first_addr = first.addr;
    let yaml = (preamble(None) + &common::outlier::backend(&[first.addr, standby.addr], ""))
        .replace("{address: 127.0.0.2}", "{address: 127.0.0.2, priority: 1}");
    let proxy = TestProxy::start(&yaml).await;
    assert!(send(&proxy, 20).await.iter().all(|s| *s == 200));
    assert_eq!(standby.request_count(), 0, "priority 1 idles");

    drop(first);
    let statuses = send(&proxy, 25).await;
    assert_eq!(
        statuses.iter().filter(|s| **s != 200).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(standby.request_count(), 20);

    let first = Upstream::start_on("first again", first_addr).await;
    eventually(
        "requests reach the first endpoint again",
        Duration::from_secs(5),
        || async {
            send(&proxy, 5).await;
            first.request_count() > 0
        },
    )
    .await;
    let before = standby.request_count();
    send(&proxy, 10).await;
    assert_eq!(standby.request_count(), before, "back on priority 0");
}
