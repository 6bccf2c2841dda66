//! A hand-driven HTTP/2 (h2c) upstream: a script per connection decides what happens to each
//! request stream — answered, refused, left without an answer — and when the connection sends
//! GOAWAY (with any last stream id) and closes. For servers no HTTP/2 library lets a test be:
//! one that loses the streams it had taken when it reaches its request cap (hypercorn), one
//! whose GOAWAY names a stream below others in flight.
//!
//! Request header blocks are not decoded (a script needs only stream ids and where a request
//! ends); responses use HPACK's static table only (`:status 200` is index 8), so no encoder
//! state is involved.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::h2frames::{self as f, frame, read_frame};

const PING: u8 = 0x6;
const ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const REFUSED_STREAM: u32 = 0x7;

/// An h2c server on 127.0.0.1 whose connections each run a script.
pub(crate) struct RawH2Upstream {
    pub(crate) addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

impl RawH2Upstream {
    /// Advertises `max_concurrent_streams` on every connection and runs `script` with the
    /// connection's index (0 for the first one accepted) and the connection; the connection
    /// closes when the script returns.
    pub(crate) async fn start<F, Fut>(max_concurrent_streams: u32, script: F) -> RawH2Upstream
    where
        F: Fn(usize, RawH2Conn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (count, seen) = (connections.clone(), requests.clone());
        let script = Arc::new(script);
        let accept = tokio::spawn(async move {
            let mut running = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((io, _)) = accepted else { continue };
                        let index = count.fetch_add(1, Ordering::SeqCst);
                        let mut conn = RawH2Conn { io, requests: seen.clone(), pending: Vec::new() };
                        let script = script.clone();
                        running.spawn(async move {
                            if conn.handshake(max_concurrent_streams).await {
                                script(index, conn).await;
                            }
                        });
                    }
                    Some(_) = running.join_next(), if !running.is_empty() => {}
                }
            }
        });
        RawH2Upstream {
            addr,
            connections,
            requests,
            accept,
        }
    }

    /// Connections accepted.
    pub(crate) fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Requests received whole, on all connections (whatever was done with them).
    pub(crate) fn request_count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for RawH2Upstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One connection of a [`RawH2Upstream`], past the prefaces.
pub(crate) struct RawH2Conn {
    io: TcpStream,
    requests: Arc<AtomicUsize>,
    /// Streams whose request has begun (HEADERS) but not ended.
    pending: Vec<u32>,
}

impl RawH2Conn {
    /// Reads the client's preface and sends ours (SETTINGS with the stream limit).
    async fn handshake(&mut self, max_concurrent_streams: u32) -> bool {
        let mut preface = [0u8; 24];
        if self.io.read_exact(&mut preface).await.is_err() || preface != f::PREFACE {
            return false;
        }
        let mut payload = SETTINGS_MAX_CONCURRENT_STREAMS.to_be_bytes().to_vec();
        payload.extend_from_slice(&max_concurrent_streams.to_be_bytes());
        self.send(f::SETTINGS, 0, 0, &payload).await
    }

    /// The stream id of the next request received whole (its END_STREAM seen); acknowledges
    /// SETTINGS and PINGs on the way. None when the client closed the connection.
    pub(crate) async fn next_request(&mut self) -> Option<u32> {
        loop {
            let got = read_frame(&mut self.io).await?;
            let ends = got.flags & f::END_STREAM != 0;
            match got.kind {
                f::SETTINGS if got.flags & ACK == 0 => {
                    self.send(f::SETTINGS, ACK, 0, &[]).await;
                }
                PING if got.flags & ACK == 0 => {
                    self.send(PING, ACK, 0, &got.payload).await;
                }
                f::HEADERS if ends => return Some(self.received(got.stream)),
                f::HEADERS => self.pending.push(got.stream),
                f::DATA if ends && self.pending.contains(&got.stream) => {
                    self.pending.retain(|s| *s != got.stream);
                    return Some(self.received(got.stream));
                }
                _ => {}
            }
        }
    }

    fn received(&self, stream: u32) -> u32 {
        self.requests.fetch_add(1, Ordering::SeqCst);
        stream
    }

    /// Answers `stream`: 200 with the body `ok`.
    pub(crate) async fn answer(&mut self, stream: u32) -> bool {
        let mut out = Vec::new();
        frame(&mut out, f::HEADERS, f::END_HEADERS, stream, &[0x88]);
        frame(&mut out, f::DATA, f::END_STREAM, stream, b"ok");
        self.io.write_all(&out).await.is_ok()
    }

    /// Refuses `stream` (RST_STREAM `REFUSED_STREAM`): the server did not process it.
    pub(crate) async fn refuse(&mut self, stream: u32) -> bool {
        self.send(f::RST_STREAM, 0, stream, &REFUSED_STREAM.to_be_bytes())
            .await
    }

    /// Sends GOAWAY naming `last` as the last stream processed, with `code`.
    pub(crate) async fn goaway(&mut self, last: u32, code: u32) -> bool {
        let mut payload = last.to_be_bytes().to_vec();
        payload.extend_from_slice(&code.to_be_bytes());
        self.send(f::GOAWAY, 0, 0, &payload).await
    }

    /// Ends the connection gracefully: our side closes, then whatever the client still sends
    /// is read until it closes too (closing with unread bytes would reset the connection, and
    /// the client could lose frames it had not read yet, a GOAWAY among them).
    pub(crate) async fn close(mut self) {
        let _ = self.io.shutdown().await;
        while read_frame(&mut self.io).await.is_some() {}
    }

    async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> bool {
        let mut out = Vec::new();
        frame(&mut out, kind, flags, stream, payload);
        self.io.write_all(&out).await.is_ok()
    }
}
