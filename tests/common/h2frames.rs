//! Hand-written HTTP/2 frames (RFC 9113 §4.1, §6), for clients that misbehave in ways a real
//! HTTP/2 library refuses to: a stream-level protocol error on purpose, thousands of times.
//!
//! Header blocks use only HPACK's static table and literals without indexing (RFC 7541 §6.2.2),
//! so no encoder state is involved and every block is independent of the others.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The client connection preface (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const WINDOW_UPDATE: u8 = 0x8;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;

/// Appends one frame to `out`.
pub(crate) fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("small payload");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// The header block of `GET http://{authority}/`.
pub(crate) fn get_block(authority: &str) -> Vec<u8> {
    // Static table: 2 = `:method GET`, 6 = `:scheme http`, 4 = `:path /`; then `:authority`
    // (static name 1) as a literal without indexing, not Huffman-coded.
    let mut block = vec![0x82, 0x86, 0x84, 0x01];
    block.push(u8::try_from(authority.len()).expect("authority under 127 bytes"));
    block.extend_from_slice(authority.as_bytes());
    block
}

/// An empty SETTINGS frame: the client accepts every default.
pub(crate) fn empty_settings(out: &mut Vec<u8>) {
    frame(out, SETTINGS, 0, 0, &[]);
}

/// A WINDOW_UPDATE frame.
pub(crate) fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    frame(out, WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
}

/// A frame as read from the peer.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
    pub(crate) payload: Vec<u8>,
}

impl Frame {
    /// The error code of a GOAWAY or RST_STREAM frame.
    pub(crate) fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            GOAWAY => 4,
            RST_STREAM => 0,
            _ => return None,
        };
        let bytes = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes(bytes.try_into().ok()?))
    }
}

/// Reads the next frame; None when the peer closed the connection (or reset it).
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(io: &mut R) -> Option<Frame> {
    let mut head = [0u8; 9];
    io.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; len];
    io.read_exact(&mut payload).await.ok()?;
    Some(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    })
}

/// Reads frames until a GOAWAY, the end of the connection, or `limit`; returns the GOAWAY and
/// how many RST_STREAM frames came before it.
pub(crate) async fn read_until_goaway<R: AsyncRead + Unpin>(
    io: &mut R,
    limit: Duration,
) -> (Option<Frame>, usize) {
    let mut resets = 0;
    let read = async {
        while let Some(frame) = read_frame(io).await {
            match frame.kind {
                GOAWAY => return Some(frame),
                RST_STREAM => resets += 1,
                _ => {}
            }
        }
        None
    };
    let goaway = tokio::time::timeout(limit, read).await.ok().flatten();
    (goaway, resets)
}
