//! `TLSRoute` on TLS Passthrough listeners: the ClientHello's SNI matched against route
//! hostnames (exact, then `*.suffix`) picks weighted Passthrough Backends, ahead of the
//! implicit route by Backend hostname. The client's TLS still reaches the endpoint untouched.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::dns::TestDns;
use common::eventually;
use common::proxy::TestProxy;
use common::tls::{passthrough_rejected, San, TestCa, TlsOptions, TlsUpstream};
use egressd::config::{load_paths, Diagnostic, Reason};
use egressd::runtime::compile::compile;
use egressd::upstream::dns::DnsResolver;
use egressd::upstream::registry::StateRegistry;
use tokio::net::TcpStream;

/// Hostnames the Backends are declared with; no client ever sends them as SNI except
/// `direct.test`, so reaching X or Y proves a TLSRoute chose them.
const X_HOST: &str = "x.internal.test";
const Y_HOST: &str = "y.internal.test";
const DIRECT_HOST: &str = "direct.test";

fn config(dns: SocketAddr, x: u16, y: u16, direct: u16) -> String {
    format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{enabled: false}}
  dns: {{nameservers: ["{dns}"]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge}}
spec:
  listeners:
  - {{name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {{mode: Passthrough}}}}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: x}}
spec:
  destination: {{type: FQDN, fqdn: {{hostname: {X_HOST}, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {x}}}]}}
  tls: {{mode: Passthrough}}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: y}}
spec:
  destination: {{type: FQDN, fqdn: {{hostname: {Y_HOST}, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {y}}}]}}
  tls: {{mode: Passthrough}}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: direct}}
