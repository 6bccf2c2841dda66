//! The access log: one JSON line per request, written to a file, with the fields operators
//! need (who, where, what, how it went, how long, how much), parsed back here.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::poll_within;
use common::proxy::{fetch, get, ip_backend, preamble, request, route_to, TestProxy};
use common::upstream::{full, Upstream};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "app.test";

use common::proxy::json_lines as lines;

#[tokio::test]
async fn every_request_gets_a_json_line_with_its_fields() {
    // `/big`: 1,000 bytes; `/flaky`: 503 once, then 200 (retried).
    let flaky = Arc::new(AtomicU32::new(0));
    let upstream = Upstream::start_with(move |req: http::Request<hyper::body::Incoming>| {
        let flaky = flaky.clone();
        async move {
            if req.uri().path() == "/chunked" {
                // Read to the end, so the whole body was sent before the response.
                let body = req.into_body().collect().await.unwrap().to_bytes();
                return http::Response::new(full(body.len().to_string()));
            }
            match req.uri().path() {
                "/flaky" if flaky.fetch_add(1, Ordering::SeqCst) == 0 => http::Response::builder()
                    .status(503)
                    .body(full("busy"))
                    .unwrap(),
                "/big" => http::Response::new(full(vec![b'x'; 1000])),
                _ => http::Response::new(full("ok")),
            }
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let retry = "  trafficPolicy:\n    retry: {numRetries: 1, perRetry: {backOff: {baseInterval: 1ms, maxInterval: 2ms}}}\n";
    let yaml = preamble(None).replace(
        "  accessLog:\n    enabled: false\n",
        &format!("  accessLog: {{format: JSON, path: {}}}\n", log.display()),
    ) + &ip_backend("app", upstream.addr, retry)
        + &route_to(HOST, "app");
    assert!(
        yaml.contains("path: "),
        "the preamble's accessLog was replaced"
    );
    let proxy = TestProxy::start(&yaml).await;

    assert_eq!(get(proxy.http(), HOST, "/big").await.status, 200);
    assert_eq!(get(proxy.http(), HOST, "/flaky").await.status, 200);
    let post = request("POST", HOST, "/upload")
        .body(Full::new(Bytes::from_static(b"twelve bytes")))
        .unwrap();
    assert_eq!(fetch(proxy.http(), post).await.status, 200);
    let blocked = get(proxy.http(), "nowhere.test", "/").await;
    assert_eq!(blocked.status, 403);
    // A chunked body declares no length: egressd counts what it sends.
    let mut raw = tokio::net::TcpStream::connect(proxy.http()).await.unwrap();
    raw.write_all(
        b"POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.ends_with("12"),
        "the upstream got all 12 bytes: {answer}"
    );

    assert!(
        poll_within(Duration::from_secs(5), || async { lines(&log).len() == 5 })
            .await
            .is_some(),
        "{:?}",
        lines(&log)
    );
    let all = lines(&log);
    let by_path = |p: &str| all.iter().find(|l| l["path"] == p).cloned().unwrap();

    let big = by_path("/big");
    for field in [
        "time",
        "client",
        "listener",
        "method",
        "authority",
        "protocol",
        "route",
        "backend",
        "endpoint",
    ] {
        assert!(
            big.get(field).is_some_and(|v| !v.is_null()),
            "{field} in {big}"
        );
    }
    assert_eq!(big["method"], "GET");
    assert_eq!(big["authority"], HOST);
    assert_eq!(big["status"], 200);
    assert_eq!(big["backend"], "default/app");
    assert_eq!(big["endpoint"], upstream.addr.to_string());
    assert_eq!(big["attempts"], 1);
    assert_eq!(big["bytes_out"], 1000);
    assert_eq!(big["complete"], true);
    let ttfb = big["upstream_ttfb_ms"].as_f64().unwrap();
    let headers = big["headers_ms"].as_f64().unwrap();
    let total = big["duration_ms"].as_f64().unwrap();
    assert!(ttfb <= headers && headers <= total, "{big}");
    assert!(big["time"].as_str().unwrap().ends_with('Z'));

    assert_eq!(by_path("/flaky")["attempts"], 2, "the retry is counted");
    assert_eq!(by_path("/upload")["bytes_in"], 12);
    assert_eq!(by_path("/chunked")["bytes_in"], 12, "counted, not declared");
    assert_eq!(big["bytes_in"], 0, "a GET without a body");
    let refused = all
        .iter()
        .find(|l| l["authority"] == "nowhere.test")
        .unwrap();
    assert_eq!(refused["error"], "destination_not_allowed");
    assert_eq!(refused["attempts"], 0);
    assert!(refused.get("upstream_ttfb_ms").is_none());
}

#[tokio::test]
async fn the_text_format_writes_one_line_of_fixed_fields_per_request() {
    let upstream = Upstream::start("app").await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = preamble(None).replace(
        "  accessLog:\n    enabled: false\n",
        &format!("  accessLog: {{format: Text, path: {}}}\n", log.display()),
    ) + &ip_backend("app", upstream.addr, "")
        + &route_to(HOST, "app");
    let proxy = TestProxy::start(&yaml).await;
    assert_eq!(get(proxy.http(), HOST, "/a?b=c").await.status, 200);
    let reply = get(proxy.http(), "nowhere.test", "/").await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    let code = reply
        .error_code()
        .expect("an x-egressd-error code")
        .to_owned();

    let text = poll_within(Duration::from_secs(5), || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.lines().count() >= 2).then_some(text)
    })
    .await
    .expect("two lines in the access log");
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    let served = &lines[0];
    assert_eq!(served.len(), 13, "{text}");
    assert_eq!(served[2], "-", "no identity: {text}");
    assert_eq!(served[3], "default/gw/http");
    // The path without its query, as in the JSON format (queries carry tokens).
    assert_eq!(served[4..7].join(" "), format!("\"GET {HOST}/a HTTP/1.1\""));
    assert_eq!(served[7], "200");
    assert_eq!(served[10], "default/app");
    assert_eq!(served[11], upstream.addr.to_string());
    let refused = &lines[1];
    assert_eq!(refused.len(), 13, "{text}");
    assert_eq!(
        (refused[7], refused[8], refused[10], refused[11]),
        ("403", code.as_str(), "-", "-"),
        "{text}"
    );
}
