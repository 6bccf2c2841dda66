//! Opening upstream connections.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::body::RequestBody;
use super::breaker::ConnectionSlot;
use super::h1_conn::{H1Conn, H1Sender};
use super::h2_frames::{FrameWatch, PeerSettings, INITIAL_MAX_STREAMS};
use super::h2_pool::{H2Conn, StreamLimits, STREAM_IDS};
use super::tls::{TlsFailure, TlsOrigination};

/// How connections to a Backend port are made.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    /// Plaintext (`tls.mode: InsecureDisable`).
    Plain,
    /// TLS origination with a config built when the snapshot was compiled.
    Tls(Arc<TlsOrigination>),
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
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
    #[error("{addr} does not speak HTTP/2: {detail}")]
    NotHttp2 { addr: SocketAddr, detail: String },
    /// The server's preface allows no stream at all (`SETTINGS_MAX_CONCURRENT_STREAMS` 0), or
    /// it went away (GOAWAY) before any stream: the connection can carry nothing.
    #[error("{addr} takes no HTTP/2 streams: {detail}")]
    NoStreams { addr: SocketAddr, detail: String },
    #[error("HTTP handshake with {addr} failed: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
}

/// `tcpKeepalive`: probes that notice a dead peer (and keep NAT and firewall state alive)
/// on connections idle for `idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TcpKeepalive {
    pub(crate) idle: Duration,
    pub(crate) interval: Duration,
    pub(crate) probes: u32,
}

impl Default for TcpKeepalive {
    /// Linux's defaults (docs/configuration.md): 7200s idle, 75s between probes, 9 probes.
    fn default() -> Self {
        TcpKeepalive {
            idle: Duration::from_secs(7200),
            interval: Duration::from_secs(75),
            probes: 9,
        }
    }
}

/// Opens a TCP connection like [`connect_tcp`], with keepalive probes when asked for.
pub(crate) async fn connect_tcp_keepalive(
    addr: SocketAddr,
    timeout: Duration,
    keepalive: Option<&TcpKeepalive>,
) -> Result<TcpStream, ConnectError> {
    let stream = connect_tcp(addr, timeout).await?;
    if let Some(k) = keepalive {
        let params = socket2::TcpKeepalive::new()
            .with_time(k.idle)
            .with_interval(k.interval)
            .with_retries(k.probes);
        // Not fatal: the connection works without probes.
        if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&params) {
            tracing::debug!(%addr, error = %e, "could not set TCP keepalive");
        }
    }
    Ok(stream)
}

/// Opens a TCP connection with a deadline, with Nagle disabled (requests are written whole).
pub(crate) async fn connect_tcp(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectError::Timeout { addr, timeout }),
        Ok(Err(source)) => return Err(ConnectError::Io { addr, source }),
        Ok(Ok(stream)) => stream,
    };
    // Not fatal: the connection works without it, only slower for small writes.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Which HTTP version connections to a Backend port speak (from its `protocol` and TLS mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum HttpWire {
    /// HTTP/1.1 (`HTTP11`, or `HTTP` in plaintext).
    Http1,
    /// HTTP/2: over TLS with ALPN `h2` (`HTTP2`, `GRPC`), or h2c with prior knowledge
    /// (`H2C`, and `HTTP2`/`GRPC` with `InsecureDisable`).
    Http2,
    /// `HTTP` over TLS: ALPN offers `h2` and `http/1.1`, the server chooses.
    Negotiated,
}

/// How HTTP/2 connections to a Backend port are set up.
#[derive(Clone, Debug)]
pub(crate) struct Http2Options {
    builder: hyper::client::conn::http2::Builder<TokioExecutor>,
    /// `http2.maxConcurrentStreams` and `http2.maxRequestsPerConnection`.
    pub(crate) limits: StreamLimits,
}

/// The `http2` policy section, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Http2Settings {
    pub(crate) max_concurrent_streams: Option<u32>,
    /// `None`: no cap of our own (only the stream ids a connection has).
    pub(crate) max_requests_per_connection: Option<u32>,
    pub(crate) stream_window: u32,
    pub(crate) connection_window: u32,
    /// PING interval and timeout.
    pub(crate) keepalive: Option<(Duration, Duration)>,
}

/// Streams one upstream HTTP/2 connection carries by default (`http2.maxRequestsPerConnection`):
/// what common servers allow one connection (hypercorn's `keep_alive_max_requests`, nginx's
/// `keepalive_requests`). A server at its cap sends GOAWAY, and some (hypercorn) then never
/// answer the streams they had already taken: a connection egressd retires first never
/// meets that.
pub(crate) const DEFAULT_MAX_REQUESTS_PER_CONNECTION: u32 = 1000;

impl Default for Http2Settings {
    fn default() -> Self {
        Http2Settings {
            max_concurrent_streams: None,
            max_requests_per_connection: Some(DEFAULT_MAX_REQUESTS_PER_CONNECTION),
            stream_window: 2 << 20,
            connection_window: 5 << 20,
            keepalive: None,
        }
    }
}

