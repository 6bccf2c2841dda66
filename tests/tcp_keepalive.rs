//! `tcpKeepalive`: upstream connections carry TCP keepalive probes when the section is set, and
//! none otherwise. Read from the kernel (/proc/net/tcp: an established socket with keepalive
//! on has its keepalive timer armed, `tr` = 2), so the test sees what egressd asked of it.

mod common;

use common::outlier::{answering, backend, HOST};
use common::ports::shared_port;
use common::proxy::{get, preamble, TestProxy};

/// The `tr` (timer) field of the established IPv4 sockets connected to 127.0.0.1:`port`.
fn timers_of_connections_to(port: u16) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.get(2) == Some(&remote.as_str()) && f.get(3) == Some(&"01"))
                .then(|| f[5].split(':').next().unwrap_or_default().to_owned())
        })
        .collect()
}

async fn timers_after_one_request(policy: &str) -> Vec<String> {
    let port = shared_port();
    let up = answering(1, port, 200).await;
    let yaml = (preamble(None) + &backend(&[up.addr], ""))
        .replace("    healthCheck:", &format!("{policy}    healthCheck:"));
    let proxy = TestProxy::start(&yaml).await;
    assert_eq!(get(proxy.http(), HOST, "/").await.status, 200);
    // The pooled upstream connection stays open (idle) for the next request.
    let timers = timers_of_connections_to(port);
    drop(proxy);
    timers
}

#[tokio::test]
async fn upstream_connections_get_keepalive_probes_only_when_configured() {
    let with =
        timers_after_one_request("    tcpKeepalive: {idleTime: 60s, interval: 10s, probes: 3}\n")
            .await;
    assert_eq!(with, vec!["02"], "keepalive timer armed: {with:?}");
    let without = timers_after_one_request("").await;
    assert_eq!(
        without,
        vec!["00"],
        "no timer without the section: {without:?}"
    );
}
