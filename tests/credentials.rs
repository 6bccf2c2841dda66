//! `CredentialInjector` Backend extensions: the credential from a file replaces what the
//! client sent, follows the file when it is rotated (no restart), never shows in `/config`,
//! and an unreadable credential fails closed (503, nothing sent upstream) unless `failOpen`.

mod common;

use std::time::Duration;

use common::eventually;
use common::proxy::{fetch, get, ip_backend, preamble, request, route_to, ClientBody, TestProxy};
use common::upstream::Upstream;

const HOST: &str = "api.test";

fn config(upstream: std::net::SocketAddr, key: &std::path::Path, extra: &str) -> String {
    let extension = format!(
        "  extensions:\n  - name: api-key\n    type: CredentialInjector{extra}\n    config: {{header: Authorization, prefix: \"Bearer \", credential: {{valueFile: {}}}}}\n",
        key.display()
    );
    preamble(None) + &ip_backend("api", upstream, &extension) + &route_to(HOST, "api")
}

async fn call(proxy: &TestProxy) -> common::proxy::Response {
    let req = request("GET", HOST, "/v1/models")
        .header("authorization", "Bearer app-token")
        .body(ClientBody::default())
        .unwrap();
    fetch(proxy.http(), req).await
}

#[tokio::test]
async fn the_credential_replaces_the_clients_and_follows_its_file() {
    let upstream = Upstream::start("api").await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("api.key");
    std::fs::write(&key, "s3cret-one\n").unwrap();
    let proxy = TestProxy::start_watching(&config(upstream.addr, &key, "")).await;

    let r = call(&proxy).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = upstream.last_request().headers;
    assert_eq!(seen.get_all("authorization").iter().count(), 1);
    assert_eq!(seen["authorization"], "Bearer s3cret-one");

    // Never in the config dump.
    let dump = get(proxy.admin, "localhost", "/config").await.text();
    assert!(!dump.contains("s3cret"), "{dump}");

    // Rotated in place: the next requests carry the new one, no restart.
    std::fs::write(&key, "s3cret-two\n").unwrap();
    eventually(
        "the rotated credential is used",
        Duration::from_secs(10),
        || async {
            call(&proxy).await.status == 200
                && upstream.last_request().headers["authorization"] == "Bearer s3cret-two"
        },
    )
    .await;

    // Gone: fail closed, nothing reaches the upstream.
    std::fs::remove_file(&key).unwrap();
    eventually(
        "an unreadable credential fails closed",
        Duration::from_secs(10),
        || async { call(&proxy).await.status == 503 },
    )
    .await;
    let before = upstream.request_count();
    let r = call(&proxy).await;
    assert_eq!(r.error_code(), Some("credential_unavailable"));
    assert!(!r.text().contains("s3cret"), "{}", r.text());
    assert_eq!(upstream.request_count(), before);
    let status = get(proxy.admin, "localhost", "/status").await.text();
    assert!(
        status.contains("credential of extension api-key"),
        "{status}"
    );
}

#[tokio::test]
async fn fail_open_sends_the_request_without_the_credential_and_overwrite_false_keeps_the_clients()
{
    let upstream = Upstream::start("api").await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-there.key");
    let proxy = TestProxy::start(&config(upstream.addr, &missing, "\n    failOpen: true")).await;
    let r = call(&proxy).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        upstream.last_request().headers["authorization"],
        "Bearer app-token"
    );

    let key = dir.path().join("api.key");
    std::fs::write(&key, "s3cret").unwrap();
    let keep = config(upstream.addr, &key, "").replace(
        "credential: {valueFile",
        "overwrite: false, credential: {valueFile",
    );
    proxy.rewrite(&keep);
    proxy.reload().await;
    call(&proxy).await;
    assert_eq!(
        upstream.last_request().headers["authorization"],
        "Bearer app-token"
    );
    let bare = request("GET", HOST, "/")
        .body(ClientBody::default())
        .unwrap();
    fetch(proxy.http(), bare).await;
    assert_eq!(
        upstream.last_request().headers["authorization"],
        "Bearer s3cret"
    );
}
