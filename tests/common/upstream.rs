//! Real upstream servers for the integration tests: hyper HTTP/1.1 servers on 127.0.0.1:0 that
//! record what they receive, plus a raw TCP server for misbehaving upstreams.
//!
//! Dropping an [`Upstream`] or [`RawUpstream`] closes its listener and aborts its connections,
//! so a test that ends early never leaves a server behind.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody as HttpBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The response body type handlers return.
pub(crate) type BoxBody = HttpBoxBody<Bytes, std::io::Error>;

/// A whole body from bytes.
pub(crate) fn full(body: impl Into<Bytes>) -> BoxBody {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub(crate) fn empty() -> BoxBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// Reads a request body to the end, counting its bytes without keeping them (uploads in the
/// tests can be hundreds of MiB).
pub(crate) async fn count_body(mut body: Incoming) -> Result<u64, hyper::Error> {
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            total += data.len() as u64;
        }
    }
    Ok(total)
}

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub(crate) method: http::Method,
    /// The request target exactly as received (origin-form for requests egressd forwards).
    pub(crate) uri: String,
    pub(crate) version: http::Version,
    pub(crate) headers: http::HeaderMap,
    /// Bytes of request body read by the default handler of [`Upstream::start`]; custom
    /// handlers consume the body themselves, so for them this stays 0.
    pub(crate) body_len: u64,
}

#[derive(Default)]
struct State {
    requests: Mutex<Vec<Recorded>>,
    connections: AtomicUsize,
}

/// A hyper HTTP/1.1 server on 127.0.0.1 with keep-alive, recording every request.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Upstream {
    /// Answers every request with 200, header `x-upstream: <name>` and body `<name>`, after
    /// reading (and counting) the whole request body.
    pub(crate) async fn start(name: &str) -> Upstream {
        Self::start_on(name, "127.0.0.1:0".parse().unwrap()).await
    }

    /// As [`Upstream::start`], bound to `addr` (for example another loopback address with the
    /// same port, to stand for a host whose DNS answer changes).
    pub(crate) async fn start_on(name: &str, addr: SocketAddr) -> Upstream {
        Self::start_inner(addr, Handler::Named(Arc::from(name))).await
    }

    /// As [`Upstream::start_with`], bound to `addr`.
    pub(crate) async fn start_on_with<F, Fut>(addr: SocketAddr, handler: F) -> Upstream
    where
        F: Fn(http::Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = http::Response<BoxBody>> + Send + 'static,
    {
        let handler: CustomFn = Arc::new(move |request| Box::pin(handler(request)));
        Self::start_inner(addr, Handler::Custom(handler)).await
    }

    /// Answers every request with `handler`. Recording still happens (before the handler runs,
    /// so a request whose response never comes is still seen).
    pub(crate) async fn start_with<F, Fut>(handler: F) -> Upstream
    where
        F: Fn(http::Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = http::Response<BoxBody>> + Send + 'static,
    {
        let handler: CustomFn = Arc::new(move |request| Box::pin(handler(request)));
        Self::start_inner("127.0.0.1:0".parse().unwrap(), Handler::Custom(handler)).await
    }

    async fn start_inner(bind: SocketAddr, handler: Handler) -> Upstream {
        let listener = super::ports::listen(bind).await.expect("bind upstream");
        let addr = listener.local_addr().expect("upstream local addr");
        let state = Arc::new(State::default());
        let accept = tokio::spawn(accept_loop(listener, state.clone(), handler));
        Upstream {
            addr,
            state,
            accept,
        }
    }

    /// Every request received so far, in arrival order.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub(crate) fn request_count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }

    /// Connections accepted so far (to assert pooling / keep-alive reuse).
    pub(crate) fn connection_count(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// The most recent request; panics when there is none.
    pub(crate) fn last_request(&self) -> Recorded {
        self.requests().pop().expect("upstream received no request")
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // The accept task owns the listener and the JoinSet of connections: aborting it drops
        // both, which closes the listener and aborts every connection task.
        self.accept.abort();
    }
}

type CustomFn = Arc<
    dyn Fn(
            http::Request<Incoming>,
        ) -> std::pin::Pin<Box<dyn Future<Output = http::Response<BoxBody>> + Send>>
        + Send
        + Sync,
>;

#[derive(Clone)]
enum Handler {
    Named(Arc<str>),
    Custom(CustomFn),
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, handler: Handler) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                connections.spawn(serve_connection(stream, state.clone(), handler.clone()));
            }
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, state: Arc<State>, handler: Handler) {
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let state = state.clone();
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handle(request, state, handler).await) }
    });
    // Errors here are the client going away mid-request, which several tests do on purpose.
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    request: http::Request<Incoming>,
    state: Arc<State>,
    handler: Handler,
) -> http::Response<BoxBody> {
    let index = {
        let mut requests = state.requests.lock().unwrap();
        requests.push(Recorded {
            method: request.method().clone(),
            uri: request.uri().to_string(),
            version: request.version(),
            headers: request.headers().clone(),
            body_len: 0,
        });
        requests.len() - 1
    };
    match handler {
        Handler::Named(name) => {
            let body_len = count_body(request.into_body()).await.unwrap_or(0);
            state.requests.lock().unwrap()[index].body_len = body_len;
            http::Response::builder()
                .header("x-upstream", &*name)
                .body(full(name.to_string()))
                .expect("valid response")
        }
        Handler::Custom(handler) => handler(request).await,
    }
}

