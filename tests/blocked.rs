//! The blocked-egress audit: admin `/blocked` lists the destinations egressd refused because
//! nothing declares them, with a Backend for each that, dropped into the config directory,
//! makes the next request succeed.

mod common;

use std::time::Duration;

use common::outlier::metric;
use common::proxy::{get, get_absolute, preamble, TestProxy};
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `CONNECT target` on a new connection; the status line's code.
async fn connect_status(proxy: std::net::SocketAddr, target: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_blocked_host_is_listed_with_a_backend_that_allows_it() {
    let upstream = Upstream::start("api").await;
    // A `*.localhost` name: the pasted Backend may resolve it to loopback (RFC 6761), where
    // the test upstream listens, without `allowedAddresses`.
    let proxy = TestProxy::start(&preamble(None)).await;
    let url = format!(
        "http://api.blocked.localhost:{}/v1/things",
        upstream.addr.port()
    );

    for _ in 0..2 {
        let r = get_absolute(proxy.http(), &url).await;
        assert_eq!(r.status, 403);
        assert_eq!(r.error_code(), Some("destination_not_allowed"));
    }
    assert_eq!(
        connect_status(proxy.http(), "vault.blocked.test:443").await,
        403
    );
    assert_eq!(upstream.request_count(), 0);

    let listed: serde_json::Value =
        serde_json::from_slice(&get(proxy.admin, "localhost", "/blocked").await.body).unwrap();
    let blocked = listed["blocked"].as_array().unwrap();
    assert_eq!(blocked.len(), 2, "{listed:#}");
    let api = blocked
        .iter()
        .find(|b| b["host"] == "api.blocked.localhost")
        .expect("the HTTP destination");
    assert_eq!(api["port"], upstream.addr.port());
    assert_eq!(api["count"], 2);
    assert_eq!(api["via"], "http");
    assert!(api["firstSeen"].as_str().unwrap() <= api["lastSeen"].as_str().unwrap());
    let vault = blocked
        .iter()
        .find(|b| b["host"] == "vault.blocked.test")
        .unwrap();
    assert_eq!(
        (vault["port"].clone(), vault["via"].clone()),
        (443.into(), "connect".into())
    );
    assert!(vault["backend"]
        .as_str()
        .unwrap()
        .contains("mode: Passthrough"));
    assert_eq!(
        metric(
            &proxy,
            r#"egressd_blocked_requests_total{host="api.blocked.localhost"}"#
        )
        .await,
        2.0
    );
    let yaml = get(proxy.admin, "localhost", "/blocked?format=yaml")
        .await
        .text();
    assert_eq!(yaml.matches("kind: Backend").count(), 2, "{yaml}");

    // The suggested Backend, as an operator would paste it into the config directory.
    let backend = api["backend"].as_str().unwrap();
    let dir = proxy.config_path().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("allow-api.yaml"), backend).unwrap();
    proxy.reload().await;
    common::eventually(
        "the pasted Backend allows the destination",
        Duration::from_secs(5),
        || async { get_absolute(proxy.http(), &url).await.status == 200 },
    )
    .await;
    assert_eq!(upstream.last_request().uri, "/v1/things");
}

/// Once the pasted Backend serves the destination, `/blocked` no longer lists it (nor offers
/// a Backend for it again); the entry the reload did not allow stays.
#[tokio::test]
async fn a_destination_the_new_config_declares_leaves_blocked() {
    let upstream = Upstream::start("api").await;
    let proxy = TestProxy::start(&preamble(None)).await;
    let url = format!("http://api.blocked.localhost:{}/", upstream.addr.port());
    assert_eq!(get_absolute(proxy.http(), &url).await.status, 403);
    assert_eq!(
        connect_status(proxy.http(), "vault.blocked.test:443").await,
        403
    );
    let listed = |proxy: &TestProxy| {
        let admin = proxy.admin;
        async move {
            let v: serde_json::Value =
                serde_json::from_slice(&get(admin, "localhost", "/blocked").await.body).unwrap();
            v["blocked"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["host"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let before = listed(&proxy).await;
    assert_eq!(before.len(), 2, "{before:?}");
    let v: serde_json::Value =
        serde_json::from_slice(&get(proxy.admin, "localhost", "/blocked").await.body).unwrap();
    let api = v["blocked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["host"] == "api.blocked.localhost")
        .unwrap()["backend"]
        .as_str()
        .unwrap()
        .to_owned();
    let dir = proxy.config_path().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("allow-api.yaml"), api).unwrap();
    proxy.reload().await;
    assert_eq!(listed(&proxy).await, ["vault.blocked.test"]);
}
