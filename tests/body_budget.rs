//! Bodies egressd holds whole (MCP inspection for a tool policy, retry read-ahead) share one
//! process-wide budget (`bufferedBodies.budget`) and must arrive within
//! `bufferedBodies.readTimeout`: clients holding back the last byte of large MCP POSTs cannot
//! grow egressd's memory past it, and are answered in bounded time.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::binary::Egressd;
use common::eventually;
use common::proxy::preamble_with;
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOST: &str = "tools.test";
/// Just under the 4 MiB egressd inspects at most.
const BODY: usize = (4 << 20) - 1024;
const CLIENTS: usize = 40;
/// Bodies the default budget (32 MiB) holds at once.
const HELD: usize = 8;
/// What the held bodies may add to egressd's RSS, documented in docs/operations.md "Limits and
/// hardening": the default 32 MiB budget and 8 MiB for everything else 40 connections cost.
/// Without the budget the same clients held 40 × 4 MiB; with it but each buffer grown by
/// doubling (the old and the new buffer both held while it grew), +46 MiB.
const RSS_GROWTH_BOUND_KIB: u64 = (32 + 8) * 1024;

fn config(upstream: SocketAddr) -> String {
    // The budget is the default one: what users run.
    let spec = "  bufferedBodies: {readTimeout: 8s}\n";
    preamble_with(None, spec)
        + &format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: tools}}\nspec:\n  destination:\n    type: IP\n    ip: {{endpoints: [{{address: {ip}}}]}}\n    ports: [{{number: {port}}}]\n  protocol: MCP\n  tls: {{mode: InsecureDisable}}\n  protocolOptions:\n    mcp: {{tools: {{deny: [rm]}}}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: tools}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: tools}}]}}]\n",
            ip = upstream.ip(),
            port = upstream.port()
        )
}

/// Opens a connection and sends an MCP POST head and all but the last byte of its body.
async fn held_post(proxy: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {BODY}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let body = vec![b' '; BODY - 1];
    // A refused request may be answered (and closed) before the whole body is written.
    let _ = stream.write_all(&body).await;
    stream
}

/// The status line's code of the answer on `stream`, if one comes within `within`.
async fn status(stream: &mut TcpStream, within: Duration) -> Option<u16> {
    let mut head = [0u8; 12];
    match tokio::time::timeout(within, stream.read_exact(&mut head)).await {
        Ok(Ok(_)) => std::str::from_utf8(&head[9..12]).ok()?.parse().ok(),
        _ => None,
    }
}

#[tokio::test]
async fn held_mcp_bodies_stay_within_the_budget_and_time_out() {
    let upstream = Upstream::start("tools").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), config(upstream.addr)).unwrap();
    let egressd = Egressd::spawn(dir.path()).await;
    let proxy = egressd.listener_addr("default/gw/http").await;

    let before = egressd.peak_rss_kib();
    let mut held = Vec::new();
    for _ in 0..CLIENTS {
        held.push(held_post(proxy).await);
    }
    // Eight bodies fit the 32 MiB budget; the others are refused at once: a tool policy cannot
    // let a body pass uninspected.
    let mut refused = 0;
    let mut waiting = Vec::new();
    for mut stream in held {
        match status(&mut stream, Duration::from_millis(500)).await {
            Some(503) => refused += 1,
            Some(other) => panic!("unexpected {other}"),
            None => waiting.push(stream),
        }
    }
    assert_eq!(waiting.len(), HELD, "the budget holds eight 4 MiB bodies");
    assert_eq!(refused, CLIENTS - HELD);
    let overflows = egressd
        .metric("egressd_buffered_body_overflows_total{action=\"no_room\"}")
        .await;
    assert_eq!(overflows, (CLIENTS - HELD) as f64);
    let held_bytes = egressd.metric("egressd_buffered_body_bytes").await;
    assert_eq!(held_bytes, (HELD * BODY) as f64);

    let peak = egressd.peak_rss_kib();
    let growth = peak.saturating_sub(before);
    eprintln!("peak RSS {before} KiB before, {peak} KiB with the bodies held: +{growth} KiB");
    assert!(growth < RSS_GROWTH_BOUND_KIB, "RSS grew by {growth} KiB");

    // The held ones never complete: 408 within the read timeout (8s), and the budget is free.
    for mut stream in waiting {
        assert_eq!(
            status(&mut stream, Duration::from_secs(15)).await,
            Some(408)
        );
    }
    eventually(
        "the budget is given back",
        Duration::from_secs(5),
        || async { egressd.metric("egressd_buffered_body_bytes").await == 0.0 },
    )
    .await;
    assert_eq!(upstream.request_count(), 0, "nothing reached the upstream");
}
