//! HTTPS interception (`ProxyConfig.spec.tlsInterception`, docs/interception.md): a `CONNECT`
//! to a declared Backend port whose TLS egressd originates is answered `200`, egressd completes
//! the client's TLS with a certificate its CA signs, and the requests inside pass the pipeline
//! as if sent as `http://` — here with curl through `HTTPS_PROXY`, an upstream with its own CA
//! on 127.0.0.1 whose name the test's DNS answers, and a credential egressd injects.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::dns::TestDns;
use common::proxy::TestProxy;
use common::tls::{San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const API: &str = "api.test";
const TOKEN: &str = "s3cret-token";

/// `egressd ca init DIR` (the binary, as a user runs it): `DIR/ca.crt`, `DIR/ca.key`.
fn ca_init(dir: &Path) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_egressd"))
        .args(["ca", "init"])
        .arg(dir)
        .output()
        .expect("run egressd ca init");
    assert!(
        out.status.success(),
        "egressd ca init: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("ca.crt")
}

/// What the tests share: egressd's CA, the API upstream (its own CA), the DNS that names it.
struct World {
    dir: tempfile::TempDir,
    ca_crt: PathBuf,
    api: TlsUpstream,
    dns: TestDns,
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let ca_crt = ca_init(&dir.path().join("ca"));
        let api_ca = TestCa::new("api");
        std::fs::write(dir.path().join("api-ca.pem"), api_ca.pem()).unwrap();
        std::fs::write(dir.path().join("token"), TOKEN).unwrap();
        let api = TlsUpstream::start(
            "api",
            api_ca.server_cert(&[San::dns(API)]),
            TlsOptions::default(),
        )
        .await;
        let dns = TestDns::start().await;
        dns.set(API, &[Ipv4Addr::LOCALHOST], 300);
        World {
            dir,
            ca_crt,
            api,
            dns,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The config: access log to a file, DNS to the test's, interception when `intercept`,
    /// the API Backend (TLS originated, a credential injected) and `more`.
    fn yaml(&self, intercept: bool, more: &str) -> String {
        let interception = if intercept {
            format!(
                "  tlsInterception:\n    ca: {{certificateFile: {}, privateKeyFile: {}}}\n",
                self.path("ca/ca.crt"),
                self.path("ca/ca.key")
            )
        } else {
            String::new()
        };
        format!(
            r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{path: {log}}}
  drain: {{timeout: 1s}}
  dns: {{nameservers: ["{dns}"]}}
{interception}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  listeners:
  - {{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {{name: api}}
spec:
  destination:
    type: FQDN
    fqdn: {{hostname: {API}, allowedAddresses: [127.0.0.0/8]}}
    ports: [{{number: {port}}}]
  tls:
    mode: Simple
    validation: {{caCertificateFiles: [{api_ca}]}}
  extensions:
  - name: token
    type: CredentialInjector
    config: {{header: x-api-token, credential: {{valueFile: {token}}}}}
{more}"#,
            log = self.path("access.log"),
            dns = self.dns.addr,
            port = self.api.addr.port(),
            api_ca = self.path("api-ca.pem"),
            token = self.path("token"),
        )
    }

    fn api_url(&self, path: &str) -> String {
        format!("https://{API}:{}{path}", self.api.addr.port())
    }

    fn access_log(&self) -> Vec<serde_json::Value> {
        common::proxy::json_lines(&self.dir.path().join("access.log"))
    }

    /// The access log once it has `n` lines marked intercepted (they are written by a
    /// background thread).
    async fn access_log_with_intercepted(&self, n: usize) -> Vec<serde_json::Value> {
        common::eventually(
            &format!("{n} intercepted lines in the access log"),
            std::time::Duration::from_secs(5),
            || {
                let lines = self.access_log();
                let done = lines.iter().filter(|l| l["intercepted"] == true).count() == n;
                async move { done.then_some(lines) }
            },
        )
        .await
    }
}

/// curl through `HTTPS_PROXY=http://proxy`: (exit code, body, stderr).
async fn curl(proxy: SocketAddr, args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20"])
            .args(&args)
            .env("HTTPS_PROXY", format!("http://{proxy}"))
            .env_remove("https_proxy")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .output()
            .expect("run curl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// curl with `https://api.test:PORT/…` and the CA trusted, over HTTP/1.1 and over HTTP/2:
/// the upstream gets each request with the credential egressd injects (curl sent none), and
/// the access log has the method and path, marked intercepted.
#[tokio::test]
async fn curl_with_https_proxy_gets_the_backend_s_features() {
    let world = World::new().await;
    let proxy = TestProxy::start(&world.yaml(true, "")).await;
    for (version, path) in [("--http1.1", "/v1/items"), ("--http2", "/v2/items")] {
        let args = vec![
            version.to_owned(),
            "--cacert".to_owned(),
            world.ca_crt.display().to_string(),
            world.api_url(path),
        ];
        let (code, body, stderr) = curl(proxy.http(), args).await;
        assert_eq!((code, body.as_str()), (0, "api"), "{version}: {stderr}");
        let seen = world.api.requests();
        let last = seen.last().expect("the upstream saw the request");
        // An HTTP/2 upstream's request carries the whole URI.
        assert!(last.uri.ends_with(path), "{version}: {}", last.uri);
        assert_eq!(
            last.headers
                .get("x-api-token")
                .and_then(|v| v.to_str().ok()),
            Some(TOKEN),
            "{version}: the credential was injected"
        );
    }
    assert_eq!(
        proxy.metric("egressd_intercepted_tunnels_total{tls=\"true\"}"),
        2.0
    );
    // `/status` names the CA as openssl prints its fingerprint; `/config` shows no key.
    let fingerprint = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(&world.ca_crt)
        .output()
        .expect("openssl x509");
    let fingerprint = String::from_utf8(fingerprint.stdout).unwrap();
    let status: serde_json::Value = serde_json::from_slice(
        &common::proxy::get(proxy.admin, "localhost", "/status")
            .await
            .body,
    )
    .unwrap();
    let shown = status["interception"]["caFingerprintSha256"]
        .as_str()
        .unwrap();
    assert!(
        fingerprint.trim().ends_with(shown),
        "{fingerprint} vs {shown}"
    );
    assert_eq!(status["interception"]["cachedHosts"], 1);
    let config = common::proxy::get(proxy.admin, "localhost", "/config")
        .await
        .text();
    assert!(config.contains("tlsInterception"), "{config}");
    assert!(!config.contains("PRIVATE KEY"), "{config}");
    let lines = world.access_log_with_intercepted(2).await;
    for path in ["/v1/items", "/v2/items"] {
        let line = lines
            .iter()
            .find(|l| l["path"] == path)
            .unwrap_or_else(|| panic!("no line for {path}: {lines:?}"));
        assert_eq!(line["method"], "GET");
        assert_eq!(line["intercepted"], true);
        assert_eq!(line["status"], 200);
        assert_eq!(line["backend"], "default/api");
    }
}

/// A client that does not trust egressd's CA (curl with its system store) fails its
/// handshake; egressd counts the alert it sent and nothing reaches the upstream.
#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_fails_and_egressd_counts_why() {
    let world = World::new().await;
    let proxy = TestProxy::start(&world.yaml(true, "")).await;
    let (code, _, stderr) = curl(proxy.http(), vec![world.api_url("/")]).await;
    assert_eq!(code, 60, "curl: peer certificate not verified: {stderr}");
    common::eventually(
        "the refusal counted",
        std::time::Duration::from_secs(5),
        || async {
            proxy.metric("egressd_interception_handshake_failures_total{reason=\"unknown_ca\"}")
                == 1.0
        },
    )
    .await;
    assert_eq!(world.api.request_count(), 0);
}

/// `CONNECT target` on a new connection; the status and the connection (a tunnel on 200).
async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.expect("connect to egressd");
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = stream.read(&mut byte).await.expect("read response head");
        assert_eq!(n, 1, "closed: {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head[9..12].parse().expect("status code");
    let mut body = Vec::new();
    if status != 200 {
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_owned())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        body.resize(length, 0);
        stream
            .read_exact(&mut body)
            .await
            .expect("the refusal's body");
    }
    (status, head + &String::from_utf8_lossy(&body), stream)
}

/// A TLS client trusting `ca_crt`, with `sni` as its server name.
async fn tls_over(
    stream: TcpStream,
    ca_crt: &Path,
    sni: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(trusting(ca_crt)));
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    connector.connect(name, stream).await
}

/// A TLS client config trusting only the CA certificate(s) in `ca_crt`.
fn trusting(ca_crt: &Path) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(&std::fs::read(ca_crt).unwrap()) {
        roots.add(cert).unwrap();
    }
    rustls::ClientConfig::builder_with_provider(common::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|c| c.expect("PEM certificate"))
        .collect()
}

/// One HTTP/1.1 request on `stream`; the response head and body as text.
async fn request_over<S>(stream: &mut S, host: &str, path: &str) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut out),
    )
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Inside an intercepted tunnel, a request for another host gets 421 (no domain fronting),
/// and a ClientHello naming another host ends the handshake.
#[tokio::test]
async fn another_host_inside_the_tunnel_is_misdirected() {
    let world = World::new().await;
    let proxy = TestProxy::start(&world.yaml(true, "")).await;
    let target = format!("{API}:{}", world.api.addr.port());
    let (status, head, stream) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "{head}");
    let mut tls = tls_over(stream, &world.ca_crt, API)
        .await
        .expect("handshake");
    let reply = request_over(&mut tls, "other.test", "/").await;
    assert!(reply.starts_with("HTTP/1.1 421"), "{reply}");
    assert!(
        reply.contains("x-egressd-error: misdirected_request"),
        "{reply}"
    );
    assert_eq!(world.api.request_count(), 0);

    let (status, _, stream) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200);
    assert!(tls_over(stream, &world.ca_crt, "other.test").await.is_err());
    common::eventually("counted", std::time::Duration::from_secs(5), || async {
        proxy.metric("egressd_interception_handshake_failures_total{reason=\"sni_mismatch\"}")
            == 1.0
    })
    .await;
}

