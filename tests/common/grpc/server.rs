//! The Echo server: hyper's HTTP/2 server in front of a service shaped like tonic-build's
//! generated code, recording connections and RPCs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tonic::codec::Streaming;
use tonic::server::{NamedService, ServerStreamingService, StreamingService, UnaryService};
use tonic::Status;
use tonic_prost::ProstCodec;
use tower_service::Service;

use super::super::tls::{provider, CertAndKey};
use super::{
    failure, BoxFuture, EchoRequest, EchoResponse, BIDI, FAIL, SERVER_STREAM, SERVICE, UNARY,
};

/// Whether the server stops a `Unary` call when its `grpc-timeout` passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadlines {
    /// Answer `DEADLINE_EXCEEDED` when the deadline passes during the sleep (as grpc-go does).
    Enforce,
    /// Sleep the full `sleep_ms` whatever the deadline: only something in between (the proxy)
    /// can then end the call early.
    Ignore,
}

/// One RPC as the server received it.
#[derive(Clone, Debug)]
pub(crate) struct Rpc {
    /// Which accepted connection carried it (0 for the first).
    pub(crate) connection: usize,
    /// The request path, e.g. [`UNARY`].
    pub(crate) path: String,
    /// The `:authority` it arrived with.
    pub(crate) authority: Option<String>,
    /// Every request header (custom metadata, `grpc-timeout`, `te`, `content-type`...).
    pub(crate) headers: http::HeaderMap,
}

impl Rpc {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }
}

struct ServerState {
    deadlines: Deadlines,
    connections: AtomicUsize,
    rpcs: Mutex<Vec<Rpc>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// Counts a `Unary` call as in flight until dropped.
struct InFlight<'a>(&'a ServerState);

impl<'a> InFlight<'a> {
    fn enter(state: &'a ServerState) -> InFlight<'a> {
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(state)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The Echo service on 127.0.0.1:0, HTTP/2 only: h2c by prior knowledge, or TLS with ALPN `h2`.
pub(crate) struct EchoServer {
    pub(crate) addr: SocketAddr,
    state: Arc<ServerState>,
    accept: JoinHandle<()>,
}

impl EchoServer {
    /// Plaintext HTTP/2 (h2c, prior knowledge).
    pub(crate) async fn start(deadlines: Deadlines) -> EchoServer {
        Self::start_with(deadlines, None).await
    }

    /// HTTP/2 over TLS with `cert`, ALPN `h2`.
    pub(crate) async fn start_tls(deadlines: Deadlines, cert: &CertAndKey) -> EchoServer {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("default protocol versions")
            .with_no_client_auth()
            .with_single_cert(cert.cert_chain(), cert.private_key())
            .expect("server certificate and key");
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::start_with(deadlines, Some(acceptor)).await
    }

    async fn start_with(
        deadlines: Deadlines,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> EchoServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind gRPC server");
        let addr = listener.local_addr().expect("gRPC server local addr");
        let state = Arc::new(ServerState {
            deadlines,
            connections: AtomicUsize::new(0),
            rpcs: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, tls, state.clone()));
        EchoServer {
            addr,
            state,
            accept,
        }
    }

    /// TCP connections accepted so far.
    pub(crate) fn connection_count(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Every RPC received, in order of arrival.
    pub(crate) fn rpcs(&self) -> Vec<Rpc> {
        self.state.rpcs.lock().unwrap().clone()
    }

    /// The most `Unary` calls that were running at once.
    pub(crate) fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        // The accept task owns the listener and the connection tasks: aborting it stops all.
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<ServerState>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let service = EchoService {
                    connection: state.connections.fetch_add(1, Ordering::SeqCst),
                    state: state.clone(),
                };
                match tls.clone() {
                    None => connections.spawn(serve(stream, service)),
                    Some(acceptor) => connections.spawn(async move {
                        // A failed handshake is the client's business; the count above stands.
                        if let Ok(stream) = acceptor.accept(stream).await {
                            serve(stream, service).await;
                        }
                    }),
                };
            }
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve<IO>(io: IO, service: EchoService)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let mut service = service.clone();
        async move { service.call(request).await }
    });
    // Errors are the client going away, which is not this server's business.
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), service)
        .await;
}

type EchoStream = Pin<Box<dyn Stream<Item = Result<EchoResponse, Status>> + Send + 'static>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The Echo service of one connection, shaped like tonic-build's generated server: a
/// `tower::Service` routing by path to one `tonic::server::Grpc` call per method.
#[derive(Clone)]
struct EchoService {
    connection: usize,
    state: Arc<ServerState>,
}

