//! The log filter changes at run time through admin `/logging` (the built binary, its stderr
//! read back): a 5xx local reply is logged at debug only once the filter says debug.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::binary::{Egressd, TestConfig, HOST};
use common::poll_within;
use common::proxy::{fetch, get, request, ClientBody};
use http_body_util::Full;

async fn admin_post(egressd: &Egressd, path: &str) -> common::proxy::Response {
    let post = request("POST", "localhost", path)
        .body(Full::new(Bytes::new()))
        .unwrap();
    fetch(egressd.admin(), post).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_filter_changes_through_the_admin_api() {
    // A Backend on a port nothing listens on: every request is a 503 local reply.
    let closed = common::ports::Refusing::bind();
    let addr = closed.addr;
    let config = TestConfig::new().backend("gone", addr).route_to("gone");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), config.yaml()).unwrap();
    let egressd = Egressd::spawn(dir.path()).await;
    let listener = egressd.listener_addr("default/gw/http").await;

    assert_eq!(
        get(egressd.admin(), "localhost", "/logging").await.text(),
        "info\n"
    );
    let reply = fetch(
        listener,
        request("GET", HOST, "/")
            .body(ClientBody::default())
            .unwrap(),
    )
    .await;
    assert!(reply.status.is_server_error());
    assert!(
        !egressd.stderr().contains("local reply"),
        "info hides debug lines"
    );

    let r = admin_post(&egressd, "/logging?level=info%2Cegressd%3Ddebug").await;
    assert_eq!(
        (r.status.as_u16(), r.text()),
        (200, "info,egressd=debug\n".to_owned())
    );
    assert_eq!(
        get(egressd.admin(), "localhost", "/logging").await.text(),
        "info,egressd=debug\n"
    );
    fetch(
        listener,
        request("GET", HOST, "/")
            .body(ClientBody::default())
            .unwrap(),
    )
    .await;
    let logged = poll_within(Duration::from_secs(5), || async {
        egressd.stderr().contains("local reply")
    })
    .await
    .is_some();
    assert!(logged, "debug lines now: {}", egressd.stderr());

    // A page on another site making the browser POST here changes nothing.
    let from_elsewhere = fetch(
        egressd.admin(),
        request("POST", &egressd.admin().to_string(), "/logging?level=trace")
            .header("origin", "http://attacker.test")
            .header("sec-fetch-site", "cross-site")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(from_elsewhere.status, 403, "{}", from_elsewhere.text());
    assert_eq!(from_elsewhere.error_code(), Some("admin_cross_origin"));
    assert_eq!(
        get(egressd.admin(), "localhost", "/logging").await.text(),
        "info,egressd=debug\n"
    );
    let logged = poll_within(Duration::from_secs(5), || async {
        egressd.stderr().contains("admin request refused")
    })
    .await
    .is_some();
    assert!(logged, "the refusal is logged: {}", egressd.stderr());

    let bad = admin_post(&egressd, "/logging?level=egressd%3Dloud").await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(
        get(egressd.admin(), "localhost", "/logging").await.text(),
        "info,egressd=debug\n"
    );
    assert_eq!(admin_post(&egressd, "/logging").await.status, 400);
}
