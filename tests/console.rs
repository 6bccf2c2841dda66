//! The admin console at `/`: HTML for a browser, served with a strict Content-Security-Policy
//! and `nosniff`, its script and style as admin paths of their own; the plain-text index for
//! curl. What the page renders is tested in a real browser by tests/console/run (CI).

mod common;

use common::proxy::{get_with_headers, preamble, TestProxy};

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

/// The headers every console response carries.
fn assert_locked_down(r: &common::proxy::Response, what: &str) {
    let csp = r
        .header("content-security-policy")
        .unwrap_or_else(|| panic!("{what}: no Content-Security-Policy"));
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(
            csp.contains(directive),
            "{what}: CSP {csp:?} lacks {directive}"
        );
    }
    assert!(
        !csp.contains("unsafe"),
        "{what}: CSP {csp:?} allows unsafe-*"
    );
    assert_eq!(
        r.header("x-content-type-options"),
        Some("nosniff"),
        "{what}"
    );
}

#[tokio::test]
async fn a_browser_gets_the_console_page_with_a_strict_csp() {
    let proxy = TestProxy::start(&preamble(None)).await;
    let page = get_with_headers(proxy.admin, "localhost", "/", &[("accept", BROWSER_ACCEPT)]).await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert_locked_down(&page, "/");
    assert_eq!(page.header("vary"), Some("accept"));
    let html = page.text();
    assert!(html.contains(r#"<script src="/console.js""#), "{html}");
    assert!(html.contains(r#"href="/console.css""#), "{html}");
    // The CSP forbids inline code: the page would be blank with it.
    assert!(!html.contains("<script>") && !html.contains(" onclick="));

    for (path, content_type) in [
        ("/console.js", "text/javascript"),
        ("/console.css", "text/css"),
    ] {
        let r = get_with_headers(proxy.admin, "localhost", path, &[]).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(content_type),
            "{path}"
        );
        assert_locked_down(&r, path);
    }
}

#[tokio::test]
async fn the_console_script_never_turns_text_into_html() {
    let proxy = TestProxy::start(&preamble(None)).await;
    let js = get_with_headers(proxy.admin, "localhost", "/console.js", &[])
        .await
        .text();
    assert!(js.contains("textContent") && js.contains("createElement"));
    for banned in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
    ] {
        assert!(!js.contains(banned), "console.js uses {banned}");
    }
}

#[tokio::test]
async fn curl_and_format_text_get_the_plain_text_index() {
    let proxy = TestProxy::start(&preamble(None)).await;
    for (path, accept) in [
        ("/", "*/*"),
        ("/", "application/json"),
        ("/?format=text", BROWSER_ACCEPT),
    ] {
        let r = get_with_headers(proxy.admin, "localhost", path, &[("accept", accept)]).await;
        assert_eq!(r.status, 200);
        assert!(
            r.header("content-type").unwrap().starts_with("text/plain"),
            "{path} with Accept {accept}"
        );
        let text = r.text();
        for p in ["/status", "/endpoints", "/blocked", "/metrics"] {
            assert!(text.contains(p), "{path}: {text}");
        }
    }
    // No Accept at all (a bare HTTP client): text too.
    let r = get_with_headers(proxy.admin, "localhost", "/", &[]).await;
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
}

/// What reaches the page from a rejected config quotes the file's text: the console gets
/// markup as data, which its script renders with `textContent` (the browser test checks the
/// rendering; this checks the markup does reach `/status`, so that test means something).
#[tokio::test]
async fn a_rejected_reload_hands_the_console_config_text_verbatim() {
    let proxy = TestProxy::start(&preamble(None)).await;
    let hostile = "<img src=x onerror=alert(1)>";
    proxy.rewrite(&format!(
        "{}---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata:\n  name: evil\nspec:\n  \"{hostile}\": 1\n",
        preamble(None)
    ));
    assert!(proxy.egressd().reload().await.is_err());
    let status: serde_json::Value = serde_json::from_slice(
        &get_with_headers(proxy.admin, "localhost", "/status", &[])
            .await
            .body,
    )
    .unwrap();
    let last = &status["lastReload"];
    assert_eq!(last["result"], "failure");
    let diagnostics = last["diagnostics"].as_array().unwrap();
    assert!(
        diagnostics
            .iter()
            .any(|d| d["message"].as_str().unwrap_or("").contains(hostile)
                && d["line"].as_u64().unwrap_or(0) > 0),
        "{last}"
    );
    assert_eq!(status["generation"], 1, "the old config still serves");
}