/// Undeclared destinations are never intercepted (no certificate is made for them), and a
/// Passthrough port is still relayed untouched: the client sees the upstream's own
/// certificate.
#[tokio::test]
async fn undeclared_and_passthrough_destinations_are_not_intercepted() {
    let world = World::new().await;
    let pt_ca = TestCa::new("pt");
    let pt = TlsUpstream::start(
        "pt",
        pt_ca.server_cert(&[San::dns("pt.test")]),
        TlsOptions::default(),
    )
    .await;
    world.dns.set("pt.test", &[Ipv4Addr::LOCALHOST], 300);
    let passthrough = format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: pt}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: pt.test, allowedAddresses: [127.0.0.0/8]}}\n    ports: [{{number: {}}}]\n  protocol: TCP\n  tls: {{mode: Passthrough}}\n",
        pt.addr.port()
    );
    let proxy = TestProxy::start(&world.yaml(true, &passthrough)).await;
    let (status, reply, _) = connect(proxy.http(), "undeclared.test:443").await;
    assert_eq!(status, 403, "{reply}");
    assert!(reply.contains("destination_not_allowed"), "{reply}");

    std::fs::write(world.dir.path().join("pt-ca.pem"), pt_ca.pem()).unwrap();
    let args = vec![
        "--cacert".to_owned(),
        world.path("pt-ca.pem"),
        format!("https://pt.test:{}/", pt.addr.port()),
    ];
    let (code, body, stderr) = curl(proxy.http(), args).await;
    assert_eq!((code, body.as_str()), (0, "pt"), "{stderr}");
    assert_eq!(pt.snis(), vec![Some("pt.test".to_owned())]);
    assert_eq!(
        proxy.metric("egressd_interception_leaves_minted_total"),
        0.0
    );
}

