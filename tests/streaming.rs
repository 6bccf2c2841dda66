//! Bodies stream through the real binary without being buffered: a 256 MiB upload and a
//! 256 MiB download arrive byte-exact while egressd's peak memory stays far below their size.

mod common;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use common::binary::{Egressd, KeepAlive, TestConfig, HOST, LISTENER};
use common::upstream::{count_body, full, Upstream};

const MIB: u64 = 1024 * 1024;
/// Each direction moves this much.
const TRANSFER: u64 = 256 * MIB;
/// Frames of 64 KiB: big enough to be quick in a debug build, small enough that a streaming
/// proxy holds a handful of them at most.
const CHUNK: usize = 64 * 1024;
/// egressd's peak RSS must stay under this: a quarter of one transfer. Buffering either body
/// would need at least 256 MiB.
const PEAK_RSS_LIMIT_KIB: u64 = 64 * 1024;
/// Upper bound for the whole exchange (debug builds are slow, and the machine is shared).
const TRANSFER_WITHIN: Duration = Duration::from_secs(120);

/// A body of `remaining` bytes produced one chunk at a time as it is polled; nothing is ever
/// held but one shared 64 KiB chunk.
struct Generated {
    remaining: u64,
    chunk: Bytes,
    /// Whether to announce the length (Content-Length) or not (chunked encoding).
    announce_length: bool,
}

impl Generated {
    fn new(len: u64, announce_length: bool) -> Self {
        let pattern: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
        Generated {
            remaining: len,
            chunk: Bytes::from(pattern),
            announce_length,
        }
    }
}

impl Body for Generated {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = this.remaining.min(this.chunk.len() as u64) as usize;
        this.remaining -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(this.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        if self.announce_length {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_upload_and_download_stream_with_bounded_memory() {
    // POST: counts the request body and answers with the count. GET: answers with a
    // generated body of TRANSFER bytes (chunked, no Content-Length).
    let upstream = Upstream::start_with(|request| async move {
        if request.method() == http::Method::POST {
            let received = count_body(request.into_body()).await.unwrap_or(0);
            http::Response::new(full(received.to_string()))
        } else {
            http::Response::new(Generated::new(TRANSFER, false).boxed())
        }
    })
    .await;
    let dir = tempfile::tempdir().expect("config dir");
    let config = TestConfig::new()
        .backend("big", upstream.addr)
        .route_to("big");
    std::fs::write(dir.path().join("egressd.yaml"), config.yaml()).expect("write config");
    let egressd = Egressd::spawn(dir.path()).await;
    let listener = egressd.listener_addr(LISTENER).await;
    let rss_before = egressd.peak_rss_kib();

    let upload = async {
        let started = Instant::now();
        let mut conn = KeepAlive::connect(listener).await.expect("connect");
        let request = http::Request::post("/upload")
            .header(http::header::HOST, HOST)
            .body(Generated::new(TRANSFER, true).boxed())
            .unwrap();
        let response = conn.send(request).await.expect("upload response");
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let received: u64 = String::from_utf8_lossy(&body).parse().expect("count");
        println!("upload: {received} bytes in {:?}", started.elapsed());
        received
    };
    let download = async {
        let started = Instant::now();
        let mut conn = KeepAlive::connect(listener).await.expect("connect");
        let request = http::Request::get("/download")
            .header(http::header::HOST, HOST)
            .body(common::upstream::empty())
            .unwrap();
        let response = conn.send(request).await.expect("download response");
        assert_eq!(response.status(), http::StatusCode::OK);
        // Counted frame by frame, never collected.
        let mut body = response.into_body();
        let mut received = 0u64;
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame.expect("download frame").data_ref() {
                received += data.len() as u64;
            }
        }
        println!("download: {received} bytes in {:?}", started.elapsed());
        received
    };
    let (uploaded, downloaded) =
        tokio::time::timeout(TRANSFER_WITHIN, async { tokio::join!(upload, download) })
            .await
            .unwrap_or_else(|_| egressd.fail("the transfers did not finish in time"));

    assert_eq!(uploaded, TRANSFER, "bytes the upstream received");
    assert_eq!(downloaded, TRANSFER, "bytes the client received");
    let peak = egressd.peak_rss_kib();
    println!(
        "egressd peak RSS: {} KiB at start, {peak} KiB after moving {} MiB each way (limit {} KiB)",
        rss_before,
        TRANSFER / MIB,
        PEAK_RSS_LIMIT_KIB
    );
    assert!(
        peak < PEAK_RSS_LIMIT_KIB,
        "egressd peak RSS {peak} KiB is not far below the {} MiB transferred",
        TRANSFER / MIB
    );
}
