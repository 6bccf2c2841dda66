//! A declared FQDN Backend's DNS answers are checked before they become endpoints: a name that
//! resolves to link-local (the cloud metadata service), unspecified, broadcast or multicast
//! addresses, or to loopback when the name is not `localhost`/`*.localhost`, is refused with
//! 502 `destination_address_denied` and a log line naming the name and the address, unless the
//! Backend lists the range in `destination.fqdn.allowedAddresses`.
//!
//! Every answer comes from the test's own DNS server; refused answers are never connected to,
//! and every upstream listens on loopback.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use common::binary::{try_get, Egressd};
use common::dns::TestDns;
use common::proxy::{endpoints_of, fqdn_backend_allowing, get, preamble, TestProxy};
use common::upstream::Upstream;

const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

#[tokio::test]
async fn a_declared_name_resolving_to_loopback_or_metadata_is_refused() {
    let upstream = Upstream::start("loopback").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    dns.set("api.svc.test", &[Ipv4Addr::LOCALHOST], 60);
    dns.set("metadata.svc.test", &[METADATA], 60);
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    dns.set_ips("mapped.svc.test", &[mapped], 60);
    let yaml = preamble(Some(dns.addr))
        + &fqdn_backend_allowing("api", "api.svc.test", &[port], &[], "")
        + &fqdn_backend_allowing("metadata", "metadata.svc.test", &[80], &[], "")
        + &fqdn_backend_allowing("mapped", "mapped.svc.test", &[port], &[], "");
    let proxy = TestProxy::start(&yaml).await;

    for (host, address, why) in [
        (format!("api.svc.test:{port}"), "127.0.0.1", "loopback"),
        (
            "metadata.svc.test".to_owned(),
            "169.254.169.254",
            "link-local",
        ),
        (format!("mapped.svc.test:{port}"), "127.0.0.1", "loopback"),
    ] {
        let r = get(proxy.http(), &host, "/").await;
        assert_eq!(r.status, 502, "{host}: {}", r.text());
        assert_eq!(r.error_code(), Some("destination_address_denied"), "{host}");
        let text = r.text();
        assert!(
            text.contains(&format!("{address} ({why})")) && text.contains("allowedAddresses"),
            "{host}: names the address, why, and the field that opens it: {text}"
        );
    }
    assert_eq!(upstream.request_count(), 0, "nothing reached loopback");
    let api = endpoints_of(&proxy, "api").await;
    assert_eq!(api["endpoints"].as_array().unwrap().len(), 0, "{api}");
    assert!(
        api["lastError"].as_str().unwrap().contains("127.0.0.1"),
        "{api}"
    );
}

#[tokio::test]
async fn allowed_addresses_open_a_range_for_one_backend() {
    let upstream = Upstream::start("opened").await;
    let port = upstream.addr.port();
    let dns = TestDns::start().await;
    dns.set("opened.svc.test", &[Ipv4Addr::LOCALHOST], 60);
    dns.set("closed.svc.test", &[Ipv4Addr::LOCALHOST], 60);
    // The spelling of the range does not matter: an IPv4-mapped network is the IPv4 one.
    let opened = fqdn_backend_allowing(
        "opened",
        "opened.svc.test",
        &[port],
        &["\"::ffff:127.0.0.0/104\""],
        "",
    );
    let yaml = preamble(Some(dns.addr))
        + &opened
        + &fqdn_backend_allowing("closed", "closed.svc.test", &[port], &[], "");
    let proxy = TestProxy::start(&yaml).await;

    let r = get(proxy.http(), &format!("opened.svc.test:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.upstream(), Some("opened"));
    let r = get(proxy.http(), &format!("closed.svc.test:{port}"), "/").await;
    assert_eq!(r.error_code(), Some("destination_address_denied"));
    assert_eq!(upstream.request_count(), 1);
}

#[tokio::test]
async fn names_that_mean_loopback_may_resolve_to_it() {
    let upstream = Upstream::start("local").await;
    let port = upstream.addr.port();
    // RFC 6761: `localhost` and `*.localhost` are loopback; the resolver answers them itself.
    let yaml = preamble(None)
        + &fqdn_backend_allowing("local", "echo.localhost", &[port], &[], "")
        + &fqdn_backend_allowing("plain", "localhost", &[port], &[], "");
    let proxy = TestProxy::start(&yaml).await;
    for host in ["echo.localhost", "localhost"] {
        let r = get(proxy.http(), &format!("{host}:{port}"), "/").await;
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
}

#[tokio::test]
async fn refused_answers_are_left_out_and_the_others_serve() {
    // Two answers on loopback; only 127.0.0.2 is opened, and only it has a server.
    let second = Upstream::start_on("second", "127.0.0.2:0".parse().unwrap()).await;
    let port = second.addr.port();
    let dns = TestDns::start().await;
    dns.set(
        "pair.svc.test",
        &[Ipv4Addr::LOCALHOST, Ipv4Addr::new(127, 0, 0, 2)],
        1,
    );
    let backend = fqdn_backend_allowing("pair", "pair.svc.test", &[port], &["127.0.0.2"], "");
    let proxy = TestProxy::start(&(preamble(Some(dns.addr)) + &backend)).await;
    for _ in 0..4 {
        let r = get(proxy.http(), &format!("pair.svc.test:{port}"), "/").await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let pair = endpoints_of(&proxy, "pair").await;
    let addresses: Vec<&str> = pair["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["address"].as_str().unwrap())
        .collect();
    assert_eq!(addresses, [format!("127.0.0.2:{port}")], "{pair}");

    // The name is rebound to a refused address: the last good one keeps serving.
    dns.set("pair.svc.test", &[Ipv4Addr::LOCALHOST], 1);
    common::eventually(
        "the refresher saw the refused answer",
        Duration::from_secs(10),
        || {
            let proxy = &proxy;
            async move {
                let pair = endpoints_of(proxy, "pair").await;
                pair["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("127.0.0.1 (loopback)"))
            }
        },
    )
    .await;
    let r = get(proxy.http(), &format!("pair.svc.test:{port}"), "/").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.upstream(), Some("second"));
    assert_eq!(second.request_count(), 5);
}

#[tokio::test]
async fn the_refusal_is_logged_with_the_name_and_the_address() {
    let dns = TestDns::start().await;
    dns.set("metadata.svc.test", &[METADATA], 60);
    let dir = tempfile::tempdir().unwrap();
    let yaml = preamble(Some(dns.addr)).replace("enabled: false", "enabled: true")
        + &fqdn_backend_allowing("metadata", "metadata.svc.test", &[80], &[], "");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let egressd = Egressd::spawn(dir.path()).await;
    let http: SocketAddr = egressd.listener_addr("default/gw/http").await;
    let r = try_get(http, "metadata.svc.test", "/latest/meta-data/")
        .await
        .unwrap();
    assert_eq!(r.status, 502);
    let line = common::eventually("the warning", Duration::from_secs(5), || {
        let stderr = egressd.stderr();
        async move {
            stderr
                .lines()
                .find(|l| {
                    l.contains("DNS answer refused") || l.contains("every DNS answer refused")
                })
                .map(str::to_owned)
        }
    })
    .await;
    assert!(
        line.contains("metadata.svc.test")
            && line.contains("169.254.169.254")
            && line.contains("default/metadata"),
        "{line}"
    );
}
