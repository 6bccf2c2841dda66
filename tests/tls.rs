//! TLS origination (Backend `tls`): egressd verifies the upstream's certificate against the
//! configured CA and name, sends the Backend's SNI (never the client's Host), presents a client
//! certificate in Mutual mode, and answers a failed handshake with 502
//! `upstream_tls_failure`, a body naming the cause and a `cause` metric.
//!
//! The upstreams are real rustls servers (`common::tls`); `api.tls.test` resolves through a test
//! DNS server to 127.0.0.1. The `harness_*` tests check those servers and certificates with a
//! plain rustls client, so a failure elsewhere in this file is egressd's.

mod common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::dns::TestDns;
use common::proxy::{get, preamble, Response, TestProxy};
use common::tls::{silent_server, CertAndKey, San, TestCa, TlsOptions, TlsUpstream, TlsVersions};
use common::upstream::Upstream;
use rustls::ProtocolVersion;

/// The Backend's hostname.
const API: &str = "api.tls.test";

/// What every test starts from: DNS answering `api.tls.test` with 127.0.0.1, and a CA whose
/// certificate is written to a temp dir for `caCertificateFiles`.
struct Env {
    dns: TestDns,
    dir: tempfile::TempDir,
    ca: TestCa,
    ca_file: PathBuf,
}

impl Env {
    async fn new() -> Env {
        let dns = TestDns::start().await;
        dns.set(API, &[Ipv4Addr::LOCALHOST], 60);
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new("trusted");
        let ca_file = ca.write_pem(dir.path());
        Env {
            dns,
            dir,
            ca,
            ca_file,
        }
    }

    /// The common preamble (DNS pointed at the test server) followed by `objects`.
    fn config(&self, objects: &str) -> String {
        preamble(Some(self.dns.addr)) + objects
    }

    /// A certificate for `api.tls.test` from the trusted CA.
    fn api_cert(&self) -> CertAndKey {
        self.ca.server_cert(&[San::dns(API)])
    }

    /// A TLS upstream `api` with `cert` and default options.
    async fn upstream(&self, cert: CertAndKey) -> TlsUpstream {
        TlsUpstream::start("api", cert, TlsOptions::default()).await
    }

    /// Starts egressd with Backend `api` (FQDN `api.tls.test` on `port`, protocol HTTP11, `tls`).
    async fn proxy(&self, port: u16, tls: &Tls<'_>) -> TestProxy {
        TestProxy::start(&self.config(&fqdn_tls_backend(port, tls, ""))).await
    }
}

/// The `tls` block of Backend `api`. Unset fields are left out of the YAML.
#[derive(Default)]
struct Tls<'a> {
    mode: Option<&'a str>,
    sni: Option<&'a str>,
    ca_file: Option<&'a Path>,
    hostname: Option<&'a str>,
    /// `subjectAltNames` entries as YAML flow maps.
    subject_alt_names: Vec<String>,
    insecure_skip_verify: bool,
    /// (certificateFile, privateKeyFile)
    client_cert: Option<(&'a Path, &'a Path)>,
    min_version: Option<&'a str>,
    max_version: Option<&'a str>,
}

impl<'a> Tls<'a> {
    /// `mode: Simple` trusting `ca_file`.
    fn simple(ca_file: &'a Path) -> Tls<'a> {
        Tls {
            mode: Some("Simple"),
            ca_file: Some(ca_file),
            ..Tls::default()
        }
    }

    /// The block's lines, indented to sit under `spec.tls`.
    fn yaml(&self) -> String {
        let mut out = String::new();
        if let Some(mode) = self.mode {
            out += &format!("    mode: {mode}\n");
        }
        if let Some(sni) = self.sni {
            out += &format!("    sni: {sni}\n");
        }
        let mut validation = Vec::new();
        if let Some(ca) = self.ca_file {
            validation.push(format!("caCertificateFiles: [\"{}\"]", ca.display()));
        }
        if let Some(hostname) = self.hostname {
            validation.push(format!("hostname: {hostname}"));
        }
        if !self.subject_alt_names.is_empty() {
            let sans = self.subject_alt_names.join(", ");
            validation.push(format!("subjectAltNames: [{sans}]"));
        }
        if self.insecure_skip_verify {
            validation.push("insecureSkipVerify: true".to_owned());
        }
        if !validation.is_empty() {
            out += "    validation:\n";
            for line in validation {
                out += &format!("      {line}\n");
            }
        }
        if let Some((cert, key)) = self.client_cert {
            out += &format!(
                "    clientCertificate:\n      certificateFile: \"{}\"\n      privateKeyFile: \"{}\"\n",
                cert.display(),
                key.display()
            );
        }
        if let Some(v) = self.min_version {
            out += &format!("    minVersion: \"{v}\"\n");
        }
        if let Some(v) = self.max_version {
            out += &format!("    maxVersion: \"{v}\"\n");
        }
        out
    }
}

/// Backend `api` for FQDN `api.tls.test` on `port`, protocol HTTP11. `extra` is appended to the
/// spec, indented by two spaces.
fn fqdn_tls_backend(port: u16, tls: &Tls<'_>, extra: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: api
spec:
  destination:
    type: FQDN
    fqdn:
      hostname: {API}
      allowedAddresses: [127.0.0.0/8]
    ports:
    - number: {port}
  protocol: HTTP11
  tls:
{tls}{extra}"#,
        tls = tls.yaml()
    )
}

