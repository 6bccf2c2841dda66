//! Gateway API's `XBackend` and the `Secret`/`ConfigMap` documents that TLS references
//! resolve against: mutual TLS with a client certificate from a Secret (base64 `data`, as
//! kubectl writes it) and a CA from a ConfigMap, an HTTPS listener serving a Secret's
//! certificate (`stringData`), positioned errors for an unknown field and a dangling reference
//! (the last good config keeps serving), and Secret bytes absent from `/config` and
//! `egressd validate`.

mod common;

use std::path::Path;

use base64::Engine as _;
use common::proxy::{get, preamble, TestProxy};
use common::tls::{get_over, CertAndKey, San, TestCa, TlsOptions, TlsUpstream};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// `*.localhost` names resolve to loopback without a DNS server, and their loopback answers
/// pass the DNS answer check of declared destinations.
const API: &str = "api.xb.localhost";

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A `kubernetes.io/tls` Secret as `kubectl get secret -o yaml` prints it.
fn kubectl_tls_secret(name: &str, pair: &CertAndKey) -> String {
    format!(
        r#"---
apiVersion: v1
data:
  tls.crt: {}
  tls.key: {}
kind: Secret
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"{name}"}}}}
  creationTimestamp: "2026-11-27T09:00:00Z"
  managedFields:
  - apiVersion: v1
    fieldsType: FieldsV1
    fieldsV1:
      f:data:
        .: {{}}
    manager: kubectl-create
    operation: Update
    time: "2026-11-27T09:00:00Z"
  name: {name}
  namespace: default
  resourceVersion: "81234"
  uid: 6c0f9d2e-5b1a-4c8e-9f11-2a3b4c5d6e7f
type: kubernetes.io/tls
"#,
        b64(&pair.cert_pem),
        b64(&pair.key_pem),
    )
}

/// Text indented for a YAML literal block under a key at two spaces.
fn block(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

fn ca_config_map(name: &str, ca: &TestCa) -> String {
    format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\n  uid: 0b7e\ndata:\n  ca.crt: |\n{}",
        block(&ca.pem())
    )
}

/// An XBackend for [`API`] on `port` speaking HTTP/1.1 (a connection per request when the
/// upstream closes them, and handshake failures seen as such) with the given `tls` block
/// (indented by two spaces).
fn xbackend(name: &str, port: u16, tls: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.x-k8s.io/v1alpha1\nkind: XBackend\nmetadata: {{name: {name}}}\nspec:\n  type: ExternalHostname\n  externalHostname: {{hostname: {API}}}\n  port: {{number: {port}}}\n  protocol: HTTP11\n{tls}"
    )
}

const MUTUAL: &str = "  tls:\n    mode: ClientAndServer\n    clientCertificateRef: {name: client}\n    validation:\n      caCertificateRefs: [{group: \"\", kind: ConfigMap, name: ca}]\n";

/// A route by another hostname to the XBackend, referenced by its Gateway API group and kind.
const ROUTE: &str = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: routed}\nspec:\n  hostnames: [routed.xb.test]\n  rules:\n  - backendRefs: [{group: gateway.networking.x-k8s.io, kind: XBackend, name: api}]\n";

async fn mutual_upstream() -> Mutual {
    mutual_upstream_closing(false).await
}

struct Mutual {
    ca: TestCa,
    client: CertAndKey,
    upstream: TlsUpstream,
}

/// An upstream for [`API`] that wants a client certificate of its CA; with `close`, every
/// request comes on a new connection (a new handshake).
async fn mutual_upstream_closing(close: bool) -> Mutual {
    let ca = TestCa::new("xbackend test CA");
    let client = ca.client_cert("egressd-client");
    let upstream = TlsUpstream::start(
        "xb",
        ca.server_cert(&[San::dns(API)]),
        TlsOptions {
            require_client_cert_from: Some(&ca),
            close_connections: close,
            ..TlsOptions::default()
        },
    )
    .await;
    Mutual {
        ca,
        client,
        upstream,
    }
}

fn mutual_config(m: &Mutual, secret: &str) -> String {
    format!(
        "{}{}{}{}{ROUTE}",
        preamble(None),
        kubectl_tls_secret(secret, &m.client),
        ca_config_map("ca", &m.ca),
        xbackend("api", m.upstream.addr.port(), MUTUAL),
    )
}