/// Without `tlsInterception`, a CONNECT to a port whose TLS egressd originates gets 403
/// `connect_to_originating_port` naming the Backend and the ways out, and `/blocked` offers
/// no Backend that would take the port over.
#[tokio::test]
async fn without_interception_the_connect_is_refused_naming_the_backend() {
    let world = World::new().await;
    let proxy = TestProxy::start(&world.yaml(false, "")).await;
    let target = format!("{API}:{}", world.api.addr.port());
    let (status, reply, _) = connect(proxy.http(), &target).await;
    assert_eq!(status, 403, "{reply}");
    for expected in [
        "x-egressd-error: connect_to_originating_port",
        "Backend default/api",
        "tlsInterception",
        "Passthrough",
        &format!("http://{target}"),
    ] {
        assert!(reply.contains(expected), "{expected}: {reply}");
    }
    let blocked: serde_json::Value = serde_json::from_slice(
        &common::proxy::get(proxy.admin, "localhost", "/blocked")
            .await
            .body,
    )
    .unwrap();
    assert_eq!(
        blocked["blocked"].as_array().map(Vec::len),
        Some(0),
        "{blocked}"
    );
}

/// `CONNECT host:80` to a plaintext port (Node's undici sends it for `http://` URLs) is served
/// as HTTP inside the tunnel, without interception configured: the request passes the
/// pipeline (the credential is injected).
#[tokio::test]
async fn connect_to_a_plaintext_port_is_served_as_http() {
    let world = World::new().await;
    let plain = Upstream::start("plain").await;
    world.dns.set("plain.test", &[Ipv4Addr::LOCALHOST], 300);
    let backend = format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: plain}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: plain.test, allowedAddresses: [127.0.0.0/8]}}\n    ports: [{{number: {}}}]\n  tls: {{mode: InsecureDisable}}\n  extensions:\n  - name: token\n    type: CredentialInjector\n    config: {{header: x-api-token, credential: {{valueFile: {}}}}}\n",
        plain.addr.port(),
        world.path("token")
    );
    let proxy = TestProxy::start(&world.yaml(false, &backend)).await;
    let target = format!("plain.test:{}", plain.addr.port());
    let (status, head, mut stream) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "{head}");
    let reply = request_over(&mut stream, &target, "/hello").await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let seen = plain.last_request();
    assert_eq!(seen.uri, "/hello");
    assert_eq!(
        seen.headers
            .get("x-api-token")
            .and_then(|v| v.to_str().ok()),
        Some(TOKEN)
    );
    assert_eq!(
        proxy.metric("egressd_intercepted_tunnels_total{tls=\"false\"}"),
        1.0
    );
}

