//! MCP answer streams: the legacy transport's `endpoint` event rewriting
//! ([`EndpointEvent`], [`rewrite_endpoint`]) and the server-error scan ([`ErrorScan`]), fed
//! in arbitrary chunks.
//!
//! Input: a control byte, then split points, then the stream. The control byte's low four
//! bits are the number of split points (two bytes each, see below); bit 4
//! puts a comment line just under [`EndpointEvent::HOLD_LIMIT`] in front of the stream, bit 5
//! one just under [`MESSAGE_LIMIT`] (bit 6 makes it a `data:` line), so that the fuzzer
//! reaches the bounds without growing huge inputs. Seeds are `\0` followed by a stream.
//!
//! Properties: however the stream is split, the rewriter sends the same bytes and the scan
//! reaches the same verdict as with the stream in one piece; the rewriter never holds more
//! than `HOLD_LIMIT` bytes; an announced endpoint is rewritten to a reference that resolves
//! against egressd (no scheme, no authority), whose session unwraps to the announced one.

#![no_main]

use std::net::SocketAddr;
use std::sync::LazyLock;

use egressd::mcp::errors::{ErrorScan, MESSAGE_LIMIT};
use egressd::mcp::legacy::{rewrite_endpoint, unwrap_request, EndpointEvent};
use egressd::mcp::session::{SessionHome, SessionKey};
use libfuzzer_sys::fuzz_target;

static KEY: LazyLock<SessionKey> = LazyLock::new(SessionKey::generate);

fn home() -> SessionHome {
    SessionHome {
        backend: "default/tools".into(),
        port: 8080,
        endpoint: SocketAddr::from(([10, 0, 0, 7], 8080)),
    }
}

type Rewrite = fn(&str) -> String;
const HOLD_LIMIT: usize = EndpointEvent::<Rewrite>::HOLD_LIMIT;

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let splits = usize::from(control & 0x0f);
    if rest.len() < 2 * splits {
        return;
    }
    let (split_bytes, body) = rest.split_at(2 * splits);
    let mut stream = Vec::new();
    let line = if control & 0x40 != 0 { "data: " } else { ": " };
    if control & 0x10 != 0 {
        stream.extend_from_slice(line.as_bytes());
        stream.resize(HOLD_LIMIT - 16, b'x');
    }
    if control & 0x20 != 0 {
        stream.extend_from_slice(line.as_bytes());
        stream.resize(stream.len() + MESSAGE_LIMIT - 16, b'x');
    }
    // A split point with the high bit clear is an offset into the body (after the padding,
    // where the limits are crossed); with it set, a point anywhere in the stream.
    let padded = stream.len();
    stream.extend_from_slice(body);
    let mut cuts: Vec<usize> = split_bytes
        .chunks(2)
        .map(|b| {
            let v = usize::from(u16::from_be_bytes([b[0], b[1]]));
            if v & 0x8000 == 0 {
                padded + v % (body.len() + 1)
            } else {
                (v & 0x7fff) * stream.len() / 0x7fff
            }
        })
        .collect();
    cuts.sort_unstable();
    let mut chunks = Vec::new();
    let mut at = 0;
    for cut in cuts.into_iter().chain([stream.len()]) {
        chunks.push(&stream[at..cut]);
        at = cut;
    }

    // Past its first 64 KiB the rewriter only relays: the 1 MiB padding is for the scan.
    if control & 0x20 == 0 {
        endpoint_event(&stream, &chunks);
    }
    for event_stream in [true, false] {
        let mut whole = ErrorScan::new(event_stream);
        whole.feed(&stream);
        let mut split = ErrorScan::new(event_stream);
        for chunk in &chunks {
            split.feed(chunk);
        }
        assert_eq!(
            split.finish(),
            whole.finish(),
            "the scan's verdict depends on how the stream is split (event stream: {event_stream})"
        );
    }
    // The stream's first line as an announced endpoint (an event's data is one line).
    let first_line = body
        .split(|b| matches!(b, b'\n' | b'\r'))
        .next()
        .unwrap_or_default();
    check_rewrite(&String::from_utf8_lossy(first_line));
});

fn endpoint_event(stream: &[u8], chunks: &[&[u8]]) {
    let rewrite: Rewrite = |announced| {
        check_rewrite(announced);
        rewrite_endpoint(announced, &KEY, &home())
    };
    let mut whole = EndpointEvent::new(rewrite);
    let mut expected = whole.feed(stream);
    expected.extend(whole.finish());

    let mut split = EndpointEvent::new(rewrite);
    let mut out = Vec::new();
    let mut fed = 0;
    for chunk in chunks {
        out.extend(split.feed(chunk));
        fed += chunk.len();
        if !split.done() {
            // Until the rewrite, every byte sent is a byte received: the rest is held.
            assert!(
                fed - out.len() <= HOLD_LIMIT,
                "{} bytes held",
                fed - out.len()
            );
        }
    }
    out.extend(split.finish());
    assert!(
        out == expected,
        "the rewritten stream depends on how it is split ({} chunks)",
        chunks.len()
    );
}

/// What the client gets for `announced` resolves against egressd, and its session is the
/// announced one.
fn check_rewrite(announced: &str) {
    let rewritten = rewrite_endpoint(announced, &KEY, &home());
    assert!(
        resolves_against_base(&rewritten),
        "{announced:?} became {rewritten:?}, which does not resolve against egressd"
    );
    match unwrap_request(&rewritten, &KEY) {
        Ok(Some((at, restored))) => {
            assert_eq!(at, home());
            assert_eq!(
                rewrite_endpoint(&restored, &KEY, &home()),
                rewritten,
                "the restored {restored:?} is not what was announced"
            );
        }
        Ok(None) => {}
        Err(e) => panic!("{rewritten:?} does not unwrap: {e:?}"),
    }
}

/// Whether a URL reference keeps the base URL's scheme and authority, as RFC 3986 and the
/// WHATWG URL standard (which MCP's TypeScript SDK uses: tabs and newlines removed,
/// leading C0 controls and spaces trimmed, `\` as `/`) both resolve it.
fn resolves_against_base(reference: &str) -> bool {
    let cleaned: String = reference
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let trimmed = cleaned.trim_matches(|c: char| c <= ' ');
    for candidate in [reference, trimmed] {
        if candidate.starts_with("//")
            || candidate.starts_with("\\\\")
            || candidate.starts_with("/\\")
            || candidate.starts_with("\\/")
        {
            return false;
        }
        // A scheme: a letter, then letters, digits, `+`, `-`, `.`, up to a `:` that comes
        // before any `/`, `?` or `#`.
        if let Some(colon) = candidate.find(':') {
            let scheme = &candidate[..colon];
            let mut chars = scheme.chars();
            if chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            {
                return false;
            }
        }
    }
    true
}
