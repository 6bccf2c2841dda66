//! Upstreams that lie or misbehave on purpose: egressd answers the request itself, in bounded
//! time, and the worker that met them keeps serving everyone else.

mod common;

use std::time::Duration;

use common::h2frames::{frame, GOAWAY, SETTINGS};
use common::proxy::{get, ip_backend, ip_backend_speaking, preamble, route_to, TestProxy};
use common::upstream::{RawUpstream, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 §6.5.2).
const MAX_CONCURRENT_STREAMS: u16 = 0x3;

/// The server preface of an HTTP/2 upstream that takes no stream: SETTINGS with
/// `MAX_CONCURRENT_STREAMS = 0`, then (when `goaway`) GOAWAY(last stream 0, NO_ERROR).
fn no_streams_preface(goaway: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut setting = MAX_CONCURRENT_STREAMS.to_be_bytes().to_vec();
    setting.extend_from_slice(&0u32.to_be_bytes());
    frame(&mut out, SETTINGS, 0, 0, &setting);
    if goaway {
        frame(&mut out, GOAWAY, 0, 0, &[0; 8]);
    }
    out
}

/// Reads the client's first bytes (its preface), answers with `preface`, and then either
/// closes (`close`) or keeps the connection open without another word.
async fn answer_preface(mut stream: TcpStream, preface: Vec<u8>, close: bool) {
    let mut buf = [0u8; 1024];
    if stream.read(&mut buf).await.unwrap_or(0) == 0 {
        return;
    }
    let _ = stream.write_all(&preface).await;
    if close {
        let _ = stream.shutdown().await;
    }
    // Read until the client goes: closing with unread bytes would reset the connection
    // before the client has read ours.
    while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {}
}

/// A proxy with Backend `hostile` (H2C to `hostile`) and Backend `good` (HTTP/1.1), a route to
/// each, connect timeout 2s, one worker.
async fn proxy_with(hostile: &RawUpstream, good: &Upstream) -> TestProxy {
    let timeout = "  trafficPolicy:\n    timeout:\n      tcp:\n        connectTimeout: 2s\n";
    let yaml = preamble(None)
        + &ip_backend_speaking("hostile", hostile.addr, "H2C", timeout)
        + &ip_backend("good", good.addr, "")
        + &route_to("hostile.test", "hostile")
        + &route_to("good.test", "good");
    TestProxy::start(&yaml).await
}

/// The hostile request runs while another Backend is asked on the same (only) worker: the
/// other one is served, and the hostile one gets a local reply within the connect timeout.
async fn assert_local_reply_and_worker_free(proxy: &TestProxy, hostile: &RawUpstream) {
    let addr = proxy.http();
    let stuck = tokio::spawn(async move { get(addr, "hostile.test", "/").await });
    common::eventually(
        "egressd never connected to the hostile upstream",
        Duration::from_secs(5),
        || async { hostile.connection_count() > 0 },
    )
    .await;
    let other = tokio::time::timeout(Duration::from_secs(5), get(addr, "good.test", "/"))
        .await
        .expect("a request to another Backend is served while the hostile one is handled");
    assert_eq!(other.status, 200);
    assert_eq!(other.upstream(), Some("good"));

    let reply = tokio::time::timeout(Duration::from_secs(4), stuck)
        .await
        .expect("a local reply within the connect timeout (2s)")
        .expect("request task");
    assert!(
        reply.status == 502 || reply.status == 503,
        "got {} {:?}",
        reply.status,
        reply.text()
    );
    assert!(reply.error_code().is_some(), "{reply:?}");
}

#[tokio::test]
async fn an_http2_upstream_that_allows_no_stream_and_goes_away_gets_a_local_reply() {
    let hostile =
        RawUpstream::start(|stream| answer_preface(stream, no_streams_preface(true), true)).await;
    let good = Upstream::start("good").await;
    let proxy = proxy_with(&hostile, &good).await;
    assert_local_reply_and_worker_free(&proxy, &hostile).await;
}

#[tokio::test]
async fn an_http2_upstream_that_allows_no_stream_and_stays_silent_gets_a_local_reply() {
    let hostile =
        RawUpstream::start(|stream| answer_preface(stream, no_streams_preface(false), false)).await;
    let good = Upstream::start("good").await;
    let proxy = proxy_with(&hostile, &good).await;
    assert_local_reply_and_worker_free(&proxy, &hostile).await;
}