/// A CA key that group or others may read is refused when the config loads, at the field
/// that names it.
#[test]
fn a_ca_key_others_may_read_is_refused_at_its_field() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    ca_init(&dir.path().join("ca"));
    let key = dir.path().join("ca/ca.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let yaml = "apiVersion: egressd.dev/v1alpha1\nkind: ProxyConfig\nmetadata: {name: egressd}\nspec:\n  tlsInterception:\n    ca:\n      certificateFile: ca/ca.crt\n      privateKeyFile: ca/ca.key\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  listeners:\n  - {name: http, address: 127.0.0.1, port: 0, protocol: HTTP}\n";
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let validation = egressd::commands::validate(&[dir.path().to_path_buf()]);
    assert!(!validation.ok, "{}", validation.report);
    assert!(
        validation
            .report
            .contains("egressd.yaml:8:23: error: ProxyConfig default/egressd: spec.tlsInterception.ca.privateKeyFile"),
        "{}",
        validation.report
    );
    assert!(validation.report.contains("0644"), "{}", validation.report);
}

/// The ```yaml interception-NAME block of docs/interception.md, its indentation taken off.
fn documented(name: &str) -> (String, String) {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interception.md"))
            .expect("docs/interception.md");
    let fence = format!("```yaml interception-{name}\n");
    let at = doc.find(&fence).expect("the example block");
    let indent = doc[..at].len() - doc[..at].trim_end_matches(' ').len();
    let start = at + fence.len();
    let block = &doc[start..][..doc[start..].find("```").unwrap()];
    let yaml = block
        .lines()
        .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
        .collect::<Vec<_>>()
        .join("\n");
    (doc, yaml)
}

/// docs/interception.md as written: the settings block loads next to a CA from `egressd ca
/// init`, and the worked sidecar example, with its listener and the API moved to loopback
/// ports and names answered by the test's DNS, serves the curl command the page shows, the
/// token injected.
#[tokio::test]
async fn the_documented_examples_load_and_the_sidecar_example_works_with_curl() {
    let (_, settings) = documented("settings");
    let dir = tempfile::tempdir().unwrap();
    ca_init(&dir.path().join("ca"));
    let listener = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec:\n  listeners:\n  - {name: http, address: 127.0.0.1, port: 0, protocol: HTTP}\n";
    std::fs::write(dir.path().join("egressd.yaml"), settings + "\n" + listener).unwrap();
    let validation = egressd::commands::validate(&[dir.path().to_path_buf()]);
    assert!(validation.ok, "{}", validation.report);

    let (doc, example) = documented("example");
    let command =
        "HTTPS_PROXY=http://127.0.0.1:15001 curl --cacert ca/ca.crt https://api.test/v1/items";
    assert!(doc.contains(command), "the page's command changed");
    let world = World::new().await;
    let port = world.api.addr.port();
    let yaml = example
        .replace("port: 15001", "port: 0")
        .replace("number: 443", &format!("number: {port}"))
        .replace(
            "      hostname: api.test",
            "      hostname: api.test\n      allowedAddresses: [127.0.0.0/8]",
        )
        .replace(
            "spec:\n  tlsInterception:",
            &format!(
                "spec:\n  dns: {{nameservers: [\"{}\"]}}\n  tlsInterception:",
                world.dns.addr
            ),
        );
    let files = world.dir.path();
    std::fs::write(files.join("egressd.yaml"), &yaml).unwrap();
    std::fs::write(files.join("api-token"), TOKEN).unwrap();
    let options = egressd::Options {
        config: vec![files.to_path_buf()],
        workers: 1,
        admin_address: Some("127.0.0.1:0".parse().unwrap()),
        watch: None,
    };
    let proxy = egressd::Proxy::start(options)
        .await
        .expect("egressd starts");
    let listener = proxy
        .listener_addr("default/sidecar/proxy")
        .unwrap_or_else(|| panic!("not serving: {:?}", proxy.shared().reload_status().messages));
    let args = vec![
        "--cacert".to_owned(),
        world.ca_crt.display().to_string(),
        world.api_url("/v1/items"),
    ];
    let (code, body, stderr) = curl(listener, args).await;
    assert_eq!((code, body.as_str()), (0, "api"), "{stderr}");
    let seen = world.api.requests();
    let authorization = seen[0]
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    assert_eq!(authorization, Some(format!("Bearer {TOKEN}").as_str()));
}

