//! TLS Passthrough listeners: the ClientHello is read (without terminating TLS) within
//! `headerReadTimeout`, and the connection goes through the pipeline's phases like every kind
//! of traffic (`http::pipeline::passthrough`): routed by SNI, judged, admitted, relayed to an
//! endpoint starting with the ClientHello itself.

use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::sni::{peek_client_hello, Peek, MAX_HELLO};
use crate::http::error::{HelloRejection, ProxyError};
use crate::http::pipeline::passthrough::{Arrival, ClientHello};
use crate::http::pipeline::ConnInfo;
use crate::snapshot::shared::Shared;

/// Serves one connection. The ClientHello must be complete by `hello_deadline`
/// (`headerReadTimeout` after accept).
pub(super) async fn serve(
    mut client: TcpStream,
    info: &ConnInfo,
    shared: &Arc<Shared>,
    hello_deadline: Option<Instant>,
) {
    let arrival = Arrival::now();
    let mut bytes = Vec::with_capacity(1024);
    let hello = match super::conn::within(hello_deadline, read_hello(&mut client, &mut bytes)).await
    {
        None => {
            super::conn::timed_out(shared, info, super::watchdog::Expiry::HeaderRead);
            Err(HelloRejection::Timeout)
        }
        Some(Err(reason)) => Err(HelloRejection::NotTls(reason)),
        Some(Ok(None)) => Err(HelloRejection::NoSni),
        Some(Ok(Some(sni))) => Ok(ClientHello { bytes, sni }),
    };
    let hello = hello.map_err(ProxyError::ClientHello);
    crate::http::pipeline::passthrough::serve(shared, info, arrival, client, hello).await;
}

/// Reads until the ClientHello is complete; returns its SNI.
async fn read_hello(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<String>, &'static str> {
    loop {
        match peek_client_hello(buf) {
            Peek::Hello(sni) => return Ok(sni),
            Peek::Invalid(reason) => return Err(reason),
            Peek::NeedMore => {}
        }
        if buf.len() > MAX_HELLO + 16 * 1024 {
            return Err("ClientHello too large");
        }
        let mut chunk = [0u8; 4096];
        match client.read(&mut chunk).await {
            Ok(0) => return Err("connection closed before the ClientHello was complete"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err("read error before the ClientHello was complete"),
        }
    }
}
