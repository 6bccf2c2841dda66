//! The HTTP/2 server side of egressd, seen by raw HTTP/2 clients over h2c (prior knowledge) on
//! an HTTP listener: the SETTINGS it announces follow `ProxyConfig.spec.downstream.http2`
//! (and a reload, for new connections), oversized header blocks are refused without harming
//! the connection, and stream-reset floods (Rapid Reset, MadeYouReset) end the flooding
//! connection with GOAWAY `ENHANCE_YOUR_CALM` while other clients keep being served.

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::h2frames;
use common::proxy::{ip_backend, preamble_with, TestProxy};
use common::upstream::Upstream;
use h2::client::{Connection, SendRequest};
use h2::Reason;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// How long any single step may take before the test fails instead of hanging.
const STEP: Duration = Duration::from_secs(10);

/// A config whose ProxyConfig has `http2` (YAML lines under `downstream.http2`, indented by
/// six spaces) and an HTTPRoute for `h2.test` to `upstream`.
fn config(upstream: SocketAddr, http2: &str) -> String {
    let downstream = if http2.is_empty() {
        String::new()
    } else {
        format!("  downstream:\n    http2:\n{http2}")
    };
    preamble_with(None, &downstream)
        + &ip_backend("app", upstream, "")
        + "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: app}\n\
           spec:\n  hostnames: [h2.test, flood.test]\n  rules: [{backendRefs: [{name: app}]}]\n"
}

type Client = (SendRequest<Bytes>, Connection<TcpStream, Bytes>);

/// An HTTP/2 client connection to `addr` (h2c, prior knowledge).
async fn connect(addr: SocketAddr) -> Client {
    let tcp = TcpStream::connect(addr).await.expect("connect to egressd");
    h2::client::handshake(tcp).await.expect("HTTP/2 handshake")
}

/// Runs `work` while polling `conn`, which must keep being polled for `work` to progress (and
/// stays usable afterwards, to read what the server announced).
async fn driving<T>(conn: &mut Connection<TcpStream, Bytes>, work: impl Future<Output = T>) -> T {
    let run = async {
        tokio::pin!(work);
        tokio::select! {
            out = &mut work => out,
            end = &mut *conn => panic!("egressd ended the connection: {end:?}"),
        }
    };
    tokio::time::timeout(STEP, run).await.expect("in time")
}

/// `GET http://{host}/` with extra headers, on `send`; the status, or the stream's error.
async fn get(
    send: &mut SendRequest<Bytes>,
    host: &str,
    headers: &[(&str, &str)],
) -> Result<http::StatusCode, h2::Error> {
    let mut request = http::Request::get(format!("http://{host}/"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(()).expect("valid request");
    let (response, _) = send.send_request(request, true)?;
    let response = response.await?;
    let status = response.status();
    // Read the body to the end, so the stream is finished on both sides.
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(status)
}

#[tokio::test]
async fn announces_the_configured_settings() {
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(
        upstream.addr,
        "      maxConcurrentStreams: 7\n      initialStreamWindowSize: 40000\n",
    ))
    .await;
    let (mut send, mut conn) = connect(proxy.http()).await;
    // A first exchange: its response comes after egressd's SETTINGS.
    let status = driving(&mut conn, get(&mut send, "h2.test", &[])).await;
    assert_eq!(status.expect("response"), 200);
    assert_eq!(conn.max_concurrent_send_streams(), 7);
    assert!(send.is_extended_connect_protocol_enabled());

    // The stream window: what a new stream may send before egressd grants more (the
    // connection window, 1Mi by default, is larger and does not limit it).
    let window = driving(&mut conn, async {
        let request = http::Request::post("http://h2.test/").body(()).unwrap();
        let (_response, mut stream) = send.send_request(request, false).unwrap();
        stream.reserve_capacity(1 << 20);
        std::future::poll_fn(|cx| stream.poll_capacity(cx))
            .await
            .expect("capacity")
            .expect("no error")
    })
    .await;
    assert_eq!(window, 40000);
}

#[tokio::test]
async fn defaults_are_announced_without_any_setting() {
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let (mut send, mut conn) = connect(proxy.http()).await;
    let status = driving(&mut conn, get(&mut send, "h2.test", &[])).await;
    assert_eq!(status.expect("response"), 200);
    assert_eq!(conn.max_concurrent_send_streams(), 256);
    // SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441 §3): websockets over HTTP/2.
    assert!(send.is_extended_connect_protocol_enabled());
}

#[tokio::test]
async fn oversized_header_block_is_answered_431_and_the_connection_keeps_serving() {
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(upstream.addr, "      maxHeaderListSize: 8Ki\n")).await;
    let (mut send, mut conn) = connect(proxy.http()).await;
    assert_eq!(
        driving(&mut conn, get(&mut send, "h2.test", &[]))
            .await
            .unwrap(),
        200
    );

    let big = "x".repeat(16 * 1024);
    let refused = driving(&mut conn, get(&mut send, "h2.test", &[("x-big", &big)])).await;
    // h2 answers 431 (RFC 9113 §10.5.1) itself, before the request reaches egressd's code,
    // then resets the stream so the client sends no body.
    assert_eq!(
        refused.expect("a response"),
        http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );

    // Just under the limit still goes through, on the same connection.
    let fits = "y".repeat(6 * 1024);
    let status = driving(&mut conn, get(&mut send, "h2.test", &[("x-fits", &fits)])).await;
    assert_eq!(status.unwrap(), 200);
    let seen = upstream.requests();
    assert_eq!(
        seen.len(),
        2,
        "the oversized request never reached the upstream"
    );
    assert!(seen.iter().all(|r| r.headers.get("x-big").is_none()));
}