#[tokio::test]
async fn client_and_server_xbackend_presents_the_secrets_certificate_and_trusts_the_config_maps_ca()
{
    let m = mutual_upstream().await;
    let proxy = TestProxy::start(&mutual_config(&m, "client")).await;
    let port = m.upstream.addr.port();

    // By the implicit route of its hostname and port, and by an HTTPRoute naming the XBackend.
    let direct = get(proxy.http(), &format!("{API}:{port}"), "/").await;
    assert_eq!(direct.status, 200, "{}", direct.text());
    assert_eq!(direct.upstream(), Some("xb"));
    let routed = get(proxy.http(), "routed.xb.test", "/").await;
    assert_eq!(routed.status, 200, "{}", routed.text());
    assert!(
        m.upstream
            .client_cns()
            .iter()
            .all(|cn| cn.as_deref() == Some("egressd-client")),
        "{:?}",
        m.upstream.client_cns()
    );
    assert_eq!(m.upstream.snis()[0].as_deref(), Some(API));

    // The key is nowhere in the dump, neither as PEM nor as the base64 kubectl wrote; the
    // XBackend is shown as written.
    let dump = get(proxy.admin, "localhost", "/config").await.text();
    let key_line = m.client.key_pem.lines().nth(1).expect("a key line");
    assert!(!dump.contains(key_line), "{dump}");
    assert!(!dump.contains(&b64(&m.client.key_pem)), "{dump}");
    assert!(!dump.contains(&b64(&m.client.cert_pem)), "{dump}");
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("JSON");
    let object = |kind: &str| {
        dump["objects"]
            .as_array()
            .expect("objects")
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} in {dump:#}"))
            .clone()
    };
    let secret = object("Secret");
    assert_eq!(secret["data"]["tls.key"], "<redacted>", "{secret:#}");
    assert_eq!(secret["type"], "kubernetes.io/tls", "{secret:#}");
    assert_eq!(object("XBackend")["spec"]["tls"]["mode"], "ClientAndServer");

    // Their certificates' expiry, next to certificate files' (the test CA's certificates are
    // valid until 2200): the Secret's chain and the ConfigMap's CA; the key has none.
    let metrics = get(proxy.admin, "localhost", "/metrics").await.text();
    for series in [
        r#"egressd_certificate_expiry_seconds{file="Secret default/client tls.crt"}"#,
        r#"egressd_certificate_expiry_seconds{file="ConfigMap default/ca ca.crt"}"#,
    ] {
        let left: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no {series} in {metrics}"));
        assert!(left > 100.0 * 365.0 * 86_400.0, "{series} = {left}");
    }
    assert!(!metrics.contains("tls.key"), "{metrics}");
}

/// Without its client certificate the upstream refuses the handshake: what the test above
/// shows is the Secret's certificate at work.
#[tokio::test]
async fn server_only_xbackend_is_refused_by_an_upstream_that_wants_a_client_certificate() {
    let m = mutual_upstream().await;
    let server_only = "  tls:\n    mode: ServerOnly\n    validation:\n      caCertificateRefs: [{kind: ConfigMap, name: ca}]\n";
    // The port in the spelling of Service ports (`name`, `port`), which is accepted too.
    let p = m.upstream.addr.port();
    let yaml = format!(
        "{}{}{}",
        preamble(None),
        ca_config_map("ca", &m.ca),
        xbackend("api", p, server_only).replace(
            &format!("port: {{number: {p}}}"),
            &format!("port: {{name: https, port: {p}}}")
        ),
    );
    let proxy = TestProxy::start(&yaml).await;
    let response = get(
        proxy.http(),
        &format!("{API}:{}", m.upstream.addr.port()),
        "/",
    )
    .await;
    assert_eq!(response.status, 502, "{}", response.text());
    assert_eq!(response.error_code(), Some("upstream_tls_failure"));
}

#[tokio::test]
async fn https_listener_serves_the_certificate_of_a_secret_written_with_string_data() {
    let ca = TestCa::new("listener CA");
    let served = ca.server_cert(&[San::dns("secure.xb.test")]);
    let app = common::upstream::Upstream::start("app").await;
    let secret = format!(
        "---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata:\n  name: web-cert\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        block(&served.cert_pem),
        block(&served.key_pem)
    );
    let yaml = format!(
        "{}{secret}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: web}}\nspec:\n  listeners:\n  - name: https\n    address: 127.0.0.1\n    port: 0\n    protocol: HTTPS\n    tls:\n      certificateRefs: [{{kind: Secret, name: web-cert}}]\n{}{}",
        preamble(None),
        common::proxy::ip_backend("app", app.addr, ""),
        common::proxy::route_to("secure.xb.test", "app"),
    );
    let proxy = TestProxy::start(&yaml).await;
    let tcp = TcpStream::connect(proxy.listener("default/web/https"))
        .await
        .expect("connect");
    let name = ServerName::try_from("secure.xb.test").expect("name");
    let tls = TlsConnector::from(ca.client_config(true))
        .connect(name, tcp)
        .await
        .expect("the handshake verifies the Secret's certificate");
    let (status, body) = get_over(tls, "secure.xb.test").await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"app");
}

