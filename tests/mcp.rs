//! MCP through egressd with the official Rust MCP SDK (rmcp) as client and server over the
//! Streamable HTTP transport. The Backends here say `protocol: HTTP`: what works without any
//! MCP-specific handling, plus the session-affinity test `protocol: MCP` has to make pass.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::mcp::{McpClient, McpServer, McpServerOptions, PATH};
use common::ports::shared_port;
use common::proxy::{preamble_with, TestProxy};

const HOST: &str = "mcp.test";

/// A plaintext `protocol: HTTP` Backend `mcp` of the IP endpoints `endpoints` (one shared
/// port), balanced RoundRobin, and an HTTPRoute for [`HOST`] to it.
fn config(endpoints: &[SocketAddr]) -> String {
    config_speaking(endpoints, "HTTP\n")
}

/// [`config`] with `protocol: {protocol}` (the rest of the spec lines may follow it).
fn config_speaking(endpoints: &[SocketAddr], protocol: &str) -> String {
    config_with(endpoints, protocol, "")
}

/// [`config_speaking`] with `proxy_spec` lines in the ProxyConfig (see `preamble_with`).
fn config_with(endpoints: &[SocketAddr], protocol: &str, proxy_spec: &str) -> String {
    let list: String = endpoints
        .iter()
        .map(|a| format!("      - {{address: {}}}\n", a.ip()))
        .collect();
    format!(
        "{preamble}---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: mcp}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{list}    ports: [{{number: {port}}}]\n  protocol: {protocol}  tls: {{mode: InsecureDisable}}\n  trafficPolicy:\n    loadBalancer: {{type: RoundRobin}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: mcp}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: mcp}}]}}]\n",
        preamble = preamble_with(None, proxy_spec),
        port = endpoints[0].port()
    )
}

/// The harness itself, without egressd: what the tests through egressd compare against.
#[tokio::test]
async fn harness_talks_mcp_directly() {
    let server = McpServer::start(1, 0, McpServerOptions::default()).await;
    let client = McpClient::connect(&format!("http://{}{PATH}", server.addr))
        .await
        .expect("initialize");
    assert_eq!(client.whoami().await, server.identity());
    assert_eq!(server.sessions_initialized(), 1);
    client.close().await;
}

#[tokio::test]
async fn initialize_list_and_call_a_tool_through_egressd() {
    let server = McpServer::start(1, 0, McpServerOptions::default()).await;
    let proxy = TestProxy::start(&config(&[server.addr])).await;

    let client = McpClient::connect_via(proxy.http(), HOST)
        .await
        .expect("initialize through egressd");
    let mut tools = client.tool_names().await.expect("tools/list");
    tools.sort();
    assert_eq!(tools, ["count", "echo", "slow_progress", "whoami"]);

    assert_eq!(client.whoami().await, server.identity());
    assert_eq!(
        client
            .call_text("echo", serde_json::json!({"text": "through egressd"}))
            .await
            .unwrap(),
        "through egressd"
    );
    for expected in ["1", "2", "3"] {
        assert_eq!(client.count().await, expected);
    }

    assert_eq!(server.sessions_initialized(), 1);
    let session = server.sessions().remove(0);
    assert_eq!(server.tool_calls_in_session(&session), 5);
    // Every request after initialize carried the session and the negotiated protocol version.
    let requests = server.requests();
    assert!(requests[0].session.is_none(), "initialize has no session");
    for request in &requests[1..] {
        assert_eq!(request.session.as_deref(), Some(session.as_str()));
        assert!(
            request.headers.contains_key("mcp-protocol-version"),
            "{} without MCP-Protocol-Version",
            request.method
        );
    }
    client.close().await;
}

