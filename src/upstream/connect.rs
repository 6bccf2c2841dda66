//! Opening upstream connections.

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::pool::H1Sender;

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect to {addr} timed out after {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("connect to {addr} failed: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP/1.1 handshake with {addr} failed: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
}

/// Opens a TCP connection with a deadline, with Nagle disabled (requests are written whole).
pub async fn connect_tcp(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectError::Timeout { addr, timeout }),
        Ok(Err(source)) => return Err(ConnectError::Io { addr, source }),
        Ok(Ok(stream)) => stream,
    };
    // Not fatal: the connection works without it, only slower for small writes.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Opens a plaintext HTTP/1.1 connection and spawns its driver on the current runtime.
pub async fn connect_http1(addr: SocketAddr, timeout: Duration) -> Result<H1Sender, ConnectError> {
    let stream = connect_tcp(addr, timeout).await?;
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|source| ConnectError::Handshake { addr, source })?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(%addr, error = %e, "upstream connection closed with error");
        }
    });
    Ok(sender)
}
