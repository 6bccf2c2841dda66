//! Egress policy per client: `EgressPolicy` objects name the clients (SPIFFE IDs and subject
//! names of client certificates, source CIDRs, proxy users) that may reach the destinations
//! they cover; everyone else gets 403 `client_not_allowed` naming the policy, or, in `Report`
//! mode, passes and is recorded (log, metric, `/blocked` with the client).
//!
//! Clients are real rustls clients with certificates from a test CA (X.509-SVIDs carry a
//! `spiffe://` URI SAN) and hyper client connections; upstreams are plaintext test servers on
//! loopback.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::outlier::metric;
use common::proxy::{collect, get, get_absolute, ip_backend, request, ClientBody, TestProxy};
use common::tls::{provider, CertAndKey, San, TestCa};
use common::upstream::Upstream;
use http::StatusCode;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const PAYMENTS: &str = "spiffe://test.example/ns/payments/sa/api";
const WEB: &str = "spiffe://test.example/ns/web/sa/frontend";

/// An HTTPRoute `name` sending requests for `host` to the IP Backend `name`.
fn routed_backend(name: &str, host: &str, upstream: SocketAddr) -> String {
    ip_backend(name, upstream, "")
        + &format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}}}\nspec:\n  hostnames: [{host}]\n  rules: [{{backendRefs: [{{name: {name}}}]}}]\n"
        )
}

/// An `EgressPolicy` `name` (`mode`), letting `clients` (YAML flow mapping body) reach
/// `to` (idem).
fn egress_policy(name: &str, mode: &str, clients: &str, to: &str) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: EgressPolicy\nmetadata: {{name: {name}}}\nspec:\n  mode: {mode}\n  clients: {{{clients}}}\n  to: {{{to}}}\n"
    )
}

/// ProxyConfig with the access log in `log` (JSON) and `extra` spec lines, and a Gateway `gw`
/// with one listener `edge`: HTTPS with `tls` lines when given, else HTTP.
fn head(log: &Path, extra: &str, tls: Option<&str>) -> String {
    let listener = match tls {
        Some(tls) => format!("    protocol: HTTPS\n    tls:\n{tls}"),
        None => "    protocol: HTTP\n".to_owned(),
    };
    format!(
        "apiVersion: egressd.dev/v1alpha1\nkind: ProxyConfig\nmetadata: {{name: egressd}}\nspec:\n  accessLog: {{format: JSON, path: {log}}}\n  drain: {{timeout: 1s}}\n{extra}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw}}\nspec:\n  listeners:\n  - name: edge\n    address: 127.0.0.1\n    port: 0\n{listener}",
        log = log.display()
    )
}

/// A CA for both sides, the listener's certificate, and the two upstreams behind `pay.test`
/// and `admin.test`.
struct Env {
    dir: tempfile::TempDir,
    ca: TestCa,
    pay: Upstream,
    admin: Upstream,
}

impl Env {
    async fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
            ca: TestCa::new("mesh"),
            pay: Upstream::start("pay").await,
            admin: Upstream::start("admin").await,
        }
    }

    fn log(&self) -> std::path::PathBuf {
        self.dir.path().join("access.log")
    }

    /// The listener's `tls` lines: a server certificate, and client validation in `mode`.
    fn listener_tls(&self, mode: &str) -> String {
        let server = self.ca.server_cert(&[San::dns("egress.test")]);
        let (cert, key) = server.write(self.dir.path(), "server");
        let ca = self.ca.write_pem(self.dir.path());
        format!(
            "      certificateFiles: [{{certificateFile: {}, privateKeyFile: {}}}]\n      frontendValidation: {{caCertificateFiles: [{}], mode: {mode}}}\n",
            cert.display(),
            key.display(),
            ca.display()
        )
    }

    /// The config: HTTPS with client validation (`mode`), Backends `pay` and `admin`, and
    /// `policies`.
    fn config(&self, mode: &str, policies: &str) -> String {
        head(&self.log(), "", Some(&self.listener_tls(mode)))
            + &routed_backend("pay", "pay.test", self.pay.addr)
            + &routed_backend("admin", "admin.test", self.admin.addr)
            + policies
    }

    /// A TLS client presenting `cert` (none: no client certificate).
    fn client(&self, cert: Option<&CertAndKey>) -> ClientConfig {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.ca.root_store());
        match cert {
            Some(c) => builder
                .with_client_auth_cert(c.cert_chain(), c.private_key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        }
    }
}