#[tokio::test]
async fn progress_notifications_are_not_buffered() {
    let server = McpServer::start(1, 0, McpServerOptions::default()).await;
    let proxy = TestProxy::start(&config(&[server.addr])).await;
    let mut client = McpClient::connect_via(proxy.http(), HOST)
        .await
        .expect("initialize through egressd");

    let (text, progress) = client
        .slow_progress(5, Duration::from_millis(200))
        .await
        .expect("slow_progress");
    assert_eq!(text, "done 5");
    let steps: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert_eq!(steps, [1.0, 2.0, 3.0, 4.0, 5.0]);
    // Sent 200 ms apart: 800 ms between the first and the last when relayed as they come, about
    // nothing when egressd holds the SSE stream until the call ends.
    let spread = progress[4].at - progress[0].at;
    assert!(
        spread >= Duration::from_millis(600),
        "progress arrived within {spread:?}: buffered"
    );
    client.close().await;
}

/// What an MCP session meets behind a plain `protocol: HTTP` Backend of two endpoints today:
/// RoundRobin sends `notifications/initialized` (the request after initialize) to the endpoint
/// that did not issue the session, which answers 404, and rmcp's client gives up.
#[tokio::test]
async fn without_affinity_a_session_reaches_the_other_endpoint() {
    let port = shared_port();
    let a = McpServer::start(1, port, McpServerOptions::default()).await;
    let b = McpServer::start(2, port, McpServerOptions::default()).await;
    let proxy = TestProxy::start(&config(&[a.addr, b.addr])).await;

    let error = McpClient::connect_via(proxy.http(), HOST)
        .await
        .err()
        .expect("the session breaks on the second endpoint");
    assert!(
        error.to_string().contains("initialized"),
        "fails sending notifications/initialized: {error}"
    );
    let (issuer, other) = if a.sessions_initialized() == 1 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert_eq!(issuer.sessions_initialized(), 1);
    assert_eq!(other.sessions_initialized(), 0);
    let session = issuer.sessions().remove(0);
    assert_eq!(
        other.requests_in_session(&session),
        1,
        "{} got the session's next request",
        other.identity()
    );
}

/// Two endpoints of one `protocol: MCP` Backend: every request of a session must reach the
/// endpoint that issued it (the other answers 404 "session not found"), while new sessions are
/// still balanced over both.
#[tokio::test]
async fn a_session_stays_on_the_endpoint_that_issued_it() {
    let port = shared_port();
    let a = McpServer::start(1, port, McpServerOptions::default()).await;
    let b = McpServer::start(2, port, McpServerOptions::default()).await;
    let protocol = "MCP\n  protocolOptions:\n    mcp: {path: /mcp, transport: StreamableHTTP, sessionRouting: Stateful}\n";
    let proxy = TestProxy::start(&config_speaking(&[a.addr, b.addr], protocol)).await;

    for _ in 0..4 {
        let client = McpClient::connect_via(proxy.http(), HOST)
            .await
            .expect("initialize through egressd");
        let whoami = client.whoami().await;
        for expected in 1..=6 {
            assert_eq!(client.count().await, expected.to_string());
            assert_eq!(client.whoami().await, whoami);
        }
        client.close().await;
    }

    // Closing a session sends DELETE: it reached the endpoint that issued the session, with
    // that server's own session id.
    for server in [&a, &b] {
        let deletes: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| r.method == http::Method::DELETE)
            .collect();
        assert_eq!(
            deletes.len(),
            server.sessions_initialized(),
            "{}",
            server.identity()
        );
        for d in deletes {
            let session = d.session.expect("DELETE names its session");
            assert!(server.sessions().contains(&session), "{session}");
        }
    }

    // Both endpoints issued sessions (RoundRobin still balances initializes), and no endpoint
    // saw a request of a session it did not issue.
    assert!(a.sessions_initialized() >= 1 && b.sessions_initialized() >= 1);
    for (server, other) in [(&a, &b), (&b, &a)] {
        for session in other.sessions() {
            assert_eq!(
                server.requests_in_session(&session),
                0,
                "{} saw requests of {}'s session {session}",
                server.identity(),
                other.identity()
            );
        }
    }
}

