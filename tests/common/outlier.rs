//! Outlier-detection test helpers: a Backend of IP endpoints on 127.0.0.x (same port, so
//! several upstreams fit one Backend port), upstreams with fixed or scripted statuses, and
//! readers of `/endpoints` and `/metrics`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use super::proxy::{get, TestProxy};
use super::upstream::{full, Upstream};

pub(crate) const HOST: &str = "od.test";

pub(crate) fn backend(endpoints: &[SocketAddr], passive: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|a| format!("      - {{address: {}}}\n", a.ip()))
        .collect();
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n  trafficPolicy:\n    loadBalancer: {{type: RoundRobin}}\n    healthCheck:\n      passive: {{interval: 200ms, baseEjectionTime: 400ms{passive}}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: api}}]}}]\n",
        port = endpoints[0].port()
    )
}

/// egressd serving [`backend`] over `endpoints` with the `passive` settings.
pub(crate) async fn od_proxy(endpoints: &[SocketAddr], passive: &str) -> TestProxy {
    TestProxy::start(&(super::proxy::preamble(None) + &backend(endpoints, passive))).await
}

/// An upstream on 127.0.0.`n`:`port` answering every request with `status`.
pub(crate) async fn answering(n: u8, port: u16, status: u16) -> Upstream {
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    Upstream::start_on_with(addr, move |_req| async move {
        http::Response::builder()
            .status(status)
            .body(full(status.to_string()))
            .unwrap()
    })
    .await
}

pub(crate) async fn endpoint_state(proxy: &TestProxy, ip: &str) -> serde_json::Value {
    let response = get(proxy.admin, "localhost", "/endpoints").await;
    let all: serde_json::Value = serde_json::from_slice(&response.body).expect("JSON");
    all["backends"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["address"].as_str().unwrap().starts_with(ip))
        .cloned()
        .expect("endpoint listed")
}

/// The value of one Prometheus series from `/metrics` (0 when absent).
pub(crate) async fn metric(proxy: &TestProxy, series: &str) -> f64 {
    let body = get(proxy.admin, "localhost", "/metrics").await.text();
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

pub(crate) async fn is_ejected(proxy: &TestProxy, ip: &str) -> bool {
    endpoint_state(proxy, ip).await["ejection"]["ejected"]
        .as_bool()
        .unwrap()
}

/// An upstream on 127.0.0.`n`:`port` answering with the statuses of `script` in turn, then 200.
pub(crate) async fn scripted(n: u8, port: u16, script: Arc<Mutex<VecDeque<u16>>>) -> Upstream {
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    Upstream::start_on_with(addr, move |_req| {
        let status = script.lock().unwrap().pop_front().unwrap_or(200);
        async move {
            http::Response::builder()
                .status(status)
                .body(full(status.to_string()))
                .unwrap()
        }
    })
    .await
}

/// How many endpoints of the first Backend are ejected now.
pub(crate) async fn ejected_count(proxy: &TestProxy) -> usize {
    let response = get(proxy.admin, "localhost", "/endpoints").await;
    let all: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    all["backends"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ejection"]["ejected"] == true)
        .count()
}
