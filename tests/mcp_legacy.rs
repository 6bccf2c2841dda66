//! The legacy HTTP+SSE transport of MCP 2024-11-05 (`transport: SSE`) through egressd, against
//! two servers that behave like the SDKs' legacy servers: `GET /sse` opens an event stream
//! whose first event announces where to POST messages (`/messages?sessionId=…` relative, like
//! the TypeScript SDK, or an absolute URL with `session_id`, like the Python one); a POST
//! for a session the server holds is accepted (202) and answered on that stream; any other
//! session gets 404.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::ports::shared_port;
use common::proxy::{fetch, preamble, request, Conn, TestProxy};
use common::upstream::{full, Upstream};
use http_body_util::{BodyExt, Full};
use tokio::sync::mpsc;

const HOST: &str = "legacy.test";

type Streams = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Bytes>>>>;

/// A legacy MCP server on 127.0.0.`n`:`port` named `name`; `absolute`: announce an absolute
/// URL with `session_id` (else a relative one with `sessionId`).
async fn legacy_server(n: u8, port: u16, name: &'static str, absolute: bool) -> Upstream {
    let streams: Streams = Arc::default();
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    Upstream::start_on_with(addr, move |req: http::Request<hyper::body::Incoming>| {
        let streams = streams.clone();
        async move {
            let query = req.uri().query().unwrap_or_default().to_owned();
            match (req.method().clone(), req.uri().path()) {
                (http::Method::GET, "/sse") => {
                    let id = format!("{name}-{}", fastrand::u32(..));
                    let (tx, rx) = mpsc::unbounded_channel();
                    let announced = if absolute {
                        format!("http://{addr}/messages?session_id={id}")
                    } else {
                        format!("/messages?sessionId={id}")
                    };
                    tx.send(Bytes::from(format!(
                        "event: endpoint\ndata: {announced}\n\n"
                    )))
                    .unwrap();
                    streams.lock().unwrap().insert(id, tx);
                    let events = futures_util::stream::unfold(rx, |mut rx| async move {
                        let event = rx.recv().await?;
                        Some((Ok::<_, std::io::Error>(hyper::body::Frame::data(event)), rx))
                    });
                    http::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(http_body_util::StreamBody::new(events).boxed())
                        .unwrap()
                }
                (http::Method::POST, "/messages") => {
                    let session = query
                        .split('&')
                        .find_map(|p| {
                            p.strip_prefix("sessionId=")
                                .or_else(|| p.strip_prefix("session_id="))
                        })
                        .unwrap_or_default()
                        .to_owned();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let message: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let stream = streams.lock().unwrap().get(&session).cloned();
                    match stream {
                        Some(tx) => {
                            let answer = serde_json::json!({
                                "jsonrpc": "2.0",
                                "id": message["id"],
                                "result": {"server": name, "session": session},
                            });
                            let _ =
                                tx.send(Bytes::from(format!("event: message\ndata: {answer}\n\n")));
                            http::Response::builder().status(202).body(full("Accepted"))
                        }
                        None => http::Response::builder()
                            .status(404)
                            .body(full("Could not find session")),
                    }
                    .unwrap()
                }
                _ => http::Response::builder()
                    .status(404)
                    .body(full("not here"))
                    .unwrap(),
            }
        }
    })
    .await
}

fn config(endpoints: &[SocketAddr], mcp: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|a| format!("      - {{address: {}}}\n", a.ip()))
        .collect();
    preamble(None)
        + &format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: legacy}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  protocol: MCP\n  tls: {{mode: InsecureDisable}}\n  protocolOptions:\n    mcp: {{transport: SSE{mcp}}}\n  trafficPolicy:\n    loadBalancer: {{type: RoundRobin}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: legacy}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: legacy}}]}}]\n",
            port = endpoints[0].port()
        )
}

/// An open legacy event stream through egressd.
struct EventStream {
    body: hyper::body::Incoming,
    buffered: String,
    _conn: Conn,
}

impl EventStream {
    async fn open(proxy: &TestProxy) -> EventStream {
        let mut conn = Conn::open(proxy.http()).await;
        let get = request("GET", HOST, "/sse")
            .header("accept", "text/event-stream")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = conn.send(get).await.expect("the stream opens");
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-accel-buffering"], "no");
        EventStream {
            body: response.into_body(),
            buffered: String::new(),
            _conn: conn,
        }
    }