/// `GET /` for `host` over a new TLS connection with `config`; `Err` when the connection or
/// handshake fails.
async fn tls_get(
    addr: SocketAddr,
    config: ClientConfig,
    host: &str,
) -> Result<common::proxy::Response, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("egress.test").unwrap();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = request("GET", host, "/")
        .body(ClientBody::default())
        .unwrap();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    Ok(collect(response).await)
}

/// `/blocked` as JSON entries.
async fn blocked(proxy: &TestProxy) -> Vec<serde_json::Value> {
    let listed: serde_json::Value =
        serde_json::from_slice(&get(proxy.admin, "localhost", "/blocked").await.body).unwrap();
    listed["blocked"].as_array().unwrap().clone()
}

fn policies_for(mode: &str) -> String {
    egress_policy(
        "payments",
        "Enforce",
        "spiffeIds: [\"spiffe://test.example/ns/payments/*\"], subjectNames: [batch-runner]",
        "backendRefs: [{name: pay}]",
    ) + &egress_policy(
        "admins",
        mode,
        "spiffeIds: [\"spiffe://test.example/ns/admin/*\"]",
        "backendRefs: [{name: admin}]",
    )
}

#[tokio::test]
async fn a_spiffe_client_reaches_the_backend_its_policy_names_and_is_refused_another() {
    let env = Env::new().await;
    let proxy = TestProxy::start(&env.config("Require", &policies_for("Enforce"))).await;
    let edge = proxy.listener("default/gw/edge");
    let payments = env
        .ca
        .client_cert_with("payments-api", &[San::uri(PAYMENTS)]);

    let r = tls_get(edge, env.client(Some(&payments)), "pay.test")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.upstream(), Some("pay"));

    let r = tls_get(edge, env.client(Some(&payments)), "admin.test")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert_eq!(r.error_code(), Some("client_not_allowed"));
    let text = r.text();
    assert!(
        text.contains("EgressPolicy default/admins") && text.contains(PAYMENTS),
        "names the policy and the client: {text}"
    );
    assert_eq!(env.admin.request_count(), 0, "nothing reached admin");

    // A certificate without a SPIFFE ID is its subject CN.
    let batch = env.ca.client_cert("batch-runner");
    let r = tls_get(edge, env.client(Some(&batch)), "pay.test")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let web = env.ca.client_cert_with("frontend", &[San::uri(WEB)]);
    let r = tls_get(edge, env.client(Some(&web)), "pay.test")
        .await
        .unwrap();
    assert_eq!(r.error_code(), Some("client_not_allowed"));

    // What an operator sees: /blocked with the client, the metric, the access log.
    let entries = blocked(&proxy).await;
    let refused = entries
        .iter()
        .find(|b| {
            b["client"]
                .as_str()
                .is_some_and(|c| c.starts_with(PAYMENTS))
        })
        .unwrap_or_else(|| panic!("{entries:?}"));
    assert_eq!(refused["action"], "client_denied");
    assert_eq!(refused["policy"], "default/admins");
    assert_eq!(refused["host"], "admin.test");
    assert!(refused["backend"].is_null(), "{refused}");
    let series = format!(
        "egressd_client_policy_decisions_total{{policy=\"default/admins\",decision=\"client_denied\",client=\"{PAYMENTS}\"}}"
    );
    assert_eq!(metric(&proxy, &series).await, 1.0);
    let lines = common::eventually("the access log lines", Duration::from_secs(5), || {
        let log = env.log();
        async move {
            let lines = common::proxy::json_lines(&log);
            (lines.len() >= 4).then_some(lines)
        }
    })
    .await;
    assert_eq!(lines[0]["client_identity"], PAYMENTS, "{}", lines[0]);
    assert_eq!(lines[1]["error"], "client_not_allowed", "{}", lines[1]);
    assert_eq!(
        lines[2]["client_identity"], "CN=batch-runner",
        "{}",
        lines[2]
    );
}

#[tokio::test]
async fn report_mode_lets_the_client_through_and_records_what_it_would_refuse() {
    let env = Env::new().await;
    let proxy = TestProxy::start(&env.config("Require", &policies_for("Report"))).await;
    let edge = proxy.listener("default/gw/edge");
    let payments = env
        .ca
        .client_cert_with("payments-api", &[San::uri(PAYMENTS)]);

    let r = tls_get(edge, env.client(Some(&payments)), "admin.test")
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.upstream(), Some("admin"));
    let entries = blocked(&proxy).await;
    let reported = entries
        .iter()
        .find(|b| b["action"] == "would_deny")
        .unwrap_or_else(|| panic!("{entries:?}"));
    assert_eq!(reported["policy"], "default/admins");
    assert!(reported["client"].as_str().unwrap().starts_with(PAYMENTS));
    let series = format!(
        "egressd_client_policy_decisions_total{{policy=\"default/admins\",decision=\"would_deny\",client=\"{PAYMENTS}\"}}"
    );
    assert_eq!(metric(&proxy, &series).await, 1.0);

    // The same config switched to Enforce by a reload: now refused.
    proxy.rewrite(&env.config("Require", &policies_for("Enforce")));
    proxy.reload().await;
    let r = tls_get(edge, env.client(Some(&payments)), "admin.test")
        .await
        .unwrap();
    assert_eq!(r.error_code(), Some("client_not_allowed"));
}

