//! gRPC with real peers: a tonic client and the Echo service of `common::grpc`, first talking
//! directly (proving the harness), then through egressd to a Backend of protocol `GRPC` over h2c.
//!
//! Each behaviour is one scenario function run twice: `direct_*` (client → server) and
//! `egressd_*` (client → egressd → server). The `egressd_*` tests are ignored until egressd
//! speaks HTTP/2 upstream; the config they use is the one that work must accept.
//!
//! The client never enforces a deadline itself, and through egressd the server ignores
//! deadlines too ([`Deadlines::Ignore`]), so a `DEADLINE_EXCEEDED` there can only be egressd's.

mod common;

use std::time::{Duration, Instant};

use common::grpc::client::{CallOptions, GrpcClient, StreamOutcome};
use common::grpc::server::{Deadlines, EchoServer};
use common::grpc::{frame, EchoRequest, FAIL, UNARY};
use common::proxy::{ip_backend_speaking, preamble, TestProxy};
use common::tls::{San, TestCa};
use tonic::Code;

/// The authority every call is addressed to; through egressd it routes to the Backend.
const AUTHORITY: &str = "grpc.test";

async fn direct(deadlines: Deadlines) -> (EchoServer, GrpcClient) {
    let server = EchoServer::start(deadlines).await;
    let client = GrpcClient::connect(server.addr, AUTHORITY).await;
    (server, client)
}

/// egressd in front of `server`: a `GRPC` Backend reached over h2c (`tls: InsecureDisable`) and
/// an HTTPRoute sending `grpc.test` to it. The client speaks h2c to egressd's HTTP listener.
async fn via_egressd(deadlines: Deadlines) -> (EchoServer, TestProxy, GrpcClient) {
    let server = EchoServer::start(deadlines).await;
    let proxy = TestProxy::start(&config(&server)).await;
    let client = GrpcClient::connect(proxy.http(), AUTHORITY).await;
    (server, proxy, client)
}

fn config(server: &EchoServer) -> String {
    let route = format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: grpc}}\nspec:\n  hostnames: [{AUTHORITY}]\n  rules: [{{backendRefs: [{{name: echo}}]}}]\n"
    );
    preamble(None) + &ip_backend_speaking("echo", server.addr, "GRPC", "") + &route
}

fn ok_status(outcome: &StreamOutcome) {
    assert_eq!(
        outcome.status.code(),
        Code::Ok,
        "stream ended with {:?}",
        outcome.status
    );
}

// ---- scenarios -------------------------------------------------------------------------------

/// A unary call is echoed, and the server saw the gRPC request headers and custom metadata.
async fn unary_echoes_with_metadata(mut client: GrpcClient, server: &EchoServer) {
    let options = CallOptions {
        timeout: Some(Duration::from_secs(30)),
        metadata: vec![("x-test-meta", "hello".to_owned())],
    };
    let response = client
        .unary(EchoRequest::new("ping"), &options)
        .await
        .expect("unary call succeeds");
    assert_eq!(response.get_ref().message, "ping");

    let rpcs = server.rpcs();
    assert_eq!(rpcs.len(), 1);
    let rpc = &rpcs[0];
    assert_eq!(rpc.path, UNARY);
    assert_eq!(rpc.header("x-test-meta"), Some("hello"));
    assert_eq!(rpc.header("te"), Some("trailers"));
    assert_eq!(rpc.header("content-type"), Some("application/grpc"));
    assert!(rpc.header("grpc-timeout").is_some(), "grpc-timeout arrived");
}