impl Http2Options {
    pub(crate) fn new(settings: &Http2Settings) -> Self {
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(settings.stream_window)
            .initial_connection_window_size(settings.connection_window)
            .initial_max_send_streams(INITIAL_MAX_STREAMS as usize)
            // Large enough for any header block an upstream sends back (h2's default is 16 MiB
            // of decoded headers; this bounds memory per response).
            .max_header_list_size(256 << 10);
        if let Some((interval, timeout)) = settings.keepalive {
            builder
                .keep_alive_interval(interval)
                .keep_alive_timeout(timeout)
                .keep_alive_while_idle(false);
        }
        Http2Options {
            builder,
            limits: StreamLimits {
                concurrent: settings.max_concurrent_streams.unwrap_or(u32::MAX),
                per_connection: settings.max_requests_per_connection.unwrap_or(STREAM_IDS),
            },
        }
    }
}

impl Default for Http2Options {
    fn default() -> Self {
        Http2Options::new(&Http2Settings::default())
    }
}

/// A new HTTP connection, of the version the server agreed to.
pub(crate) enum HttpConnection {
    Http1(H1Conn),
    Http2(H2Conn),
}

/// What a TLS handshake with an upstream settled on (for the access log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TlsSummary {
    /// `TLSv1.2` or `TLSv1.3`.
    pub(crate) version: &'static str,
    /// `h2`, `http/1.1`, another (`other`), or none.
    pub(crate) alpn: Option<&'static str>,
}

impl TlsSummary {
    fn of(conn: &rustls::ClientConnection) -> TlsSummary {
        TlsSummary {
            version: match conn.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "other",
            },
            alpn: conn.alpn_protocol().map(|p| match p {
                b"h2" => "h2",
                b"http/1.1" => "http/1.1",
                _ => "other",
            }),
        }
    }
}

/// Opens an HTTP connection (TLS when the transport says so): an HTTP/2 one's driver is
/// spawned on the current runtime, an HTTP/1.1 one is driven by whoever uses it. The TLS
/// handshake gets its own `timeout`, after the TCP connect's. `slot` (the circuit breaker's
/// count of open connections) is held until the connection closes. With TLS, also what the
/// handshake settled on.
pub(crate) async fn connect_http(
    addr: SocketAddr,
    timeout: Duration,
    transport: &Transport,
    wire: HttpWire,
    h2: &Http2Options,
    slot: Option<ConnectionSlot>,
    keepalive: Option<&TcpKeepalive>,
) -> Result<(HttpConnection, Option<TlsSummary>), ConnectError> {
    let stream = connect_tcp_keepalive(addr, timeout, keepalive).await?;
    match transport {
        Transport::Plain => match wire {
            HttpWire::Http2 => Ok((
                HttpConnection::Http2(handshake_http2(addr, stream, timeout, h2, slot).await?),
                None,
            )),
            HttpWire::Http1 | HttpWire::Negotiated => Ok((
                HttpConnection::Http1(handshake_http1(addr, stream, slot).await?),
                None,
            )),
        },
        Transport::Tls(tls) => {
            let stream = tls_handshake(addr, stream, timeout, tls, &tls.config).await?;
            let summary = TlsSummary::of(stream.get_ref().1);
            // ALPN decides; a server that chose none gets what the config asked for (HTTP2
            // offered only `h2`, so an HTTP/2 server without ALPN is still spoken to as one).
            let http2 = match stream.get_ref().1.alpn_protocol() {
                Some(b"h2") => true,
                Some(_) => false,
                None => wire == HttpWire::Http2,
            };
            let conn = if http2 {
                HttpConnection::Http2(handshake_http2(addr, stream, timeout, h2, slot).await?)
            } else {
                HttpConnection::Http1(handshake_http1(addr, stream, slot).await?)
            };
            Ok((conn, Some(summary)))
        }
    }
}

/// An HTTP/1.1 connection for a request that asks to switch protocols (websocket): never
/// pooled, and after a `101` handed over with `hyper::upgrade::on(response)`. Over TLS, ALPN
/// offers only `http/1.1`, whatever the port's protocol.
pub(crate) async fn connect_http1_upgradable(
    addr: SocketAddr,
    timeout: Duration,
    transport: &Transport,
    keepalive: Option<&TcpKeepalive>,
) -> Result<H1Sender, ConnectError> {
    let stream = connect_tcp_keepalive(addr, timeout, keepalive).await?;
    match transport {
        Transport::Plain => handshake_upgradable(addr, stream).await,
        Transport::Tls(tls) => {
            let stream = tls_handshake(addr, stream, timeout, tls, &tls.http1_config).await?;
            handshake_upgradable(addr, stream).await
        }
    }
}

