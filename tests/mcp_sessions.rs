//! MCP session affinity without a shared store, against two real HTTP upstreams that behave
//! like stateful MCP servers (each knows only the sessions it issued and answers 404 to
//! others, as the MCP specification requires). The official SDK's own tests are in
//! tests/mcp.rs.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::ports::shared_port;
use common::proxy::{fetch, preamble_with, request, Response, TestProxy};
use common::upstream::{full, Upstream};
use http_body_util::Full;
use tokio::sync::mpsc;

const HOST: &str = "mcp.test";

/// A stateful "MCP server" on 127.0.0.`n`:`port` named `name`: a POST without a session id
/// (initialize) gets a new one in `Mcp-Session-Id`; a request with a session it issued is
/// answered with its name; any other session id gets 404. `GET` with a session answers an
/// event stream; `DELETE` ends the session.
async fn server(n: u8, port: u16, name: &'static str) -> Upstream {
    let issued = Arc::new(Mutex::new(HashSet::new()));
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    Upstream::start_on_with(addr, move |req: http::Request<hyper::body::Incoming>| {
        let issued = issued.clone();
        async move {
            let session = req
                .headers()
                .get("mcp-session-id")
                .map(|v| v.to_str().unwrap().to_owned());
            let builder = http::Response::builder();
            match session {
                None => {
                    // ':' is outside base64url, so it cannot appear in a wrapped id by chance.
                    let id = format!("{name}:{}", fastrand::u32(..));
                    issued.lock().unwrap().insert(id.clone());
                    builder
                        .header("content-type", "application/json")
                        .header("mcp-session-id", id)
                        .body(full(format!(r#"{{"server":"{name}"}}"#)))
                }
                Some(id) if issued.lock().unwrap().contains(&id) => {
                    if req.method() == http::Method::DELETE {
                        issued.lock().unwrap().remove(&id);
                        builder.body(full("session ended"))
                    } else if req.method() == http::Method::GET {
                        builder
                            .header("content-type", "text/event-stream")
                            .body(full(format!("data: {name}\n\n")))
                    } else {
                        builder.body(full(name))
                    }
                }
                Some(_) => builder.status(404).body(full("unknown session")),
            }
            .unwrap()
        }
    })
    .await
}

fn config(endpoints: &[SocketAddr], mcp: &str, proxy_spec: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|a| format!("      - {{address: {}}}\n", a.ip()))
        .collect();
    preamble_with(None, proxy_spec)
        + &format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: tools}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  protocol: MCP\n  tls: {{mode: InsecureDisable}}\n  protocolOptions:\n    mcp: {{{mcp}}}\n  trafficPolicy:\n    loadBalancer: {{type: RoundRobin}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: tools}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: tools}}]}}]\n",
            port = endpoints[0].port()
        )
}

async fn post(proxy: &TestProxy, session: Option<&str>, extra: &[(&str, &str)]) -> Response {
    let mut builder = request("POST", HOST, "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        builder = builder.header("mcp-session-id", s);
    }
    for (k, v) in extra {
        builder = builder.header(*k, *v);
    }
    let body = Full::new(Bytes::from_static(
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
    ));
    fetch(proxy.http(), builder.body(body).unwrap()).await
}

/// Initializes a session; returns the session id egressd handed out and the server's name.
async fn initialize(proxy: &TestProxy) -> (String, String) {
    let r = post(proxy, None, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.header("mcp-session-id").expect("a session id").to_owned();
    (id, r.text())
}

#[tokio::test]
async fn every_request_of_a_session_reaches_the_endpoint_that_issued_it() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let b = server(2, port, "b").await;
    let proxy = TestProxy::start(&config(&[a.addr, b.addr], "path: /mcp", "")).await;

    let mut servers = HashSet::new();
    for _ in 0..4 {
        let (id, init) = initialize(&proxy).await;
        assert!(id.starts_with("egd2."), "wrapped: {id}");
        assert!(!id.contains(':'), "the server's id is not exposed: {id}");
        let name = if init.contains("\"a\"") { "a" } else { "b" };
        servers.insert(name);
        // Round robin would alternate; the session holds every request on its server.
        for _ in 0..6 {
            let r = post(&proxy, Some(&id), &[]).await;
            assert_eq!((r.status.as_u16(), r.text()), (200, name.to_owned()));
        }
        // A GET stream of the session too, marked not to be buffered by proxies in front.
        let get = fetch(
            proxy.http(),
            request("GET", HOST, "/mcp")
                .header("mcp-session-id", &id)
                .header("accept", "text/event-stream")
                .body(Default::default())
                .unwrap(),
        )
        .await;
        assert_eq!(get.status, 200);
        assert_eq!(get.text(), format!("data: {name}\n\n"));
        assert_eq!(get.header("x-accel-buffering"), Some("no"));
    }
    assert_eq!(servers.len(), 2, "sessions were balanced over both servers");
}

