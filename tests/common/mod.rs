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
//! | `outlier` | Backends of 127.0.0.x endpoints, scripted upstreams, `/endpoints` readers |
//! | `mcp` | rmcp (official MCP SDK) Streamable HTTP servers on 127.0.0.x that record sessions, and a client through egressd |
//! | `python` | the official MCP Python SDK's server (with an event store), installed into target/tmp on first use |
//! | `websocket` | a websocket echo server that records its handshakes |
#![allow(dead_code)]

pub mod binary;
pub mod dns;
pub mod grpc;
pub mod h2;
pub mod h2frames;
pub mod mcp;
pub mod outlier;
pub mod proxy;
pub mod python;
pub mod tls;
pub mod upstream;
pub mod websocket;