async fn tls_handshake(
    addr: SocketAddr,
    stream: TcpStream,
    timeout: Duration,
    tls: &TlsOrigination,
    config: &Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ConnectError> {
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let handshake = connector.connect(tls.server_name(addr), stream);
    match tokio::time::timeout(timeout, handshake).await {
        Err(_) => Err(ConnectError::Tls {
            addr,
            failure: TlsFailure::HandshakeTimeout,
            detail: format!("no handshake within {timeout:?}"),
        }),
        Ok(Err(e)) => {
            let failure = TlsFailure::from_error_chain(&e).unwrap_or(TlsFailure::Other);
            Err(ConnectError::Tls {
                addr,
                failure,
                detail: e.to_string(),
            })
        }
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// hyper's HTTP/1.1 client handshake (nothing is sent: it sets up the two halves).
async fn http1_halves<S>(
    addr: SocketAddr,
    stream: S,
) -> Result<
    (
        H1Sender,
        hyper::client::conn::http1::Connection<TokioIo<S>, RequestBody>,
    ),
    ConnectError,
>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|source| ConnectError::Handshake { addr, source })
}

/// An HTTP/1.1 connection driven by the task that uses it (see `h1_conn`).
async fn handshake_http1<S>(
    addr: SocketAddr,
    stream: S,
    slot: Option<ConnectionSlot>,
) -> Result<H1Conn, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, driver) = http1_halves(addr, stream).await?;
    Ok(H1Conn::new(sender, driver, addr, slot))
}

/// An HTTP/1.1 connection whose driver is a task of its own, so that after a `101` the
/// upgraded stream is handed over through `hyper::upgrade::on`.
async fn handshake_upgradable<S>(addr: SocketAddr, stream: S) -> Result<H1Sender, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1_halves(addr, stream).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(%addr, error = %e, "upstream connection closed with error");
        }
    });
    Ok(sender)
}

/// Why an HTTP/2 connection failed before the server's preface: the TLS refusal when there
/// was one (h2 keeps only the text of I/O errors, so the watch under it notes the TLS error
/// as it goes by); otherwise, as when it closes quietly, a peer that is no HTTP/2 server
/// (an HTTP/1.1 server answering the preface, a reset), with the connection's error.
fn failed_before_preface(addr: SocketAddr, peer: &PeerSettings, e: hyper::Error) -> ConnectError {
    match peer
        .tls_failure()
        .or_else(|| TlsFailure::from_error_chain(&e))
    {
        Some(failure) => ConnectError::Tls {
            addr,
            failure,
            detail: crate::telemetry::error_chain(&e),
        },
        None => ConnectError::NotHttp2 {
            addr,
            detail: format!(
                "the connection failed before the server's HTTP/2 SETTINGS: {}",
                crate::telemetry::error_chain(&e)
            ),
        },
    }
}

/// The HTTP/2 handshake, with the server's frames watched for SETTINGS and GOAWAY (see
/// `h2_frames`).
async fn handshake_http2<S>(
    addr: SocketAddr,
    stream: S,
    timeout: Duration,
    options: &Http2Options,
    slot: Option<ConnectionSlot>,
) -> Result<H2Conn, ConnectError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (io, peer) = FrameWatch::new(stream);
    let (sender, conn) = options
        .builder
        .handshake(TokioIo::new(io))
        .await
        .map_err(|source| ConnectError::Handshake { addr, source })?;
    // The connection's end, if it fails: a connection that fails before the server's
    // preface (a write refused, nothing read) ends the wait below with its reason.
    let (failed, mut failure) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(%addr, error = %e, "upstream HTTP/2 connection closed with error");
            let _ = failed.send(e);
        }
        drop(slot);
    });
    // The server's SETTINGS come first (RFC 9113 §3.4); waiting for them (one round trip,
    // once per connection) means a burst of requests sees the real stream limit and does not
    // open connections it does not need.
    let preface = tokio::select! {
        seen = tokio::time::timeout(timeout, peer.preface()) => seen,
        Ok(e) = &mut failure => return Err(failed_before_preface(addr, &peer, e)),
    };
    match preface {
        // A connection that can carry no stream is useless to the request that opened it;
        // keeping it would have that request wait (or look for another) without end.
        Ok(true) if peer.goaway() => Err(ConnectError::NoStreams {
            addr,
            detail: "the server sent GOAWAY with its preface".into(),
        }),
        Ok(true) if peer.max_concurrent_streams() == 0 => Err(ConnectError::NoStreams {
            addr,
            detail: "the server's SETTINGS_MAX_CONCURRENT_STREAMS is 0".into(),
        }),
        Ok(true) => Ok(H2Conn::new(sender, peer, addr, options.limits)),
        // The connection ended: with an error that says why (a TLS alert, a reset), or
        // quietly.
        Ok(false) => match tokio::time::timeout(timeout, failure).await {
            Ok(Ok(e)) => Err(failed_before_preface(addr, &peer, e)),
            _ => Err(ConnectError::NotHttp2 {
                addr,
                detail: "the server closed the connection instead of sending HTTP/2 SETTINGS"
                    .into(),
            }),
        },
        Err(_) => Err(ConnectError::NotHttp2 {
            addr,
            detail: format!("no HTTP/2 SETTINGS from the server within {timeout:?}"),
        }),
    }
}