/// `id` with the first character of its MAC changed.
fn tampered_mac(id: &str) -> String {
    let (head, mac) = id.rsplit_once('.').unwrap();
    let first = if mac.starts_with('A') { 'B' } else { 'A' };
    format!("{head}.{first}{}", &mac[1..])
}

#[tokio::test]
async fn a_session_id_egressd_did_not_issue_gets_404_so_the_client_reinitializes() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let proxy = TestProxy::start(&config(&[a.addr], "path: /mcp", "")).await;
    let (id, _) = initialize(&proxy).await;
    let before = a.request_count();
    for forged in [
        "a:12345".to_owned(),
        id.replace("egd2.", "egd2.x"),
        id.replace("egd2.", "egd1."),
        tampered_mac(&id),
    ] {
        let r = post(&proxy, Some(&forged), &[]).await;
        assert_eq!(r.status, 404, "{forged}: {}", r.text());
        assert_eq!(r.error_code(), Some("mcp_session_not_found"));
    }
    assert_eq!(a.request_count(), before, "nothing reached the server");
}

#[tokio::test]
async fn a_second_replica_sharing_the_key_file_routes_the_session() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let b = server(2, port, "b").await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("mcp-session.key");
    std::fs::write(
        &key,
        "a shared key of more than thirty-two bytes, for replicas",
    )
    .unwrap();
    let spec = format!("  mcp: {{sessionKeyFile: {}}}\n", key.display());
    let one = TestProxy::start(&config(&[a.addr, b.addr], "", &spec)).await;
    let two = TestProxy::start(&config(&[a.addr, b.addr], "", &spec)).await;
    let (id, init) = initialize(&one).await;
    let name = if init.contains("\"a\"") { "a" } else { "b" };
    for _ in 0..4 {
        let r = post(&two, Some(&id), &[]).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, name.to_owned()));
    }
    // A replica with another key cannot use it: 404, the client starts over.
    let other = TestProxy::start(&config(&[a.addr, b.addr], "", "")).await;
    assert_eq!(post(&other, Some(&id), &[]).await.status, 404);
}

#[tokio::test]
async fn a_protocol_version_other_than_the_backends_gets_400() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let proxy = TestProxy::start(&config(&[a.addr], "version: \"2025-06-18\"", "")).await;
    let r = post(&proxy, None, &[("mcp-protocol-version", "2025-03-26")]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error_code(), Some("mcp_protocol_version"));
    assert_eq!(a.request_count(), 0);
    let r = post(&proxy, None, &[("mcp-protocol-version", "2025-06-18")]).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn a_session_whose_endpoint_is_gone_gets_404() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let b = server(2, port, "b").await;
    let both = config(&[a.addr, b.addr], "", "");
    let proxy = TestProxy::start(&both).await;
    let (id, init) = initialize(&proxy).await;
    let stays = if init.contains("\"a\"") {
        b.addr
    } else {
        a.addr
    };
    // The issuing endpoint leaves the config; the session cannot continue elsewhere.
    proxy.rewrite(&config(&[stays], "", ""));
    proxy.reload().await;
    let r = post(&proxy, Some(&id), &[]).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.error_code(), Some("mcp_session_not_found"));
}

async fn call_tool(proxy: &TestProxy, session: &str, tool: &str) -> Response {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    );
    let request = request("POST", HOST, "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    fetch(proxy.http(), request).await
}