#[tokio::test]
async fn reload_changes_the_settings_of_new_connections_only() {
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(upstream.addr, "      maxConcurrentStreams: 7\n")).await;
    let (mut old_send, mut old_conn) = connect(proxy.http()).await;
    assert_eq!(
        driving(&mut old_conn, get(&mut old_send, "h2.test", &[]))
            .await
            .unwrap(),
        200
    );
    assert_eq!(old_conn.max_concurrent_send_streams(), 7);

    proxy.rewrite(&config(upstream.addr, "      maxConcurrentStreams: 11\n"));
    proxy.reload().await;

    let (mut new_send, mut new_conn) = connect(proxy.http()).await;
    assert_eq!(
        driving(&mut new_conn, get(&mut new_send, "h2.test", &[]))
            .await
            .unwrap(),
        200
    );
    assert_eq!(new_conn.max_concurrent_send_streams(), 11);

    // The connection from before the reload keeps what it was told, and keeps working.
    assert_eq!(
        driving(&mut old_conn, get(&mut old_send, "h2.test", &[]))
            .await
            .unwrap(),
        200
    );
    assert_eq!(old_conn.max_concurrent_send_streams(), 7);
}

/// Checks that a well-behaved client is served after a flood, and returns how many of the
/// flood's requests reached `upstream`. Counted after that client's exchange, which gives a
/// cancelled request that was still on its way the time to arrive.
async fn still_serves(proxy: &TestProxy, upstream: &Upstream) -> usize {
    let before = upstream.request_count();
    let (mut send, mut conn) = connect(proxy.http()).await;
    let status = driving(&mut conn, get(&mut send, "h2.test", &[])).await;
    assert_eq!(status.expect("a response"), 200);
    let after = upstream.request_count();
    assert!(
        after > before,
        "the well-behaved request reached the upstream"
    );
    after - 1
}