/// Backend `api` with the single IP endpoint `addr`, protocol HTTP11.
fn ip_tls_backend(addr: SocketAddr, tls: &Tls<'_>) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: api
spec:
  destination:
    type: IP
    ip:
      endpoints:
      - address: {ip}
    ports:
    - number: {port}
  protocol: HTTP11
  tls:
{tls}"#,
        ip = addr.ip(),
        port = addr.port(),
        tls = tls.yaml()
    )
}

/// An HTTPRoute sending requests for `hostname` to Backend `api`.
fn route_to_api(hostname: &str) -> String {
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: front
spec:
  parentRefs:
  - name: gw
  hostnames: ["{hostname}"]
  rules:
  - backendRefs:
    - {{group: egressd.dev, kind: Backend, name: api}}
"#
    )
}

/// `GET /` for `api.tls.test:port` (the implicit route to the FQDN Backend).
async fn get_api(proxy: &TestProxy, port: u16) -> Response {
    get(proxy.http(), &format!("{API}:{port}"), "/").await
}

fn assert_ok_from_api(response: &Response) {
    assert_eq!(
        (response.status.as_u16(), response.error_code()),
        (200, None),
        "body: {}",
        response.text()
    );
    assert_eq!(response.upstream(), Some("api"));
}

/// `egressd_upstream_tls_failures_total` by `cause`, summed over any other labels.
async fn tls_failure_counts(proxy: &TestProxy) -> BTreeMap<String, f64> {
    let metrics = get(proxy.admin, "127.0.0.1", "/metrics").await;
    assert_eq!(metrics.status, 200, "{}", metrics.text());
    let mut counts = BTreeMap::new();
    for line in metrics.text().lines() {
        let Some(labels) = line.strip_prefix("egressd_upstream_tls_failures_total{") else {
            continue;
        };
        let cause = labels
            .split_once("cause=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(cause, _)| cause.to_owned())
            .unwrap_or_else(|| panic!("no cause label: {line}"));
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no value: {line}"));
        *counts.entry(cause).or_insert(0.0) += value;
    }
    counts
}

/// Asserts a 502 `upstream_tls_failure` whose one-line body names `cause`, counted under that
/// cause (and no other) in the metrics.
async fn assert_tls_failure(proxy: &TestProxy, response: &Response, cause: &str) {
    let body = response.text();
    assert_eq!(
        (response.status.as_u16(), response.error_code()),
        (502, Some("upstream_tls_failure")),
        "body: {body}"
    );
    assert_eq!(body.trim_end().lines().count(), 1, "body: {body:?}");
    assert!(
        body.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| word == cause),
        "the body does not name the cause `{cause}`: {body:?}"
    );
    // Polled with a deadline: the counter may be bumped just after the reply is written.
    let counted = common::poll_within(Duration::from_secs(3), || async {
        let counts = tls_failure_counts(proxy).await;
        counts
            .get(cause)
            .is_some_and(|n| *n >= 1.0)
            .then_some(counts)
    })
    .await;
    let Some(counts) = counted else {
        panic!(
            "egressd_upstream_tls_failures_total{{cause=\"{cause}\"}} not incremented: {:?}",
            tls_failure_counts(proxy).await
        );
    };
    assert!(
        counts.iter().all(|(c, n)| c == cause || *n == 0.0),
        "failures counted under other causes: {counts:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Successful origination

#[tokio::test]
async fn simple_tls_with_a_custom_ca_sends_the_backend_hostname_as_sni_not_the_client_host() {
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let yaml = env.config(
        &(fqdn_tls_backend(upstream.addr.port(), &Tls::simple(&env.ca_file), "")
            + &route_to_api("front.test")),
    );
    let proxy = TestProxy::start(&yaml).await;

    let response = get(proxy.http(), "front.test", "/").await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.request_count(), 1);
    assert_eq!(upstream.snis(), vec![Some(API.to_owned())]);
    // HTTP11 offers exactly http/1.1 (the server would have taken h2 if offered).
    assert_eq!(upstream.offered_alpns(), vec![vec!["http/1.1".to_owned()]]);
    assert_eq!(upstream.alpns(), vec![Some("http/1.1".to_owned())]);
    assert_eq!(upstream.versions(), vec![ProtocolVersion::TLSv1_3]);
}

#[tokio::test]
async fn tls_block_without_mode_is_simple() {
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let tls = Tls {
        mode: None,
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.handshake_count(), 1);
}

#[tokio::test]
async fn backend_without_tls_block_originates_tls_verified_by_the_system_roots() {
    // Omitting `tls` means Simple with the system trust store, which does not know the test CA:
    // egressd must try TLS (the server sees a ClientHello) and reject the certificate.
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let backend =
        fqdn_tls_backend(upstream.addr.port(), &Tls::default(), "").replace("  tls:\n", "");
    let proxy = TestProxy::start(&env.config(&backend)).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "unknown_ca").await;
    assert_eq!(upstream.snis(), vec![Some(API.to_owned())]);
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn validation_hostname_is_the_name_verified_while_the_configured_sni_is_sent() {
    let env = Env::new().await;
    // The certificate names only the validation hostname, not the SNI.
    let upstream = env
        .upstream(env.ca.server_cert(&[San::dns("verify.test")]))
        .await;
    let tls = Tls {
        sni: Some(API),
        hostname: Some("verify.test"),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.snis(), vec![Some(API.to_owned())]);
}

#[tokio::test]
async fn validation_hostname_is_also_the_default_sni() {
    // docs/configuration.md: `sni` defaults to validation.hostname, then the FQDN hostname.
    let env = Env::new().await;
    let upstream = env
        .upstream(env.ca.server_cert(&[San::dns("verify.test")]))
        .await;
    let tls = Tls {
        hostname: Some("verify.test"),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.snis(), vec![Some("verify.test".to_owned())]);
}

#[tokio::test]
async fn configured_sni_is_sent_and_verified() {
    let env = Env::new().await;
    // Valid only for the SNI override: success also shows the SNI is the name verified.
    let upstream = env
        .upstream(env.ca.server_cert(&[San::dns("sni.override.test")]))
        .await;
    let tls = Tls {
        sni: Some("sni.override.test"),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.snis(), vec![Some("sni.override.test".to_owned())]);
}

#[tokio::test]
async fn ip_endpoint_is_verified_against_its_ip_san_and_gets_no_sni() {
    let env = Env::new().await;
    let upstream = env
        .upstream(env.ca.server_cert(&[San::ip("127.0.0.1")]))
        .await;
    let yaml = env.config(
        &(ip_tls_backend(upstream.addr, &Tls::simple(&env.ca_file)) + &route_to_api("ip.test")),
    );
    let proxy = TestProxy::start(&yaml).await;

    let response = get(proxy.http(), "ip.test", "/").await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.snis(), vec![None]);
}

