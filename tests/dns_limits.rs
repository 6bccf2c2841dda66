//! What names clients choose cost egressd, bounded: a wildcard Backend's hosts and undeclared
//! destinations leave nothing behind when the table forgets them (their DNS refreshers stop at
//! once), a DNS answer of thousands of addresses is cut (`dns.maxAddressesPerAnswer`), the
//! hosts of a wildcard Backend hold a bounded number of endpoints together (`maxEndpoints`),
//! and new names are looked up at a bounded rate (`dns.maxLookupsPerSecond`: 503
//! `dns_rate_limited` over it).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::dns::TestDns;
use common::proxy::{get, preamble_with, TestProxy};
use common::upstream::Upstream;

/// The ProxyConfig lines pointing DNS at `dns`, with `more` lines of `spec.dns`.
fn dns_spec(dns: &TestDns, more: &str) -> String {
    format!("  dns:\n    nameservers: [\"{}\"]\n{more}", dns.addr)
}

/// A plaintext wildcard Backend `w` for `*.w.test` on `port`, which may resolve to loopback,
/// with `extra` fields of `fqdn`.
fn wildcard_backend(port: u16, extra: &str) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: w}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: \"*.w.test\", allowedAddresses: [127.0.0.0/8]{extra}}}\n    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n"
    )
}

/// `n` distinct addresses in 127.0.0.0/8 (127.1.0.0 upwards).
fn many_addresses(n: usize) -> Vec<IpAddr> {
    (0..n)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8)))
        .collect()
}

const REFRESHERS: &str = "egressd_dns_refreshers";

/// 300 distinct hosts of a wildcard Backend that keeps 4: once the flood stops, 4 DNS
/// refreshers run, not 300 (before, each forgotten host's refresher and task lived until its
/// answer's TTL or hostIdleTimeout ran out: minutes).
#[tokio::test]
async fn a_flood_of_wildcard_hosts_leaves_nothing_of_the_forgotten_ones() {
    let upstream = Upstream::start("w").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    let names: Vec<String> = (0..300).map(|i| format!("h{i}.w.test")).collect();
    for name in &names {
        dns.set(name, &[Ipv4Addr::LOCALHOST], 300);
    }
    let spec = dns_spec(&dns, "    maxLookupsPerSecond: 100000\n");
    let yaml = preamble_with(None, &spec) + &wildcard_backend(port, ", maxHosts: 4");
    let proxy = TestProxy::start(&yaml).await;
    for name in &names {
        let r = get(proxy.http(), &format!("{name}:{port}"), "/").await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert!(
            proxy.metric(REFRESHERS) <= 5.0,
            "at most maxHosts (and one being made)"
        );
    }
    common::eventually(
        "the refreshers of forgotten hosts stopped",
        Duration::from_secs(5),
        || async { proxy.metric(REFRESHERS) == 4.0 },
    )
    .await;
    assert_eq!(upstream.request_count(), 300);
}

/// The same for undeclared destinations under `AllowAny`.
#[tokio::test]
async fn a_flood_of_undeclared_names_leaves_nothing_of_the_forgotten_ones() {
    let upstream = Upstream::start("u").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    let names: Vec<String> = (0..300).map(|i| format!("h{i}.u.test")).collect();
    for name in &names {
        dns.set(name, &[Ipv4Addr::LOCALHOST], 300);
    }
    let spec = dns_spec(&dns, "    maxLookupsPerSecond: 100000\n")
        + "  outboundPolicy: AllowAny\n  undeclaredDestinations: {maxDestinations: 4, allowedAddresses: [127.0.0.0/8]}\n";
    let proxy = TestProxy::start(&preamble_with(None, &spec)).await;
    for name in &names {
        let r = get(proxy.http(), &format!("{name}:{port}"), "/").await;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
    }
    common::eventually(
        "the refreshers of forgotten destinations stopped",
        Duration::from_secs(5),
        || async { proxy.metric(REFRESHERS) == 4.0 },
    )
    .await;
}

