//! A real gRPC peer pair for the gRPC tests: the `egressd.test.Echo` service (tonic's server
//! codec behind a hand-written service, as tonic-build would generate it) and a tonic client,
//! both over hyper's HTTP/2 on 127.0.0.1.
//!
//! | module | what |
//! |---|---|
//! | this file | the messages (hand-written prost), method paths, the failure status, raw framing |
//! | `server` | [`server::EchoServer`]: h2c or TLS, counting connections and recording RPCs |
//! | `client` | [`client::GrpcClient`]: unary, server-stream and bidi calls with call options |
//!
//! Messages and service are written by hand (no protoc, no build.rs). Both ends run on hyper
//! rather than tonic's own transport because tonic's `Server` and `Channel` each enforce
//! `grpc-timeout` themselves and report an expiry as `CANCELLED`: a test could then neither see
//! `DEADLINE_EXCEEDED` nor tell whether a proxy in between enforced the deadline. Here the
//! client never enforces a deadline, and the server does only when told to
//! ([`server::Deadlines`]).

pub(crate) mod client;
pub(crate) mod server;

use std::future::Future;
use std::pin::Pin;

use bytes::{BufMut, Bytes, BytesMut};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// The request of every Echo method.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EchoRequest {
    #[prost(string, tag = "1")]
    pub(crate) message: String,
    /// `ServerStream`: how many responses to send.
    #[prost(uint32, tag = "2")]
    pub(crate) count: u32,
    /// `ServerStream`: the pause between two responses.
    #[prost(uint32, tag = "3")]
    pub(crate) interval_ms: u32,
    /// `Unary`: how long to sleep before answering.
    #[prost(uint32, tag = "4")]
    pub(crate) sleep_ms: u32,
}

/// The response of every Echo method.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EchoResponse {
    #[prost(string, tag = "1")]
    pub(crate) message: String,
    /// The position of this response in its call (0 for `Unary`).
    #[prost(uint32, tag = "2")]
    pub(crate) index: u32,
}

impl EchoRequest {
    pub(crate) fn new(message: &str) -> EchoRequest {
        EchoRequest {
            message: message.to_owned(),
            ..EchoRequest::default()
        }
    }
}

/// The fully qualified service name.
pub(crate) const SERVICE: &str = "egressd.test.Echo";
pub(crate) const UNARY: &str = "/egressd.test.Echo/Unary";
pub(crate) const SERVER_STREAM: &str = "/egressd.test.Echo/ServerStream";
pub(crate) const BIDI: &str = "/egressd.test.Echo/Bidi";

/// The message that makes `Unary` (and `ServerStream`, after its responses) fail with
/// [`failure`].
pub(crate) const FAIL: &str = "fail";

/// The status a `fail` request ends with: `INVALID_ARGUMENT` carrying `x-test-trailer: yes`.
pub(crate) fn failure() -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert("x-test-trailer", MetadataValue::from_static("yes"));
    Status::with_metadata(
        Code::InvalidArgument,
        "the test asked for a failure",
        metadata,
    )
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// One gRPC message on the wire: uncompressed flag, 4-byte length, protobuf bytes (for clients
/// that speak gRPC without tonic).
pub(crate) fn frame(message: &impl prost::Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(body.len()).expect("message under 4 GiB"));
    out.put_slice(&body);
    out.freeze()
}
