//! Opening upstream connections.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::pool::H1Sender;
use super::tls::{TlsFailure, TlsOrigination};

/// How connections to a Backend port are made.
#[derive(Clone, Debug)]
pub enum Transport {
    /// Plaintext (`tls.mode: InsecureDisable`).
    Plain,
    /// TLS origination with a config built when the snapshot was compiled.
    Tls(Arc<TlsOrigination>),
}

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
    #[error("TLS handshake with {addr} failed: {}: {detail}", failure.code())]
    Tls {
        addr: SocketAddr,
        failure: TlsFailure,
        detail: String,
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

/// Opens an HTTP/1.1 connection (TLS when the transport says so) and spawns its driver on the
/// current runtime. The TLS handshake gets its own `timeout`, after the TCP connect's.
pub async fn connect_http1(
    addr: SocketAddr,
    timeout: Duration,
    transport: &Transport,
) -> Result<H1Sender, ConnectError> {
    connect(addr, timeout, transport, false).await
}

/// Like [`connect_http1`], for a request that asks to switch protocols (websocket): the
/// connection is never pooled, and after a `101` it is handed over with
/// `hyper::upgrade::on(response)`.
pub async fn connect_http1_upgradable(
    addr: SocketAddr,
    timeout: Duration,
    transport: &Transport,
) -> Result<H1Sender, ConnectError> {
    connect(addr, timeout, transport, true).await
}

async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    transport: &Transport,
    upgrades: bool,
) -> Result<H1Sender, ConnectError> {
    let stream = connect_tcp(addr, timeout).await?;
    match transport {
        Transport::Plain => handshake_http1(addr, stream, upgrades).await,
        Transport::Tls(tls) => {
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            let handshake = connector.connect(tls.server_name(addr), stream);
            let stream = match tokio::time::timeout(timeout, handshake).await {
                Err(_) => {
                    return Err(ConnectError::Tls {
                        addr,
                        failure: TlsFailure::HandshakeTimeout,
                        detail: format!("no handshake within {timeout:?}"),
                    })
                }
                Ok(Err(e)) => {
                    let failure = TlsFailure::from_error_chain(&e).unwrap_or(TlsFailure::Other);
                    return Err(ConnectError::Tls {
                        addr,
                        failure,
                        detail: e.to_string(),
                    });
                }
                Ok(Ok(stream)) => stream,
            };
            handshake_http1(addr, stream, upgrades).await
        }
    }
}

async fn handshake_http1<S>(
    addr: SocketAddr,
    stream: S,
    upgrades: bool,
) -> Result<H1Sender, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|source| ConnectError::Handshake { addr, source })?;
    tokio::spawn(async move {
        let result = if upgrades {
            conn.with_upgrades().await
        } else {
            conn.await
        };
        if let Err(e) = result {
            tracing::debug!(%addr, error = %e, "upstream connection closed with error");
        }
    });
    Ok(sender)
}