/// A raw TCP server for upstreams that break HTTP: each accepted connection is handed to
/// `on_connection` (for example: read the request head, then close without answering).
pub(crate) struct RawUpstream {
    pub(crate) addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl RawUpstream {
    pub(crate) async fn start<F, Fut>(on_connection: F) -> RawUpstream
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind raw upstream");
        let addr = listener.local_addr().expect("raw upstream local addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let accept = tokio::spawn(async move {
            let mut tasks = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        counter.fetch_add(1, Ordering::SeqCst);
                        tasks.spawn(on_connection(stream));
                    }
                    Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                }
            }
        });
        RawUpstream {
            addr,
            connections,
            accept,
        }
    }

    pub(crate) fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Reads from `stream` until the end of an HTTP/1.1 request head (`\r\n\r\n`) or EOF, and
/// returns what was read. For [`RawUpstream`] handlers.
pub(crate) async fn read_request_head(stream: &mut TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    head
}

/// A listening socket that never accepts, with its accept queue filled, so that further SYNs
/// to it are dropped and connecting hangs until the connector's timeout (on Linux, a backlog of
/// 0 queues one connection; later ones are not answered).
pub(crate) struct Unresponsive {
    pub(crate) addr: SocketAddr,
    _listener: socket2::Socket,
    _queued: Vec<std::net::TcpStream>,
}

impl Unresponsive {
    /// Binds and fills the queue. Blocks for a few hundred milliseconds; call it before starting
    /// anything that shares the test's runtime thread.
    pub(crate) fn start() -> Unresponsive {
        use socket2::{Domain, Socket, Type};
        use std::time::Duration;
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
        listener.bind(&bind.into()).expect("bind");
        listener.listen(0).expect("listen");
        let addr = listener
            .local_addr()
            .expect("local addr")
            .as_socket()
            .expect("inet addr");
        let mut queued = Vec::new();
        // Connect until one attempt times out: from then on the queue is full.
        for _ in 0..64 {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                Ok(stream) => queued.push(stream),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Unresponsive {
                        addr,
                        _listener: listener,
                        _queued: queued,
                    }
                }
                Err(e) => panic!("filling the accept queue: {e}"),
            }
        }
        panic!("the accept queue of a backlog-0 listener never filled");
    }
}

/// A response body that sends `first` and then nothing, forever (the connection stays open).
pub(crate) fn stalling_body(first: &'static [u8]) -> BoxBody {
    use futures_util::StreamExt;
    let first = Ok(hyper::body::Frame::data(Bytes::from_static(first)));
    let frames = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
    BodyExt::boxed(http_body_util::StreamBody::new(frames))
}

/// A response body that sends `chunk` every `interval`, forever.
pub(crate) fn dripping_body(chunk: &'static [u8], interval: std::time::Duration) -> BoxBody {
    let frames = futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(interval).await;
        Some((Ok(hyper::body::Frame::data(Bytes::from_static(chunk))), ()))
    });
    http_body_util::StreamBody::new(frames).boxed()
}