/// Five responses 200 ms apart arrive spread out as they were sent, not in one burst.
async fn server_stream_arrives_spread_over_time(mut client: GrpcClient) {
    const INTERVAL: Duration = Duration::from_millis(200);
    let request = EchoRequest {
        count: 5,
        interval_ms: INTERVAL.as_millis() as u32,
        ..EchoRequest::new("tick")
    };
    let outcome = client.server_stream(request, &CallOptions::default()).await;
    ok_status(&outcome);
    let indices: Vec<u32> = outcome.messages().iter().map(|m| m.index).collect();
    assert_eq!(indices, vec![0, 1, 2, 3, 4]);
    // The server spaces them 4 × 200 ms; a buffering hop would deliver them together. Half of
    // that span leaves room for scheduling jitter and still rules a burst out.
    let first = outcome.arrivals.first().unwrap().at;
    let last = outcome.arrivals.last().unwrap().at;
    let span = last - first;
    assert!(
        span >= INTERVAL * 2,
        "the 5 responses arrived within {span:?} of each other"
    );
}

/// Each message is echoed before the next is sent: the stream is interactive both ways.
async fn bidi_echoes_each_message_before_the_next(mut client: GrpcClient) {
    let mut call = client
        .bidi(&CallOptions::default())
        .await
        .expect("bidi call opens");
    for i in 0..5u32 {
        let text = format!("message {i}");
        call.send(&text).await;
        let echo = call
            .receive()
            .await
            .expect("no error")
            .expect("an echo before the stream ends");
        assert_eq!((echo.message.as_str(), echo.index), (text.as_str(), i));
    }
    let rest = call.finish().await;
    ok_status(&rest);
    assert!(rest.arrivals.is_empty(), "nothing after the half-close");
}

/// An error status reaches the client with its message and custom metadata, both as a
/// trailers-only reply (unary) and as trailers after response messages (server stream).
async fn error_status_carries_the_custom_trailer(mut client: GrpcClient) {
    let status = client
        .unary(EchoRequest::new(FAIL), &CallOptions::default())
        .await
        .expect_err("the server fails the call");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "the test asked for a failure");
    assert_eq!(
        status
            .metadata()
            .get("x-test-trailer")
            .map(|v| v.to_str().unwrap()),
        Some("yes")
    );

    let request = EchoRequest {
        count: 2,
        ..EchoRequest::new(FAIL)
    };
    let outcome = client.server_stream(request, &CallOptions::default()).await;
    assert_eq!(outcome.arrivals.len(), 2, "the messages before the error");
    assert_eq!(outcome.status.code(), Code::InvalidArgument);
    assert_eq!(
        outcome
            .status
            .metadata()
            .get("x-test-trailer")
            .map(|v| v.to_str().unwrap()),
        Some("yes")
    );
}

/// A 200 ms deadline on a call the server would take 2 s over ends as `DEADLINE_EXCEEDED`, long
/// before the 2 s. Returns the status for further checks.
async fn deadline_expires(mut client: GrpcClient) -> tonic::Status {
    let request = EchoRequest {
        sleep_ms: 2000,
        ..EchoRequest::new("slow")
    };
    let started = Instant::now();
    let status = client
        .unary(request, &CallOptions::timeout(Duration::from_millis(200)))
        .await
        .expect_err("the deadline passes first");
    let elapsed = started.elapsed();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        elapsed < Duration::from_millis(1500),
        "ended after {elapsed:?}"
    );
    status
}

/// 100 unary calls at once over one client connection all succeed, overlapping at the server,
/// which accepted a single connection for them all.
async fn hundred_concurrent_calls_share_one_connection(client: GrpcClient, server: &EchoServer) {
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let request = EchoRequest {
                    sleep_ms: 500,
                    ..EchoRequest::new(&format!("call {i}"))
                };
                client.unary(request, &CallOptions::default()).await
            })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        let response = call.await.unwrap().expect("call succeeds");
        assert_eq!(response.get_ref().message, format!("call {i}"));
    }
    assert_eq!(server.rpcs().len(), 100);
    assert!(
        server.max_in_flight() >= 50,
        "only {} calls overlapped at the server",
        server.max_in_flight()
    );
    assert_eq!(server.connection_count(), 1, "one upstream connection");
}

// ---- Part A: the harness, client straight to server ------------------------------------------