    /// The next event, whole (its lines without the blank one).
    async fn next(&mut self) -> String {
        loop {
            if let Some(end) = self.buffered.find("\n\n") {
                let event = self.buffered[..end].to_owned();
                self.buffered.drain(..end + 2);
                return event;
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .expect("an event within 5 s")
                .expect("the stream goes on")
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.buffered.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    async fn data(&mut self) -> String {
        let event = self.next().await;
        event
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no data in {event:?}"))
            .to_owned()
    }
}

async fn post_message(proxy: &TestProxy, url: &str, message: &str) -> common::proxy::Response {
    let post = request("POST", HOST, url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(message.to_owned())))
        .unwrap();
    fetch(proxy.http(), post).await
}

/// Two streams land on the two servers (round robin); each announces its message URL through
/// egressd (the absolute one made relative), and every message posted there reaches the
/// server holding that stream, its answer arriving on the stream. A forged or foreign session
/// gets 404 without reaching a server.
#[tokio::test]
async fn messages_reach_the_server_that_holds_their_stream() {
    let port = shared_port();
    let a = legacy_server(1, port, "a", false).await;
    let b = legacy_server(2, port, "b", true).await;
    let proxy = TestProxy::start(&config(&[a.addr, b.addr], "")).await;

    let mut seen = Vec::new();
    for _ in 0..2 {
        let mut stream = EventStream::open(&proxy).await;
        let first = stream.next().await;
        assert!(first.starts_with("event: endpoint\n"), "{first:?}");
        let url = first
            .lines()
            .nth(1)
            .unwrap()
            .strip_prefix("data: ")
            .unwrap()
            .to_owned();
        assert!(
            url.starts_with("/messages?"),
            "relative, through egressd: {url}"
        );
        assert!(url.contains("=egd2."), "the session is wrapped: {url}");
        let mut server = None;
        for id in 1..=3 {
            // Round robin would alternate: only affinity keeps the messages on one server.
            let r = post_message(
                &proxy,
                &url,
                &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
            )
            .await;
            assert_eq!(r.status, 202, "{}", r.text());
            let answer: serde_json::Value = serde_json::from_str(&stream.data().await).unwrap();
            assert_eq!(answer["id"], id);
            let name = answer["result"]["server"].as_str().unwrap().to_owned();
            assert_eq!(*server.get_or_insert(name.clone()), name);
            assert!(
                !url.contains(answer["result"]["session"].as_str().unwrap()),
                "the server's id is not shown"
            );
        }
        seen.push(server.unwrap());
    }
    seen.sort();
    assert_eq!(seen, ["a", "b"]);

    let before = a.request_count() + b.request_count();
    for url in [
        "/messages?sessionId=egd2.Zm9yZ2Vk.AAAAAAAAAAAAAAAAAAAAAA",
        "/messages?session_id=egd2.x",
    ] {
        let r = post_message(&proxy, url, r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#).await;
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.error_code(), Some("mcp_session_not_found"));
    }
    assert_eq!(a.request_count() + b.request_count(), before);
}

/// With a tool policy a denied call is refused as a request (403: the legacy transport
/// answers on the stream, so a JSON-RPC error in the POST's answer would leave the client
/// waiting) and never reaches the server.
#[tokio::test]
async fn a_denied_tool_call_is_refused_as_a_request() {
    let port = shared_port();
    let a = legacy_server(1, port, "a", false).await;
    let proxy = TestProxy::start(&config(&[a.addr], ", tools: {deny: [rm]}")).await;
    let mut stream = EventStream::open(&proxy).await;
    let url = stream.data().await;
    let before = a.request_count();
    let call = |tool: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"{tool}"}}}}"#)
    };
    let r = post_message(&proxy, &url, &call("rm")).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error_code(), Some("mcp_tool_denied"));
    assert_eq!(a.request_count(), before);
    let r = post_message(&proxy, &url, &call("ls")).await;
    assert_eq!(r.status, 202);
    let answer: serde_json::Value = serde_json::from_str(&stream.data().await).unwrap();
    assert_eq!(answer["id"], 5);
}