#[tokio::test]
async fn a_denied_tool_call_gets_a_json_rpc_error_and_never_reaches_the_server() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let proxy = TestProxy::start(&config(
        &[a.addr],
        "tools: {allow: [\"read_*\", search], deny: [read_secrets]}",
        "",
    ))
    .await;
    let (id, _) = initialize(&proxy).await;
    let before = a.request_count();
    for tool in ["read_secrets", "delete_everything"] {
        let r = call_tool(&proxy, &id, tool).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.error_code(), Some("mcp_tool_denied"));
        let reply: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(reply["id"], 42);
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
    }
    assert_eq!(
        a.request_count(),
        before,
        "denied calls never reached the server"
    );
    for tool in ["read_file", "search"] {
        let r = call_tool(&proxy, &id, tool).await;
        assert_eq!((r.status.as_u16(), r.text()), (200, "a".to_owned()));
    }
    assert_eq!(a.request_count(), before + 2);
    let metrics = common::proxy::get(proxy.admin, "localhost", "/metrics")
        .await
        .text();
    assert!(
        metrics.contains(r#"egressd_mcp_tool_calls_denied_total{backend="default/tools"} 2"#),
        "{metrics}"
    );
    assert!(metrics
        .contains(r#"egressd_mcp_requests_total{backend="default/tools",reason="tools/call"} 4"#));
    for tool in ["read_secrets", "delete_everything", "read_file", "search"] {
        let series =
            format!(r#"egressd_mcp_tool_calls_total{{backend="default/tools",tool="{tool}"}} 1"#);
        assert!(metrics.contains(&series), "{series} in {metrics}");
    }
}

#[tokio::test]
async fn stateless_routing_balances_every_request() {
    // `sessionRouting: Stateless` (servers that keep no session state, like the 2026-07-28
    // protocol): no wrapping, every request balanced.
    let port = shared_port();
    let a = server(1, port, "a").await;
    let b = server(2, port, "b").await;
    let proxy = TestProxy::start(&config(&[a.addr, b.addr], "sessionRouting: Stateless", "")).await;
    for _ in 0..6 {
        let r = post(&proxy, None, &[]).await;
        let id = r.header("mcp-session-id").unwrap();
        assert!(!id.starts_with("egd2."), "not wrapped: {id}");
    }
    assert_eq!((a.request_count(), b.request_count()), (3, 3));
}

/// A POST whose body has no declared length (HTTP/2 without content-length).
fn unsized_call(tool: &str) -> http::Request<common::h2::ClientBody> {
    use http_body_util::BodyExt;
    let message = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
    );
    // Two frames, so the body cannot be taken whole from the first one.
    let (head, tail) = message.split_at(20);
    let frames = vec![
        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(head.to_owned()))),
        Ok(hyper::body::Frame::data(Bytes::from(tail.to_owned()))),
    ];
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{HOST}/mcp"))
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed())
        .unwrap()
}

/// With a tool policy every call is read, also one without a declared length (which used to
/// stream past uninspected); `Mcp-Method` / `Mcp-Name` that contradict the body get MCP's
/// `-32020` error (400) before the server sees anything; a body over the inspection limit is
/// refused (413) rather than let through unchecked.
#[tokio::test]
async fn the_tool_policy_sees_every_call_and_headers_must_match_the_body() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let proxy = TestProxy::start(&config(&[a.addr], "tools: {deny: [rm]}", "")).await;
    let (id, _) = initialize(&proxy).await;
    let before = a.request_count();

    let mut h2 = common::h2::client(proxy.http()).await;
    let mut refused = unsized_call("rm");
    refused
        .headers_mut()
        .insert("mcp-session-id", id.parse().unwrap());
    let r = common::proxy::collect(h2.send_request(refused).await.unwrap()).await;
    assert_eq!(r.error_code(), Some("mcp_tool_denied"), "{}", r.text());
    let mut allowed = unsized_call("ls");
    allowed
        .headers_mut()
        .insert("mcp-session-id", id.parse().unwrap());
    let r = common::proxy::collect(h2.send_request(allowed).await.unwrap()).await;
    assert_eq!((r.status.as_u16(), r.text()), (200, "a".to_owned()));
    assert_eq!(a.request_count(), before + 1);

    // The headers name an allowed tool, the body the denied one.
    let body = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"rm"}}"#;
    let disguised = request("POST", HOST, "/mcp")
        .header("content-type", "application/json")
        .header("mcp-session-id", &id)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "ls")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = fetch(proxy.http(), disguised).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error_code(), Some("mcp_header_mismatch"));
    let reply: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (reply["id"].clone(), reply["error"]["code"].clone()),
        (9.into(), (-32020).into())
    );
    // Matching headers (the name Base64-wrapped, as SEP-2243 allows) pass.
    let r = fetch(
        proxy.http(),
        request("POST", HOST, "/mcp")
            .header("mcp-session-id", &id)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "=?base64?cm0=?=")
            .body(Full::new(Bytes::from(body)))
            .unwrap(),
    )
    .await;
    assert_eq!(r.error_code(), Some("mcp_tool_denied"), "{}", r.text());

    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"ls","arguments":{{"pad":"{}"}}}}}}"#,
        "x".repeat(5 << 20)
    );
    // Over HTTP/2, where the answer can come before the body is sent (HTTP/1.1 closes the
    // connection under a client still writing).
    let too_large = http::Request::builder()
        .method("POST")
        .uri(format!("http://{HOST}/mcp"))
        .header("mcp-session-id", &id)
        .header("content-length", huge.len())
        .body(common::h2::body(huge))
        .unwrap();
    let r = common::proxy::collect(h2.send_request(too_large).await.unwrap()).await;
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.error_code(), Some("mcp_body_too_large"));
    assert_eq!(
        a.request_count(),
        before + 1,
        "nothing refused reached the server"
    );
}