/// Loads and compiles `yaml` in `dir` as `egressd validate` does; the report.
fn validate(dir: &Path, yaml: &str) -> egressd::commands::Validation {
    std::fs::write(dir.join("egressd.yaml"), yaml).expect("write config");
    egressd::commands::validate(&[dir.to_path_buf()])
}

/// `file:line:column` of the first line of `yaml` containing `token`, the column that of
/// `token`.
fn position_of(yaml: &str, token: &str) -> String {
    let (line, text) = yaml
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(token))
        .unwrap_or_else(|| panic!("`{token}` not in the config"));
    let column = text.find(token).expect("token") + 1;
    format!("egressd.yaml:{}:{column}", line + 1)
}

#[test]
fn unknown_xbackend_fields_and_values_are_positioned_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "{}{}",
        preamble(None),
        xbackend(
            "api",
            443,
            "  timeout: 10s\n  tls:\n    mode: Mutual\n    validation: {hostname: api.xb.localhost, caBundle: x}\n",
        )
    );
    let v = validate(dir.path(), &yaml);
    assert!(!v.ok, "{}", v.report);
    for (token, message) in [
        ("timeout: 10s", "unknown field `timeout`"),
        ("Mutual", "unknown value `Mutual`"),
        ("caBundle", "unknown field `caBundle`"),
    ] {
        let at = position_of(&yaml, token);
        assert!(
            v.report.lines().any(|l| l.contains(&at)
                && l.contains("XBackend default/api")
                && l.contains(message)),
            "no `{message}` at {at} in:\n{}",
            v.report
        );
    }
}

#[test]
fn broken_references_name_the_reference_and_the_secret() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new("refs CA");
    let client = ca.client_cert("c");
    let opaque =
        kubectl_tls_secret("opaque", &client).replace("type: kubernetes.io/tls", "type: Opaque");
    let broken = kubectl_tls_secret("broken", &client).replacen("tls.key: ", "tls.key: x%", 1);
    let not_pem = "---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {name: not-pem}\nstringData: {tls.crt: hello, tls.key: world}\n";
    let refs = |secret: &str| {
        format!("  tls:\n    mode: ClientAndServer\n    clientCertificateRef: {{name: {secret}}}\n")
    };
    let yaml = format!(
        "{}{opaque}{broken}{not_pem}{}{}{}{}",
        preamble(None),
        xbackend("dangling", 443, &refs("missing")),
        xbackend("wrong-type", 443, &refs("opaque")).replace(API, "b.xb.localhost"),
        xbackend("bad-base64", 443, &refs("broken")).replace(API, "c.xb.localhost"),
        xbackend("bad-pem", 443, &refs("not-pem")).replace(API, "d.xb.localhost"),
    );
    let v = validate(dir.path(), &yaml);
    assert!(!v.ok, "{}", v.report);
    // Where a Secret's document starts: its first key, the line after its `---`.
    let secret_at = |name: &str| {
        let lines: Vec<&str> = yaml.lines().collect();
        let named = lines
            .iter()
            .position(|l| *l == format!("  name: {name}"))
            .expect("secret");
        let start = lines[..named]
            .iter()
            .rposition(|l| *l == "---")
            .expect("---")
            + 2;
        format!("egressd.yaml:{start}:1")
    };
    let expect = [
        (
            "XBackend default/dangling",
            vec!["Secret default/missing not found".to_owned()],
        ),
        (
            "XBackend default/wrong-type",
            vec![
                "Secret default/opaque (/".to_owned(),
                format!("{}) has type `Opaque`", secret_at("opaque")),
            ],
        ),
        (
            "XBackend default/bad-base64",
            vec![
                "Secret default/broken key `tls.key` (/".to_owned(),
                format!("{}) is not valid base64", position_of(&yaml, "x%")),
            ],
        ),
        (
            "XBackend default/bad-pem",
            vec![
                "Secret default/not-pem key `tls.crt` (/".to_owned(),
                format!("{}) holds no PEM certificate", position_of(&yaml, "hello")),
            ],
        ),
    ];
    for (object, messages) in expect {
        assert!(
            v.report.lines().any(|l| l.contains(object)
                && l.contains("spec.tls.clientCertificateRef")
                && messages.iter().all(|m| l.contains(m))),
            "no {messages:?} for {object} in:\n{}",
            v.report
        );
    }
    assert!(v.report.contains("is not valid base64"), "{}", v.report);
    // Each reference is pointed at where it is written.
    let dangling_at = position_of(&yaml, "{name: missing}");
    assert!(v.report.contains(&dangling_at), "{}", v.report);
    // Nothing of any value is shown.
    for secret in [&client.key_pem, &client.cert_pem] {
        assert!(!v.report.contains(&b64(secret)), "{}", v.report);
        assert!(
            !v.report.contains(secret.lines().nth(1).expect("line")),
            "{}",
            v.report
        );
    }
    assert!(
        !v.report.contains("hello") && !v.report.contains("world"),
        "{}",
        v.report
    );
}

