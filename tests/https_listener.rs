//! Frontend TLS: a Gateway listener with `protocol: HTTPS` terminates TLS with the certificates
//! of `tls.certificateFiles` (chosen by SNI, the first one by default), offers ALPN `h2` and
//! `http/1.1`, and then serves exactly as a plaintext listener does, telling the upstream
//! `X-Forwarded-Proto: https`. Failed handshakes are counted; certificate files are read when
//! the config loads, so a broken one rejects the reload and the old certificate keeps serving.
//!
//! Clients are real rustls clients (tokio-rustls) with hyper client connections; certificates
//! come from a test CA (`common::tls`); the upstream is a plaintext `common::upstream`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::proxy::{collect, get, ip_backend, ClientBody, Response, TestProxy};
use common::tls::{provider, CertAndKey, San, TestCa};
use common::upstream::Upstream;
use common::{eventually, poll_within};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The listener key of [`config`].
const LISTENER: &str = "default/gw/https";

/// The name the default test certificate is issued for.
const APP: &str = "app.test";

// ---------------------------------------------------------------------------------------------
// Config

/// `(certificateFile, privateKeyFile)` as written in the YAML (absolute or relative).
type CertFiles = (String, String);

fn files(paths: &(std::path::PathBuf, std::path::PathBuf)) -> CertFiles {
    (paths.0.display().to_string(), paths.1.display().to_string())
}

/// A Gateway `gw` with listener `name` on 127.0.0.1, ephemeral port: protocol HTTPS with
/// `certs` when there are any, plain HTTP otherwise.
fn gateway(name: &str, certs: &[CertFiles]) -> String {
    let listener = if certs.is_empty() {
        "    protocol: HTTP\n".to_owned()
    } else {
        let entries: String = certs
            .iter()
            .map(|(cert, key)| {
                format!("      - certificateFile: {cert:?}\n        privateKeyFile: {key:?}\n")
            })
            .collect();
        format!("    protocol: HTTPS\n    tls:\n      certificateFiles:\n{entries}")
    };
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  listeners:
  - name: {name}
    address: 127.0.0.1
    port: 0
{listener}"#
    )
}

/// The whole config: access log off, the Gateway of [`gateway`] with listener `https`, and an
/// HTTPRoute sending everything to the plaintext IP Backend `app` at `upstream`.
fn config(certs: &[CertFiles], upstream: SocketAddr) -> String {
    config_named("https", certs, upstream)
}

fn config_named(listener: &str, certs: &[CertFiles], upstream: SocketAddr) -> String {
    format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata:
  name: egressd
spec:
  accessLog:
    enabled: false
  drain:
    timeout: 1s
{gateway}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: app
spec:
  parentRefs:
  - name: gw
  rules:
  - backendRefs:
    - {{group: egressd.dev, kind: Backend, name: app}}
{backend}"#,
        gateway = gateway(listener, certs),
        backend = ip_backend("app", upstream, ""),
    )
}

/// A CA, a certificate for `app.test` from it written to a temp dir, and a plaintext upstream.
struct Env {
    dir: tempfile::TempDir,
    ca: TestCa,
    cert: CertAndKey,
    files: CertFiles,
    upstream: Upstream,
}

