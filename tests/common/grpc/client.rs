//! The Echo client: tonic's client codec over one hyper HTTP/2 connection, which (unlike
//! tonic's `Channel`) never enforces a deadline itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tonic::codec::Streaming;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_service::Service;

use super::super::tls::TestCa;
use super::{BoxFuture, EchoRequest, EchoResponse, BIDI, SERVER_STREAM, UNARY};

/// How long the client helpers wait for any one message before failing the test.
const PATIENCE: Duration = Duration::from_secs(10);

/// Options of one call.
#[derive(Clone, Debug, Default)]
pub(crate) struct CallOptions {
    /// Sent as `grpc-timeout`; the client itself never enforces it.
    pub(crate) timeout: Option<Duration>,
    /// Custom request metadata (ASCII).
    pub(crate) metadata: Vec<(&'static str, String)>,
}

impl CallOptions {
    pub(crate) fn timeout(timeout: Duration) -> CallOptions {
        CallOptions {
            timeout: Some(timeout),
            ..CallOptions::default()
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(timeout) = self.timeout {
            request.set_timeout(timeout);
        }
        for (name, value) in &self.metadata {
            request
                .metadata_mut()
                .insert(*name, value.parse().expect("ASCII metadata value"));
        }
        request
    }
}

/// One response of a stream and when it arrived.
#[derive(Clone, Debug)]
pub(crate) struct Arrival {
    pub(crate) at: Instant,
    pub(crate) message: EchoResponse,
}

/// A whole streaming call: what arrived and how it ended (`Code::Ok` when it ended well; the
/// trailers' custom metadata is in the status's metadata either way).
#[derive(Debug)]
pub(crate) struct StreamOutcome {
    pub(crate) arrivals: Vec<Arrival>,
    pub(crate) status: Status,
}

impl StreamOutcome {
    pub(crate) fn messages(&self) -> Vec<EchoResponse> {
        self.arrivals.iter().map(|a| a.message.clone()).collect()
    }
}

/// The HTTP/2 connection under a [`GrpcClient`]: one hyper connection, shared by every call.
#[derive(Clone)]
struct H2Conn {
    sender: hyper::client::conn::http2::SendRequest<tonic::body::Body>,
}

impl Service<http::Request<tonic::body::Body>> for H2Conn {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<Self::Response, hyper::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.sender.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.sender.send_request(request))
    }
}

/// A tonic client of the Echo service over one HTTP/2 connection to `addr`, with requests
/// addressed to `authority` (so a proxy can route them by it). Clones share the connection.
#[derive(Clone)]
pub(crate) struct GrpcClient {
    grpc: tonic::client::Grpc<H2Conn>,
}

impl GrpcClient {
    /// h2c by prior knowledge, as gRPC clients speak to an `http://` target.
    pub(crate) async fn connect(addr: SocketAddr, authority: &str) -> GrpcClient {
        let stream = TcpStream::connect(addr).await.expect("connect gRPC client");
        Self::handshake(stream, &format!("http://{authority}")).await
    }

    /// TLS with ALPN `h2`, trusting only `ca`, with SNI `server_name`.
    pub(crate) async fn connect_tls(
        addr: SocketAddr,
        authority: &str,
        ca: &TestCa,
        server_name: &str,
    ) -> GrpcClient {
        let stream = TcpStream::connect(addr).await.expect("connect gRPC client");
        let config = (*ca.client_config(true)).clone();
        Self::tls_over(stream, authority, config, server_name).await
    }

    /// TLS with ALPN `h2` on `stream` (a connection, or a CONNECT tunnel through a proxy),
    /// trusting what `config` trusts, with SNI `server_name`.
    pub(crate) async fn tls_over(
        stream: TcpStream,
        authority: &str,
        mut config: rustls::ClientConfig,
        server_name: &str,
    ) -> GrpcClient {
        config.alpn_protocols = vec![b"h2".to_vec()];
        let name =
            rustls::pki_types::ServerName::try_from(server_name.to_owned()).expect("server name");
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .expect("TLS handshake with the gRPC server");
        assert_eq!(
            stream.get_ref().1.alpn_protocol(),
            Some(&b"h2"[..]),
            "ALPN h2 negotiated"
        );
        Self::handshake(stream, &format!("https://{authority}")).await
    }