#[tokio::test]
async fn a_dangling_secret_reference_is_refused_and_the_last_good_config_keeps_serving() {
    let m = mutual_upstream().await;
    let proxy = TestProxy::start(&mutual_config(&m, "client")).await;
    let host = format!("{API}:{}", m.upstream.addr.port());
    assert_eq!(get(proxy.http(), &host, "/").await.status, 200);
    let generation = proxy.generation();

    // The Secret renamed: the XBackend's reference now dangles.
    proxy.rewrite(&mutual_config(&m, "renamed"));
    let refused = proxy.egressd().reload().await;
    assert!(refused.is_err(), "the dangling reference was accepted");
    let messages = proxy.egressd().shared().reload_status().messages;
    let dangling: Vec<&String> = messages
        .iter()
        .filter(|m| m.contains("Secret default/client not found"))
        .collect();
    assert_eq!(dangling.len(), 1, "{messages:?}");
    let yaml = mutual_config(&m, "renamed");
    let at = position_of(&yaml, "{name: client}");
    assert!(dangling[0].contains(&at), "{} is not at {at}", dangling[0]);
    assert!(
        dangling[0].contains("XBackend default/api: spec.tls.clientCertificateRef"),
        "{}",
        dangling[0]
    );

    assert_eq!(proxy.generation(), generation);
    let response = get(proxy.http(), &host, "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
}

/// A rotated Secret is a changed config file: the watcher reloads it, and the next handshakes
/// present the new certificate without a restart.
#[tokio::test]
async fn a_rotated_secret_applies_without_a_restart() {
    let m = mutual_upstream_closing(true).await;
    let proxy = TestProxy::start_watching(&mutual_config(&m, "client")).await;
    let port = m.upstream.addr.port();
    let host = format!("{API}:{port}");
    assert_eq!(get(proxy.http(), &host, "/").await.status, 200);
    let generation = proxy.generation();

    let rotated = m.ca.client_cert("egressd-client-2");
    let yaml = format!(
        "{}{}{}{}",
        preamble(None),
        kubectl_tls_secret("client", &rotated),
        ca_config_map("ca", &m.ca),
        xbackend("api", port, MUTUAL),
    );
    proxy.rewrite(&yaml);
    common::eventually(
        "the rewritten Secret was not loaded",
        std::time::Duration::from_secs(10),
        || async { proxy.generation() > generation },
    )
    .await;
    // The upstream closes every connection: this request makes a new handshake.
    let response = get(proxy.http(), &host, "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        m.upstream.client_cns().last().cloned().flatten().as_deref(),
        Some("egressd-client-2"),
        "{:?}",
        m.upstream.client_cns()
    );
}

/// Gateway API's own rules (its CEL validations), and the identity an XBackend shares with
/// Backends, are errors at the value that breaks them.
#[test]
fn xbackend_rules_and_shared_identity_are_positioned_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let x = |name: &str, host: &str, protocol: &str, tls: &str| {
        xbackend(name, 443, tls)
            .replace(API, host)
            .replace("protocol: HTTP11", &format!("protocol: {protocol}"))
    };
    let yaml = format!(
        "{}{}{}{}{}{}{}",
        preamble(None),
        common::proxy::fqdn_backend("twin", "twin.xb.localhost", &[443], ""),
        x(
            "twin",
            "twin2.xb.localhost",
            "HTTP",
            "  tls: {mode: ServerOnly}\n"
        ),
        x("h2c", "h2c.xb.localhost", "H2C", "  tls: {mode: None}\n"),
        x("h2", "h2.xb.localhost", "HTTP2", ""),
        x(
            "server-only",
            "so.xb.localhost",
            "HTTP",
            "  tls: {mode: ServerOnly, clientCertificateRef: {name: c}}\n"
        ),
        x(
            "in-cluster",
            "api.team.svc.cluster.local",
            "HTTP",
            "  tls: {mode: ServerOnly}\n"
        ),
    );
    let v = validate(dir.path(), &yaml);
    assert!(!v.ok, "{}", v.report);
    for (object, token, message) in [
        (
            "XBackend default/twin",
            "apiVersion: gateway.networking.x-k8s.io",
            "duplicate object",
        ),
        (
            "XBackend default/h2c",
            "H2C",
            "protocol H2C is HTTP/2 without TLS, but tls is set",
        ),
        ("XBackend default/h2", "HTTP2", "protocol HTTP2 needs tls"),
        (
            "XBackend default/server-only",
            "{name: c}",
            "only for tls.mode ClientAndServer",
        ),
        (
            "XBackend default/in-cluster",
            "api.team.svc.cluster.local",
            "names a cluster Service",
        ),
    ] {
        let at = position_of(&yaml, token);
        assert!(
            v.report
                .lines()
                .any(|l| l.contains(&at) && l.contains(object) && l.contains(message)),
            "no `{message}` at {at} for {object} in:\n{}",
            v.report
        );
    }
}