impl Env {
    async fn new() -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new("frontend");
        let cert = ca.server_cert(&[San::dns(APP)]);
        let files = files(&cert.write(dir.path(), "app"));
        let upstream = Upstream::start("app").await;
        Env {
            dir,
            ca,
            cert,
            files,
            upstream,
        }
    }

    /// egressd with one HTTPS listener serving the `app.test` certificate.
    async fn proxy(&self) -> TestProxy {
        TestProxy::start(&config(
            std::slice::from_ref(&self.files),
            self.upstream.addr,
        ))
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

/// A rustls client trusting `roots`, offering `alpn`.
fn client(roots: RootCertStore, alpn: &[&[u8]]) -> ClientConfig {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// Connects to `addr` and completes a TLS handshake for `name` (SNI and verified name).
async fn connect(
    addr: SocketAddr,
    config: ClientConfig,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_owned()).expect("server name");
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// The negotiated ALPN protocol of a client connection.
fn alpn(tls: &TlsStream<TcpStream>) -> Option<String> {
    tls.get_ref()
        .1
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned())
}

/// `GET path` with `Host: app.test` over HTTP/1.1 on an established TLS connection; the
/// connection stays usable for more requests through the returned sender.
async fn h1_get(
    sender: &mut hyper::client::conn::http1::SendRequest<ClientBody>,
    path: &str,
) -> Response {
    let request = http::Request::builder()
        .uri(path)
        .header(http::header::HOST, APP)
        .body(ClientBody::default())
        .unwrap();
    sender.ready().await.expect("connection ready");
    collect(sender.send_request(request).await.expect("response")).await
}

async fn h1_handshake(
    tls: TlsStream<TcpStream>,
) -> hyper::client::conn::http1::SendRequest<ClientBody> {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    sender
}

/// A new TLS connection trusting `ca`, then one `GET /`: the response.
async fn https_get(addr: SocketAddr, ca: &TestCa) -> Response {
    let tls = connect(addr, client(ca.root_store(), &[b"http/1.1"]), APP)
        .await
        .expect("TLS handshake with egressd");
    h1_get(&mut h1_handshake(tls).await, "/").await
}

/// Accepts any certificate: lets a test see which certificate egressd serves for an SNI that
/// the certificate does not cover (the default). Never used to judge whether TLS works.
#[derive(Debug)]
struct AcceptAny;

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The leaf certificate egressd serves to a ClientHello with `sni` (`None`: no SNI at all, as
/// a client connecting by IP address sends).
async fn served_certificate(addr: SocketAddr, sni: Option<&str>) -> CertificateDer<'static> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    let name = match sni {
        Some(name) => ServerName::try_from(name.to_owned()).expect("server name"),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    tls.get_ref().1.peer_certificates().expect("a certificate")[0].clone()
}

fn leaf(cert: &CertAndKey) -> CertificateDer<'static> {
    cert.cert_chain().remove(0)
}

/// `egressd_downstream_tls_handshake_failures_total`.
async fn handshake_failures(proxy: &TestProxy) -> f64 {
    let metrics = get(proxy.admin, "127.0.0.1", "/metrics").await;
    assert_eq!(metrics.status, 200, "{}", metrics.text());
    let text = metrics.text();
    text.lines()
        .find_map(|line| line.strip_prefix("egressd_downstream_tls_handshake_failures_total "))
        .unwrap_or_else(|| panic!("no handshake failure counter in:\n{text}"))
        .trim()
        .parse()
        .expect("counter value")
}

async fn assert_handshake_failures_reach(proxy: &TestProxy, expected: f64) {
    let reached = poll_within(Duration::from_secs(5), || async {
        handshake_failures(proxy).await >= expected
    })
    .await
    .is_some();
    assert!(
        reached,
        "handshake failures: {} (expected {expected})",
        handshake_failures(proxy).await
    );
}

fn assert_ok_from_app(response: &Response) {
    assert_eq!(
        (response.status.as_u16(), response.upstream()),
        (200, Some("app")),
        "body: {}",
        response.text()
    );
}

/// Writes `content` to `path` the way deployment tools do: a new file renamed over the old.
fn replace_file(path: &Path, content: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, content).expect("write replacement");
    std::fs::rename(&tmp, path).expect("rename replacement");
}

// ---------------------------------------------------------------------------------------------
// Serving

#[tokio::test]
async fn https_listener_terminates_tls_and_forwards_with_x_forwarded_proto_https() {
    let env = Env::new().await;
    let proxy = env.proxy().await;

    let tls = connect(
        proxy.listener(LISTENER),
        client(env.ca.root_store(), &[b"http/1.1"]),
        APP,
    )
    .await
    .expect("a client trusting the CA completes the handshake");
    assert_eq!(alpn(&tls).as_deref(), Some("http/1.1"));
    let mut sender = h1_handshake(tls).await;
    let response = h1_get(&mut sender, "/hello").await;
    assert_ok_from_app(&response);
    assert_eq!(response.text(), "app");

    let seen = env.upstream.last_request();
    assert_eq!(seen.uri, "/hello");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(seen.headers["host"], APP);

    // Keep-alive works over TLS as over plaintext: a second request on the same connection.
    assert_ok_from_app(&h1_get(&mut sender, "/again").await);
    assert_eq!(env.upstream.request_count(), 2);
    assert_eq!(handshake_failures(&proxy).await, 0.0);
}