/// A tool policy: the denied tool is missing from `tools/list` (the server's event-stream
/// answer is filtered) and calling it anyway is refused without reaching the server.
#[tokio::test]
async fn a_denied_tool_is_hidden_and_refused() {
    let server = McpServer::start(1, 0, McpServerOptions::default()).await;
    let protocol = "MCP\n  protocolOptions:\n    mcp: {tools: {deny: [count]}}\n";
    let proxy = TestProxy::start(&config_speaking(&[server.addr], protocol)).await;
    let client = McpClient::connect_via(proxy.http(), HOST)
        .await
        .expect("initialize through egressd");
    let mut tools = client.tool_names().await.expect("tools/list");
    tools.sort();
    assert_eq!(tools, ["echo", "slow_progress", "whoami"]);
    let session = server.sessions().pop().expect("a session");
    let before = server.tool_calls_in_session(&session);
    let refused = client.call_text("count", serde_json::json!({})).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(server.tool_calls_in_session(&session), before);
    assert_eq!(
        client
            .call_text("echo", serde_json::json!({"text": "allowed"}))
            .await
            .unwrap(),
        "allowed"
    );
}

/// The stateless protocol (2026-07-28): no session, so every request is balanced on its own —
/// with the Backend's default `sessionRouting: Stateful` too; the client's `Mcp-Method` /
/// `Mcp-Name` headers reach the servers, and the tool policy holds.
#[tokio::test]
async fn the_stateless_protocol_balances_every_request() {
    let port = shared_port();
    let a = McpServer::start(1, port, McpServerOptions::default()).await;
    let b = McpServer::start(2, port, McpServerOptions::default()).await;
    let protocol = "MCP\n  protocolOptions:\n    mcp: {tools: {deny: [count]}}\n";
    let proxy = TestProxy::start(&config_speaking(&[a.addr, b.addr], protocol)).await;
    let client = McpClient::connect_stateless_via(proxy.http(), HOST)
        .await
        .expect("server/discover through egressd");
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(client.whoami().await);
    }
    for server in [&a, &b] {
        let served = answers.iter().filter(|w| **w == server.identity()).count();
        assert_eq!(served, 3, "RoundRobin over both endpoints: {answers:?}");
    }
    assert_eq!(a.sessions_initialized() + b.sessions_initialized(), 0);
    let call = a
        .requests()
        .into_iter()
        .chain(b.requests())
        .find(|r| r.headers.get("mcp-name").is_some_and(|n| n == "whoami"))
        .expect("a tools/call with Mcp-Name");
    assert_eq!(call.headers["mcp-method"], "tools/call");
    assert_eq!(call.session, None);

    let calls_before = a.requests().len() + b.requests().len();
    let refused = client.call_text("count", serde_json::json!({})).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(a.requests().len() + b.requests().len(), calls_before);
    let mut tools = client.tool_names().await.expect("tools/list");
    tools.sort();
    assert_eq!(tools, ["echo", "slow_progress", "whoami"]);
}

/// A server ends the event stream of a tool call after its first progress notification (MCP
/// 2025-11-25 lets it; the priming event told the client how to resume). The rmcp client
/// resumes with a GET carrying `Last-Event-ID`, which egressd sends to the endpoint that
/// issued the session (two endpoints, RoundRobin: without affinity it would reach the other
/// one), and the call completes with every notification.
#[tokio::test]
async fn a_stream_the_server_closes_is_resumed_with_last_event_id() {
    let port = shared_port();
    let options = McpServerOptions {
        close_post_streams_after: Some(2),
        sse_retry: Some(Duration::from_millis(50)),
        ..McpServerOptions::default()
    };
    let a = McpServer::start(1, port, options.clone()).await;
    let b = McpServer::start(2, port, options).await;
    let proxy = TestProxy::start(&config_speaking(&[a.addr, b.addr], "MCP\n")).await;
    let mut client = McpClient::connect_via(proxy.http(), HOST)
        .await
        .expect("initialize through egressd");
    let call = client.slow_progress(3, Duration::from_millis(100));
    let Ok(done) = tokio::time::timeout(Duration::from_secs(10), call).await else {
        panic!("no answer; a: {:#?}\nb: {:#?}", a.requests(), b.requests());
    };
    let (text, progress) = done.expect("the call completes on the resumed stream");
    assert!(text.contains('3'), "{text}");
    assert_eq!(progress.len(), 3, "{progress:?}");

    let (issuer, other) = if a.sessions_initialized() == 1 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let session = issuer.sessions().pop().expect("a session");
    let resumed = issuer
        .requests()
        .into_iter()
        .filter(|r| r.method == http::Method::GET && r.headers.contains_key("last-event-id"))
        .count();
    assert!(resumed >= 1, "{:?}", issuer.requests());
    assert_eq!(other.requests_in_session(&session), 0);
    assert_eq!(other.sessions_initialized(), 0);
    client.close().await;
}