impl NamedService for EchoService {
    const NAME: &'static str = SERVICE;
}

impl<B> Service<http::Request<B>> for EchoService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.state.rpcs.lock().unwrap().push(Rpc {
            connection: self.connection,
            path: request.uri().path().to_owned(),
            authority: request.uri().authority().map(|a| a.to_string()),
            headers: request.headers().clone(),
        });
        let state = self.state.clone();
        match request.uri().path() {
            UNARY => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(UnarySvc(state), request).await)
            }),
            SERVER_STREAM => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.server_streaming(ServerStreamSvc, request).await)
            }),
            BIDI => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.streaming(BidiSvc, request).await)
            }),
            path => {
                let status = Status::unimplemented(format!("{} has no method {path}", Self::NAME));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

struct UnarySvc(Arc<ServerState>);

impl UnaryService<EchoRequest> for UnarySvc {
    type Response = EchoResponse;
    type Future = BoxFuture<tonic::Response<EchoResponse>, Status>;

    fn call(&mut self, request: tonic::Request<EchoRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move { unary(&state, request).await })
    }
}

async fn unary(
    state: &ServerState,
    request: tonic::Request<EchoRequest>,
) -> Result<tonic::Response<EchoResponse>, Status> {
    let _in_flight = InFlight::enter(state);
    let deadline = match state.deadlines {
        Deadlines::Enforce => request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| parse_grpc_timeout(v.to_str().ok()?)),
        Deadlines::Ignore => None,
    };
    let request = request.into_inner();
    let work = tokio::time::sleep(Duration::from_millis(request.sleep_ms.into()));
    match deadline {
        Some(deadline) => {
            if tokio::time::timeout(deadline, work).await.is_err() {
                return Err(Status::deadline_exceeded(
                    "the deadline passed during the sleep",
                ));
            }
        }
        None => work.await,
    }
    if request.message == FAIL {
        return Err(failure());
    }
    Ok(tonic::Response::new(EchoResponse {
        message: request.message,
        index: 0,
    }))
}

/// A `grpc-timeout` value: at most 8 digits and a unit (gRPC over HTTP/2, "Timeout").
pub(crate) fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

struct ServerStreamSvc;

impl ServerStreamingService<EchoRequest> for ServerStreamSvc {
    type Response = EchoResponse;
    type ResponseStream = EchoStream;
    type Future = BoxFuture<tonic::Response<EchoStream>, Status>;

    /// `count` responses `interval_ms` apart (the first at once); a `fail` request then ends
    /// with [`failure`] in the trailers instead of OK.
    fn call(&mut self, request: tonic::Request<EchoRequest>) -> Self::Future {
        let request = request.into_inner();
        let interval = Duration::from_millis(request.interval_ms.into());
        let fail = request.message == FAIL;
        let stream = futures_util::stream::unfold(0u32, move |index| {
            let message = request.message.clone();
            let count = request.count;
            async move {
                if index < count {
                    if index > 0 {
                        tokio::time::sleep(interval).await;
                    }
                    Some((Ok(EchoResponse { message, index }), index + 1))
                } else if index == count && fail {
                    Some((Err(failure()), index + 1))
                } else {
                    None
                }
            }
        });
        Box::pin(async move { Ok(tonic::Response::new(Box::pin(stream) as EchoStream)) })
    }
}

struct BidiSvc;

impl StreamingService<EchoRequest> for BidiSvc {
    type Response = EchoResponse;
    type ResponseStream = EchoStream;
    type Future = BoxFuture<tonic::Response<EchoStream>, Status>;

    /// Echoes each request as it arrives, indexed from 0, until the client half-closes.
    fn call(&mut self, request: tonic::Request<Streaming<EchoRequest>>) -> Self::Future {
        let requests = request.into_inner();
        let stream = futures_util::stream::unfold(Some((requests, 0u32)), |state| async move {
            let (mut requests, index) = state?;
            match requests.message().await {
                Ok(Some(request)) => Some((
                    Ok(EchoResponse {
                        message: request.message,
                        index,
                    }),
                    Some((requests, index + 1)),
                )),
                Ok(None) => None,
                Err(status) => Some((Err(status), None)),
            }
        });
        Box::pin(async move { Ok(tonic::Response::new(Box::pin(stream) as EchoStream)) })
    }
}
