//! Clients that do not read their responses (issue #31, point 1): while a response waits for
//! its client, hyper stops asking the body for more, so the body's own timers do not run and
//! the upstream connection stays taken. `downstream.sendTimeout` (and the request's deadline
//! and the stream idle timeout) cut such a response anyway: the HTTP/1.1 connection is
//! closed, the HTTP/2 stream reset, the tunnel closed; the upstream connection is released and
//! other clients are served. A stream that is slow because its upstream is slow is not cut.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::eventually;
use common::h2frames::{self, read_frame};
use common::proxy::{get, ip_backend, preamble_with, route_to, TestProxy};
use common::upstream::{full, BoxBody, RawUpstream, Upstream};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "svc.test";
/// Generous: the machine is shared. Without the limits the cut never happens at all.
const WITHIN: Duration = Duration::from_secs(10);
/// The Backend takes two connections at most: two clients that do not read would take both.
const TWO_CONNECTIONS: &str =
    "  trafficPolicy:\n    circuitBreaker: {maxConnections: 2, maxPendingRequests: 1}\n";

/// An upstream answering `/` with a body that never ends and comes as fast as it is taken,
/// `/drip` with two chunks 1.2 s apart, and anything else with `ok`.
async fn upstream() -> Upstream {
    Upstream::start_with(|req| async move {
        let body = match req.uri().path() {
            "/" => endless(),
            "/drip" => drip(),
            _ => full("ok"),
        };
        http::Response::new(body)
    })
    .await
}

fn endless() -> BoxBody {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    let frames =
        futures_util::stream::repeat_with(move || Ok(hyper::body::Frame::data(chunk.clone())));
    http_body_util::StreamBody::new(frames).boxed()
}

fn drip() -> BoxBody {
    let frames = futures_util::stream::unfold(0u8, |sent| async move {
        match sent {
            0 => Some((Ok(hyper::body::Frame::data(Bytes::from_static(b"a"))), 1)),
            1 => {
                tokio::time::sleep(Duration::from_millis(1200)).await;
                Some((Ok(hyper::body::Frame::data(Bytes::from_static(b"b"))), 2))
            }
            _ => None,
        }
    });
    http_body_util::StreamBody::new(frames).boxed()
}

/// A proxy with `downstream` (lines indented by four spaces) as `spec.downstream` and
/// `backend` (lines indented by two spaces) added to Backend `svc`'s spec.
async fn proxy(downstream: &str, upstream: SocketAddr, backend: &str) -> TestProxy {
    let spec = format!("  downstream:\n{downstream}");
    let yaml =
        preamble_with(None, &spec) + &route_to(HOST, "svc") + &ip_backend("svc", upstream, backend);
    TestProxy::start(&yaml).await
}

fn cuts(reason: &str) -> String {
    format!("egressd_downstream_send_timeouts_total{{reason=\"{reason}\"}}")
}

fn metric(proxy: &TestProxy, series: &str) -> f64 {
    proxy.metric(series)
}

/// Sends `GET path` on a new HTTP/1.1 connection and never reads the answer.
async fn never_reading(proxy: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    stream
}

#[tokio::test]
async fn http1_clients_that_never_read_are_cut_at_send_timeout_and_others_are_served() {
    let upstream = upstream().await;
    let proxy = proxy("    sendTimeout: 500ms\n", upstream.addr, TWO_CONNECTIONS).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(never_reading(proxy.http(), "/").await);
    }
    eventually("both upstream connections taken", WITHIN, || async {
        upstream.connection_count() >= 2
    })
    .await;
    // The two responses wait for their clients: cut, and their upstream connections freed.
    eventually("the two unread responses were cut", WITHIN, || async {
        metric(&proxy, &cuts("send_timeout")) >= 2.0
    })
    .await;
    let served = get(proxy.http(), HOST, "/small").await;
    assert_eq!(served.status, 200, "body: {}", served.text());
    assert_eq!(served.text(), "ok");
    // The clients' connections are closed: after what was buffered, the end.
    for mut stream in held {
        let mut buf = vec![0u8; 1 << 20];
        let ended = tokio::time::timeout(WITHIN, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "a cut client connection was not closed");
    }
}

