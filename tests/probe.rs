//! `egressd check --probe DIR`: the built binary validates the config, then resolves every
//! Backend's destination (through the test DNS server named in `ProxyConfig.dns.nameservers`)
//! and handshakes with each endpoint using the Backend's TLS settings, printing per endpoint
//! the SNI, chain and name verification, TLS version and ALPN, the client-certificate outcome
//! and the days until the server certificate expires; exit status 1 when anything fails.
//!
//! The servers are real rustls upstreams (`common::tls`) on 127.0.0.1; each test also checks
//! what the server itself saw, so a report cannot pass without a real handshake.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::dns::TestDns;
use common::proxy::{fqdn_backend, ip_backend, preamble};
use common::tls::{silent_server, CertAndKey, San, TestCa, TlsOptions, TlsUpstream, TlsVersions};
use common::upstream::Upstream;

/// The FQDN Backend's hostname, resolved by the test DNS server to 127.0.0.1.
const API: &str = "api.probe.test";
/// notAfter of `Validity::Current` certificates (2200-01-01T00:00:00Z) and of expired ones
/// (2001-01-01T00:00:00Z), as Unix seconds.
const CURRENT_NOT_AFTER: i64 = 7_258_118_400;
const EXPIRED_NOT_AFTER: i64 = 978_307_200;

/// A temp config dir, a DNS server answering `api.probe.test` and a trusted CA written to it.
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

    /// Writes the preamble (DNS pointed at the test server) and `objects` as the config.
    fn write_config(&self, objects: &str) {
        let yaml = preamble(Some(self.dns.addr)) + objects;
        std::fs::write(self.dir.path().join("egressd.yaml"), yaml).expect("write config");
    }

    /// `tls` lines for mode Simple trusting the test CA.
    fn simple(&self) -> String {
        format!(
            "    mode: Simple\n    validation:\n      caCertificateFiles: [\"{}\"]\n",
            self.ca_file.display()
        )
    }

    /// `tls` lines for mode Mutual trusting the test CA and presenting `client`.
    fn mutual(&self, client: &CertAndKey) -> String {
        let (cert, key) = client.write(self.dir.path(), "client");
        format!(
            "{}    clientCertificate:\n      certificateFile: \"{}\"\n      privateKeyFile: \"{}\"\n",
            self.simple().replace("Simple", "Mutual"),
            cert.display(),
            key.display()
        )
    }

    async fn check_probe(&self) -> Probe {
        run_check(self.dir.path(), true).await
    }
}

/// Backend `name` for FQDN `api.probe.test` on `port`, protocol HTTP11, with `tls` lines.
fn fqdn_tls_backend(name: &str, port: u16, tls: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: {name}
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
{tls}"#
    )
}

/// Backend `name` with the single IP endpoint `addr`, protocol HTTP11, with `tls` lines.
fn ip_tls_backend(name: &str, addr: SocketAddr, tls: &str) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: {name}
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
        port = addr.port()
    )
}

/// What `egressd check [--probe]` printed and how it exited.
struct Probe {
    code: Option<i32>,
    stdout: String,
}

impl Probe {
    /// The lines of the endpoint `addr`: its header (`  addr: ok` / `FAILED ...`) and fields.
    fn endpoint(&self, addr: SocketAddr) -> Endpoint<'_> {
        let header = format!("  {addr}: ");
        let mut lines = self.stdout.lines().skip_while(|l| !l.starts_with(&header));
        let Some(first) = lines.next() else {
            panic!("no endpoint {addr} in the report:\n{}", self.stdout);
        };
        let fields = lines.take_while(|l| l.starts_with("    ")).collect();
        Endpoint {
            status: &first[header.len()..],
            fields,
            report: &self.stdout,
        }
    }

    fn assert_exit(&self, code: i32) {
        assert_eq!(
            self.code,
            Some(code),
            "exit status; report:\n{}",
            self.stdout
        );
    }
}

struct Endpoint<'a> {
    status: &'a str,
    fields: Vec<&'a str>,
    report: &'a str,
}

impl Endpoint<'_> {
    /// The value of `label:` in this endpoint's block.
    fn field(&self, label: &str) -> &str {
        let prefix = format!("{label}:");
        self.fields
            .iter()
            .map(|l| l.trim_start())
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no `{label}` field; report:\n{}", self.report))
    }
}

/// Runs the built binary (off the runtime: the test's servers must keep serving meanwhile).
async fn run_check(dir: &Path, probe: bool) -> Probe {
    run_check_with(dir, probe, &[]).await
}