/// The proxy user a CONNECT authenticated is the identity of every request inside the
/// tunnel: an EgressPolicy that lets alice reach the API lets her requests through and
/// answers bob's with 403 `client_not_allowed`, and the access log names the user.
#[tokio::test]
async fn the_connect_s_proxy_user_is_who_egress_policy_judges_inside_the_tunnel() {
    let world = World::new().await;
    let users = world.dir.path().join("users");
    let hash = |password: &str| {
        let out = Command::new("openssl")
            .args(["passwd", "-5", "-salt", "egressdtest", password])
            .output()
            .expect("openssl passwd");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    std::fs::write(
        &users,
        format!("alice:{}\nbob:{}\n", hash("pw-alice"), hash("pw-bob")),
    )
    .unwrap();
    let policy = "---\napiVersion: egressd.dev/v1alpha1\nkind: EgressPolicy\nmetadata: {name: api-users}\nspec:\n  clients: {proxyUsers: [alice]}\n  to: {backendRefs: [{name: api}]}\n";
    let yaml = world.yaml(true, policy).replace(
        "  drain: {timeout: 1s}\n",
        &format!(
            "  drain: {{timeout: 1s}}\n  clientPolicy: {{proxyUsers: {{file: {}, required: true}}}}\n",
            users.display()
        ),
    );
    let proxy = TestProxy::start(&yaml).await;
    let through_as = |user: &str| {
        vec![
            "--proxy-user".to_owned(),
            user.to_owned(),
            "-w".to_owned(),
            " %{http_code}".to_owned(),
            "--cacert".to_owned(),
            world.ca_crt.display().to_string(),
            world.api_url("/v1/items"),
        ]
    };
    let (code, body, stderr) = curl(proxy.http(), through_as("alice:pw-alice")).await;
    assert_eq!((code, body.as_str()), (0, "api 200"), "{stderr}");
    let (code, body, stderr) = curl(proxy.http(), through_as("bob:pw-bob")).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(body.ends_with(" 403"), "{body}");
    assert!(body.contains("bob"), "the refusal names the client: {body}");
    // Without credentials the CONNECT itself is refused (407): no tunnel, no certificate.
    let (code, _, stderr) = curl(proxy.http(), vec![world.api_url("/")]).await;
    assert_ne!(code, 0, "{stderr}");
    assert_eq!(
        world.api.request_count(),
        1,
        "only alice's request went upstream"
    );
    let lines = world.access_log_with_intercepted(2).await;
    let inside: Vec<_> = lines.iter().filter(|l| l["intercepted"] == true).collect();
    assert_eq!(inside[0]["proxy_user"], "alice");
    assert_eq!(inside[1]["proxy_user"], "bob");
    assert_eq!(inside[1]["error"], "client_not_allowed");
}

/// A port that says `interception: Disabled` is refused as without interception, and no
/// certificate is made for it.
#[tokio::test]
async fn a_port_can_opt_out_of_interception() {
    let world = World::new().await;
    let port = world.api.addr.port();
    let yaml = world.yaml(true, "").replace(
        &format!("ports: [{{number: {port}}}]"),
        &format!("ports: [{{number: {port}, interception: Disabled}}]"),
    );
    let proxy = TestProxy::start(&yaml).await;
    let (status, reply, _) = connect(proxy.http(), &format!("{API}:{port}")).await;
    assert_eq!(status, 403, "{reply}");
    assert!(reply.contains("connect_to_originating_port"), "{reply}");
    assert_eq!(
        proxy.metric("egressd_interception_leaves_minted_total"),
        0.0
    );
}

/// gRPC inside an intercepted tunnel: a client that CONNECTs and speaks TLS with ALPN `h2` to
/// egressd's certificate makes unary and server-streaming calls that reach a TLS gRPC server
/// (a `protocol: GRPC` Backend) with the credential injected, trailers and all.
#[tokio::test]
async fn grpc_calls_pass_an_intercepted_tunnel() {
    use common::grpc::client::{CallOptions, GrpcClient};
    use common::grpc::server::{Deadlines, EchoServer};
    use common::grpc::EchoRequest;
    let world = World::new().await;
    let grpc_ca = TestCa::new("grpc");
    std::fs::write(world.dir.path().join("grpc-ca.pem"), grpc_ca.pem()).unwrap();
    let server = EchoServer::start_tls(
        Deadlines::Enforce,
        &grpc_ca.server_cert(&[San::dns("rpc.test")]),
    )
    .await;
    world.dns.set("rpc.test", &[Ipv4Addr::LOCALHOST], 300);
    let port = server.addr.port();
    let backend = format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: rpc}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: rpc.test, allowedAddresses: [127.0.0.0/8]}}\n    ports: [{{number: {port}}}]\n  protocol: GRPC\n  tls:\n    mode: Simple\n    validation: {{caCertificateFiles: [{}]}}\n  extensions:\n  - name: token\n    type: CredentialInjector\n    config: {{header: x-api-token, credential: {{valueFile: {}}}}}\n",
        world.path("grpc-ca.pem"),
        world.path("token")
    );
    let proxy = TestProxy::start(&world.yaml(true, &backend)).await;
    let target = format!("rpc.test:{port}");
    let (status, head, stream) = connect(proxy.http(), &target).await;
    assert_eq!(status, 200, "{head}");
    let config = trusting(&world.ca_crt);
    let mut client = GrpcClient::tls_over(stream, &target, config, "rpc.test").await;
    let response = client
        .unary(EchoRequest::new("hello"), &CallOptions::default())
        .await
        .expect("unary call through the interception");
    assert_eq!(response.get_ref().message, "hello");
    let mut request = EchoRequest::new("tick");
    request.count = 3;
    let stream = client.server_stream(request, &CallOptions::default()).await;
    assert_eq!(stream.status.code(), tonic::Code::Ok, "{:?}", stream.status);
    assert_eq!(stream.messages().len(), 3);
    let rpcs = server.rpcs();
    assert_eq!(rpcs.len(), 2);
    assert_eq!(rpcs[0].headers.get("x-api-token").unwrap(), TOKEN);
}