#[tokio::test]
async fn http2_streams_without_window_are_reset_at_send_timeout_and_the_upstream_is_freed() {
    let upstream = upstream().await;
    let proxy = proxy("    sendTimeout: 500ms\n", upstream.addr, TWO_CONNECTIONS).await;
    let mut stream = TcpStream::connect(proxy.http()).await.unwrap();
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: egressd may send no byte of any response body.
    let mut hello = h2frames::PREFACE.to_vec();
    h2frames::frame(&mut hello, h2frames::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]);
    for id in [1, 3] {
        let flags = h2frames::END_STREAM | h2frames::END_HEADERS;
        h2frames::frame(
            &mut hello,
            h2frames::HEADERS,
            flags,
            id,
            &h2frames::get_block(HOST),
        );
    }
    stream.write_all(&hello).await.unwrap();
    let mut reset = Vec::new();
    let found = tokio::time::timeout(WITHIN, async {
        while reset.len() < 2 {
            let Some(frame) = read_frame(&mut stream).await else {
                break;
            };
            assert_ne!(
                frame.kind,
                h2frames::GOAWAY,
                "the connection was closed, not the streams"
            );
            if frame.kind == h2frames::RST_STREAM {
                reset.push(frame.stream);
            }
        }
    })
    .await;
    assert!(found.is_ok(), "streams reset: {reset:?}");
    reset.sort_unstable();
    assert_eq!(reset, [1, 3]);
    assert_eq!(metric(&proxy, &cuts("send_timeout")), 2.0);
    let served = get(proxy.http(), HOST, "/small").await;
    assert_eq!(served.status, 200, "body: {}", served.text());
}

#[tokio::test]
async fn the_stream_idle_timeout_cuts_a_response_its_client_does_not_read() {
    let upstream = upstream().await;
    let backend =
        format!("{TWO_CONNECTIONS}    timeout:\n      http:\n        streamIdleTimeout: 400ms\n");
    // No send timeout: the Backend's own limit must fire although the body is never asked.
    let proxy = proxy("    sendTimeout: 0s\n", upstream.addr, &backend).await;
    let _held = never_reading(proxy.http(), "/").await;
    eventually(
        "the unread response was cut by the stream idle timeout",
        WITHIN,
        || async { metric(&proxy, &cuts("stream_idle_timeout")) >= 1.0 },
    )
    .await;
    assert_eq!(metric(&proxy, &cuts("send_timeout")), 0.0);
}

#[tokio::test]
async fn a_stream_slow_because_its_upstream_is_slow_is_not_cut() {
    let upstream = upstream().await;
    let proxy = proxy("    sendTimeout: 300ms\n", upstream.addr, "").await;
    // 1.2 s between the chunks, four times the send timeout: the client reads all along.
    let response = get(proxy.http(), HOST, "/drip").await;
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "ab");
    assert_eq!(metric(&proxy, &cuts("send_timeout")), 0.0);
}

#[tokio::test]
async fn a_tunnel_whose_client_does_not_read_is_closed_at_send_timeout() {
    // A TCP server that writes as fast as it can to whoever connects.
    let flood = RawUpstream::start(|mut socket: TcpStream| async move {
        let chunk = vec![b'x'; 64 * 1024];
        while socket.write_all(&chunk).await.is_ok() {}
    })
    .await;
    let upstream = upstream().await;
    let spec = "  outboundPolicy: AllowAny\n  undeclaredDestinations: {deniedAddresses: []}\n  downstream:\n    sendTimeout: 500ms\n";
    let yaml =
        preamble_with(None, spec) + &route_to(HOST, "svc") + &ip_backend("svc", upstream.addr, "");
    let proxy = TestProxy::start(&yaml).await;
    let target = format!("127.0.0.1:{}", flood.addr.port());
    let mut tunnel = TcpStream::connect(proxy.http()).await.unwrap();
    let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    tunnel.write_all(connect.as_bytes()).await.unwrap();
    eventually("the unread tunnel was closed", WITHIN, || async {
        metric(&proxy, &cuts("send_timeout")) >= 1.0
    })
    .await;
    drop(tunnel);
}

#[tokio::test]
async fn a_websocket_whose_client_does_not_read_is_closed_at_send_timeout() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    // A websocket server that sends as fast as it can to whoever connects.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                while ws.send(Message::Binary(chunk.clone())).await.is_ok() {}
            });
        }
    });
    let proxy = proxy("    sendTimeout: 500ms\n", addr, "").await;
    let stream = TcpStream::connect(proxy.http()).await.unwrap();
    let (ws, response) = tokio_tungstenite::client_async(format!("ws://{HOST}/"), stream)
        .await
        .expect("websocket handshake through egressd");
    assert_eq!(response.status(), 101);
    // The client reads nothing more.
    eventually("the unread websocket was closed", WITHIN, || async {
        metric(&proxy, &cuts("send_timeout")) >= 1.0
    })
    .await;
    drop(ws);
    server.abort();
}