#[tokio::test]
async fn direct_unary_echoes_and_the_server_records_its_metadata() {
    let (server, client) = direct(Deadlines::Enforce).await;
    unary_echoes_with_metadata(client, &server).await;
    assert_eq!(server.rpcs()[0].authority.as_deref(), Some(AUTHORITY));
}

#[tokio::test]
async fn direct_server_stream_arrives_spread_over_time() {
    let (_server, client) = direct(Deadlines::Enforce).await;
    server_stream_arrives_spread_over_time(client).await;
}

#[tokio::test]
async fn direct_bidi_echoes_each_message_before_the_next() {
    let (_server, client) = direct(Deadlines::Enforce).await;
    bidi_echoes_each_message_before_the_next(client).await;
}

#[tokio::test]
async fn direct_error_status_carries_the_custom_trailer() {
    let (_server, client) = direct(Deadlines::Enforce).await;
    error_status_carries_the_custom_trailer(client).await;
}

#[tokio::test]
async fn direct_deadline_expires_as_deadline_exceeded() {
    let (_server, client) = direct(Deadlines::Enforce).await;
    deadline_expires(client).await;
}

#[tokio::test]
async fn direct_hundred_concurrent_calls_share_one_connection() {
    let (server, client) = direct(Deadlines::Enforce).await;
    hundred_concurrent_calls_share_one_connection(client, &server).await;
}

#[tokio::test]
async fn direct_unary_over_tls_negotiates_h2() {
    let ca = TestCa::new("grpc-ca");
    let cert = ca.server_cert(&[San::dns(AUTHORITY)]);
    let server = EchoServer::start_tls(Deadlines::Enforce, &cert).await;
    let mut client = GrpcClient::connect_tls(server.addr, AUTHORITY, &ca, AUTHORITY).await;
    let response = client
        .unary(EchoRequest::new("secret"), &CallOptions::default())
        .await
        .expect("unary call over TLS succeeds");
    assert_eq!(response.get_ref().message, "secret");
    assert_eq!(server.connection_count(), 1);
}

// ---- Part B: through egressd ------------------------------------------------------------------

#[tokio::test]
async fn egressd_unary_reaches_the_server_with_grpc_headers() {
    let (server, _proxy, client) = via_egressd(Deadlines::Ignore).await;
    unary_echoes_with_metadata(client, &server).await;
}

#[tokio::test]
async fn egressd_server_stream_is_not_buffered() {
    let (_server, _proxy, client) = via_egressd(Deadlines::Ignore).await;
    server_stream_arrives_spread_over_time(client).await;
}

#[tokio::test]
async fn egressd_bidi_echoes_each_message_before_the_next() {
    let (_server, _proxy, client) = via_egressd(Deadlines::Ignore).await;
    bidi_echoes_each_message_before_the_next(client).await;
}

#[tokio::test]
async fn egressd_error_status_and_custom_trailer_reach_the_client() {
    let (_server, _proxy, client) = via_egressd(Deadlines::Ignore).await;
    error_status_carries_the_custom_trailer(client).await;
}

#[tokio::test]
async fn egressd_ends_a_call_past_its_deadline_as_deadline_exceeded() {
    // Neither the client nor this server enforces deadlines: only egressd can end it early.
    let (_server, _proxy, client) = via_egressd(Deadlines::Ignore).await;
    let status = deadline_expires(client).await;
    assert!(
        status.metadata().get("x-egressd-error").is_some(),
        "egressd's own reply: {status:?}"
    );
}

#[tokio::test]
async fn egressd_multiplexes_hundred_concurrent_calls_on_one_upstream_connection() {
    let (server, _proxy, client) = via_egressd(Deadlines::Ignore).await;
    hundred_concurrent_calls_share_one_connection(client, &server).await;
}