#[tokio::test]
async fn ip_endpoint_whose_certificate_lacks_the_ip_san_fails_with_name_mismatch() {
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let yaml = env.config(
        &(ip_tls_backend(upstream.addr, &Tls::simple(&env.ca_file)) + &route_to_api("ip.test")),
    );
    let proxy = TestProxy::start(&yaml).await;

    let response = get(proxy.http(), "ip.test", "/").await;
    assert_tls_failure(&proxy, &response, "name_mismatch").await;
    assert_eq!(upstream.snis(), vec![None]);
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn uri_subject_alt_name_matches_a_spiffe_id() {
    let env = Env::new().await;
    // No DNS name at all: only the URI SAN can make this certificate acceptable.
    let upstream = env
        .upstream(
            env.ca
                .server_cert(&[San::uri("spiffe://cluster.local/ns/a/sa/b")]),
        )
        .await;
    let tls = Tls {
        subject_alt_names: vec!["{type: URI, uri: \"spiffe://cluster.local/ns/a/sa/b\"}".into()],
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
}

#[tokio::test]
async fn uri_subject_alt_name_of_another_identity_fails_with_name_mismatch() {
    let env = Env::new().await;
    let upstream = env
        .upstream(
            env.ca
                .server_cert(&[San::uri("spiffe://cluster.local/ns/a/sa/other")]),
        )
        .await;
    let tls = Tls {
        subject_alt_names: vec!["{type: URI, uri: \"spiffe://cluster.local/ns/a/sa/b\"}".into()],
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "name_mismatch").await;
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn mutual_tls_presents_the_configured_client_certificate() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            ..TlsOptions::default()
        },
    )
    .await;
    let (cert, key) = env
        .ca
        .client_cert("egressd-client")
        .write(env.dir.path(), "client");
    let tls = Tls {
        mode: Some("Mutual"),
        client_cert: Some((&cert, &key)),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
    assert_eq!(
        upstream.client_cns(),
        vec![Some("egressd-client".to_owned())]
    );
}

#[tokio::test]
async fn insecure_skip_verify_accepts_an_unknown_ca_and_marks_the_backend_degraded() {
    let env = Env::new().await;
    let stranger = TestCa::new("stranger");
    let upstream = env.upstream(stranger.server_cert(&[San::dns(API)])).await;
    let tls = Tls {
        mode: Some("Simple"),
        insecure_skip_verify: true,
        ..Tls::default()
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);

    let status = get(proxy.admin, "127.0.0.1", "/status").await;
    assert_eq!(status.status, 200, "{}", status.text());
    let status: serde_json::Value = serde_json::from_slice(&status.body).expect("JSON status");
    let backend = status["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .find(|o| o["kind"] == "Backend" && o["name"] == "api")
        .unwrap_or_else(|| panic!("no Backend api in {status:#}"));
    let degraded = backend["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Degraded");
    assert_eq!(
        degraded.map(|c| c["status"].clone()),
        Some(serde_json::json!("True")),
        "{backend:#}"
    );
}

#[tokio::test]
async fn max_version_1_2_negotiates_tls_1_2() {
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let tls = Tls {
        max_version: Some("1.2"),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_ok_from_api(&response);
    assert_eq!(upstream.versions(), vec![ProtocolVersion::TLSv1_2]);
}

#[tokio::test]
async fn sequential_requests_reuse_one_tls_connection() {
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let proxy = env
        .proxy(upstream.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    // Each request on its own client connection: reuse is egressd's upstream pool.
    for _ in 0..2 {
        let response = get_api(&proxy, upstream.addr.port()).await;
        assert_ok_from_api(&response);
    }
    assert_eq!(upstream.request_count(), 2);
    assert_eq!(upstream.handshake_count(), 1, "{:?}", upstream.handshakes());
    assert_eq!(upstream.hellos().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Handshake failures, one per cause

#[tokio::test]
async fn certificate_from_an_unknown_ca_fails_with_unknown_ca() {
    let env = Env::new().await;
    let stranger = TestCa::new("stranger");
    let upstream = env.upstream(stranger.server_cert(&[San::dns(API)])).await;
    let proxy = env
        .proxy(upstream.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "unknown_ca").await;
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn expired_certificate_fails_with_expired() {
    let env = Env::new().await;
    let upstream = env
        .upstream(env.ca.expired_server_cert(&[San::dns(API)]))
        .await;
    let proxy = env
        .proxy(upstream.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "expired").await;
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn certificate_valid_only_in_the_future_fails_with_not_yet_valid() {
    let env = Env::new().await;
    let upstream = env
        .upstream(env.ca.not_yet_valid_server_cert(&[San::dns(API)]))
        .await;
    let proxy = env
        .proxy(upstream.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "not_yet_valid").await;
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn certificate_for_another_name_fails_with_name_mismatch() {
    let env = Env::new().await;
    let upstream = env
        .upstream(env.ca.server_cert(&[San::dns("other.test")]))
        .await;
    let proxy = env
        .proxy(upstream.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "name_mismatch").await;
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn certificate_not_issued_for_server_auth_fails_with_bad_certificate() {
    let env = Env::new().await;
    // A client certificate (extended key usage clientAuth only) served as a server certificate.
    let upstream = env.upstream(env.ca.client_cert(API)).await;
    let proxy = env
        .proxy(upstream.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "bad_certificate").await;
    assert_eq!(upstream.request_count(), 0);
}

/// A Simple Backend speaking `protocol` to a server that requires a client certificate.
async fn refused_for_want_of_a_client_certificate(protocol: &str) {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            ..TlsOptions::default()
        },
    )
    .await;
    let backend = fqdn_tls_backend(upstream.addr.port(), &Tls::simple(&env.ca_file), "")
        .replace("protocol: HTTP11", &format!("protocol: {protocol}"));
    let proxy = TestProxy::start(&env.config(&backend)).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "client_cert_required").await;
    assert_eq!(upstream.request_count(), 0);
}

#[tokio::test]
async fn server_requiring_a_client_certificate_fails_with_client_cert_required() {
    refused_for_want_of_a_client_certificate("HTTP11").await;
}

/// Over HTTP/2 the refusal (TLS 1.3: after our side of the handshake) arrives while the
/// preface is written, not with a response: still the same cause, and at once.
#[tokio::test]
async fn http2_server_requiring_a_client_certificate_fails_with_client_cert_required() {
    refused_for_want_of_a_client_certificate("HTTP2").await;
}

#[tokio::test]
async fn plaintext_http_server_fails_with_plaintext_peer() {
    let env = Env::new().await;
    let plain = Upstream::start("plain").await;
    let proxy = env
        .proxy(plain.addr.port(), &Tls::simple(&env.ca_file))
        .await;

    let response = get_api(&proxy, plain.addr.port()).await;
    assert_tls_failure(&proxy, &response, "plaintext_peer").await;
    assert_eq!(plain.request_count(), 0);
}

#[tokio::test]
async fn server_that_never_answers_the_client_hello_fails_with_handshake_timeout() {
    let env = Env::new().await;
    let silent = silent_server().await;
    let policy = "  trafficPolicy:\n    timeout:\n      tcp:\n        connectTimeout: 500ms\n";
    let yaml = env.config(&fqdn_tls_backend(
        silent.addr.port(),
        &Tls::simple(&env.ca_file),
        policy,
    ));
    let proxy = TestProxy::start(&yaml).await;

    let started = Instant::now();
    let response = get_api(&proxy, silent.addr.port()).await;
    let elapsed = started.elapsed();
    assert_tls_failure(&proxy, &response, "handshake_timeout").await;
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_secs(5),
        "answered after {elapsed:?} with a 500ms connect timeout"
    );
    // TCP connected: it was the handshake, not the connect, that timed out.
    assert!(silent.connection_count() >= 1);
}

#[tokio::test]
async fn min_version_1_3_against_a_tls_1_2_only_server_fails_with_protocol_version() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            versions: TlsVersions::Tls12Only,
            ..TlsOptions::default()
        },
    )
    .await;
    let tls = Tls {
        min_version: Some("1.3"),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "protocol_version").await;
    assert_eq!(upstream.handshake_count(), 0);
}

#[tokio::test]
async fn max_version_1_2_against_a_tls_1_3_only_server_fails_with_protocol_version() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            versions: TlsVersions::Tls13Only,
            ..TlsOptions::default()
        },
    )
    .await;
    let tls = Tls {
        max_version: Some("1.2"),
        ..Tls::simple(&env.ca_file)
    };
    let proxy = env.proxy(upstream.addr.port(), &tls).await;

    let response = get_api(&proxy, upstream.addr.port()).await;
    assert_tls_failure(&proxy, &response, "protocol_version").await;
    assert_eq!(upstream.handshake_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// The harness itself, checked with a plain rustls client (no egressd involved)

/// Writes `content` to `path` the way deployment tools do: a new file renamed over the old.
fn replace_file(path: &Path, content: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content).expect("write replacement");
    std::fs::rename(&tmp, path).expect("rename replacement");
}

#[tokio::test]
async fn rotated_client_certificate_is_used_by_the_next_handshake_without_restart() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            // Every request gets a new connection, so every request shows the certificate
            // egressd presents now.
            close_connections: true,
            ..TlsOptions::default()
        },
    )
    .await;
    let first = env.ca.client_cert("client-one");
    let (cert, key) = first.write(env.dir.path(), "client");
    let tls = Tls {
        mode: Some("Mutual"),
        client_cert: Some((&cert, &key)),
        ..Tls::simple(&env.ca_file)
    };
    let proxy =
        TestProxy::start_watching(&env.config(&fqdn_tls_backend(upstream.addr.port(), &tls, "")))
            .await;
    assert_ok_from_api(&get_api(&proxy, upstream.addr.port()).await);
    assert_eq!(
        upstream.client_cns().last(),
        Some(&Some("client-one".to_owned()))
    );

    // Rotate: new certificate and key, written over the old files. No restart, no SIGHUP.
    let second = env.ca.client_cert("client-two");
    replace_file(&key, &second.key_pem);
    replace_file(&cert, &second.cert_pem);
    let rotated = common::poll_within(Duration::from_secs(5), || async {
        let response = get_api(&proxy, upstream.addr.port()).await;
        response.status == 200
            && upstream.client_cns().last() == Some(&Some("client-two".to_owned()))
    })
    .await
    .is_some();
    assert!(
        rotated,
        "new handshakes must present the rotated certificate; saw {:?}",
        upstream.client_cns()
    );
}