/// Rapid Reset (CVE-2023-44487): open a stream and cancel it at once, as fast as possible.
#[tokio::test]
async fn rapid_reset_flood_ends_with_goaway_enhance_your_calm() {
    const STREAMS: usize = 20_000;
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let (mut send, conn) = connect(proxy.http()).await;
    let conn = tokio::spawn(conn);

    let deadline = Instant::now() + STEP;
    let mut opened = 0;
    while opened < STREAMS && Instant::now() < deadline {
        send = match send.ready().await {
            Ok(send) => send,
            Err(_) => break, // the server's GOAWAY has arrived
        };
        let request = http::Request::get("http://flood.test/").body(()).unwrap();
        let Ok((_response, mut stream)) = send.send_request(request, true) else {
            break;
        };
        stream.send_reset(Reason::CANCEL);
        opened += 1;
        // Let the connection task write (and read the server's frames) now and then; on this
        // single-threaded runtime it runs only when the loop yields.
        if opened % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }

    let end = tokio::time::timeout(STEP, conn)
        .await
        .expect("egressd closes the connection")
        .expect("connection task");
    let err = end.expect_err("the connection ends with an error");
    // Usually the client reads egressd's GOAWAY; but egressd closes the socket right after
    // it, and a client still writing its flood may fail that write (broken pipe, reset)
    // before it reads the GOAWAY. Either way egressd ended the connection; the raw-frame
    // test below reads the GOAWAY itself.
    let goaway =
        err.is_go_away() && err.is_remote() && err.reason() == Some(Reason::ENHANCE_YOUR_CALM);
    let closed = err.get_io().is_some_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        )
    });
    assert!(goaway || closed, "{err:?}");

    let reached = still_serves(&proxy, &upstream).await;
    eprintln!("opened {opened} streams; {reached} reached the upstream");
    assert!(opened < STREAMS, "the flood was stopped before it ended");
    assert!(
        reached < 100,
        "only a handful of the {opened} cancelled requests reached the upstream: {reached}"
    );
}

/// Writes `flood` to a new connection to `proxy` while reading egressd's answers; returns the
/// GOAWAY and how many RST_STREAM frames came before it.
async fn flood_raw(proxy: &TestProxy, flood: Vec<u8>) -> (Goaway, usize) {
    let tcp = TcpStream::connect(proxy.http()).await.unwrap();
    let (mut read, mut write) = tcp.into_split();
    // Written by a task of its own, so that reading egressd's answers never waits for the
    // whole flood to be written (or the other way round). Its write fails once egressd
    // closes the connection, which is expected.
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&flood).await;
        write
    });
    let (goaway, resets) = h2frames::read_until_goaway(&mut read, STEP).await;
    writer.abort();
    let frame = goaway.expect("egressd sends GOAWAY");
    let goaway = Goaway {
        reason: frame.error_code().map(Reason::from),
        last_stream: u32::from_be_bytes(frame.payload[..4].try_into().expect("GOAWAY payload")),
        debug_data: String::from_utf8_lossy(&frame.payload[8..]).into_owned(),
    };
    (goaway, resets)
}

/// What a GOAWAY says.
#[derive(Debug)]
struct Goaway {
    reason: Option<Reason>,
    /// The last stream egressd processed (RFC 9113 §6.8).
    last_stream: u32,
    /// h2 names the limit that was reached here.
    debug_data: String,
}

/// The client stream ids 1, 3, 5, … of a flood of `streams`.
fn stream_ids(streams: u32) -> impl Iterator<Item = u32> {
    (0..streams).map(|i| 2 * i + 1)
}

/// The preface, then `streams` requests, each cancelled right away by the client.
fn rapid_reset_flood(streams: u32) -> Vec<u8> {
    let mut flood = h2frames::PREFACE.to_vec();
    h2frames::empty_settings(&mut flood);
    let block = h2frames::get_block("flood.test");
    let cancel = u32::from(Reason::CANCEL).to_be_bytes();
    for stream in stream_ids(streams) {
        let flags = h2frames::END_HEADERS | h2frames::END_STREAM;
        h2frames::frame(&mut flood, h2frames::HEADERS, flags, stream, &block);
        h2frames::frame(&mut flood, h2frames::RST_STREAM, 0, stream, &cancel);
    }
    flood
}