/// A bare HTTP/2 client (no gRPC library, so nothing enforces the deadline on the client side)
/// sends `grpc-timeout: 200m` for a call the server takes 2 s over: egressd itself must answer,
/// in gRPC's shape (HTTP 200, `grpc-status: 4`), well before the server would.
#[tokio::test]
async fn egressd_answers_an_expired_grpc_timeout_with_a_grpc_deadline_reply() {
    let (_server, proxy, _client) = via_egressd(Deadlines::Ignore).await;
    let tcp = tokio::net::TcpStream::connect(proxy.http()).await.unwrap();
    let (h2, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut h2 = h2.ready().await.unwrap();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{AUTHORITY}{UNARY}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "200m")
        .body(())
        .unwrap();
    let body = frame(&EchoRequest {
        sleep_ms: 2000,
        ..EchoRequest::new("slow")
    });

    let started = Instant::now();
    let (response, mut send) = h2.send_request(request, false).unwrap();
    send.send_data(body, true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("a reply within 5 s")
        .expect("response head");
    let (head, mut body) = response.into_parts();
    // A trailers-only reply carries grpc-status in the head; otherwise it is in the trailers.
    let grpc_status = match head.headers.get("grpc-status") {
        Some(status) => status.clone(),
        None => {
            for _ in 0..1000 {
                let Some(chunk) = body.data().await else {
                    break;
                };
                let chunk = chunk.expect("reply body");
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            let trailers = tokio::time::timeout(Duration::from_secs(5), body.trailers())
                .await
                .expect("trailers within 5 s")
                .expect("trailers")
                .expect("a reply with trailers");
            trailers.get("grpc-status").expect("grpc-status").clone()
        }
    };
    let elapsed = started.elapsed();

    assert_eq!(head.status, 200);
    let content_type = head.headers.get("content-type").expect("content-type");
    assert!(
        content_type
            .to_str()
            .unwrap()
            .starts_with("application/grpc"),
        "{content_type:?}"
    );
    assert_eq!(grpc_status, "4", "DEADLINE_EXCEEDED");
    assert!(
        head.headers.contains_key("x-egressd-error"),
        "{:?}",
        head.headers
    );
    assert!(
        elapsed < Duration::from_millis(1500),
        "replied after {elapsed:?}"
    );
}

#[tokio::test]
async fn egressd_ends_a_stream_past_its_deadline_with_status_trailers() {
    // Ten responses 200 ms apart under a 700 ms deadline: the first few arrive, then egressd
    // ends the stream with grpc-status DEADLINE_EXCEEDED in trailers (not a reset stream).
    let (_server, _proxy, mut client) = via_egressd(Deadlines::Ignore).await;
    let request = EchoRequest {
        count: 10,
        interval_ms: 200,
        ..EchoRequest::new("tick")
    };
    let outcome = client
        .server_stream(request, &CallOptions::timeout(Duration::from_millis(700)))
        .await;
    let received = outcome.messages().len();
    assert!(
        (1..10).contains(&received),
        "{received} of 10 messages before the deadline"
    );
    assert_eq!(
        outcome.status.code(),
        Code::DeadlineExceeded,
        "{:?}",
        outcome.status
    );
    assert_eq!(
        outcome
            .status
            .metadata()
            .get("x-egressd-error")
            .map(|v| v.to_str().unwrap()),
        Some("upstream_timeout")
    );
}

#[tokio::test]
async fn egressd_local_replies_to_grpc_calls_are_grpc_statuses() {
    // A call to an authority no Backend declares: 403 for HTTP, PERMISSION_DENIED for gRPC.
    let server = EchoServer::start(Deadlines::Ignore).await;
    let proxy = TestProxy::start(&config(&server)).await;
    let mut client = GrpcClient::connect(proxy.http(), "undeclared.test").await;
    let status = client
        .unary(EchoRequest::new("hi"), &CallOptions::default())
        .await
        .expect_err("refused by egressd");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("undeclared.test"), "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("x-egressd-error")
            .map(|v| v.to_str().unwrap()),
        Some("destination_not_allowed")
    );
}