#[tokio::test]
async fn broken_rotated_certificate_keeps_the_old_one_and_reports_resolved_refs_false() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            close_connections: true,
            ..TlsOptions::default()
        },
    )
    .await;
    let (cert, key) = env
        .ca
        .client_cert("client-one")
        .write(env.dir.path(), "client");
    let tls = Tls {
        mode: Some("Mutual"),
        client_cert: Some((&cert, &key)),
        ..Tls::simple(&env.ca_file)
    };
    let proxy =
        TestProxy::start_watching(&env.config(&fqdn_tls_backend(upstream.addr.port(), &tls, "")))
            .await;
    assert_ok_from_api(&get_api(&proxy, upstream.addr.port()).await);

    replace_file(
        &cert,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
    );
    let reported = common::poll_within(Duration::from_secs(5), || async {
        let status = get(proxy.admin, "127.0.0.1", "/status").await.text();
        status.contains("\"result\": \"failure\"") && status.contains("client.pem")
    })
    .await
    .is_some();
    let status = get(proxy.admin, "127.0.0.1", "/status").await.text();
    assert!(
        reported,
        "the broken file must be reported in /status: {status}"
    );
    let status: serde_json::Value = serde_json::from_str(&status).expect("status is JSON");
    let rejected = status["lastReload"]["rejectedObjects"]
        .as_array()
        .expect("rejected objects listed");
    let api = rejected
        .iter()
        .find(|o| o["kind"] == "Backend" && o["name"] == "api")
        .expect("Backend api in the rejected config");
    let resolved = api["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ResolvedRefs")
        .unwrap();
    assert_eq!(resolved["status"], "False", "{api}");
    assert!(
        resolved["message"].as_str().unwrap().contains("client.pem"),
        "{api}"
    );

    // The old certificate keeps serving: new handshakes still present client-one.
    let handshakes = upstream.handshake_count();
    assert_ok_from_api(&get_api(&proxy, upstream.addr.port()).await);
    assert!(upstream.handshake_count() > handshakes);
    assert_eq!(
        upstream.client_cns().last(),
        Some(&Some("client-one".to_owned()))
    );
}