/// Two rmcp servers on 127.0.0.1 and .2 (one port) and a `protocol: MCP` config for them whose
/// ProxyConfig names a session key file (in the returned directory, kept while it lives).
async fn two_servers_with_key_file() -> (McpServer, McpServer, tempfile::TempDir, String) {
    let port = shared_port();
    let a = McpServer::start(1, port, McpServerOptions::default()).await;
    let b = McpServer::start(2, port, McpServerOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("mcp-session.key");
    std::fs::write(
        &key,
        "a key of more than thirty-two bytes, shared by egressds",
    )
    .unwrap();
    let spec = format!("  mcp: {{sessionKeyFile: {}}}\n", key.display());
    let yaml = config_with(&[a.addr, b.addr], "MCP\n", &spec);
    (a, b, dir, yaml)
}

/// egressd restarts (a new process would generate a new key: the session key file is what
/// makes sessions outlive it) on the same address; the client's session goes on, on the
/// endpoint that issued it, its per-session counter intact.
#[tokio::test]
async fn a_session_keeps_working_after_egressd_restarts() {
    let (a, b, _key_dir, yaml) = two_servers_with_key_file().await;
    // The first egressd's listener takes an ephemeral port; the second is given that port.
    let before = TestProxy::start(&yaml).await;
    let listen = before.http().port();
    let yaml = yaml.replace("port: 0", &format!("port: {listen}"));
    let client = McpClient::connect_via(before.http(), HOST)
        .await
        .expect("initialize through egressd");
    for n in 1..=3 {
        let counted = client.count().await;
        assert_eq!(counted, n.to_string());
    }
    // The client's GET stream is still open: cut at the drain timeout, as in any restart.
    before.shutdown().await;

    let after = TestProxy::start(&yaml).await;
    assert_eq!(after.http().port(), listen);
    for n in 4..=6 {
        let counted = client
            .call_text("count", serde_json::json!({}))
            .await
            .expect("the session survives the restart");
        assert_eq!(counted, n.to_string());
    }
    assert_eq!(a.sessions_initialized() + b.sessions_initialized(), 1);
}

/// `yaml` (from [`config_speaking`]) with `healthCheck.active: {active}`.
fn with_active_check(yaml: String, active: &str) -> String {
    let balancer = "    loadBalancer: {type: RoundRobin}\n";
    assert!(yaml.contains(balancer));
    yaml.replace(
        balancer,
        &format!("{balancer}    healthCheck:\n      active: {active}\n"),
    )
}

/// `"state"` of the active check of the endpoint on `ip` in `/endpoints`.
async fn check_state(proxy: &TestProxy, ip: &str) -> String {
    let all = common::proxy::get(proxy.admin, "localhost", "/endpoints").await;
    let all: serde_json::Value = serde_json::from_slice(&all.body).expect("JSON");
    let endpoint = all["backends"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["address"].as_str().unwrap().starts_with(ip))
        .cloned()
        .expect("endpoint listed");
    endpoint["activeHealth"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// `healthCheck.active.type: MCP`: an rmcp server passes (initialize, initialized, ping, and
/// the session deleted again); an HTTP server that answers 200 but speaks no MCP fails and
/// gets no traffic.
#[tokio::test]
async fn mcp_health_checks_ping_and_leave_no_session_behind() {
    let port = shared_port();
    let mcp = McpServer::start(1, port, McpServerOptions::default()).await;
    let not_mcp = common::upstream::Upstream::start_on_with(
        SocketAddr::new([127, 0, 0, 2].into(), port),
        |_req| async { http::Response::new(common::upstream::full("ok")) },
    )
    .await;
    let yaml = with_active_check(
        config_speaking(&[mcp.addr, not_mcp.addr], "MCP\n"),
        "{type: MCP, interval: 100ms, unhealthyThreshold: 1}",
    );
    let proxy = TestProxy::start(&yaml).await;
    let settled = common::poll_within(Duration::from_secs(5), || async {
        check_state(&proxy, "127.0.0.1").await == "healthy"
            && check_state(&proxy, "127.0.0.2").await == "unhealthy"
    })
    .await
    .is_some();
    assert!(
        settled,
        "{} / {}",
        check_state(&proxy, "127.0.0.1").await,
        check_state(&proxy, "127.0.0.2").await
    );

    let seen: Vec<_> = mcp.requests().iter().map(|r| r.method.clone()).collect();
    let first = &seen[..4];
    assert_eq!(
        first,
        [
            http::Method::POST,
            http::Method::POST,
            http::Method::POST,
            http::Method::DELETE
        ]
    );
    let session = mcp
        .sessions()
        .first()
        .cloned()
        .expect("the check's session");
    let deleted = mcp
        .requests()
        .iter()
        .any(|r| r.method == http::Method::DELETE && r.session.as_deref() == Some(&session));
    assert!(deleted, "the check ended its session");

    let before = not_mcp.request_count();
    let client = McpClient::connect_via(proxy.http(), HOST)
        .await
        .expect("initialize");
    for _ in 0..4 {
        assert_eq!(client.whoami().await, mcp.identity());
    }
    // Only checks reach the server that is not MCP (one every 100 ms at most).
    assert!(
        not_mcp.request_count() - before <= 3 * 6,
        "traffic went to it"
    );
}

/// For the stateless protocol (`version: 2026-07-28`) the check is one self-contained `ping`.
#[tokio::test]
async fn a_stateless_mcp_health_check_is_one_ping() {
    let mcp = McpServer::start(1, 0, McpServerOptions::default()).await;
    let protocol = "MCP\n  protocolOptions:\n    mcp: {version: \"2026-07-28\"}\n";
    let yaml = with_active_check(
        config_speaking(&[mcp.addr], protocol),
        "{type: MCP, interval: 100ms}",
    );
    let proxy = TestProxy::start(&yaml).await;
    let passed = common::poll_within(Duration::from_secs(5), || async {
        check_state(&proxy, "127.0.0.1").await == "healthy"
    })
    .await
    .is_some();
    assert!(passed, "{}", check_state(&proxy, "127.0.0.1").await);
    let first = mcp.requests().first().cloned().expect("the check");
    assert_eq!(first.headers["mcp-method"], "ping");
    assert_eq!(first.headers["mcp-protocol-version"], "2026-07-28");
    assert_eq!(mcp.sessions_initialized(), 0);
}

/// A TCP balancer in front of egressd replicas (as a Kubernetes Service is): each new
/// connection goes to the next replica in turn.
async fn round_robin_tcp(replicas: Vec<SocketAddr>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut next = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            let replica = replicas[next % replicas.len()];
            next += 1;
            tokio::spawn(async move {
                if let Ok(mut upstream) = tokio::net::TcpStream::connect(replica).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    addr
}

/// Two egressd replicas sharing the session key file behind a TCP balancer; the rmcp client
/// opens a new connection for every request, so its requests alternate between the replicas,
/// and every one of them still reaches the endpoint that issued the session.
#[tokio::test]
async fn a_session_works_through_replicas_sharing_the_key() {
    let (a, b, _key_dir, yaml) = two_servers_with_key_file().await;
    let one = TestProxy::start(&yaml).await;
    let two = TestProxy::start(&yaml).await;
    let front = round_robin_tcp(vec![one.http(), two.http()]).await;

    let client = McpClient::connect_via_fresh_connections(front, HOST)
        .await
        .expect("initialize through the replicas");
    let whoami = client.whoami().await;
    for n in 1..=6 {
        let counted = client.count().await;
        assert_eq!(counted, n.to_string());
        assert_eq!(client.whoami().await, whoami);
    }
    let served = |p: &TestProxy| p.egressd().shared().metrics.requests.get();
    assert!(
        served(&one) >= 3 && served(&two) >= 3,
        "both replicas served the session"
    );
    assert_eq!(a.sessions_initialized() + b.sessions_initialized(), 1);
}

/// A server that speaks another protocol version than the Backend's `version`: the rmcp
/// client's first request after `initialize` carries the negotiated version, gets 400 from
/// egressd, and the session fails at once instead of misbehaving later.
#[tokio::test]
async fn a_protocol_version_mismatch_fails_the_rmcp_session_with_400() {
    let server = McpServer::start(1, 0, McpServerOptions::default()).await;
    let protocol = "MCP\n  protocolOptions:\n    mcp: {version: \"2025-03-26\"}\n";
    let proxy = TestProxy::start(&config_speaking(&[server.addr], protocol)).await;
    let connected = McpClient::connect_via(proxy.http(), HOST).await;
    assert!(connected.is_err(), "the session must not start");
    let seen = server.requests();
    assert_eq!(
        seen.len(),
        1,
        "only initialize (which has no version header) got through: {seen:?}"
    );
}

/// Two MCP Backends behind one route with weighted backendRefs (50/50), as a newcomer writes a
/// blue/green pair: each session stays with the Backend and server that issued it, whatever
/// the weights pick per request; DELETE reaches it too. Dropping a Backend from the route ends
/// its sessions with a 404 that says so, and the client initializes anew on the other.
#[tokio::test]
async fn a_session_stays_with_its_backend_across_weighted_backend_refs() {
    let blue = McpServer::start(1, 0, McpServerOptions::default()).await;
    let green = McpServer::start(2, 0, McpServerOptions::default()).await;
    let backend = |name: &str, addr: SocketAddr| {
        format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: {name}}}\nspec:\n  destination:\n    type: IP\n    ip: {{endpoints: [{{address: {}}}]}}\n    ports: [{{number: {}}}]\n  protocol: MCP\n  protocolOptions:\n    mcp: {{path: /mcp, sessionRouting: Stateful}}\n  tls: {{mode: InsecureDisable}}\n",
            addr.ip(),
            addr.port()
        )
    };
    let route = |refs: &str| {
        format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: mcp}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{refs}]}}]\n")
    };
    let base =
        preamble_with(None, "") + &backend("blue", blue.addr) + &backend("green", green.addr);
    let both = base.clone() + &route("{name: blue, weight: 50}, {name: green, weight: 50}");
    let proxy = TestProxy::start_watching(&both).await;

    let mut clients = Vec::new();
    // At least six sessions, and until both Backends issued some: over 50/50 refs, six all on
    // one Backend happen once in 32 runs, 48 once in 2^47.
    while clients.len() < 6 || blue.sessions_initialized() == 0 || green.sessions_initialized() == 0
    {
        assert!(
            clients.len() < 48,
            "48 sessions over 50/50 backendRefs all went to one Backend"
        );
        let client = McpClient::connect_via(proxy.http(), HOST)
            .await
            .expect("initialize through egressd");
        let whoami = client.whoami().await;
        for expected in 1..=5 {
            assert_eq!(client.count().await, expected.to_string());
            assert_eq!(client.whoami().await, whoami);
        }
        clients.push((client, whoami));
    }

    // Green leaves the route: its sessions get 404 naming why (clients start over on blue);
    // blue's carry on.
    proxy.rewrite(&(base + &route("{name: blue}")));
    proxy.reload().await;
    for (client, whoami) in clients {
        if whoami == blue.identity() {
            assert_eq!(client.whoami().await, whoami);
            client.close().await;
        } else {
            // egressd answers 404 for the old session; the SDK initializes a new one, which
            // the route now gives to blue.
            let answer = client.call_text("whoami", serde_json::json!({})).await;
            assert_eq!(
                answer.ok(),
                Some(blue.identity()),
                "a green client after green left"
            );
        }
    }
    let direct = common::proxy::request("POST", HOST, PATH)
        .header("mcp-session-id", green_session_id(&green).await)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(common::proxy::ClientBody::from(
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ))
        .unwrap();
    let r = common::proxy::fetch(proxy.http(), direct).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.error_code(), Some("mcp_session_not_found"));
    assert!(
        r.text().contains("Backend default/green port")
            && r.text().contains("no longer a backend of"),
        "{}",
        r.text()
    );

    // Every DELETE reached the server that issued the session.
    for server in [&blue, &green] {
        for d in server
            .requests()
            .into_iter()
            .filter(|r| r.method == http::Method::DELETE)
        {
            let session = d.session.expect("DELETE names its session");
            assert!(server.sessions().contains(&session), "{session}");
        }
    }
    // No server saw a request of a session another one issued.
    for (server, other) in [(&blue, &green), (&green, &blue)] {
        for session in other.sessions() {
            assert_eq!(server.requests_in_session(&session), 0);
        }
    }
}