#[tokio::test]
async fn client_sent_x_forwarded_proto_is_kept_and_plain_http_listeners_still_say_http() {
    // egressd sets X-Forwarded-Proto only when the client did not, on HTTPS as on HTTP.
    let env = Env::new().await;
    let proxy = env.proxy().await;
    let tls = connect(
        proxy.listener(LISTENER),
        client(env.ca.root_store(), &[]),
        APP,
    )
    .await
    .expect("handshake without ALPN");
    assert_eq!(alpn(&tls), None, "no ALPN offered, none negotiated");
    let request = http::Request::builder()
        .uri("/")
        .header(http::header::HOST, APP)
        .header("x-forwarded-proto", "wss")
        .body(ClientBody::default())
        .unwrap();
    let mut sender = h1_handshake(tls).await;
    let response = collect(sender.send_request(request).await.expect("response")).await;
    assert_ok_from_app(&response);
    assert_eq!(
        env.upstream.last_request().headers["x-forwarded-proto"],
        "wss"
    );

    let plain = TestProxy::start(&config(&[], env.upstream.addr)).await;
    assert_ok_from_app(&get(plain.listener(LISTENER), APP, "/").await);
    assert_eq!(
        env.upstream.last_request().headers["x-forwarded-proto"],
        "http"
    );
}

#[tokio::test]
async fn http2_is_served_when_the_client_negotiates_h2() {
    let env = Env::new().await;
    let proxy = env.proxy().await;

    let tls = connect(
        proxy.listener(LISTENER),
        client(env.ca.root_store(), &[b"h2", b"http/1.1"]),
        APP,
    )
    .await
    .expect("TLS handshake");
    assert_eq!(alpn(&tls).as_deref(), Some("h2"), "h2 is preferred");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(connection);

    // Two concurrent streams on the one connection.
    let request = |path: &str| {
        http::Request::builder()
            .method("POST")
            .uri(format!("https://{APP}{path}"))
            .body(ClientBody::from(Bytes::from_static(b"ping")))
            .unwrap()
    };
    let (a, b) = tokio::join!(
        sender.clone().send_request(request("/a")),
        sender.send_request(request("/b"))
    );
    for response in [a, b] {
        let response = response.expect("HTTP/2 response");
        assert_eq!(response.version(), http::Version::HTTP_2);
        assert_ok_from_app(&collect(response).await);
    }

    let mut uris: Vec<String> = env
        .upstream
        .requests()
        .iter()
        .map(|r| r.uri.clone())
        .collect();
    uris.sort();
    assert_eq!(uris, ["/a", "/b"]);
    for seen in env.upstream.requests() {
        // Upstream is HTTP/1.1 whatever the client spoke; the authority became Host.
        assert_eq!(seen.version, http::Version::HTTP_11);
        assert_eq!(seen.headers["host"], APP);
        assert_eq!(seen.headers["x-forwarded-proto"], "https");
        assert_eq!(seen.body_len, 4);
    }
}