mod harness {
    use std::io;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;

    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    use rustls::pki_types::ServerName;
    use rustls::{CertificateError, ClientConfig, ProtocolVersion, SupportedProtocolVersion};
    use tokio::net::TcpStream;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::TlsConnector;

    use super::common::tls::{
        provider, silent_server, subject_cn, CertAndKey, San, TestCa, TlsOptions, TlsUpstream,
        TlsVersions,
    };

    const BOTH: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

    /// A client trusting `ca`, offering `http/1.1`, presenting `client` if given.
    fn client_config(
        ca: &TestCa,
        client: Option<&CertAndKey>,
        versions: &[&'static SupportedProtocolVersion],
    ) -> ClientConfig {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .expect("versions")
            .with_root_certificates(ca.root_store());
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some(c) => builder
                .with_client_auth_cert(c.cert_chain(), c.private_key())
                .expect("client certificate"),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }

    async fn connect(
        addr: SocketAddr,
        config: ClientConfig,
        name: &str,
    ) -> io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from(name.to_owned()).expect("server name");
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }

    /// `GET /` over `tls`: (status, x-upstream, body), or the error that ended it.
    async fn https_get(tls: TlsStream<TcpStream>) -> Result<(u16, String, String), hyper::Error> {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let request = http::Request::builder()
            .uri("/")
            .header("host", "api.tls.test")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let upstream = response.headers()["x-upstream"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((
            status,
            upstream,
            String::from_utf8_lossy(&body).into_owned(),
        ))
    }

    /// The rustls error inside an I/O error from a handshake.
    fn rustls_error(e: &io::Error) -> rustls::Error {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .unwrap_or_else(|| panic!("not a rustls error: {e:?}"))
            .clone()
    }

    #[tokio::test]
    async fn harness_tls_upstream_serves_https_and_records_the_handshake() {
        let ca = TestCa::new("harness");
        let upstream = TlsUpstream::start(
            "api",
            ca.server_cert(&[San::dns("api.tls.test")]),
            TlsOptions::default(),
        )
        .await;
        let tls = connect(
            upstream.addr,
            client_config(&ca, None, BOTH),
            "api.tls.test",
        )
        .await
        .expect("handshake");
        let answer = https_get(tls).await.expect("response");
        assert_eq!(answer, (200, "api".to_owned(), "api".to_owned()));

        assert_eq!(upstream.snis(), vec![Some("api.tls.test".to_owned())]);
        assert_eq!(upstream.offered_alpns(), vec![vec!["http/1.1".to_owned()]]);
        assert_eq!(upstream.alpns(), vec![Some("http/1.1".to_owned())]);
        assert_eq!(upstream.versions(), vec![ProtocolVersion::TLSv1_3]);
        assert_eq!(upstream.client_cns(), vec![None]);
        assert_eq!(upstream.handshake_count(), 1);
        assert_eq!(upstream.request_count(), 1);
    }

    #[tokio::test]
    async fn harness_records_no_sni_when_the_client_connects_by_ip() {
        let ca = TestCa::new("harness");
        let upstream = TlsUpstream::start(
            "api",
            ca.server_cert(&[San::ip("127.0.0.1")]),
            TlsOptions::default(),
        )
        .await;
        let tls = connect(upstream.addr, client_config(&ca, None, BOTH), "127.0.0.1")
            .await
            .expect("handshake verified against the IP SAN");
        https_get(tls).await.expect("response");
        assert_eq!(upstream.snis(), vec![None]);
    }

    #[tokio::test]
    async fn harness_records_the_client_certificate_cn_and_refuses_clients_without_one() {
        let ca = TestCa::new("harness");
        let upstream = TlsUpstream::start(
            "api",
            ca.server_cert(&[San::dns("api.tls.test")]),
            TlsOptions {
                require_client_cert_from: Some(&ca),
                ..TlsOptions::default()
            },
        )
        .await;
        let client = ca.client_cert("client-a");
        let tls = connect(
            upstream.addr,
            client_config(&ca, Some(&client), BOTH),
            "api.tls.test",
        )
        .await
        .expect("mutual handshake");
        https_get(tls).await.expect("response");
        assert_eq!(upstream.client_cns(), vec![Some("client-a".to_owned())]);

        // Without a certificate: with TLS 1.3 the client's side of the handshake completes, and
        // the server's refusal arrives as an alert on the first read.
        let outcome = match connect(
            upstream.addr,
            client_config(&ca, None, BOTH),
            "api.tls.test",
        )
        .await
        {
            Err(e) => Err(rustls_error(&e)),
            Ok(tls) => https_get(tls).await.map_err(|e| {
                let io = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<io::Error>())
                    .unwrap_or_else(|| panic!("no I/O error under {e:?}"));
                rustls_error(io)
            }),
        };
        assert_eq!(
            outcome,
            Err(rustls::Error::AlertReceived(
                rustls::AlertDescription::CertificateRequired
            ))
        );
        assert_eq!(upstream.handshake_count(), 1);
        assert_eq!(upstream.request_count(), 1);
    }

