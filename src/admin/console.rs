//! The admin console: one HTML page at `/` (with its script and style at `/console.js` and
//! `/console.css`) that polls `/status`, `/endpoints`, `/blocked` and `/metrics` and shows
//! them at a glance. Static text embedded in the binary: no build step, no external assets,
//! nothing computed here; the page only reads what the JSON endpoints already answer.
//!
//! The page is served with a strict `Content-Security-Policy` (scripts and styles only from
//! the admin server itself, no inline script, no framing) and `X-Content-Type-Options:
//! nosniff`; the script builds its DOM with `createElement`/`textContent` only, so config
//! error messages that quote the config's text render as text.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;

/// The page, its script and its style.
const INDEX_HTML: &str = include_str!("console/index.html");
const CONSOLE_JS: &str = include_str!("console/console.js");
const CONSOLE_CSS: &str = include_str!("console/console.css");

/// Nothing but the admin server's own script, style and JSON; no inline code, no framing.
pub(super) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The plain-text index `/` answers clients that do not ask for HTML (curl) and
/// `/?format=text`.
pub(super) const TEXT_INDEX: &str = "egressd admin: /ready /healthz /config /status /endpoints \
     /blocked /metrics /logging; console: open / in a browser\n";

/// The console's asset at `path`, if it is one.
pub(super) fn asset(path: &str) -> Option<Response<Full<Bytes>>> {
    let (body, content_type) = match path {
        "/console.js" => (CONSOLE_JS, "text/javascript; charset=utf-8"),
        "/console.css" => (CONSOLE_CSS, "text/css; charset=utf-8"),
        _ => return None,
    };
    Some(page(body, content_type))
}

/// `/`: the HTML page for a browser (an `Accept` naming `text/html`), unless `?format=text`;
/// the plain-text index otherwise.
pub(super) fn index<B>(req: &Request<B>) -> Response<Full<Bytes>> {
    let text_asked = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "format=text"));
    let html_asked = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"));
    let mut r = if html_asked && !text_asked {
        page(INDEX_HTML, "text/html; charset=utf-8")
    } else {
        super::text(StatusCode::OK, TEXT_INDEX)
    };
    // Which of the two depends on `Accept`: a cache in between must not mix them up.
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept"));
    r
}

fn page(body: &'static str, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, accept: Option<&str>) -> Response<Full<Bytes>> {
        let mut req = Request::get(path);
        if let Some(a) = accept {
            req = req.header(header::ACCEPT, a);
        }
        index(&req.body(()).unwrap())
    }

    fn content_type(r: &Response<Full<Bytes>>) -> &str {
        r.headers()[header::CONTENT_TYPE].to_str().unwrap()
    }

    #[test]
    fn browsers_get_the_page_and_curl_the_text_index() {
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert!(content_type(&get("/", Some(browser))).starts_with("text/html"));
        assert!(content_type(&get("/", Some("*/*"))).starts_with("text/plain"));
        assert!(content_type(&get("/", None)).starts_with("text/plain"));
        assert!(content_type(&get("/?format=text", Some(browser))).starts_with("text/plain"));
    }

    #[test]
    fn the_script_never_parses_html_from_strings() {
        for banned in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!CONSOLE_JS.contains(banned), "console.js uses {banned}");
        }
        assert!(
            !INDEX_HTML.contains("<script>"),
            "no inline script: the CSP forbids it"
        );
        assert!(
            !INDEX_HTML.contains(" style="),
            "no inline style: the CSP forbids it"
        );
    }
}
