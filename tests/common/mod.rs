//! Test harness shared by the integration tests (compiled only for tests).
//!
//! | module | what |
//! |---|---|
//! | `upstream` | real hyper upstream servers on 127.0.0.1:0 |
//! | `dns` | a real DNS server on 127.0.0.1:0 answering from a mutable table |
//! | `h2` | HTTP/2 upstreams (hyper h2c, raw h2 refusing streams) and an HTTP/2 client |
//! | `proxy` | an in-process egressd started from YAML written to a temp dir |
//! | `binary` | the built `egressd` binary run as a child process |
//! | `tls` | a test CA minting certificates (rcgen), and a TLS upstream |
//! | `grpc` | a real gRPC Echo server and client (tonic over hyper's HTTP/2) |
//! | `h2frames` | hand-written HTTP/2 frames, for clients no HTTP/2 library would be |
//! | `h2raw` | a hand-driven h2c upstream: a script per connection answers, refuses or drops streams and sends GOAWAY with any last stream id |
//! | `outlier` | Backends of 127.0.0.x endpoints, scripted upstreams, `/endpoints` readers |
//! | `mcp` | rmcp (official MCP SDK) Streamable HTTP servers on 127.0.0.x that record sessions, and a client through egressd |
//! | `python` | venvs of pinned PyPI packages in target/tmp, made on first use; the official MCP Python SDK's server (with an event store) |
//! | `websocket` | a websocket echo server that records its handshakes |
//! | `ports` | ports held by bound sockets: shared by 127.0.0.x servers, or refusing connections |
//! | `redis` | a real `redis-server` (Debian's) on 127.0.0.1: killed, restarted, frozen, TLS, an ACL user |
//!
//! [`eventually`] (and [`poll_within`] under it) is the one way the tests wait for a condition:
//! polled with a deadline, never a sleep.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

pub(crate) mod binary;
pub(crate) mod dns;
pub(crate) mod grpc;
pub(crate) mod h2;
pub(crate) mod h2frames;
pub(crate) mod h2raw;
pub(crate) mod mcp;
pub(crate) mod outlier;
pub(crate) mod ports;
pub(crate) mod proxy;
pub(crate) mod python;
pub(crate) mod redis;
pub(crate) mod tls;
pub(crate) mod upstream;
pub(crate) mod websocket;

/// Pause between two checks of a polled condition.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// What a polled check returns: `true`, or `Some(value)`, once its condition holds.
pub(crate) trait Polled {
    type Value;
    fn value(self) -> Option<Self::Value>;
}

impl Polled for bool {
    type Value = ();
    fn value(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Polled for Option<T> {
    type Value = T;
    fn value(self) -> Option<T> {
        self
    }
}

/// Runs `check` every [`POLL_EVERY`] until it holds (`true` or `Some(value)`) or `timeout` has
/// passed: its value, or `None` when it never held. `check` runs at least once, and once more
/// at or after the deadline. For callers that report the expiry themselves (with a process log
/// or state read afterwards) or try again; [`eventually`] otherwise.
pub(crate) async fn poll_within<F, Fut>(
    timeout: Duration,
    mut check: F,
) -> Option<<Fut::Output as Polled>::Value>
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Polled,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await.value() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`poll_within`] that panics, naming `what` (the condition awaited) and `timeout`, when the
/// condition never held.
pub(crate) async fn eventually<F, Fut>(
    what: &str,
    timeout: Duration,
    check: F,
) -> <Fut::Output as Polled>::Value
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Polled,
{
    match poll_within(timeout, check).await {
        Some(value) => value,
        None => panic!("not within {timeout:?}: {what}"),
    }
}
