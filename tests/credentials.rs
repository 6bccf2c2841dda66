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

/// A Backend extension whose credential is `secretRef` (the Secret's document follows).
fn secret_config(upstream: std::net::SocketAddr, secret_ref: &str, secret: &str) -> String {
    let extension = format!(
        "  extensions:\n  - name: api-key\n    type: CredentialInjector\n    config: {{header: x-api-key, credential: {{secretRef: {secret_ref}}}}}\n"
    );
    preamble(None) + &ip_backend("api", upstream, &extension) + &route_to(HOST, "api") + secret
}

/// An Opaque Secret `api-key` as `kubectl get secret -o yaml` writes it (`data`, base64).
fn opaque_secret(key: &str, value: &str) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(value);
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: api-key\n  namespace: default\n  resourceVersion: \"4711\"\ntype: Opaque\ndata:\n  {key}: {encoded}\n"
    )
}

#[tokio::test]
async fn a_credential_from_a_secret_is_injected_never_shown_and_follows_the_secret() {
    let upstream = Upstream::start("api").await;
    let proxy = TestProxy::start(&secret_config(
        upstream.addr,
        "{name: api-key}",
        &opaque_secret("credential", "k-123-secret\n"),
    ))
    .await;
    let r = call(&proxy).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(upstream.last_request().headers["x-api-key"], "k-123-secret");
    let dump = get(proxy.admin, "localhost", "/config").await.text();
    assert!(!dump.contains("k-123-secret"), "{dump}");
    assert!(!dump.contains("ay0xMjMtc2VjcmV0"), "nor its base64: {dump}");

    // Another key, named; the Secret edited (as `kubectl apply` would) and reloaded.
    proxy.rewrite(&secret_config(
        upstream.addr,
        "{name: api-key, key: token}",
        &opaque_secret("token", "k-456-secret"),
    ));
    proxy.reload().await;
    assert_eq!(call(&proxy).await.status, 200);
    assert_eq!(upstream.last_request().headers["x-api-key"], "k-456-secret");
}

#[tokio::test]
async fn a_secret_ref_that_cannot_serve_is_an_error_at_the_ref_that_never_quotes_the_value() {
    let upstream = Upstream::start("api").await;
    let proxy = TestProxy::start(&secret_config(
        upstream.addr,
        "{name: api-key}",
        &opaque_secret("credential", "good-one"),
    ))
    .await;
    let generation = proxy.generation();
    let cases = [
        // No such Secret.
        (
            "{name: other}",
            opaque_secret("credential", "x"),
            "Secret default/other not found",
        ),
        // No such key: the keys there are named.
        (
            "{name: api-key}",
            opaque_secret("token", "tok-secret"),
            "has no key `credential`",
        ),
        // A value a header cannot carry.
        (
            "{name: api-key}",
            opaque_secret("credential", "line-one\nline-two-secret"),
            "holds characters a header cannot carry",
        ),
        // Not a Secret.
        (
            "{name: api-key, kind: ConfigMap}",
            opaque_secret("credential", "x"),
            "this field takes a Secret",
        ),
    ];
    for (secret_ref, secret, expected) in cases {
        proxy.rewrite(&secret_config(upstream.addr, secret_ref, &secret));
        assert!(proxy.egressd().reload().await.is_err(), "{secret_ref}");
        let messages = proxy.egressd().shared().reload_status().messages.join("\n");
        assert!(messages.contains(expected), "{secret_ref}: {messages}");
        assert!(
            messages.contains("spec.extensions[0].config.credential.secretRef"),
            "{messages}"
        );
        assert!(
            !messages.contains("secret\n") && !messages.contains("line-two"),
            "{messages}"
        );
        assert!(!messages.contains("tok-secret"), "{messages}");
        // The last good config keeps its credential.
        assert_eq!(proxy.generation(), generation);
        assert_eq!(call(&proxy).await.status, 200);
        assert_eq!(upstream.last_request().headers["x-api-key"], "good-one");
    }
    // Both sources, or neither.
    proxy.rewrite(
        &secret_config(
            upstream.addr,
            "{name: api-key}",
            &opaque_secret("credential", "x"),
        )
        .replace(
            "credential: {secretRef",
            "credential: {valueFile: /nonexistent, secretRef",
        ),
    );
    assert!(proxy.egressd().reload().await.is_err());
    let messages = proxy.egressd().shared().reload_status().messages.join("\n");
    assert!(
        messages.contains("exactly one of valueFile and secretRef"),
        "{messages}"
    );
}