    #[tokio::test]
    async fn harness_bad_certificates_fail_verification_for_the_intended_reason() {
        let ca = TestCa::new("harness");
        let stranger = TestCa::new("stranger");
        let api = [San::dns("api.tls.test")];
        let cases = [
            ("unknown CA", stranger.server_cert(&api), "UnknownIssuer"),
            ("expired", ca.expired_server_cert(&api), "Expired"),
            (
                "not yet valid",
                ca.not_yet_valid_server_cert(&api),
                "NotValidYet",
            ),
            (
                "other name",
                ca.server_cert(&[San::dns("other.test")]),
                "NotValidForName",
            ),
            (
                "URI SAN only",
                ca.server_cert(&[San::uri("spiffe://cluster.local/ns/a/sa/b")]),
                "NotValidForName",
            ),
            (
                "client certificate",
                ca.client_cert("api.tls.test"),
                "InvalidPurpose",
            ),
        ];
        for (case, cert, expected) in cases {
            let upstream = TlsUpstream::start("api", cert, TlsOptions::default()).await;
            let error = connect(
                upstream.addr,
                client_config(&ca, None, BOTH),
                "api.tls.test",
            )
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: the handshake succeeded"));
            let kind = match rustls_error(&error) {
                rustls::Error::InvalidCertificate(c) => match c {
                    CertificateError::UnknownIssuer => "UnknownIssuer",
                    CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                        "Expired"
                    }
                    CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                        "NotValidYet"
                    }
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. } => "NotValidForName",
                    CertificateError::InvalidPurpose
                    | CertificateError::InvalidPurposeContext { .. } => "InvalidPurpose",
                    other => panic!("{case}: unexpected {other:?}"),
                },
                other => panic!("{case}: unexpected {other:?}"),
            };
            assert_eq!(kind, expected, "{case}");
        }
    }

    #[tokio::test]
    async fn harness_version_limited_servers_negotiate_or_refuse_as_configured() {
        let ca = TestCa::new("harness");
        let tls12 = TlsUpstream::start(
            "api",
            ca.server_cert(&[San::dns("api.tls.test")]),
            TlsOptions {
                versions: TlsVersions::Tls12Only,
                ..TlsOptions::default()
            },
        )
        .await;
        let tls = connect(tls12.addr, client_config(&ca, None, BOTH), "api.tls.test")
            .await
            .expect("TLS 1.2 handshake");
        https_get(tls).await.expect("response");
        assert_eq!(tls12.versions(), vec![ProtocolVersion::TLSv1_2]);

        let only13 = client_config(&ca, None, &[&rustls::version::TLS13]);
        let error = connect(tls12.addr, only13, "api.tls.test")
            .await
            .expect_err("no version in common");
        assert_eq!(
            rustls_error(&error),
            rustls::Error::AlertReceived(rustls::AlertDescription::ProtocolVersion)
        );
    }

    #[tokio::test]
    async fn harness_silent_server_accepts_but_never_answers_a_client_hello() {
        let ca = TestCa::new("harness");
        let silent = silent_server().await;
        let handshake = tokio::time::timeout(
            Duration::from_millis(300),
            connect(silent.addr, client_config(&ca, None, BOTH), "api.tls.test"),
        )
        .await;
        assert!(handshake.is_err(), "the handshake ended: {handshake:?}");
        assert_eq!(silent.connection_count(), 1);
    }

    #[test]
    fn harness_subject_cn_reads_the_common_name_of_a_certificate() {
        let ca = TestCa::new("harness");
        assert_eq!(subject_cn(&ca.der()), Some("harness".to_owned()));
        let client = ca.client_cert("client-b");
        let der = client.cert_chain().remove(0);
        assert_eq!(subject_cn(&der), Some("client-b".to_owned()));
        assert_eq!(subject_cn(b"\x30\x03\x02\x01"), None, "truncated input");
    }
}

