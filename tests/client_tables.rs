//! What clients can make egressd remember is bounded in entries, in bytes and in time: a
//! `Host` that is no host name is refused before anything records it, the blocked-egress
//! audit and its metric labels keep at most so many hosts of at most 253 bytes, and
//! undeclared destinations nobody asks for any more are forgotten with their DNS refreshers.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::binary::{try_get, Egressd, KeepAlive};
use common::dns::TestDns;
use common::eventually;
use common::proxy::{get, preamble, preamble_with, TestProxy};

/// RSS the flood below may take egressd to, documented in docs/operations.md "Limits and hardening".
/// Measured: about 16 MiB; before hosts were checked and the tables bounded in bytes, the same
/// flood took it past 250 MiB.
const FLOOD_RSS_BOUND_KIB: u64 = 48 * 1024;

#[tokio::test]
async fn hosts_that_are_no_host_name_get_400_and_are_not_recorded() {
    let proxy = TestProxy::start(&preamble(None)).await;
    let long_label = format!("{}.test", "a".repeat(64));
    let long_name = format!("{}.test", vec!["a".repeat(60); 5].join("."));
    for host in [
        "127.1",
        "2130706433",
        "0x7f.0.0.1",
        "a..b.test",
        long_label.as_str(),
        long_name.as_str(),
        "[::ffff:127.0.0.1",
    ] {
        let r = get(proxy.http(), host, "/").await;
        assert_eq!(r.status, 400, "{host}: {}", r.text());
        assert_eq!(r.error_code(), Some("invalid_request"), "{host}");
        assert!(r.body.len() < 512, "the reply does not echo the host");
    }
    let blocked = get(proxy.admin, "localhost", "/blocked").await.text();
    let listed: serde_json::Value = serde_json::from_str(&blocked).unwrap();
    assert_eq!(listed["blocked"], serde_json::json!([]), "nothing recorded");
    let metrics = get(proxy.admin, "localhost", "/metrics").await.text();
    assert!(
        !metrics.contains("egressd_blocked_requests_total{"),
        "no host label"
    );
}

/// A config with one HTTP listener, written to `dir`.
fn write_config(dir: &Path, yaml: &str) {
    std::fs::write(dir.join("egressd.yaml"), yaml).expect("write config");
}

/// The listener's address as the running binary reports it.
async fn listener(egressd: &Egressd) -> SocketAddr {
    egressd.listener_addr("default/gw/http").await
}

#[tokio::test]
async fn a_flood_of_huge_and_random_hosts_keeps_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &preamble(None));
    let egressd = Egressd::spawn(dir.path()).await;
    let addr = listener(&egressd).await;

    // 300 requests with a 300 KB Host: refused as a whole (400, or 431 for the head size).
    let huge = format!("{}.test", "a".repeat(300 * 1024));
    for _ in 0..300 {
        if let Ok(r) = try_get(addr, &huge, "/").await {
            assert!(
                r.status == 400 || r.status == 431,
                "a 300 KB Host gets {}",
                r.status
            );
        }
    }
    // 3,000 distinct valid 248-byte hosts, refused as undeclared: each one recorded until the
    // audit and the metric label set are full.
    let mut conn = KeepAlive::connect(addr).await.unwrap();
    for i in 0..3000 {
        let label = "b".repeat(60);
        let host = format!("{i:0>6}{}.{label}.{label}.{label}.test", &label[6..]);
        assert_eq!(host.len(), 248);
        if conn.closing() {
            conn = KeepAlive::connect(addr).await.unwrap();
        }
        let r = conn.get(&host, "/").await.expect("a reply");
        assert_eq!(r.status, 403);
    }
    // Reading the tables out costs memory too.
    let metrics = egressd.metrics().await;
    assert!(metrics.contains("egressd_blocked_requests_total{host=\"other\"}"));
    let blocked = egressd.admin_get("/blocked").await.unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&blocked.body).unwrap();
    assert_eq!(listed["blocked"].as_array().unwrap().len(), 1024);

    let peak = egressd.peak_rss_kib();
    eprintln!("peak RSS after the flood: {peak} KiB");
    assert!(
        peak < FLOOD_RSS_BOUND_KIB,
        "peak RSS {peak} KiB over the documented {FLOOD_RSS_BOUND_KIB} KiB"
    );
}

#[tokio::test]
async fn undeclared_destinations_are_bounded_and_forgotten_with_their_dns_refreshers() {
    let dns = TestDns::start().await;
    let spec = "  outboundPolicy: AllowAny\n  undeclaredDestinations: {maxDestinations: 4, idleTimeout: 1s}\n";
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &preamble_with(Some(dns.addr), spec));
    let egressd = Egressd::spawn(dir.path()).await;
    let addr = listener(&egressd).await;

    // Ten names that do not resolve: each a 503, each a refresher that retries.
    let names: Vec<String> = (0..10).map(|i| format!("gone{i}.nx.test")).collect();
    for name in &names {
        let r = try_get(addr, &format!("{name}:80"), "/").await.unwrap();
        assert_eq!(r.status, 503, "{name}: {}", r.text());
        let kept = egressd.metric("egressd_undeclared_destinations").await;
        assert!(kept <= 4.0, "at most maxDestinations kept, got {kept}");
    }
    // Idle for 1s: forgotten, refreshers stopped.
    eventually(
        "idle destinations forgotten",
        Duration::from_secs(10),
        || async { egressd.metric("egressd_undeclared_destinations").await == 0.0 },
    )
    .await;
    let queries = |dns: &TestDns| -> usize { names.iter().map(|n| dns.query_count(n)).sum() };
    let after = queries(&dns);
    // A refresher still running would retry a failing name within 1–2s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        queries(&dns),
        after,
        "no refresher asks for a forgotten name"
    );

    let log = egressd.stderr();
    assert!(
        !log.contains("DNS resolution failed"),
        "a client's unresolvable names are not warnings:\n{log}"
    );
}