#[tokio::test]
async fn a_client_without_a_certificate_connects_only_when_missing_ones_are_allowed() {
    let env = Env::new().await;
    let proxy = TestProxy::start(&env.config("Require", &policies_for("Enforce"))).await;
    let edge = proxy.listener("default/gw/edge");
    assert!(
        tls_get(edge, env.client(None), "pay.test").await.is_err(),
        "Require: no certificate, no request"
    );
    // A certificate from another CA is refused whatever the mode.
    let stranger = TestCa::new("stranger").client_cert_with("x", &[San::uri(PAYMENTS)]);
    assert!(tls_get(edge, env.client(Some(&stranger)), "pay.test")
        .await
        .is_err());

    proxy.rewrite(&env.config("AllowMissing", &policies_for("Enforce")));
    proxy.reload().await;
    let edge = proxy.listener("default/gw/edge");
    let r = tls_get(edge, env.client(None), "pay.test").await.unwrap();
    assert_eq!(r.error_code(), Some("client_not_allowed"), "no identity");
    assert!(tls_get(edge, env.client(Some(&stranger)), "pay.test")
        .await
        .is_err());
    assert_eq!(env.pay.request_count(), 0);
}

/// A users file with `alice` (bcrypt, as `htpasswd -B` writes) and `bob` (SHA-crypt, as
/// `openssl passwd -5` writes).
fn users_file(dir: &Path, alice: &str, bob: &str) -> std::path::PathBuf {
    let path = dir.join("users");
    let alice = bcrypt::hash(alice, 4).unwrap();
    let params = sha_crypt::Sha256Params::new(1000).unwrap();
    let bob = sha_crypt::sha256_simple(bob, &params).unwrap();
    std::fs::write(&path, format!("# proxy users\nalice:{alice}\nbob:{bob}\n")).unwrap();
    path
}

fn basic(user: &str, password: &str) -> String {
    let encoded = data_encoding::BASE64.encode(format!("{user}:{password}").as_bytes());
    format!("Basic {encoded}")
}

/// `GET http://{host}/` in absolute form (a forward-proxy client) with `credentials`.
async fn proxied_get(
    proxy: SocketAddr,
    host: &str,
    credentials: Option<&str>,
) -> common::proxy::Response {
    let mut builder = request("GET", host, "/").uri(format!("http://{host}/"));
    if let Some(c) = credentials {
        builder = builder.header("proxy-authorization", c);
    }
    common::proxy::fetch(proxy, builder.body(ClientBody::default()).unwrap()).await
}

