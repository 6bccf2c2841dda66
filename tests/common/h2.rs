//! HTTP/2 peers for the tests: an h2c upstream (hyper) that records requests, counts
//! connections and can send GOAWAY after a number of requests; a raw `h2` upstream that
//! refuses streams; and an HTTP/2 (h2c prior knowledge) client to the proxy.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody as HttpBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use super::upstream::{BoxBody, Recorded};

/// Request bodies the HTTP/2 client sends (any body, so trailers can be sent).
pub(crate) type ClientBody = HttpBoxBody<Bytes, Infallible>;

type Handler = Arc<
    dyn Fn(http::Request<Incoming>) -> Pin<Box<dyn Future<Output = http::Response<BoxBody>> + Send>>
        + Send
        + Sync,
>;

/// How an [`H2Upstream`] behaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct H2Options {
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` it advertises.
    pub(crate) max_concurrent_streams: u32,
    /// Gracefully shut a connection down (GOAWAY) once it has received this many requests.
    pub(crate) goaway_after: Option<usize>,
}

impl Default for H2Options {
    fn default() -> Self {
        H2Options {
            max_concurrent_streams: 100,
            goaway_after: None,
        }
    }
}

#[derive(Default)]
struct State {
    requests: Mutex<Vec<Recorded>>,
    connections: AtomicUsize,
    goaways: AtomicUsize,
}

/// A plaintext HTTP/2 (prior knowledge) server on 127.0.0.1 run by hyper.
pub(crate) struct H2Upstream {
    pub(crate) addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl H2Upstream {
    /// Answers with `handler`; every request is recorded before the handler runs.
    pub(crate) async fn start<F, Fut>(options: H2Options, handler: F) -> H2Upstream
    where
        F: Fn(http::Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = http::Response<BoxBody>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |request| Box::pin(handler(request)));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind h2 upstream");
        let addr = listener.local_addr().expect("h2 upstream address");
        let state = Arc::new(State::default());
        let accept = tokio::spawn(accept_loop(listener, state.clone(), handler, options));
        H2Upstream {
            addr,
            state,
            accept,
        }
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub(crate) fn request_count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }

    pub(crate) fn connection_count(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Connections this server has sent GOAWAY on.
    pub(crate) fn goaway_count(&self) -> usize {
        self.state.goaways.load(Ordering::SeqCst)
    }
}

impl Drop for H2Upstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    handler: Handler,
    options: H2Options,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                connections.spawn(serve(stream, state.clone(), handler.clone(), options));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(stream: TcpStream, state: Arc<State>, handler: Handler, options: H2Options) {
    let seen = Arc::new(AtomicUsize::new(0));
    let limit_reached = Arc::new(Notify::new());
    let service = {
        let (state, seen, limit_reached) = (state.clone(), seen.clone(), limit_reached.clone());
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            state.requests.lock().unwrap().push(Recorded {
                method: request.method().clone(),
                uri: request.uri().to_string(),
                version: request.version(),
                headers: request.headers().clone(),
                body_len: 0,
            });
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            if options.goaway_after == Some(n) {
                limit_reached.notify_one();
            }
            let handler = handler.clone();
            async move { Ok::<_, Infallible>(handler(request).await) }
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.max_concurrent_streams);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = limit_reached.notified() => {}
    }
    state.goaways.fetch_add(1, Ordering::SeqCst);
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// A raw HTTP/2 server (the `h2` crate) that answers `REFUSED_STREAM` to every other request
/// and 200 `ok` to the rest.
pub(crate) struct RefusingUpstream {
    pub(crate) addr: SocketAddr,
    refused: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl RefusingUpstream {
    pub(crate) async fn start() -> RefusingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let refused = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let (r, s) = (refused.clone(), served.clone());
        let accept = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            let counter = Arc::new(AtomicUsize::new(0));
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        connections.spawn(serve_refusing(stream, counter.clone(), r.clone(), s.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        RefusingUpstream {
            addr,
            refused,
            served,
            accept,
        }
    }

    pub(crate) fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    pub(crate) fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for RefusingUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve_refusing(
    stream: TcpStream,
    counter: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
) {
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    while let Some(Ok((_request, mut respond))) = conn.accept().await {
        if counter.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
            refused.fetch_add(1, Ordering::SeqCst);
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        }
        served.fetch_add(1, Ordering::SeqCst);
        let response = http::Response::builder().status(200).body(()).unwrap();
        if let Ok(mut body) = respond.send_response(response, false) {
            let _ = body.send_data(Bytes::from_static(b"ok"), true);
        }
    }
}

/// An HTTP/2 client connection to `addr` with prior knowledge (h2c), as gRPC clients and
/// `curl --http2-prior-knowledge` connect to a plaintext proxy port.
pub(crate) async fn client(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<ClientBody> {
    let stream = TcpStream::connect(addr).await.expect("connect to proxy");
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    let (sender, connection) = builder
        .handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/2 handshake with the proxy");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

/// A request body from bytes.
pub(crate) fn body(bytes: impl Into<Bytes>) -> ClientBody {
    http_body_util::Full::new(bytes.into()).boxed()
}

/// A request body of `data` followed by `trailers`.
pub(crate) fn body_with_trailers(data: &'static [u8], trailers: http::HeaderMap) -> ClientBody {
    let frames = vec![
        Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from_static(data))),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
}