/// A session id `green` issued as egressd hands it out: made through a second egressd whose
/// route has only green (same process, so the same session key).
async fn green_session_id(green: &McpServer) -> String {
    let yaml = preamble_with(None, "")
        + &format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: green}}\nspec:\n  destination:\n    type: IP\n    ip: {{endpoints: [{{address: {}}}]}}\n    ports: [{{number: {}}}]\n  protocol: MCP\n  protocolOptions:\n    mcp: {{path: /mcp, sessionRouting: Stateful}}\n  tls: {{mode: InsecureDisable}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: mcp}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: green}}]}}]\n",
            green.addr.ip(),
            green.addr.port()
        );
    let other = TestProxy::start(&yaml).await;
    let init = common::proxy::request("POST", HOST, PATH)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(common::proxy::ClientBody::from(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        ))
        .unwrap();
    let r = common::proxy::fetch(other.http(), init).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("mcp-session-id").expect("a session id").to_owned()
}

/// The official Python SDK's server with an event store (every answer an event stream with a
/// priming event): the MCP health check passes, and every check ends its session with DELETE;
/// an rmcp client reaches it through egressd too.
#[tokio::test]
async fn mcp_health_checks_pass_on_the_python_sdk_server_and_end_their_sessions() {
    let python = common::python::PythonMcpServer::start().await;
    let yaml = with_active_check(
        config_speaking(&[python.addr], "MCP\n"),
        "{type: MCP, interval: 100ms, unhealthyThreshold: 1, healthyThreshold: 1}",
    );
    let proxy = TestProxy::start(&yaml).await;
    // Several checks in a row passed: the state stays healthy and DELETEs pile up.
    let settled = common::poll_within(Duration::from_secs(10), || async {
        check_state(&proxy, "127.0.0.1").await == "healthy" && python.stats().await.2 >= 5
    })
    .await
    .is_some();
    let endpoints = common::proxy::get(proxy.admin, "localhost", "/endpoints").await;
    assert!(settled, "{}", endpoints.text());
    assert!(
        !endpoints.text().contains("\"fail\""),
        "no check failed: {}",
        endpoints.text()
    );
    // Every check's session was deleted, but for the one in flight.
    let (sessions, initializes, deletes) = python.stats().await;
    assert!(
        sessions <= 1 && initializes <= deletes + 1,
        "{sessions} sessions open, {initializes} initialized, {deletes} deleted"
    );

    let client = McpClient::connect_via(proxy.http(), HOST)
        .await
        .expect("initialize through egressd");
    assert_eq!(client.whoami().await, "python-reference");
    client.close().await;
}