spec:
  destination: {{type: FQDN, fqdn: {{hostname: {DIRECT_HOST}, allowedAddresses: [127.0.0.0/8]}}, ports: [{{number: {direct}}}]}}
  tls: {{mode: Passthrough}}
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{name: wildcard}}
spec:
  hostnames: ["*.routed.test"]
  rules:
  - backendRefs: [{{name: x}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{name: vip}}
spec:
  parentRefs: [{{name: edge, sectionName: tls}}]
  hostnames: [vip.routed.test]
  rules:
  - backendRefs: [{{name: y}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha3
kind: TLSRoute
metadata: {{name: takeover}}
spec:
  hostnames: [{DIRECT_HOST}]
  rules:
  - backendRefs: [{{name: y}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {{name: split}}
spec:
  hostnames: [split.test]
  rules:
  - backendRefs: [{{name: x, weight: 1}}, {{name: y, weight: 1}}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {{name: drained}}
spec:
  hostnames: [off.test]
  rules:
  - backendRefs: [{{name: x, weight: 0}}]
"#
    )
}

struct Setup {
    _dns: TestDns,
    ca: TestCa,
    x: TlsUpstream,
    y: TlsUpstream,
    direct: TlsUpstream,
    proxy: TestProxy,
    listener: SocketAddr,
}

async fn setup() -> Setup {
    let dns = TestDns::start().await;
    for host in [X_HOST, Y_HOST, DIRECT_HOST] {
        dns.set(host, &[Ipv4Addr::LOCALHOST], 60);
    }
    let ca = TestCa::new("tls-route");
    // Each endpoint holds a certificate for the names clients may reach it by, so a completed
    // handshake plus the body (the upstream's name) shows where the connection went.
    let x = TlsUpstream::start(
        "x",
        ca.server_cert(&[
            San::dns("*.routed.test"),
            // Certificate wildcards cover one label; egressd's `*.suffix` covers several.
            San::dns("*.c.routed.test"),
            San::dns("split.test"),
        ]),
        TlsOptions::default(),
    )
    .await;
    let y = TlsUpstream::start(
        "y",
        ca.server_cert(&[
            San::dns("vip.routed.test"),
            San::dns(DIRECT_HOST),
            San::dns("split.test"),
        ]),
        TlsOptions::default(),
    )
    .await;
    let direct = TlsUpstream::start(
        "direct",
        ca.server_cert(&[San::dns(DIRECT_HOST)]),
        TlsOptions::default(),
    )
    .await;
    let proxy = TestProxy::start(&config(
        dns.addr,
        x.addr.port(),
        y.addr.port(),
        direct.addr.port(),
    ))
    .await;
    let listener = proxy.listener("default/edge/tls");
    Setup {
        _dns: dns,
        ca,
        x,
        y,
        direct,
        proxy,
        listener,
    }
}

/// Opens TLS through the listener with `sni`, sends one GET and returns the body (the name of
/// the upstream that answered).
async fn fetch(listener: SocketAddr, config: Arc<rustls::ClientConfig>, sni: &str) -> String {
    let tcp = TcpStream::connect(listener).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(sni.to_owned().try_into().unwrap(), tcp)
        .await
        .unwrap_or_else(|e| panic!("TLS with {sni} through egressd: {e}"));
    let (status, body) = common::tls::get_over(tls, sni).await;
    assert_eq!(status, 200);
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn wildcard_tls_route_sends_a_matching_sni_to_its_backend_untouched() {
    let s = setup().await;
    let body = fetch(s.listener, s.ca.client_config(true), "a.routed.test").await;
    assert_eq!(body, "x");
    assert_eq!(
        s.x.snis(),
        vec![Some("a.routed.test".to_owned())],
        "the endpoint sees the client's own ClientHello"
    );
    // Several labels before the suffix match too.
    assert_eq!(
        fetch(s.listener, s.ca.client_config(true), "b.c.routed.test").await,
        "x"
    );
    assert!(s.y.hellos().is_empty());
}

#[tokio::test]
async fn exact_hostname_route_beats_a_matching_wildcard() {
    let s = setup().await;
    assert_eq!(
        fetch(s.listener, s.ca.client_config(true), "vip.routed.test").await,
        "y"
    );
    assert!(s.x.hellos().is_empty(), "the wildcard route was not used");
}

#[tokio::test]
async fn tls_route_beats_the_implicit_route_for_the_same_hostname() {
    let s = setup().await;
    assert_eq!(
        fetch(s.listener, s.ca.client_config(true), DIRECT_HOST).await,
        "y"
    );
    assert!(
        s.direct.hellos().is_empty(),
        "the Backend named by the hostname was bypassed"
    );
}

#[tokio::test]
async fn weighted_backends_share_connections() {
    let s = setup().await;
    let config = s.ca.client_config(true);
    let (mut to_x, mut to_y) = (0, 0);
    for _ in 0..200 {
        match fetch(s.listener, config.clone(), "split.test")
            .await
            .as_str()
        {
            "x" => to_x += 1,
            "y" => to_y += 1,
            other => panic!("unexpected upstream {other}"),
        }
    }
    // 1:1 weights: each side's count is Binomial(200, 0.5); outside [50, 150] is ~1e-12.
    assert!(
        (50..=150).contains(&to_x) && (50..=150).contains(&to_y),
        "x {to_x}, y {to_y}"
    );
}

#[tokio::test]
async fn route_whose_backends_all_weigh_zero_refuses_with_no_backend() {
    let s = setup().await;
    let before = passthrough_rejected(&s.proxy, "no_backend").await;
    let tcp = TcpStream::connect(s.listener).await.unwrap();
    let attempt = tokio_rustls::TlsConnector::from(s.ca.client_config(true))
        .connect("off.test".try_into().unwrap(), tcp)
        .await;
    assert!(attempt.is_err(), "no backend may take the connection");
    eventually(
        "a passthrough rejection counted as no_backend",
        Duration::from_secs(2),
        || async { passthrough_rejected(&s.proxy, "no_backend").await > before },
    )
    .await;
    assert!(s.x.hellos().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Config checks
// ---------------------------------------------------------------------------------------------

const GATEWAY: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge}
spec:
  listeners:
  - {name: http, port: 0, protocol: HTTP}
  - {name: tls, port: 0, protocol: TLS, tls: {mode: Passthrough}}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: pass}
spec:
  destination: {type: FQDN, fqdn: {hostname: pass.test}, ports: [{number: 443}]}
  tls: {mode: Passthrough}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: plain}
spec:
  destination: {type: FQDN, fqdn: {hostname: plain.test}, ports: [{number: 80}]}
  protocol: HTTP
  tls: {mode: InsecureDisable}
"#;

fn diagnostics(route: &str) -> (tempfile::TempDir, Vec<Diagnostic>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!("{GATEWAY}---\n{route}"),
    )
    .unwrap();
    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let resolver = DnsResolver::new(&["127.0.0.1:53".parse().unwrap()]).unwrap();
    let registry = Arc::new(StateRegistry::new(resolver));
    let compiled = compile(Arc::new(loaded.set), loaded.diagnostics, &registry, 1);
    (dir, compiled.diagnostics)
}

fn only_error(diags: &[Diagnostic]) -> &Diagnostic {
    let errors: Vec<&Diagnostic> = diags.iter().filter(|d| d.is_error()).collect();
    assert_eq!(errors.len(), 1, "{diags:#?}");
    errors[0]
}

#[test]
fn tls_route_to_a_backend_that_is_not_passthrough_is_an_error_at_the_backend_ref() {
    let (_dir, diags) = diagnostics(
        r#"apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: wrong}
spec:
  hostnames: [plain.test]
  rules:
  - backendRefs: [{name: plain}]
"#,
    );
    let d = only_error(&diags);
    assert_eq!(
        d.object.as_ref().unwrap().to_string(),
        "TLSRoute default/wrong"
    );
    assert_eq!(d.field, "spec.rules[0].backendRefs[0]");
    assert!(d.message.contains("not a TLS Passthrough port"), "{d}");
    assert!(
        d.hint.as_deref().unwrap().contains("tls.mode: Passthrough"),
        "{d}"
    );
}

#[test]
fn tls_route_to_a_missing_backend_is_ref_not_found() {
    let (_dir, diags) = diagnostics(
        r#"apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: dangling}
spec:
  rules:
  - backendRefs: [{name: nowhere}]
"#,
    );
    let d = only_error(&diags);
    assert_eq!(d.field, "spec.rules[0].backendRefs[0]");
    assert_eq!(d.reason, Some(Reason::RefNotFound));
}

#[test]
fn tls_route_naming_an_http_listener_is_an_error() {
    let (_dir, diags) = diagnostics(
        r#"apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: misattached}
spec:
  parentRefs: [{name: edge, sectionName: http}]
  rules:
  - backendRefs: [{name: pass}]
"#,
    );
    let d = only_error(&diags);
    assert_eq!(d.field, "spec.parentRefs[0]");
    assert!(d.message.contains("not a TLS Passthrough listener"), "{d}");
}

fn write_config(dir: &Path, route: &str) {
    std::fs::write(dir.join("config.yaml"), format!("{GATEWAY}---\n{route}")).unwrap();
}

#[test]
fn validate_accepts_a_tls_route() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        r#"apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: ok}
spec:
  parentRefs: [{name: edge, sectionName: tls}]
  hostnames: ["*.pass.test"]
  rules:
  - backendRefs: [{name: pass, weight: 3}]
"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["validate", "--verbose"])
        .arg(dir.path())
        .output()
        .expect("run egressd validate");
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.contains("TLSRoute default/ok") && report.contains("Accepted=True"),
        "the route has a status: {report}"
    );
}
