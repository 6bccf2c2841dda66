//! Wildcard Backends (`fqdn.hostname: "*.svc.test"`): each concrete host a client names is
//! resolved on demand (the test's DNS server answers), gets TLS with its own SNI, verified
//! against its own name, and endpoints of its own; an exact hostname beats the wildcard and
//! the longest suffix beats a shorter one; CONNECT reaches a wildcard TCP port; hosts are
//! bounded (`maxHosts`).

mod common;

use std::net::{Ipv4Addr, SocketAddr};

use common::dns::TestDns;
use common::proxy::{endpoints_of, get, preamble, TestProxy};
use common::tls::{San, TestCa, TlsOptions, TlsUpstream};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A Backend `name` for `hostname` (may be `*.suffix`) on `port`, which may resolve to
/// loopback; `tls` and `extra` spec lines as given.
fn backend(name: &str, hostname: &str, port: u16, tls: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: \"{hostname}\", allowedAddresses: [127.0.0.0/8]{extra}}}\n    ports: [{{number: {port}}}]\n  tls: {tls}\n"
    )
}

#[tokio::test]
async fn each_host_of_a_wildcard_backend_is_resolved_and_gets_its_own_sni() {
    let ca = TestCa::new("wildcard");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_pem(dir.path());
    let a = TlsUpstream::start(
        "a",
        ca.server_cert(&[San::dns("a.svc.test")]),
        TlsOptions::default(),
    )
    .await;
    let port = a.addr.port();
    // The second host's server on another loopback address, same port.
    let b = TlsUpstream::start_on(
        "b",
        SocketAddr::from(([127, 0, 0, 2], port)),
        ca.server_cert(&[San::dns("b.svc.test")]),
        TlsOptions::default(),
    )
    .await
    .expect("127.0.0.2 with the same port");
    let dns = TestDns::start().await;
    dns.set("a.svc.test", &[Ipv4Addr::LOCALHOST], 60);
    dns.set("b.svc.test", &[Ipv4Addr::new(127, 0, 0, 2)], 60);
    // A host whose server holds another host's certificate.
    dns.set("c.svc.test", &[Ipv4Addr::LOCALHOST], 60);
    let tls = format!(
        "{{mode: Simple, validation: {{caCertificateFiles: [{}]}}}}",
        ca_file.display()
    );
    let yaml = preamble(Some(dns.addr)) + &backend("svc", "*.svc.test", port, &tls, "");
    let proxy = TestProxy::start(&yaml).await;

    let r = get(proxy.http(), &format!("a.svc.test:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.upstream(), Some("a"));
    let r = get(proxy.http(), &format!("b.svc.test:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.upstream(), Some("b"));
    assert_eq!(a.snis(), [Some("a.svc.test".to_owned())]);
    assert_eq!(b.snis(), [Some("b.svc.test".to_owned())]);
    // HTTP/2 by ALPN: the authority is in the request target.
    let seen = &a.requests()[0];
    let authority = seen
        .headers
        .get("host")
        .map(|h| h.to_str().unwrap().to_owned())
        .unwrap_or_else(|| seen.uri.clone());
    assert!(
        authority.contains(&format!("a.svc.test:{port}")),
        "the authority is the concrete host: {authority}"
    );

    // Verified against the concrete host: a.svc.test's certificate is not c.svc.test's.
    let r = get(proxy.http(), &format!("c.svc.test:{port}"), "/").await;
    assert_eq!(r.error_code(), Some("upstream_tls_failure"), "{}", r.text());
    assert!(r.text().contains("name_mismatch"), "{}", r.text());

    // The apex is not covered, and a name DNS does not know fails as DNS failures do.
    let r = get(proxy.http(), &format!("svc.test:{port}"), "/").await;
    assert_eq!(r.error_code(), Some("destination_not_allowed"));
    let r = get(proxy.http(), &format!("nowhere.svc.test:{port}"), "/").await;
    assert_eq!(r.error_code(), Some("no_healthy_upstream"), "{}", r.text());

    let svc = endpoints_of(&proxy, "svc").await;
    assert_eq!(svc["wildcardHosts"], 4, "{svc}");
}

#[tokio::test]
async fn an_exact_hostname_beats_a_wildcard_and_the_longest_suffix_wins() {
    let exact = Upstream::start("exact").await;
    let port = exact.addr.port();
    let wide = Upstream::start_on("wide", SocketAddr::from(([127, 0, 0, 2], port))).await;
    let narrow = Upstream::start_on("narrow", SocketAddr::from(([127, 0, 0, 3], port))).await;
    let dns = TestDns::start().await;
    dns.set("api.svc.test", &[Ipv4Addr::LOCALHOST], 60);
    dns.set("x.svc.test", &[Ipv4Addr::new(127, 0, 0, 2)], 60);
    dns.set("y.eu.svc.test", &[Ipv4Addr::new(127, 0, 0, 3)], 60);
    let plain = "{mode: InsecureDisable}";
    let yaml = preamble(Some(dns.addr))
        + &backend("wide", "*.svc.test", port, plain, "")
        + &backend("narrow", "*.eu.svc.test", port, plain, "")
        + &backend("exact", "api.svc.test", port, plain, "");
    let proxy = TestProxy::start(&yaml).await;
    for (host, upstream) in [
        ("api.svc.test", "exact"),
        ("x.svc.test", "wide"),
        ("y.eu.svc.test", "narrow"),
    ] {
        let r = get(proxy.http(), &format!("{host}:{port}"), "/").await;
        assert_eq!(r.status, 200, "{host}: {}", r.text());
        assert_eq!(r.upstream(), Some(upstream), "{host}");
    }
    assert_eq!(wide.request_count(), 1);
    assert_eq!(narrow.request_count(), 1);
}

#[tokio::test]
async fn connect_reaches_a_wildcard_tcp_port() {
    // `*.localhost` names resolve to loopback without a DNS server (RFC 6761).
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let yaml = preamble(None)
        + &backend(
            "tunnels",
            "*.tunnel.localhost",
            port,
            "{mode: Passthrough}",
            "",
        );
    let proxy = TestProxy::start(&yaml).await;
    let mut stream = TcpStream::connect(proxy.http()).await.unwrap();
    let target = format!("db.tunnel.localhost:{port}");
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // The head only: what follows is the tunnel's, or the next response's.
    let head = common::proxy::read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping");
}

#[tokio::test]
async fn a_wildcard_backend_keeps_at_most_max_hosts() {
    let upstream = Upstream::start("many").await;
    let port = upstream.addr.port();
    let yaml = preamble(None)
        + &backend(
            "many",
            "*.many.localhost",
            port,
            "{mode: InsecureDisable}",
            ", maxHosts: 2",
        );
    let proxy = TestProxy::start(&yaml).await;
    for host in ["a", "b", "c", "a"] {
        let r = get(proxy.http(), &format!("{host}.many.localhost:{port}"), "/").await;
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    let many = endpoints_of(&proxy, "many").await;
    assert_eq!(many["wildcardHosts"], 2, "{many}");
    assert_eq!(upstream.request_count(), 4);
}

#[tokio::test]
async fn a_passthrough_sni_finds_the_wildcard_backend_of_its_host() {
    let ca = TestCa::new("pass");
    let upstream = TlsUpstream::start(
        "db",
        ca.server_cert(&[San::dns("db.pass.localhost")]),
        TlsOptions::default(),
    )
    .await;
    let port = upstream.addr.port();
    let yaml = preamble(None)
        + "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: edge}\nspec:\n  listeners:\n  - {name: tls, address: 127.0.0.1, port: 0, protocol: TLS, tls: {mode: Passthrough}}\n"
        + &backend("pass", "*.pass.localhost", port, "{mode: Passthrough}", "");
    let proxy = TestProxy::start(&yaml).await;
    let tcp = TcpStream::connect(proxy.listener("default/edge/tls"))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(ca.client_config(true))
        .connect("db.pass.localhost".try_into().unwrap(), tcp)
        .await
        .expect("the client's own TLS reaches the host's server");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(
            http::Request::get("/")
                .header("host", "db.pass.localhost")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.snis(), [Some("db.pass.localhost".to_owned())]);
}

#[tokio::test]
async fn an_egress_policy_names_a_concrete_host_of_a_wildcard_backend() {
    let upstream = Upstream::start("svc").await;
    let port = upstream.addr.port();
    let policy = "---\napiVersion: egressd.dev/v1alpha1\nkind: EgressPolicy\nmetadata: {name: only-10}\nspec:\n  clients: {cidrs: [10.0.0.0/8]}\n  to: {hostnames: [a.svc.localhost]}\n";
    let yaml = preamble(None)
        + &backend(
            "svc",
            "*.svc.localhost",
            port,
            "{mode: InsecureDisable}",
            "",
        )
        + policy;
    let proxy = TestProxy::start(&yaml).await;
    let r = get(proxy.http(), &format!("a.svc.localhost:{port}"), "/").await;
    assert_eq!(r.error_code(), Some("client_not_allowed"), "{}", r.text());
    let r = get(proxy.http(), &format!("b.svc.localhost:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(upstream.request_count(), 1);
}

/// Each concrete host is an entry of its own in `/endpoints` (with its endpoints' health),
/// counted in the Backend's endpoint gauges, and what its outlier detector finds on its
/// interval (failure percentage here) is counted as the wildcard Backend's.
#[tokio::test]
async fn each_wildcard_host_shows_its_endpoints_and_its_detections_count_for_the_backend() {
    let port = common::ports::shared_port();
    let bad = common::outlier::answering(1, port, 500).await;
    let good = common::outlier::answering(2, port, 200).await;
    let calm = common::outlier::answering(3, port, 200).await;
    let dns = TestDns::start().await;
    dns.set(
        "flaky.svc.test",
        &[Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)],
        60,
    );
    dns.set("calm.svc.test", &[Ipv4Addr::new(127, 0, 0, 3)], 60);
    let passive = "\n  trafficPolicy:\n    loadBalancer: {type: RoundRobin}\n    healthCheck:\n      passive: {interval: 100ms, baseEjectionTime: 60s, consecutive5XxErrors: 1000, consecutiveGatewayErrors: 1000, failurePercentage: {threshold: 50, minimumHosts: 2, requestVolume: 5}}\n";
    let yaml = preamble(Some(dns.addr))
        + &backend("svc", "*.svc.test", port, "{mode: InsecureDisable}", "")
        + passive;
    let proxy = TestProxy::start(&yaml).await;
    let calm_host = format!("calm.svc.test:{port}");
    assert_eq!(get(proxy.http(), &calm_host, "/").await.status, 200);

    let flaky_host = format!("flaky.svc.test:{port}");
    let detection = r#"egressd_outlier_detections_total{backend="default/svc",reason="failure_percentage",verdict="ejected"}"#;
    common::eventually(
        "the failing endpoint of flaky.svc.test ejected by failure percentage",
        std::time::Duration::from_secs(10),
        || async {
            for _ in 0..10 {
                get(proxy.http(), &flaky_host, "/").await;
            }
            common::outlier::metric(&proxy, detection).await >= 1.0
        },
    )
    .await;
    assert!(bad.request_count() >= 5 && good.request_count() >= 5);
    assert_eq!(calm.request_count(), 1);

    let all: serde_json::Value =
        serde_json::from_slice(&get(proxy.admin, "localhost", "/endpoints").await.body).unwrap();
    let entries: Vec<&serde_json::Value> = all["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["backend"] == "default/svc")
        .collect();
    // The port itself (how many hosts), then one entry per host, sorted.
    assert_eq!(entries.len(), 3, "{all}");
    assert_eq!(entries[0]["wildcardHosts"], 2, "{all}");
    assert!(entries[0].get("host").is_none());
    assert_eq!(entries[1]["host"], "calm.svc.test");
    assert_eq!(entries[2]["host"], "flaky.svc.test");
    let flaky = entries[2]["endpoints"].as_array().unwrap();
    let state = |ip: &str| {
        flaky
            .iter()
            .find(|e| e["address"].as_str().unwrap().starts_with(ip))
            .unwrap_or_else(|| panic!("{ip} in {all}"))
    };
    assert_eq!(state("127.0.0.1:")["health"], "ejected", "{all}");
    assert_eq!(
        state("127.0.0.1:")["ejection"]["lastReason"],
        "failure_percentage"
    );
    assert_eq!(state("127.0.0.2:")["health"], "healthy");
    assert_eq!(entries[1]["endpoints"][0]["totalRequests"], 1);

    let gauge = |health: &str| {
        format!(r#"egressd_upstream_endpoints{{backend="default/svc",health="{health}"}}"#)
    };
    assert_eq!(
        common::outlier::metric(&proxy, &gauge("ejected")).await,
        1.0
    );
    assert_eq!(
        common::outlier::metric(&proxy, &gauge("healthy")).await,
        2.0
    );
}

/// The `/endpoints` entry of one wildcard host.
async fn host_entry(proxy: &TestProxy, backend: &str, host: &str) -> Option<serde_json::Value> {
    let all: serde_json::Value =
        serde_json::from_slice(&get(proxy.admin, "localhost", "/endpoints").await.body).unwrap();
    all["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == format!("default/{backend}") && b["host"] == host)
        .cloned()
}

/// The active health state of `ip`'s endpoint of `host`, `None` while the host is not made.
async fn host_endpoint_health(proxy: &TestProxy, host: &str, ip: &str) -> Option<String> {
    let entry = host_entry(proxy, "svc", host).await?;
    entry["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["address"].as_str().unwrap().starts_with(ip))
        .map(|e| e["activeHealth"]["state"].as_str().unwrap_or("").to_owned())
}

/// Active health checks run for each concrete host once it is made, with the concrete host
/// as `Host`, steer its traffic away from a failing endpoint, count under the Backend, and
/// keep running across a reload that keeps the Backend.
#[tokio::test]
async fn each_wildcard_host_is_health_checked_with_its_own_name() {
    let port = common::ports::shared_port();
    let good = common::outlier::answering(1, port, 200).await;
    let failing = common::outlier::answering(2, port, 500).await;
    let dns = TestDns::start().await;
    dns.set(
        "pay.svc.test",
        &[Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)],
        60,
    );
    let active = "\n  trafficPolicy:\n    loadBalancer: {type: RoundRobin}\n    healthCheck:\n      active: {type: HTTP, interval: 100ms, timeout: 1s, unhealthyThreshold: 1, http: {path: /healthz}}\n";
    let config = |extra: &str| {
        preamble(Some(dns.addr))
            + &backend("svc", "*.svc.test", port, "{mode: InsecureDisable}", "")
            + active
            + extra
    };
    let proxy = TestProxy::start(&config("")).await;
    let host = format!("pay.svc.test:{port}");
    // The first request makes the host (and its checker).
    get(proxy.http(), &host, "/").await;
    let checks_of = |upstream: &Upstream| {
        upstream
            .requests()
            .into_iter()
            .filter(|r| r.uri == "/healthz")
            .collect::<Vec<_>>()
    };
    common::eventually(
        "pay.svc.test's endpoints checked, the failing one marked unhealthy",
        std::time::Duration::from_secs(10),
        || async {
            !checks_of(&good).is_empty()
                && host_endpoint_health(&proxy, "pay.svc.test", "127.0.0.2:")
                    .await
                    .as_deref()
                    == Some("unhealthy")
        },
    )
    .await;
    assert_eq!(
        checks_of(&good)[0].headers["host"],
        host.as_str(),
        "checked by its own name"
    );
    assert_eq!(
        host_endpoint_health(&proxy, "pay.svc.test", "127.0.0.1:")
            .await
            .as_deref(),
        Some("healthy")
    );

    let before = failing.request_count();
    for _ in 0..10 {
        let r = get(proxy.http(), &host, "/").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let sent_to_failing = failing
        .requests()
        .into_iter()
        .skip(before)
        .filter(|r| r.uri != "/healthz")
        .count();
    assert_eq!(sent_to_failing, 0, "no traffic to the unhealthy endpoint");
    let fails = r#"egressd_health_checks_total{backend="default/svc",result="fail"}"#;
    assert!(common::outlier::metric(&proxy, fails).await >= 1.0);

    // A reload that keeps the Backend (another file added; the Backend's is unchanged, so
    // it is taken as it was, hosts and all): its host goes on being checked with no request.
    let other = Upstream::start("other").await;
    let dir = proxy.config_path().parent().unwrap().to_owned();
    std::fs::write(
        dir.join("other.yaml"),
        common::proxy::ip_backend("other", other.addr, ""),
    )
    .unwrap();
    proxy.reload().await;
    let checked = failing.request_count();
    common::eventually(
        "the kept host still checked after the reload",
        std::time::Duration::from_secs(10),
        || async { failing.request_count() >= checked + 3 },
    )
    .await;

    // A reload that compiles the Backend again starts with no hosts; the next request makes
    // this one again, and its checks with it.
    proxy.rewrite(&config("").replace("interval: 100ms", "interval: 150ms"));
    proxy.reload().await;
    get(proxy.http(), &host, "/").await;
    let checked = failing.request_count();
    common::eventually(
        "the host made again is checked again",
        std::time::Duration::from_secs(10),
        || async { failing.request_count() >= checked + 3 },
    )
    .await;
}