    async fn handshake<IO>(io: IO, origin: &str) -> GrpcClient
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(async move {
            // Ends with an error when the peer resets the connection, which some tests provoke.
            let _ = connection.await;
        });
        let origin = origin.parse().expect("origin URI");
        GrpcClient {
            grpc: tonic::client::Grpc::with_origin(H2Conn { sender }, origin),
        }
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))
    }

    /// `Unary`: the response (with its headers and trailers as metadata) or the status.
    pub(crate) async fn unary(
        &mut self,
        request: EchoRequest,
        options: &CallOptions,
    ) -> Result<tonic::Response<EchoResponse>, Status> {
        self.ready().await?;
        let path = http::uri::PathAndQuery::from_static(UNARY);
        let call = self
            .grpc
            .unary(options.request(request), path, ProstCodec::default());
        tokio::time::timeout(PATIENCE, call)
            .await
            .expect("unary call ended in time")
    }

    /// `ServerStream`, read to its end.
    pub(crate) async fn server_stream(
        &mut self,
        request: EchoRequest,
        options: &CallOptions,
    ) -> StreamOutcome {
        if let Err(status) = self.ready().await {
            return StreamOutcome {
                arrivals: Vec::new(),
                status,
            };
        }
        let path = http::uri::PathAndQuery::from_static(SERVER_STREAM);
        let call =
            self.grpc
                .server_streaming(options.request(request), path, ProstCodec::default());
        match tokio::time::timeout(PATIENCE, call)
            .await
            .expect("response headers in time")
        {
            Ok(response) => read_to_end(response.into_inner(), Vec::new()).await,
            Err(status) => StreamOutcome {
                arrivals: Vec::new(),
                status,
            },
        }
    }

    /// Opens `Bidi`; messages go out with [`BidiCall::send`] as the test decides.
    pub(crate) async fn bidi(&mut self, options: &CallOptions) -> Result<BidiCall, Status> {
        self.ready().await?;
        let (sender, receiver) = mpsc::channel::<EchoRequest>(16);
        let requests = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let path = http::uri::PathAndQuery::from_static(BIDI);
        let call = self
            .grpc
            .streaming(options.request(requests), path, ProstCodec::default());
        let response = tokio::time::timeout(PATIENCE, call)
            .await
            .expect("response headers in time")?;
        Ok(BidiCall {
            requests: sender,
            responses: response.into_inner(),
        })
    }
}

/// Reads a response stream to its end (bounded: each message must come within [`PATIENCE`]).
async fn read_to_end(
    mut responses: Streaming<EchoResponse>,
    mut arrivals: Vec<Arrival>,
) -> StreamOutcome {
    loop {
        let next = tokio::time::timeout(PATIENCE, responses.message())
            .await
            .expect("a message or the end of the stream in time");
        match next {
            Ok(Some(message)) => arrivals.push(Arrival {
                at: Instant::now(),
                message,
            }),
            Ok(None) => break,
            Err(status) => return StreamOutcome { arrivals, status },
        }
    }
    let status = match tokio::time::timeout(PATIENCE, responses.trailers())
        .await
        .expect("trailers in time")
    {
        Ok(trailers) => Status::with_metadata(Code::Ok, "", trailers.unwrap_or_default()),
        Err(status) => status,
    };
    StreamOutcome { arrivals, status }
}

/// An open `Bidi` call.
pub(crate) struct BidiCall {
    requests: mpsc::Sender<EchoRequest>,
    responses: Streaming<EchoResponse>,
}

impl BidiCall {
    pub(crate) async fn send(&mut self, message: &str) {
        self.requests
            .send(EchoRequest::new(message))
            .await
            .expect("the request stream is open");
    }

    /// The next response (`None` once the server ended the stream).
    pub(crate) async fn receive(&mut self) -> Result<Option<EchoResponse>, Status> {
        tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a message or the end of the stream in time")
    }

    /// Half-closes the request stream and reads what is left and how the call ended.
    pub(crate) async fn finish(self) -> StreamOutcome {
        drop(self.requests);
        read_to_end(self.responses, Vec::new()).await
    }
}