/// The `/endpoints` entries of Backend `default/w`'s hosts: (host, endpoint count).
fn host_endpoints(all: &serde_json::Value) -> Vec<(String, usize)> {
    all["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["backend"] == "default/w" && b.get("host").is_some())
        .map(|b| {
            let host = b["host"].as_str().unwrap().to_owned();
            (host, b["endpoints"].as_array().unwrap().len())
        })
        .collect()
}

/// Five hosts each answering 4,000 addresses: each answer is cut to the default 64, and the
/// hosts together hold `maxEndpoints` (100; at least one each), so `/endpoints` stays small.
/// Before, 20,000 endpoints and an `/endpoints` of megabytes.
#[tokio::test]
async fn hostile_answers_are_cut_and_a_wildcard_backend_s_endpoints_bounded() {
    let dns = TestDns::start().await;
    let addresses = many_addresses(4000);
    let names: Vec<String> = (0..5).map(|i| format!("big{i}.w.test")).collect();
    for name in &names {
        dns.set_ips(name, &addresses, 300);
    }
    // Nothing listens on these addresses: requests fail, the hosts stay.
    let port = common::ports::shared_port();
    let yaml =
        preamble_with(None, &dns_spec(&dns, "")) + &wildcard_backend(port, ", maxEndpoints: 100");
    let proxy = TestProxy::start(&yaml).await;
    for name in &names {
        let r = get(proxy.http(), &format!("{name}:{port}"), "/").await;
        assert_eq!(r.status, 503, "{name}: {}", r.text());
    }
    let endpoints = get(proxy.admin, "localhost", "/endpoints").await;
    let all: serde_json::Value = serde_json::from_slice(&endpoints.body).unwrap();
    let hosts = host_endpoints(&all);
    let expected: Vec<(String, usize)> = names.iter().cloned().zip([64, 36, 1, 1, 1]).collect();
    assert_eq!(hosts, expected);
    assert!(
        endpoints.body.len() < 128 * 1024,
        "/endpoints is {} bytes",
        endpoints.body.len()
    );
    let cut = |limit: &str| {
        proxy.metric(&format!(
            r#"egressd_dns_answers_truncated_total{{backend="default/w",reason="{limit}"}}"#
        ))
    };
    assert!(cut("max_addresses_per_answer") >= 5.0);
    assert!(cut("max_endpoints") >= 4.0);
}

/// A declared name's answer is cut to `dns.maxAddressesPerAnswer`: the lowest addresses, the
/// same at every refresh.
#[tokio::test]
async fn a_declared_name_keeps_max_addresses_per_answer() {
    let dns = TestDns::start().await;
    let mut addresses = many_addresses(200);
    addresses.reverse();
    dns.set_ips("big.d.test", &addresses, 300);
    let port = common::ports::shared_port();
    let yaml = preamble_with(None, &dns_spec(&dns, "    maxAddressesPerAnswer: 3\n"))
        + &common::proxy::fqdn_backend("d", "big.d.test", &[port], "");
    let proxy = TestProxy::start(&yaml).await;
    let entry = common::proxy::endpoints_of(&proxy, "d").await;
    let listed: Vec<&str> = entry["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["address"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (1..=3).map(|i| format!("127.1.0.{i}:{port}")).collect();
    assert_eq!(listed, expected, "{} endpoints", listed.len());
}

/// At 5 lookups a second, a flood of new names gets 503 `dns_rate_limited` past the first
/// burst, and the DNS server is asked for no more names than the rate allows; the hosts kept
/// refresh within the rate too (a refresh over it waits its turn).
#[tokio::test]
async fn new_names_over_the_lookup_rate_get_503_and_lookups_keep_to_it() {
    let upstream = Upstream::start("w").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    let names: Vec<String> = (0..40).map(|i| format!("r{i}.w.test")).collect();
    for name in &names {
        // A 1 s TTL: each host kept is looked up again every second.
        dns.set(name, &[Ipv4Addr::LOCALHOST], 1);
    }
    let spec = dns_spec(&dns, "    maxLookupsPerSecond: 5\n");
    let proxy = TestProxy::start(&(preamble_with(None, &spec) + &wildcard_backend(port, ""))).await;
    let started = Instant::now();
    let mut limited = 0;
    for name in &names {
        let r = get(proxy.http(), &format!("{name}:{port}"), "/").await;
        match r.status.as_u16() {
            200 => {}
            503 => {
                assert_eq!(r.error_code(), Some("dns_rate_limited"), "{}", r.text());
                assert!(r.text().contains("dns.maxLookupsPerSecond"), "{}", r.text());
                limited += 1;
            }
            other => panic!("{name}: {other} {}", r.text()),
        }
    }
    // A burst of 5, then 5 a second.
    let allowed = |since: Instant| 5 + (5.0 * since.elapsed().as_secs_f64()).ceil() as usize;
    assert!(limited > 0, "no request was over the rate");
    assert!(
        dns.names_asked() <= allowed(started),
        "{} names asked in {:?}",
        dns.names_asked(),
        started.elapsed()
    );
    let refused = r#"egressd_dns_lookups_rate_limited_total{action="refused"}"#;
    assert_eq!(proxy.metric(refused), f64::from(limited));

    // The hosts kept refresh every second, each: 25 more lookups take at least 4 s.
    let lookups = || -> usize { names.iter().map(|n| dns.query_count(n)).sum() };
    let (from, before) = (Instant::now(), lookups());
    common::eventually("25 more lookups", Duration::from_secs(20), || async {
        lookups() >= before + 25
    })
    .await;
    let took = from.elapsed();
    let done = lookups() - before;
    assert!(done <= allowed(from) + 1, "{done} lookups in {took:?}");
    let delayed = r#"egressd_dns_lookups_rate_limited_total{action="delayed"}"#;
    eprintln!(
        "{done} lookups in {took:?}; {} refreshes delayed",
        proxy.metric(delayed)
    );
}

/// Undeclared HTTPS destinations share one TLS client config (not one each, made per name),
/// and each still sends its own name: the certificate is judged against it (here: by roots
/// that do not know the test's CA, so the handshake fails as `unknown_ca`).
#[tokio::test]
async fn undeclared_https_destinations_each_send_their_own_name() {
    use common::tls::{San, TestCa, TlsOptions, TlsUpstream};
    let ca = TestCa::new("undeclared");
    let upstream = TlsUpstream::start(
        "u",
        ca.server_cert(&[San::dns("a.u.test"), San::dns("b.u.test")]),
        TlsOptions::default(),
    )
    .await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    for name in ["a.u.test", "b.u.test"] {
        dns.set(name, &[Ipv4Addr::LOCALHOST], 300);
    }
    let spec = dns_spec(&dns, "")
        + "  outboundPolicy: AllowAny\n  undeclaredDestinations: {allowedAddresses: [127.0.0.0/8]}\n";
    let proxy = TestProxy::start(&preamble_with(None, &spec)).await;
    for name in ["a.u.test", "b.u.test"] {
        let url = format!("https://{name}:{port}/");
        let r = common::proxy::get_absolute(proxy.http(), &url).await;
        assert_eq!(r.error_code(), Some("upstream_tls_failure"), "{}", r.text());
        assert!(r.text().contains("unknown_ca"), "{}", r.text());
    }
    let snis = upstream.snis();
    for name in ["a.u.test", "b.u.test"] {
        assert!(snis.contains(&Some(name.to_owned())), "{snis:?}");
    }
}

/// The limits are checked: none may be 0, and `maxEndpoints` belongs to wildcard hostnames.
#[test]
fn the_limits_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = preamble_with(
        None,
        "  dns: {maxAddressesPerAnswer: 0, maxLookupsPerSecond: 0}\n  undeclaredDestinations: {maxEndpoints: 0}\n",
    ) + &common::proxy::fqdn_backend("one", "one.d.test", &[80], "")
        .replace("hostname: one.d.test", "hostname: one.d.test\n      maxEndpoints: 10")
        + &wildcard_backend(80, ", maxEndpoints: 0").replace("name: w}", "name: w0}");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let validation = egressd::commands::validate(&[dir.path().to_path_buf()]);
    assert!(!validation.ok);
    for expected in [
        "maxAddressesPerAnswer must be at least 1",
        "maxLookupsPerSecond must be at least 1",
        "spec.undeclaredDestinations.maxEndpoints",
        "maxEndpoints is for wildcard hostnames",
        "maxEndpoints must be at least 1",
    ] {
        assert!(
            validation.report.contains(expected),
            "{expected}:\n{}",
            validation.report
        );
    }
}

/// Names of a wildcard Backend are the clients' choice, so what their DNS answers make egressd
/// log is rate-limited per message (`--log-rate-limit` lines per 10 s window, then one line
/// saying how many were suppressed): 40 names that fail, 40 whose every answer is refused and
/// 40 with one answer refused write a few lines each, not 40 (before, the refusals were logged
/// once per name: a client could write 340 lines a second).
#[tokio::test]
async fn what_client_chosen_names_make_egressd_log_is_rate_limited() {
    let upstream = Upstream::start("w").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    // Link-local: refused for declared names unless `allowedAddresses` opens it (it opens
    // loopback alone here), so no connection is ever tried to it.
    let denied = IpAddr::V4(Ipv4Addr::new(169, 254, 0, 1));
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut names = Vec::new();
    for i in 0..40 {
        names.push(format!("failing{i}.w.test")); // NXDOMAIN
        let refused = format!("denied{i}.w.test");
        dns.set_ips(&refused, &[denied], 300);
        let partly = format!("partly{i}.w.test");
        dns.set_ips(&partly, &[loopback, denied], 300);
        names.extend([refused, partly]);
    }
    let spec = dns_spec(&dns, "    maxLookupsPerSecond: 100000\n");
    let yaml = preamble_with(None, &spec) + &wildcard_backend(port, "");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let egressd =
        common::binary::Egressd::spawn_with(dir.path(), &["--no-watch", "--log-rate-limit", "3"])
            .await;
    let proxy = egressd.listener_addr("default/gw/http").await;
    let started = Instant::now();
    for name in &names {
        let r = get(proxy, &format!("{name}:{port}"), "/").await;
        let expected = match name.as_bytes()[0] {
            b'p' => 200, // the loopback answer serves
            b'd' => 502, // every answer refused: egressd names the addresses
            _ => 503,    // no address
        };
        assert_eq!(r.status, expected, "{name}: {}", r.text());
    }
    // Each 10 s window allows 3 lines per message; the flood spans this many at most.
    let windows = started.elapsed().as_secs() / 10 + 2;
    let log = egressd.stderr();
    for message in [
        "DNS resolution failed",
        "every DNS answer refused",
        "DNS answers refused (",
    ] {
        let lines = log.lines().filter(|l| l.contains(message)).count() as u64;
        assert!(lines >= 1, "{message:?} was never logged:\n{log}");
        assert!(
            lines <= 3 * windows,
            "{lines} lines of {message:?} in {windows} windows:\n{log}"
        );
    }
}