/// The config preamble with `ProxyConfig.spec.platformIdentity` set to these files.
fn with_platform_identity(env: &Env, cert: &Path, key: &Path, ca: &Path) -> String {
    let identity = format!(
        "  platformIdentity:\n    certificateFile: {}\n    privateKeyFile: {}\n    caCertificateFile: {}\n",
        cert.display(),
        key.display(),
        ca.display()
    );
    let preamble = env.config("");
    let marker = "spec:\n";
    let at = preamble.find(marker).expect("ProxyConfig spec") + marker.len();
    format!("{}{identity}{}", &preamble[..at], &preamble[at..])
}

#[tokio::test]
async fn platform_provided_presents_the_platform_identity_and_trusts_its_bundle() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.api_cert(),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            ..TlsOptions::default()
        },
    )
    .await;
    let (cert, key) = env
        .ca
        .client_cert("spiffe-workload")
        .write(env.dir.path(), "svid");
    // No CA on the Backend: the platform's trust bundle verifies the server.
    let tls = Tls {
        mode: Some("PlatformProvided"),
        ..Tls::default()
    };
    let yaml = with_platform_identity(&env, &cert, &key, &env.ca_file)
        + &fqdn_tls_backend(upstream.addr.port(), &tls, "");
    let proxy = TestProxy::start(&yaml).await;
    assert_ok_from_api(&get_api(&proxy, upstream.addr.port()).await);
    assert_eq!(
        upstream.client_cns(),
        vec![Some("spiffe-workload".to_owned())]
    );
}