/// The preface, then `streams` requests, each followed by a WINDOW_UPDATE that overflows the
/// stream's send window: 65535 + (2^31 - 1) is past the largest window, a FLOW_CONTROL_ERROR
/// of that stream only (RFC 9113 §6.9.1), which egressd must answer with RST_STREAM while the
/// request itself is complete (END_STREAM) and may be on its way upstream.
fn made_you_reset_flood(streams: u32) -> Vec<u8> {
    let mut flood = h2frames::PREFACE.to_vec();
    h2frames::empty_settings(&mut flood);
    let block = h2frames::get_block("flood.test");
    for stream in stream_ids(streams) {
        let flags = h2frames::END_HEADERS | h2frames::END_STREAM;
        h2frames::frame(&mut flood, h2frames::HEADERS, flags, stream, &block);
        h2frames::window_update(&mut flood, stream, 0x7fff_ffff);
    }
    flood
}

/// Rapid Reset with hand-written frames, all in one write: the GOAWAY is read for sure, and
/// it comes right after the 21st stream (the default limit is 20).
#[tokio::test]
async fn rapid_reset_flood_of_raw_frames_gets_goaway_too_many_resets() {
    const STREAMS: u32 = 20_000;
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let (goaway, _) = flood_raw(&proxy, rapid_reset_flood(STREAMS)).await;
    assert_eq!(goaway.reason, Some(Reason::ENHANCE_YOUR_CALM), "{goaway:?}");
    assert_eq!(goaway.debug_data, "too_many_resets");
    // At least 21 streams reset before egressd accepted them (stream 41 is the 21st); a few
    // more when the flood is read in several pieces and egressd accepts some in between.
    assert!((41..200).contains(&goaway.last_stream), "{goaway:?}");
    let reached = still_serves(&proxy, &upstream).await;
    assert!(
        reached < 100,
        "{reached} of {STREAMS} requests reached the upstream"
    );
}

#[tokio::test]
async fn max_pending_accept_reset_streams_moves_the_rapid_reset_limit() {
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(
        upstream.addr,
        "      maxPendingAcceptResetStreams: 200\n",
    ))
    .await;
    let (goaway, _) = flood_raw(&proxy, rapid_reset_flood(20_000)).await;
    assert_eq!(goaway.debug_data, "too_many_resets", "{goaway:?}");
    // The 201st reset stream (id 401) is the first one over the limit.
    assert!((401..600).contains(&goaway.last_stream), "{goaway:?}");
}

/// MadeYouReset (CVE-2025-8671) with the defaults: the first 256 streams fill
/// maxConcurrentStreams and are reset for their flow-control error, the next ones are refused
/// (REFUSED_STREAM); h2 counts both toward maxLocalErrorResetStreams (1024).
#[tokio::test]
async fn made_you_reset_flood_ends_with_goaway_enhance_your_calm() {
    const STREAMS: u32 = 5_000;
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(upstream.addr, "")).await;
    let (goaway, resets) = flood_raw(&proxy, made_you_reset_flood(STREAMS)).await;
    assert_eq!(goaway.reason, Some(Reason::ENHANCE_YOUR_CALM), "{goaway:?}");
    // h2's name for the maxLocalErrorResetStreams limit.
    assert_eq!(goaway.debug_data, "too_many_internal_resets");
    assert!(
        resets <= 1024,
        "egressd stops resetting at the limit: {resets}"
    );
    let reached = still_serves(&proxy, &upstream).await;
    assert!(
        reached < STREAMS as usize / 2,
        "the flood was cut short: {reached} of {STREAMS} requests reached the upstream"
    );
}

/// With room for every stream, only the resets egressd makes for the flow-control errors
/// count, and the configured limit decides when the connection ends.
#[tokio::test]
async fn max_local_error_reset_streams_moves_the_made_you_reset_limit() {
    let upstream = Upstream::start("app").await;
    let proxy = TestProxy::start(&config(
        upstream.addr,
        "      maxLocalErrorResetStreams: 100\n      maxConcurrentStreams: 100000\n",
    ))
    .await;
    let (goaway, _) = flood_raw(&proxy, made_you_reset_flood(5_000)).await;
    assert_eq!(goaway.debug_data, "too_many_internal_resets", "{goaway:?}");
    // The 101st stream (id 201) causes the first reset over the limit.
    assert!((201..400).contains(&goaway.last_stream), "{goaway:?}");
    let reached = still_serves(&proxy, &upstream).await;
    assert!(reached < 200, "{reached} requests reached the upstream");
}