#[tokio::test]
async fn the_certificate_is_chosen_by_sni_and_the_first_one_is_the_default() {
    let env = Env::new().await;
    // The first certificate also names 127.0.0.1, so the no-SNI client below can verify it.
    let one = env
        .ca
        .server_cert(&[San::dns("one.test"), San::ip("127.0.0.1")]);
    let two = env
        .ca
        .server_cert(&[San::dns("two.test"), San::dns("*.wild.test")]);
    let certs = [
        files(&one.write(env.dir.path(), "one")),
        files(&two.write(env.dir.path(), "two")),
    ];
    let proxy = TestProxy::start(&config(&certs, env.upstream.addr)).await;
    let addr = proxy.listener(LISTENER);

    assert_eq!(served_certificate(addr, Some("one.test")).await, leaf(&one));
    assert_eq!(served_certificate(addr, Some("two.test")).await, leaf(&two));
    assert_eq!(
        served_certificate(addr, Some("api.wild.test")).await,
        leaf(&two),
        "a wildcard SAN covers one label"
    );
    assert_eq!(
        served_certificate(addr, Some("a.b.wild.test")).await,
        leaf(&one),
        "a wildcard SAN does not cover two labels: the default is served"
    );
    assert_eq!(
        served_certificate(addr, Some("unknown.test")).await,
        leaf(&one)
    );
    assert_eq!(served_certificate(addr, None).await, leaf(&one));

    // And with verification on: each name is served a certificate that verifies for it.
    let roots = || client(env.ca.root_store(), &[b"http/1.1"]);
    for name in ["one.test", "two.test", "api.wild.test", "127.0.0.1"] {
        let tls = connect(addr, roots(), name)
            .await
            .unwrap_or_else(|e| panic!("handshake for {name}: {e}"));
        assert_ok_from_app(&h1_get(&mut h1_handshake(tls).await, "/").await);
    }
}

// ---------------------------------------------------------------------------------------------
// Failed handshakes

#[tokio::test]
async fn a_client_that_does_not_trust_the_certificate_fails_the_handshake_and_it_is_counted() {
    let env = Env::new().await;
    let proxy = env.proxy().await;
    let addr = proxy.listener(LISTENER);
    assert_eq!(handshake_failures(&proxy).await, 0.0);

    let stranger = TestCa::new("stranger");
    let error = connect(addr, client(stranger.root_store(), &[b"http/1.1"]), APP)
        .await
        .expect_err("a certificate from an unknown CA must not verify");
    let rustls_error = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .unwrap_or_else(|| panic!("not a TLS error: {error:?}"));
    assert!(
        matches!(
            rustls_error,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        ),
        "{rustls_error:?}"
    );
    assert_handshake_failures_reach(&proxy, 1.0).await;
    assert_eq!(env.upstream.request_count(), 0);

    // The listener is unharmed: a trusting client is served.
    assert_ok_from_app(&https_get(addr, &env.ca).await);
    assert_eq!(handshake_failures(&proxy).await, 1.0);
}