/// [`run_check`] with extra arguments.
async fn run_check_with(dir: &Path, probe: bool, extra: &[&str]) -> Probe {
    let dir = dir.to_owned();
    let extra: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_egressd"));
        command.arg("check");
        if probe {
            command.arg("--probe");
        }
        command.args(&extra);
        command
            .arg(&dir)
            .env_remove("RUST_LOG")
            .env_remove("EGRESSD_LOG_LEVEL")
            .output()
    })
    .await
    .expect("the blocking task runs")
    .expect("run the egressd binary");
    Probe {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
    }
}

fn days_until(not_after: i64) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    (not_after - now).div_euclid(86_400)
}

/// The number in "…, in N days" / "…, EXPIRED N days ago".
fn days_in(expires: &str) -> i64 {
    expires
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no day count in {expires:?}"))
}

#[tokio::test]
async fn probe_of_a_good_simple_backend_reports_sni_version_alpn_chain_name_and_expiry() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    let plain = Upstream::start("plain").await;
    env.write_config(
        &(fqdn_tls_backend("api", upstream.addr.port(), &env.simple())
            + &ip_backend("plain", plain.addr, "")),
    );

    let probe = env.check_probe().await;

    probe.assert_exit(0);
    assert!(probe.stdout.contains("\nvalid: "), "{}", probe.stdout);
    assert!(
        probe
            .stdout
            .contains(&format!("{API} resolved by nameservers {}", env.dns.addr)),
        "{}",
        probe.stdout
    );
    let api = probe.endpoint(upstream.addr);
    assert_eq!(api.status, "ok");
    assert_eq!(api.field("sni"), API);
    assert_eq!(api.field("chain"), "ok");
    assert_eq!(api.field("name"), format!("ok (expected {API})"));
    // The server prefers h2 but egressd offers only http/1.1.
    assert_eq!(api.field("negotiated"), "TLS 1.3, ALPN http/1.1");
    assert_eq!(api.field("client cert"), "none configured");
    assert!(api.field("certificate").contains(&format!("DNS:{API}")));
    let expires = api.field("expires");
    assert!(expires.starts_with("2200-01-01, in "), "{expires}");
    assert!((days_in(expires) - days_until(CURRENT_NOT_AFTER)).abs() <= 1);
    let plain_ep = probe.endpoint(plain.addr);
    assert_eq!(plain_ep.status, "ok");
    assert!(plain_ep.field("tcp").starts_with("connected"));
    assert!(probe
        .stdout
        .contains("\nprobe ok: 2 port(s), 0 failed; 2 endpoint(s), 0 failed"));
    // The server saw the handshake the report describes.
    assert_eq!(upstream.snis(), vec![Some(API.to_owned())]);
    assert_eq!(upstream.offered_alpns(), vec![vec!["http/1.1".to_owned()]]);
}

#[tokio::test]
async fn probe_of_a_certificate_from_an_unknown_ca_fails_and_names_the_cause() {
    let env = Env::new().await;
    let stranger = TestCa::new("stranger");
    let upstream = TlsUpstream::start(
        "api",
        stranger.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.simple(),
    ));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    let api = probe.endpoint(upstream.addr);
    assert!(
        api.status.starts_with("FAILED unknown_ca"),
        "{}",
        api.status
    );
    assert!(api.field("chain").starts_with("FAILED unknown_ca"));
    // The name is right, and the report says it checked that separately.
    assert!(
        api.field("name")
            .starts_with(&format!("ok (expected {API}; checked on its own")),
        "{}",
        probe.stdout
    );
    // The certificate was still read (by the diagnostic handshake), with its expiry.
    let certificate = api.field("certificate");
    assert!(certificate.contains(&format!("DNS:{API}")), "{certificate}");
    assert!(certificate.contains("second handshake"), "{certificate}");
    assert!(api.field("expires").starts_with("2200-01-01, in "));
    assert!(probe
        .stdout
        .contains("\nprobe FAILED: 1 port(s), 1 failed; 1 endpoint(s), 1 failed"));
    // The real handshake, then the diagnostic one that accepts any certificate.
    assert_eq!(upstream.hellos().len(), 2);
    common::eventually(
        "the server counts one finished handshake",
        Duration::from_secs(5),
        || async { upstream.handshake_count() == 1 },
    )
    .await;
}

#[tokio::test]
async fn probe_of_an_ip_endpoint_whose_certificate_names_another_host_reports_name_mismatch() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns("other.probe.test")]),
        TlsOptions::default(),
    )
    .await;
    env.write_config(&ip_tls_backend("api", upstream.addr, &env.simple()));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    let api = probe.endpoint(upstream.addr);
    assert!(
        api.status.starts_with("FAILED name_mismatch"),
        "{}",
        api.status
    );
    assert_eq!(api.field("sni"), "none (IP)");
    assert_eq!(api.field("chain"), "ok");
    assert_eq!(
        api.field("name"),
        "FAILED name_mismatch: expected 127.0.0.1, the certificate names DNS:other.probe.test"
    );
    assert_eq!(upstream.snis().first(), Some(&None), "no SNI for an IP");
}