#[tokio::test]
async fn proxy_users_authenticate_with_basic_credentials_and_policies_name_them() {
    let env = Env::new().await;
    let users = users_file(env.dir.path(), "s3cret", "hunter2");
    let client_policy = format!(
        "  clientPolicy:\n    proxyUsers: {{file: {}, required: true, realm: corp-egress}}\n",
        users.display()
    );
    let yaml = head(&env.log(), &client_policy, None)
        + &routed_backend("pay", "pay.test", env.pay.addr)
        + &routed_backend("admin", "admin.test", env.admin.addr)
        + &egress_policy(
            "alice-pays",
            "Enforce",
            "proxyUsers: [alice]",
            "backendRefs: [{name: pay}]",
        );
    let proxy = TestProxy::start(&yaml).await;

    let r = proxied_get(proxy.listener("default/gw/edge"), "pay.test", None).await;
    assert_eq!(r.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED);
    assert_eq!(r.error_code(), Some("proxy_auth_required"));
    assert_eq!(
        r.header("proxy-authenticate"),
        Some("Basic realm=\"corp-egress\"")
    );
    let wrong = basic("alice", "nope");
    let r = proxied_get(proxy.listener("default/gw/edge"), "pay.test", Some(&wrong)).await;
    assert_eq!(r.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED);
    let garbage = "Basic !!not-base64";
    let r = proxied_get(proxy.listener("default/gw/edge"), "pay.test", Some(garbage)).await;
    assert_eq!(r.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED);

    let alice = basic("alice", "s3cret");
    let r = proxied_get(proxy.listener("default/gw/edge"), "pay.test", Some(&alice)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let seen = env.pay.last_request();
    assert!(
        !seen.headers.contains_key("proxy-authorization"),
        "credentials for the proxy are never forwarded"
    );
    let bob = basic("bob", "hunter2");
    let r = proxied_get(proxy.listener("default/gw/edge"), "admin.test", Some(&bob)).await;
    assert_eq!(r.status, StatusCode::OK, "no policy covers admin");
    let r = proxied_get(proxy.listener("default/gw/edge"), "pay.test", Some(&bob)).await;
    assert_eq!(r.error_code(), Some("client_not_allowed"));
    assert!(r.text().contains("user bob"), "{}", r.text());

    // The file is rotated: bob's new password works after the reload its change triggers.
    users_file(env.dir.path(), "s3cret", "correct horse");
    proxy.reload().await;
    let r = proxied_get(proxy.listener("default/gw/edge"), "admin.test", Some(&bob)).await;
    assert_eq!(r.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED);
    let bob = basic("bob", "correct horse");
    let r = proxied_get(proxy.listener("default/gw/edge"), "admin.test", Some(&bob)).await;
    assert_eq!(r.status, StatusCode::OK);

    let lines = common::proxy::json_lines(&env.log());
    assert!(
        lines.iter().any(|l| l["proxy_user"] == "alice"),
        "{lines:?}"
    );
}

#[tokio::test]
async fn source_addresses_and_the_default_decide_for_requests_and_tunnels() {
    let env = Env::new().await;
    let extra = "  clientPolicy: {default: Deny}\n";
    let yaml = head(&env.log(), extra, None)
        + &routed_backend("pay", "pay.test", env.pay.addr)
        + &routed_backend("admin", "admin.test", env.admin.addr)
        + &egress_policy(
            "loopback-pays",
            "Enforce",
            "cidrs: [\"::ffff:127.0.0.0/104\"]",
            "backendRefs: [{name: pay}]",
        );
    let proxy = TestProxy::start(&yaml).await;
    let r = get(proxy.listener("default/gw/edge"), "pay.test", "/").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = get(proxy.listener("default/gw/edge"), "admin.test", "/").await;
    assert_eq!(r.error_code(), Some("client_not_allowed"));
    assert!(
        r.text().contains("clientPolicy.default is Deny"),
        "{}",
        r.text()
    );
    let r = get_absolute(proxy.listener("default/gw/edge"), "http://admin.test/").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(env.admin.request_count(), 0);

    // A CONNECT tunnel to a declared TCP port is judged the same way.
    let port = env.admin.addr.port();
    let tunnel = format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: tunnel}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: tunnel.localhost}}\n    ports: [{{number: {port}}}]\n  protocol: TCP\n  tls: {{mode: Passthrough}}\n"
    );
    proxy.rewrite(&(yaml.clone() + &tunnel));
    proxy.reload().await;
    let edge = proxy.listener("default/gw/edge");
    let mut stream = TcpStream::connect(edge).await.unwrap();
    let target = format!("tunnel.localhost:{port}");
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // The head only: what follows is the tunnel's, or the next response's.
    let head = common::proxy::read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("client_not_allowed"), "{head}");
    let entries = blocked(&proxy).await;
    assert!(
        entries
            .iter()
            .any(|b| b["via"] == "connect" && b["action"] == "client_denied"),
        "{entries:?}"
    );
}