#[tokio::test]
async fn a_plaintext_request_on_an_https_listener_gets_no_http_answer_and_is_counted() {
    let env = Env::new().await;
    let proxy = env.proxy().await;

    let mut tcp = TcpStream::connect(proxy.listener(LISTENER))
        .await
        .expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .expect("write request");
    // egressd answers with at most a TLS alert, then closes.
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply))
        .await
        .expect("the connection is closed")
        .ok();
    assert!(
        !reply.starts_with(b"HTTP/"),
        "an HTTP answer on an HTTPS listener: {:?}",
        String::from_utf8_lossy(&reply)
    );
    assert_handshake_failures_reach(&proxy, 1.0).await;
    assert_eq!(env.upstream.request_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Reloads

#[tokio::test]
async fn a_broken_certificate_file_at_reload_is_rejected_and_the_old_certificate_keeps_serving() {
    let env = Env::new().await;
    let proxy = env.proxy().await;
    let addr = proxy.listener(LISTENER);
    assert_ok_from_app(&https_get(addr, &env.ca).await);
    let generation = proxy.generation();

    replace_file(
        Path::new(&env.files.0),
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
    );
    let error = proxy
        .egressd()
        .reload()
        .await
        .expect_err("a broken certificate must reject the reload");
    let status = get(proxy.admin, "127.0.0.1", "/status").await.text();
    let status: serde_json::Value = serde_json::from_str(&status).expect("status is JSON");
    let rejected = status["lastReload"]["rejectedObjects"]
        .as_array()
        .unwrap_or_else(|| panic!("rejected objects listed ({error}): {status}"));
    let gateway = rejected
        .iter()
        .find(|o| o["kind"] == "Gateway" && o["name"] == "gw")
        .expect("Gateway gw in the rejected config");
    let resolved = gateway["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ResolvedRefs")
        .expect("ResolvedRefs condition");
    assert_eq!(resolved["status"], "False", "{gateway}");
    assert!(
        resolved["message"].as_str().unwrap().contains("app.pem"),
        "the message names the file: {gateway}"
    );

    // Still the old config, the same socket and the old certificate.
    assert_eq!(proxy.generation(), generation);
    assert_eq!(proxy.listener(LISTENER), addr);
    assert_eq!(served_certificate(addr, Some(APP)).await, leaf(&env.cert));
    assert_ok_from_app(&https_get(addr, &env.ca).await);
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_connections_on_the_same_socket() {
    let env = Env::new().await;
    let proxy = env.proxy().await;
    let addr = proxy.listener(LISTENER);
    let tls = connect(addr, client(env.ca.root_store(), &[b"http/1.1"]), APP)
        .await
        .expect("handshake");
    let mut open = h1_handshake(tls).await;
    assert_ok_from_app(&h1_get(&mut open, "/").await);

    let rotated = env.ca.server_cert(&[San::dns(APP)]);
    replace_file(Path::new(&env.files.1), &rotated.key_pem);
    replace_file(Path::new(&env.files.0), &rotated.cert_pem);
    proxy.reload().await;

    assert_eq!(proxy.listener(LISTENER), addr, "the socket is kept");
    assert_ne!(leaf(&rotated), leaf(&env.cert));
    assert_eq!(served_certificate(addr, Some(APP)).await, leaf(&rotated));
    assert_ok_from_app(&https_get(addr, &env.ca).await);
    // The connection opened before the rotation keeps its session.
    assert_ok_from_app(&h1_get(&mut open, "/").await);
}

#[tokio::test]
async fn a_listener_switched_from_http_to_https_keeps_its_port_and_reads_certificates_next_to_the_yaml(
) {
    let env = Env::new().await;
    let proxy = TestProxy::start(&config(&[], env.upstream.addr)).await;
    let addr = proxy.listener(LISTENER);
    assert_ok_from_app(&get(addr, APP, "/").await);

    // Certificates beside the config file, named by relative paths.
    let config_dir = proxy.config_path().parent().unwrap().to_path_buf();
    std::fs::create_dir(config_dir.join("certs")).expect("certs dir");
    env.cert.write(&config_dir.join("certs"), "app");
    let relative = ("certs/app.pem".to_owned(), "certs/app.key".to_owned());
    proxy.rewrite(&config(&[relative], env.upstream.addr));
    proxy.reload().await;

    assert_eq!(proxy.listener(LISTENER), addr);
    assert_ok_from_app(&https_get(addr, &env.ca).await);
    assert_eq!(served_certificate(addr, Some(APP)).await, leaf(&env.cert));
    assert_eq!(
        env.upstream.last_request().headers["x-forwarded-proto"],
        "https"
    );

    // And back: plaintext again on the same port, TLS refused.
    proxy.rewrite(&config(&[], env.upstream.addr));
    proxy.reload().await;
    assert_eq!(proxy.listener(LISTENER), addr);
    assert_ok_from_app(&get(addr, APP, "/").await);
    assert!(
        connect(addr, client(env.ca.root_store(), &[b"http/1.1"]), APP)
            .await
            .is_err(),
        "a plaintext listener completes no TLS handshake"
    );
}

// ---------------------------------------------------------------------------------------------
// Config mistakes

/// The errors of compiling `yaml` (written to `dir/egressd.yaml`) as (field, message,
/// ResolvedRefs?), as `egressd validate` computes them.
fn config_errors(dir: &Path, yaml: &str) -> Vec<(String, String, bool)> {
    std::fs::write(dir.join("egressd.yaml"), yaml).expect("write config");
    let (validation, compiled) =
        egressd::commands::validate_compiled(&[dir.to_path_buf()], Default::default());
    let compiled = compiled.expect("compiled");
    let errors: Vec<_> = compiled
        .errors()
        .map(|d| {
            (
                d.field.clone(),
                d.message.clone(),
                d.reason == Some(egressd::config::Reason::RefNotFound),
            )
        })
        .collect();
    assert_eq!(validation.ok, errors.is_empty(), "{}", validation.report);
    errors
}

/// A config whose listener is written verbatim (indented as a list item of `listeners`).
fn with_listener(listener: &str) -> String {
    format!(
        r#"apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  listeners:
{listener}"#
    )
}

#[test]
fn https_listener_mistakes_are_errors_naming_the_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new("mistakes");
    let (cert, key) = ca.server_cert(&[San::dns(APP)]).write(dir.path(), "app");
    let (_, other_key) = ca.server_cert(&[San::dns(APP)]).write(dir.path(), "other");
    let (cert, key, other_key) = (
        cert.display().to_string(),
        key.display().to_string(),
        other_key.display().to_string(),
    );
    let head = "  - name: web\n    port: 0\n    address: 127.0.0.1\n";
    let field = "spec.listeners[0]";

    // The valid one, relative paths included.
    let valid = format!(
        "{head}    protocol: HTTPS\n    tls:\n      mode: Terminate\n      certificateFiles:\n      - {{certificateFile: app.pem, privateKeyFile: app.key}}\n"
    );
    assert_eq!(config_errors(dir.path(), &with_listener(&valid)), []);

    let cases: Vec<(String, String, &str, bool)> = vec![
        (
            format!("{head}    protocol: HTTPS\n"),
            format!("{field}.tls"),
            "needs tls",
            false,
        ),
        (
            format!("{head}    protocol: HTTPS\n    tls:\n      certificateFiles: []\n"),
            format!("{field}.tls.certificateFiles"),
            "at least one certificate",
            false,
        ),
        (
            format!("{head}    protocol: HTTPS\n    tls:\n      mode: Passthrough\n      certificateFiles:\n      - {{certificateFile: {cert:?}, privateKeyFile: {key:?}}}\n"),
            format!("{field}.tls.mode"),
            "Passthrough belongs to protocol TLS",
            false,
        ),
        (
            format!("{head}    protocol: HTTPS\n    tls:\n      certificateRefs:\n      - {{name: app-cert}}\n"),
            format!("{field}.tls.certificateRefs[0]"),
            "Secret default/app-cert not found",
            true,
        ),
        (
            format!("{head}    protocol: HTTPS\n    tls:\n      certificateFiles:\n      - {{certificateFile: missing.pem, privateKeyFile: {key:?}}}\n"),
            format!("{field}.tls.certificateFiles[0]"),
            "missing.pem",
            true,
        ),
        (
            format!("{head}    protocol: HTTPS\n    tls:\n      certificateFiles:\n      - {{certificateFile: {cert:?}, privateKeyFile: {key:?}}}\n      - {{certificateFile: {cert:?}, privateKeyFile: {other_key:?}}}\n"),
            format!("{field}.tls.certificateFiles[1]"),
            "unusable",
            true,
        ),
        (
            format!("{head}    protocol: HTTP\n    tls:\n      certificateFiles:\n      - {{certificateFile: {cert:?}, privateKeyFile: {key:?}}}\n"),
            format!("{field}.tls"),
            "an HTTP listener takes no tls",
            false,
        ),
        (
            format!("{head}    protocol: TLS\n"),
            format!("{field}.protocol"),
            "a TLS listener other than `tls: {mode: Passthrough}` (without certificates) is not supported yet",
            false,
        ),
    ];
    for (listener, want_field, want_message, want_ref) in cases {
        let errors = config_errors(dir.path(), &with_listener(&listener));
        assert!(
            errors.iter().any(|(f, m, r)| *f == want_field
                && m.contains(want_message)
                && *r == want_ref),
            "expected an error at {want_field} containing `{want_message}` (RefNotFound: {want_ref}) for\n{listener}\ngot {errors:#?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Draining

/// `egressd_downstream_connections_active`.
async fn open_connections(proxy: &TestProxy) -> f64 {
    let metrics = get(proxy.admin, "127.0.0.1", "/metrics").await.text();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("egressd_downstream_connections_active "))
        .unwrap_or_else(|| panic!("no connection gauge in:\n{metrics}"))
        .trim()
        .parse()
        .expect("gauge value")
}

#[tokio::test]
async fn a_client_silent_in_its_handshake_does_not_hold_up_shutdown() {
    let env = Env::new().await;
    let proxy = env.proxy().await;
    // Connected, accepted (the gauge counts it; the admin requests of `open_connections` do
    // not go through a listener), and never a byte of ClientHello.
    let _silent = TcpStream::connect(proxy.listener(LISTENER))
        .await
        .expect("connect");
    eventually(
        "the silent connection was not accepted",
        Duration::from_secs(5),
        || async { open_connections(&proxy).await == 1.0 },
    )
    .await;
    // The drain timeout is 1s, the handshake timeout 10s: only closing the handshake on drain
    // lets every connection finish in time.
    let started = std::time::Instant::now();
    assert!(proxy.shutdown().await, "a connection was still open");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The ```yaml mtls-example block of docs/egress-policy.md.
fn documented_mtls_example() -> (String, String) {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/egress-policy.md"),
    )
    .expect("docs/egress-policy.md");
    let start = doc
        .find("```yaml mtls-example\n")
        .expect("the example block")
        + 21;
    let yaml = doc[start..][..doc[start..].find("```").unwrap()].to_owned();
    (doc, yaml)
}

/// docs/egress-policy.md's worked example of clients with certificates, as written (files
/// next to the YAML, the listener and the ledger's address moved to loopback ports), called
/// with the curl command the page shows: the payments workload gets the ledger's answer,
/// another workload of the same CA gets 403 naming the policy, no certificate no handshake.
#[tokio::test]
async fn the_documented_client_certificate_example_works_with_curl() {
    let (doc, yaml) = documented_mtls_example();
    let curl_flags = "curl --cacert egress-ca.pem --cert payments.pem --key payments.key \\\n     -H 'Host: ledger.internal' https://egress.internal:8443/accounts";
    assert!(doc.contains(curl_flags), "the page's curl command changed");
    let ledger = Upstream::start("ledger").await;
    let port = ledger.addr.port();
    let yaml = yaml
        .replace("address: 0.0.0.0", "address: 127.0.0.1")
        .replace("port: 8443", "port: 0")
        .replace("10.0.3.20", "127.0.0.1")
        .replace("number: 8080", &format!("number: {port}"))
        .replace("port: 8080", &format!("port: {port}"));
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path();
    std::fs::write(files.join("egressd.yaml"), &yaml).unwrap();
    let egress_ca = TestCa::new("egress");
    egress_ca.write_pem(files);
    egress_ca
        .server_cert(&[San::dns("egress.internal")])
        .write(files, "egress");
    let clients_ca = TestCa::new("clients");
    clients_ca.write_pem(files);
    clients_ca
        .client_cert_with(
            "payments-api",
            &[San::uri("spiffe://corp.example/ns/payments/sa/api")],
        )
        .write(files, "payments");
    clients_ca
        .client_cert_with(
            "web",
            &[San::uri("spiffe://corp.example/ns/web/sa/frontend")],
        )
        .write(files, "web");
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
        .listener_addr("default/egress/mtls")
        .unwrap_or_else(|| panic!("not serving: {:?}", proxy.shared().reload_status().messages));
    let curl = |client: Option<&'static str>| {
        let files = files.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new("curl");
            cmd.current_dir(&files).args([
                "-s",
                "-w",
                "\n%{http_code}",
                "--cacert",
                "egress-ca.pem",
            ]);
            if let Some(stem) = client {
                cmd.args([
                    "--cert",
                    &format!("{stem}.pem"),
                    "--key",
                    &format!("{stem}.key"),
                ]);
            }
            cmd.args(["-H", "Host: ledger.internal"])
                .arg("--resolve")
                .arg(format!("egress.internal:{}:127.0.0.1", listener.port()))
                .arg(format!(
                    "https://egress.internal:{}/accounts",
                    listener.port()
                ));
            let out = cmd.output().expect("run curl");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        })
    };
    let (code, out) = curl(Some("payments")).await.unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.ends_with("\n200") && out.starts_with("ledger"), "{out}");
    let (_, out) = curl(Some("web")).await.unwrap();
    assert!(out.ends_with("\n403"), "{out}");
    assert!(out.contains("default/ledger-clients"), "{out}");
    // No certificate: the handshake fails (curl's exit code 56 or 35, nothing answered).
    let (code, out) = curl(None).await.unwrap();
    assert_ne!(code, Some(0), "{out}");
    assert_eq!(ledger.request_count(), 1);
    proxy.shutdown().await;
}