#[tokio::test]
async fn probe_of_an_expired_certificate_reports_expired_and_how_long_ago() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.expired_server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.simple(),
    ));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    let api = probe.endpoint(upstream.addr);
    assert!(api.status.starts_with("FAILED expired"), "{}", api.status);
    assert!(api.field("chain").starts_with("FAILED expired"));
    let expires = api.field("expires");
    assert!(expires.starts_with("2001-01-01, EXPIRED "), "{expires}");
    assert!((days_in(expires) + days_until(EXPIRED_NOT_AFTER)).abs() <= 1);
}

#[tokio::test]
async fn probe_of_a_mutual_backend_shows_the_client_certificate_presented_and_accepted() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            ..TlsOptions::default()
        },
    )
    .await;
    let client = env.ca.client_cert("egressd-client");
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.mutual(&client),
    ));

    let probe = env.check_probe().await;

    probe.assert_exit(0);
    let api = probe.endpoint(upstream.addr);
    assert_eq!(api.status, "ok");
    assert!(
        api.field("client cert")
            .starts_with("presented and accepted"),
        "{}",
        probe.stdout
    );
    assert!(probe
        .stdout
        .contains("(HTTP11, TLS Mutual, connect timeout 10s)"));
    assert_eq!(
        upstream.client_cns(),
        vec![Some("egressd-client".to_owned())]
    );
}

#[tokio::test]
async fn probe_of_a_mutual_backend_over_tls12_reports_version_and_accepted_client_certificate() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            versions: TlsVersions::Tls12Only,
            ..TlsOptions::default()
        },
    )
    .await;
    let client = env.ca.client_cert("egressd-client");
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.mutual(&client),
    ));

    let probe = env.check_probe().await;

    probe.assert_exit(0);
    let api = probe.endpoint(upstream.addr);
    assert_eq!(api.field("negotiated"), "TLS 1.2, ALPN http/1.1");
    assert_eq!(
        api.field("client cert"),
        "presented and accepted (the server finished the handshake after checking it)"
    );
    let cns = common::eventually(
        "the server records the client certificate",
        Duration::from_secs(5),
        || async { Some(upstream.client_cns()).filter(|c| !c.is_empty()) },
    )
    .await;
    assert_eq!(cns, vec![Some("egressd-client".to_owned())]);
}

#[tokio::test]
async fn probe_of_a_mutual_backend_whose_client_certificate_the_server_rejects_fails() {
    let env = Env::new().await;
    let other = TestCa::new("other-clients");
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions {
            require_client_cert_from: Some(&other),
            ..TlsOptions::default()
        },
    )
    .await;
    let client = env.ca.client_cert("egressd-client");
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.mutual(&client),
    ));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    let api = probe.endpoint(upstream.addr);
    assert!(api.status.starts_with("FAILED"), "{}", api.status);
    assert!(
        api.field("client cert").starts_with("REJECTED"),
        "{}",
        probe.stdout
    );
    // The server certificate itself was fine.
    assert_eq!(api.field("chain"), "ok");
    assert_eq!(
        upstream.handshake_count(),
        0,
        "{:?}",
        upstream.handshake_errors()
    );
}

#[tokio::test]
async fn probe_of_a_simple_backend_to_a_server_requiring_a_client_certificate_fails_with_client_cert_required(
) {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions {
            require_client_cert_from: Some(&env.ca),
            ..TlsOptions::default()
        },
    )
    .await;
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.simple(),
    ));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    let api = probe.endpoint(upstream.addr);
    assert!(
        api.status.starts_with("FAILED client_cert_required"),
        "{}",
        probe.stdout
    );
    assert!(api
        .field("client cert")
        .starts_with("REJECTED client_cert_required"));
}

#[tokio::test]
async fn check_without_probe_validates_only_and_connects_nowhere() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    env.write_config(&fqdn_tls_backend(
        "api",
        upstream.addr.port(),
        &env.simple(),
    ));

    let check = run_check(env.dir.path(), false).await;

    check.assert_exit(0);
    assert!(check.stdout.contains("\nvalid: "), "{}", check.stdout);
    assert!(!check.stdout.contains("probe"), "{}", check.stdout);
    assert_eq!(env.dns.query_count(API), 0);
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn probe_of_an_invalid_config_reports_the_errors_and_probes_nothing() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns(API)]),
        TlsOptions::default(),
    )
    .await;
    // Mutual without a client certificate is an error.
    let tls = env.simple().replace("Simple", "Mutual");
    env.write_config(&fqdn_tls_backend("api", upstream.addr.port(), &tls));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    assert!(probe.stdout.contains("\ninvalid: "), "{}", probe.stdout);
    assert!(probe.stdout.contains("not probing"), "{}", probe.stdout);
    assert!(upstream.hellos().is_empty());
}