#[test]
fn platform_provided_without_a_platform_identity_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let tls = Tls {
        mode: Some("PlatformProvided"),
        ..Tls::default()
    };
    let yaml = preamble(Some("127.0.0.1:53".parse().unwrap())) + &fqdn_tls_backend(443, &tls, "");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let v = egressd::commands::validate(&[dir.path().to_path_buf()]);
    assert!(!v.ok, "{}", v.report);
    assert!(
        v.report
            .contains("spec.tls.mode: tls.mode PlatformProvided needs the platform's identity"),
        "{}",
        v.report
    );
    assert!(v.report.contains("platformIdentity"), "{}", v.report);
}

/// The access log says how the upstream connection was made: the request that opened it
/// carries the connect time, and every line the TLS version and ALPN protocol.
#[tokio::test]
async fn the_access_log_names_connect_time_tls_version_and_alpn() {
    let env = Env::new().await;
    let upstream = env.upstream(env.api_cert()).await;
    let port = upstream.addr.port();
    let log = env.dir.path().join("access.log");
    let yaml = env
        .config(&fqdn_tls_backend(port, &Tls::simple(&env.ca_file), ""))
        .replace(
            "  accessLog:\n    enabled: false\n",
            &format!("  accessLog: {{path: \"{}\"}}\n", log.display()),
        );
    assert!(yaml.contains("access.log"));
    let proxy = TestProxy::start(&yaml).await;
    for _ in 0..2 {
        assert_eq!(get_api(&proxy, port).await.status, 200);
    }
    let lines = || common::proxy::json_lines(&log);
    common::eventually("two access log lines", Duration::from_secs(5), || async {
        lines().len() == 2
    })
    .await;
    let lines = lines();
    for line in &lines {
        assert_eq!(line["upstream_tls"], "TLSv1.3", "{line}");
        assert_eq!(
            line["upstream_alpn"], "http/1.1",
            "protocol HTTP11 offers only http/1.1"
        );
    }
    assert!(
        lines[0]["upstream_connect_ms"].as_f64().unwrap() > 0.0,
        "{}",
        lines[0]
    );
    assert!(
        lines[1].get("upstream_connect_ms").is_none(),
        "pooled: {}",
        lines[1]
    );
}