/// `Gateway.spec.tls.backend.clientCertificateRef`: a `Mutual` Backend naming no certificate
/// of its own presents the Gateway's; Gateways that name different Secrets leave such a
/// Backend without one (an error at its mode naming them), and one with its own keeps it.
#[tokio::test]
async fn a_mutual_backend_without_a_certificate_presents_the_gateways_default() {
    let m = mutual_upstream().await;
    let port = m.upstream.addr.port();
    let other = m.ca.client_cert("other-client");
    let gateway_default = |secret: &str| {
        format!("spec:\n  tls:\n    backend:\n      clientCertificateRef: {{name: {secret}}}\n  listeners:")
    };
    let backend = format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: {API}}}\n    ports: [{{number: {port}}}]\n  protocol: HTTP11\n  tls:\n    mode: Mutual\n    validation:\n      caCertificateRefs: [{{kind: ConfigMap, name: ca}}]\n"
    );
    let secrets = kubectl_tls_secret("client", &m.client)
        + &kubectl_tls_secret("other", &other)
        + &ca_config_map("ca", &m.ca);
    let config = |gateways: &str| {
        preamble(None).replace("spec:\n  listeners:", &gateway_default("client"))
            + gateways
            + &secrets
            + &backend
    };
    let proxy = TestProxy::start(&config("")).await;
    let r = get(proxy.http(), &format!("{API}:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(m.upstream.client_cns(), [Some("egressd-client".to_owned())]);

    // A second Gateway naming another Secret: no default to take.
    let second = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw2}\nspec:\n  tls:\n    backend:\n      clientCertificateRef: {name: other}\n  listeners:\n  - {name: http, address: 127.0.0.1, port: 0, protocol: HTTP}\n";
    proxy.rewrite(&config(second));
    assert!(proxy.egressd().reload().await.is_err());
    let messages = proxy.egressd().shared().reload_status().messages.join("\n");
    assert!(
        messages.contains("Backend default/api: spec.tls.mode")
            && messages.contains("Gateway default/gw: Secret default/client")
            && messages.contains("Gateway default/gw2: Secret default/other"),
        "{messages}"
    );
    // The last good config still presents the default.
    assert_eq!(
        get(proxy.http(), &format!("{API}:{port}"), "/")
            .await
            .status,
        200
    );

    // Agreeing Gateways are fine; a Backend's own certificate wins over the default.
    let agreeing = second.replace("{name: other}", "{name: client}");
    let own = config(&agreeing).replace(
        "    mode: Mutual\n",
        "    mode: Mutual\n    clientCertificateRef: {name: other}\n",
    );
    proxy.rewrite(&own);
    proxy.reload().await;
    let r = get(proxy.http(), &format!("{API}:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        m.upstream.client_cns().last().cloned().flatten().as_deref(),
        Some("other-client")
    );

    // A dangling default is an error at the Gateway's reference.
    proxy.rewrite(&config("").replace(&gateway_default("client"), &gateway_default("missing")));
    assert!(proxy.egressd().reload().await.is_err());
    let messages = proxy.egressd().shared().reload_status().messages.join("\n");
    assert!(
        messages.contains("Gateway default/gw: spec.tls.backend.clientCertificateRef: Secret default/missing not found"),
        "{messages}"
    );
}