/// The CA can come from a `kubernetes.io/tls` Secret document of the config (`tls.crt`,
/// `tls.key`), as `kubectl create secret tls` writes it, instead of files.
#[tokio::test]
async fn the_ca_can_come_from_a_tls_secret_document() {
    let world = World::new().await;
    let pem = |name: &str| std::fs::read_to_string(world.dir.path().join("ca").join(name)).unwrap();
    let indent = |text: String| text.trim_end().replace('\n', "\n    ");
    let secret = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: interception-ca}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n    {}\n  tls.key: |\n    {}\n",
        indent(pem("ca.crt")),
        indent(pem("ca.key"))
    );
    let files = format!(
        "ca: {{certificateFile: {}, privateKeyFile: {}}}",
        world.path("ca/ca.crt"),
        world.path("ca/ca.key")
    );
    let yaml = world
        .yaml(true, &secret)
        .replace(&files, "ca: {secretRef: {name: interception-ca}}");
    assert!(yaml.contains("secretRef"), "{yaml}");
    let proxy = TestProxy::start(&yaml).await;
    let args = vec![
        "--cacert".to_owned(),
        world.ca_crt.display().to_string(),
        world.api_url("/from-secret"),
    ];
    let (code, body, stderr) = curl(proxy.http(), args).await;
    assert_eq!((code, body.as_str()), (0, "api"), "{stderr}");
}