/// `GET http://{host}/` with `credentials` from the source address `source`: the status line's
/// code and the whole answer.
async fn proxied_get_from(
    source: std::net::IpAddr,
    proxy: SocketAddr,
    host: &str,
    credentials: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    let mut stream = socket.connect(proxy).await.expect("connect to egressd");
    let request = format!(
        "GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: {credentials}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

#[tokio::test]
async fn a_password_guessing_flood_waits_per_source_and_a_user_elsewhere_gets_through() {
    let env = Env::new().await;
    // A real cost: each check takes a while, so the flood piles up.
    let users = env.dir.path().join("users");
    let hash = bcrypt::hash("s3cret", 8).unwrap();
    std::fs::write(&users, format!("alice:{hash}\n")).unwrap();
    let client_policy = format!(
        "  clientPolicy:\n    proxyUsers: {{file: {}, required: true}}\n",
        users.display()
    );
    let yaml =
        head(&env.log(), &client_policy, None) + &routed_backend("pay", "pay.test", env.pay.addr);
    let proxy = TestProxy::start(&yaml).await;
    let edge = proxy.listener("default/gw/edge");
    let flooder: std::net::IpAddr = [127, 0, 0, 1].into();
    let wrong = basic("alice", "guess");
    let flood: Vec<_> = (0..20)
        .map(|_| {
            let wrong = wrong.clone();
            tokio::spawn(async move { proxied_get_from(flooder, edge, "pay.test", &wrong).await })
        })
        .collect();
    // Alice, from another address, is not queued behind the guesses.
    let (status, answer) = proxied_get_from(
        [127, 0, 0, 2].into(),
        edge,
        "pay.test",
        &basic("alice", "s3cret"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let mut busy = 0;
    for guess in flood {
        let (status, answer) = guess.await.unwrap();
        match status {
            407 => {}
            429 => {
                assert!(
                    answer.contains("x-egressd-error: proxy_auth_busy"),
                    "{answer}"
                );
                busy += 1;
            }
            other => panic!("a guess answered {other}: {answer}"),
        }
    }
    assert!(
        busy >= 1,
        "20 guesses at once from one address were all queued"
    );
}

/// A newcomer under `clientPolicy.default: Deny` adds a policy in `mode: Report` to try it
/// out: the default refuses every client of that destination, listed or not. `validate`
/// warns at the policy's `mode`, the refusal says the default decided it and names the
/// Report policy, and `/blocked` names `clientPolicy.default` as the log does.
#[tokio::test]
async fn a_report_policy_under_default_deny_is_warned_about_and_the_refusal_says_why() {
    let env = Env::new().await;
    let extra = "  clientPolicy: {default: Deny}\n";
    let yaml = head(&env.log(), extra, None)
        + &routed_backend("pay", "pay.test", env.pay.addr)
        + &egress_policy(
            "trial",
            "Report",
            "cidrs: [127.0.0.0/8]",
            "backendRefs: [{name: pay}]",
        );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), &yaml).unwrap();
    let report = egressd::commands::validate(&[dir.path().to_path_buf()]).report;
    assert!(
        report.lines().any(|l| l.contains(
            "warning: EgressPolicy default/trial: spec.mode: \
             mode Report under clientPolicy.default: Deny"
        )),
        "{report}"
    );

    let proxy = TestProxy::start(&yaml).await;
    let r = get(proxy.listener("default/gw/edge"), "pay.test", "/").await;
    assert_eq!(r.error_code(), Some("client_not_allowed"), "{}", r.text());
    assert!(
        r.text().contains(
            "clientPolicy.default is Deny and decided: EgressPolicy default/trial covers the \
             destination in mode Report"
        ),
        "{}",
        r.text()
    );
    assert_eq!(env.pay.request_count(), 0);
    let entries = blocked(&proxy).await;
    assert!(
        entries
            .iter()
            .any(|b| b["action"] == "client_denied" && b["policy"] == "clientPolicy.default"),
        "{entries:?}"
    );
}

/// Two ways a policy does not mean what it says, each a `validate` warning at the field:
/// under `outboundPolicy: AllowAny` with `clientPolicy.default: Allow`, a refused client
/// reaches the same server by its address (an undeclared destination, open to everyone); and a
/// `to.hostnames` entry only an HTTPRoute to an IP Backend serves covers nothing.
#[tokio::test]
async fn policies_that_cover_less_than_they_say_are_warned_about() {
    let env = Env::new().await;
    let yaml = head(&env.log(), "  outboundPolicy: AllowAny\n", None)
        + &routed_backend("pay", "pay.test", env.pay.addr)
        + &egress_policy(
            "pay-by-name",
            "Enforce",
            "cidrs: [10.0.0.0/8]",
            "hostnames: [pay.test]",
        );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), &yaml).unwrap();
    let report = egressd::commands::validate(&[dir.path().to_path_buf()]).report;
    let warning = |needle: &str| {
        report
            .lines()
            .any(|l| l.contains("warning:") && l.contains(needle))
    };
    assert!(
        warning(
            "ProxyConfig default/egressd: spec.outboundPolicy: outboundPolicy AllowAny with \
             clientPolicy.default Allow: a client EgressPolicy default/pay-by-name refuses can \
             still reach the same servers by IP address"
        ),
        "{report}"
    );
    assert!(
        warning(
            "EgressPolicy default/pay-by-name: spec.to.hostnames[0]: `pay.test` covers nothing \
             HTTPRoute default/pay sends to Backend default/pay"
        ),
        "{report}"
    );
    // And what the second warning says is so: the policy does not refuse 127.0.0.1.
    let proxy = TestProxy::start(&yaml).await;
    let r = get(proxy.listener("default/gw/edge"), "pay.test", "/").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}