#[tokio::test]
async fn probe_of_unreachable_destinations_fails_on_dns_and_on_connect() {
    let env = Env::new().await;
    env.dns.remove(API);
    // A port nothing listens on (held, so nothing else takes it).
    let refusing = common::ports::Refusing::bind();
    let closed = refusing.addr;
    env.write_config(&(fqdn_backend("gone", API, &[443], "") + &ip_backend("closed", closed, "")));

    let probe = env.check_probe().await;

    probe.assert_exit(1);
    assert!(
        probe
            .stdout
            .contains("default/gone port 443 (HTTP, plaintext"),
        "{}",
        probe.stdout
    );
    assert!(
        probe.stdout.contains(&format!("  FAILED: resolving {API}")),
        "{}",
        probe.stdout
    );
    let closed_ep = probe.endpoint(closed);
    assert!(closed_ep.status.starts_with("FAILED connect_failed"));
    assert!(closed_ep.field("tcp").starts_with("FAILED"));
    // Both ports count as failed, the one whose name did not resolve too (it has no
    // endpoint to fail).
    assert!(
        probe
            .stdout
            .contains("\nprobe FAILED: 2 port(s), 2 failed; 1 endpoint(s), 1 failed"),
        "{}",
        probe.stdout
    );
}

#[tokio::test]
async fn probe_of_a_silent_server_gives_up_after_the_backends_connect_timeout() {
    let env = Env::new().await;
    let silent = silent_server().await;
    let tls = env.simple()
        + "  trafficPolicy:\n    timeout:\n      tcp:\n        connectTimeout: 300ms\n";
    env.write_config(&fqdn_tls_backend("api", silent.addr.port(), &tls));

    let started = Instant::now();
    let probe = env.check_probe().await;

    probe.assert_exit(1);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(probe
        .stdout
        .contains("(HTTP11, TLS Simple, connect timeout 300ms)"));
    let api = probe.endpoint(silent.addr);
    assert!(
        api.status.starts_with("FAILED handshake_timeout"),
        "{}",
        probe.stdout
    );
    assert_eq!(api.field("certificate"), "not received");
}

/// A wildcard Backend has no endpoints until a request names a host: `--probe-host` probes a
/// host the way that request would go (resolved, its own SNI, verified against its own name);
/// without one the port says so and fails nothing; a host no wildcard covers fails.
#[tokio::test]
async fn probe_of_a_wildcard_backend_probes_each_named_host_by_its_own_name() {
    let env = Env::new().await;
    let upstream = TlsUpstream::start(
        "api",
        env.ca.server_cert(&[San::dns("pay.wild.test")]),
        TlsOptions::default(),
    )
    .await;
    env.dns.set("pay.wild.test", &[Ipv4Addr::LOCALHOST], 60);
    let port = upstream.addr.port();
    env.write_config(&format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: wild}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: \"*.wild.test\", allowedAddresses: [127.0.0.0/8]}}\n    ports: [{{number: {port}}}]\n  protocol: HTTP11\n  tls:\n{}",
        env.simple()
    ));

    let bare = env.check_probe().await;
    bare.assert_exit(0);
    assert!(
        bare.stdout
            .contains("wildcard *.wild.test: hosts are resolved when requests name them"),
        "{}",
        bare.stdout
    );
    assert!(upstream.snis().is_empty(), "nothing probed without a host");

    let named = run_check_with(env.dir.path(), true, &["--probe-host", "Pay.Wild.Test"]).await;
    named.assert_exit(0);
    assert!(
        named
            .stdout
            .contains(&format!("default/wild host pay.wild.test port {port}")),
        "{}",
        named.stdout
    );
    let endpoint = named.endpoint(upstream.addr);
    assert_eq!(endpoint.status, "ok", "{}", named.stdout);
    assert!(
        endpoint.field("sni").contains("pay.wild.test"),
        "{}",
        named.stdout
    );
    assert_eq!(upstream.snis(), [Some("pay.wild.test".to_owned())]);

    // Not under the wildcard: refused, and the probe fails.
    let stray = run_check_with(env.dir.path(), true, &["--probe-host", "pay.other.test"]).await;
    stray.assert_exit(1);
    assert!(
        stray
            .stdout
            .contains("--probe-host pay.other.test: FAILED: no wildcard Backend serves it"),
        "{}",
        stray.stdout
    );
}