/// An MCP server on 127.0.0.`n`:`port` answering every POST `200` with a JSON-RPC error of
/// `code` (0: a result), as JSON or, every other time, as an event stream.
async fn answering_json_rpc(n: u8, port: u16, code: i64) -> Upstream {
    let addr = SocketAddr::new([127, 0, 0, n].into(), port);
    let turn = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Upstream::start_on_with(addr, move |_req| {
        let sse = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
        async move {
            let message = match code {
                0 => r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_owned(),
                code => format!(
                    r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":{code},"message":"failed"}}}}"#
                ),
            };
            let builder = http::Response::builder();
            if sse {
                let stream = format!("id: 0\nretry: 100\ndata:\n\nevent: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{{}}}}\n\ndata: {message}\n\n");
                builder
                    .header("content-type", "text/event-stream")
                    .body(full(stream))
            } else {
                builder
                    .header("content-type", "application/json")
                    .body(full(message))
            }
            .unwrap()
        }
    })
    .await
}

/// JSON-RPC internal errors (-32603) inside `200` answers count like 5xx for outlier
/// detection (JSON and event-stream answers alike); a client's mistake (-32602) does not.
#[tokio::test]
async fn json_rpc_internal_errors_inside_200_eject_the_endpoint() {
    let port = shared_port();
    let failing = answering_json_rpc(1, port, -32603).await;
    let picky = answering_json_rpc(2, port, -32602).await;
    let fine = answering_json_rpc(3, port, 0).await;
    let yaml = config(
        &[failing.addr, picky.addr, fine.addr],
        "sessionRouting: Stateless",
        "",
    )
    .replace(
        "    loadBalancer: {type: RoundRobin}\n",
        "    loadBalancer: {type: RoundRobin}\n    healthCheck:\n      passive: {interval: 1h, baseEjectionTime: 1h, consecutive5XxErrors: 3}\n",
    );
    let proxy = TestProxy::start(&yaml).await;
    // One client connection: egressd finishes each answer (and its verdict) before it reads
    // the next request.
    let mut conn = common::proxy::Conn::open(proxy.http()).await;
    for _ in 0..12 {
        let call = request("POST", HOST, "/mcp")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            )))
            .unwrap();
        let r = conn.fetch(call).await;
        assert_eq!(r.status, 200, "answered by the server: {}", r.text());
    }
    assert_eq!(
        failing.request_count(),
        3,
        "ejected at its third internal error"
    );
    assert!(common::outlier::is_ejected(&proxy, "127.0.0.1").await);
    assert!(!common::outlier::is_ejected(&proxy, "127.0.0.2").await);
    assert_eq!(picky.request_count() + fine.request_count(), 9);
    let last = common::outlier::endpoint_state(&proxy, "127.0.0.1").await;
    assert!(
        last["lastFailure"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("-32603")),
        "{last}"
    );
}

/// The statuses MCP servers answer with reach the client unchanged (never replaced by an
/// egressd error), and the headers MCP relies on pass both ways.
#[tokio::test]
async fn mcp_statuses_and_headers_pass_through_unchanged() {
    let port = shared_port();
    let addr = SocketAddr::new([127, 0, 0, 1].into(), port);
    let a = Upstream::start_on_with(
        addr,
        |req: http::Request<hyper::body::Incoming>| async move {
            let status: u16 = req.headers()["x-answer-status"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            http::Response::builder()
                .status(status)
                .header(
                    "www-authenticate",
                    r#"Bearer resource_metadata="https://x/.well-known""#,
                )
                .header("mcp-session-id", "server-session")
                .body(full(format!("answered {status}")))
                .unwrap()
        },
    )
    .await;
    let proxy = TestProxy::start(&config(&[a.addr], "sessionRouting: Stateless", "")).await;
    for status in [202u16, 400, 403, 404, 405, 406, 413, 421] {
        let r = post(
            &proxy,
            Some("client-session"),
            &[
                ("x-answer-status", &status.to_string()),
                ("last-event-id", "7/1"),
                ("origin", "https://app.example"),
                ("authorization", "Bearer t0ken"),
            ],
        )
        .await;
        assert_eq!(r.status.as_u16(), status, "{}", r.text());
        assert_eq!(r.error_code(), None);
        assert_eq!(r.text(), format!("answered {status}"));
        assert!(r.header("www-authenticate").unwrap().starts_with("Bearer "));
        assert_eq!(r.header("mcp-session-id"), Some("server-session"));
        let seen = a.last_request().headers;
        for (name, value) in [
            ("mcp-session-id", "client-session"),
            ("last-event-id", "7/1"),
            ("origin", "https://app.example"),
            ("authorization", "Bearer t0ken"),
            ("accept", "application/json, text/event-stream"),
        ] {
            assert_eq!(seen[name], value, "{name}");
        }
    }
}

/// An event stream's bytes pass untouched (`id:`, `retry:`, comments; no compression, no
/// length added), and a client that goes away ends the upstream stream at once: the server
/// sees its response body dropped.
#[tokio::test]
async fn a_client_that_goes_away_ends_the_upstream_stream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = shared_port();
    let addr = SocketAddr::new([127, 0, 0, 1].into(), port);
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel::<()>();
    struct OnDrop(mpsc::UnboundedSender<()>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    const FIRST: &str = "id: 0/1\nretry: 3000\ndata:\n\n: keep-alive comment\n\n";
    let a = Upstream::start_on_with(addr, move |_req| {
        let guard = OnDrop(dropped_tx.clone());
        async move {
            // The first events, then nothing: a tool still working. The guard lives as long
            // as the body.
            use futures_util::StreamExt;
            let first = futures_util::stream::once(async {
                Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(
                    FIRST.as_bytes(),
                )))
            });
            let events = first
                .chain(futures_util::stream::pending())
                .map(move |frame| {
                    let _alive = &guard;
                    frame
                });
            let body = http_body_util::StreamBody::new(events);
            http::Response::builder()
                .header("content-type", "text/event-stream")
                .body(http_body_util::BodyExt::boxed(body))
                .unwrap()
        }
    })
    .await;
    let proxy = TestProxy::start(&config(&[a.addr], "sessionRouting: Stateless", "")).await;
    let mut client = tokio::net::TcpStream::connect(proxy.http()).await.unwrap();
    let message = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow"}}"#;
    client
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\naccept-encoding: gzip\r\ncontent-length: {}\r\n\r\n{message}",
                message.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&received).contains("keep-alive comment\n\n") {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.read(&mut buf))
            .await
            .expect("the first events within 5 s")
            .unwrap();
        assert!(n > 0, "stream ended early");
        received.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&received).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        !head.contains("content-encoding") && !head.contains("content-length"),
        "{head}"
    );
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(body.contains(FIRST), "bytes untouched: {body:?}");

    drop(client);
    tokio::time::timeout(std::time::Duration::from_secs(5), dropped.recv())
        .await
        .expect("the upstream stream ended within 5 s of the client leaving");
}

/// `DELETE` reaches the endpoint that issued the session and ends it there: the session's next
/// request gets the server's own 404 (not egressd's), so the client starts a new one.
#[tokio::test]
async fn delete_ends_the_session_on_its_endpoint() {
    let port = shared_port();
    let a = server(1, port, "a").await;
    let b = server(2, port, "b").await;
    let proxy = TestProxy::start(&config(&[a.addr, b.addr], "", "")).await;
    let (id, init) = initialize(&proxy).await;
    let name = if init.contains("\"a\"") { "a" } else { "b" };
    let delete = request("DELETE", HOST, "/mcp")
        .header("mcp-session-id", &id)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = fetch(proxy.http(), delete).await;
    assert_eq!(
        (r.status.as_u16(), r.text()),
        (200, "session ended".to_owned())
    );
    for _ in 0..2 {
        let r = post(&proxy, Some(&id), &[]).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.error_code(), None, "the server's own answer");
        assert_eq!(r.text(), "unknown session");
    }
    let issuer = if name == "a" { &a } else { &b };
    assert_eq!(
        issuer.request_count(),
        4,
        "initialize, DELETE and both POSTs"
    );
}
