//! The legacy HTTP+SSE transport (MCP 2024-11-05, `transport: SSE`): the client opens an
//! event stream with `GET` on the Backend's path; the server's first event (`event:
//! endpoint`) announces the URL to POST messages to, carrying the session in its query
//! (`sessionId` in the TypeScript SDK, `session_id` in the Python one); answers arrive on the
//! stream.
//!
//! The POSTs must reach the server holding the stream. egressd rewrites the announced URL on
//! its way to the client: the session value is wrapped with the issuing endpoint under the
//! session key (as `Mcp-Session-Id` is for Streamable HTTP, see `session.rs`), and an
//! absolute URL loses its scheme and authority, so the client resolves it against the URL it
//! used — egressd — instead of calling the server directly. A POST carrying a wrapped value is
//! sent to that endpoint with the server's own value restored.

use super::session::{SessionHome, SessionKey};

/// The query parameters that carry a legacy session.
const SESSION_PARAMS: [&str; 2] = ["sessionId", "session_id"];

/// The default path of the event stream.
pub(crate) const DEFAULT_PATH: &str = "/sse";

/// Where a session parameter's value lies in a query.
fn session_value(query: &str) -> Option<std::ops::Range<usize>> {
    let mut offset = 0;
    for pair in query.split('&') {
        if let Some((name, value)) = pair.split_once('=') {
            if SESSION_PARAMS.contains(&name) {
                let start = offset + name.len() + 1;
                return Some(start..start + value.len());
            }
        }
        offset += pair.len() + 1;
    }
    None
}

/// The announced endpoint (an `endpoint` event's data) as the client must see it: relative to
/// egressd, the session wrapped with `endpoint`. Anything that is not a URL with a session is
/// left as it is, except that it never keeps a scheme or an authority.
pub fn rewrite_endpoint(announced: &str, key: &SessionKey, home: &SessionHome) -> String {
    let relative = origin_relative(announced);
    let Some(q) = relative.find('?') else {
        return relative;
    };
    let Some(range) = session_value(&relative[q + 1..]) else {
        return relative;
    };
    let range = q + 1 + range.start..q + 1 + range.end;
    let wrapped = key.wrap(home, &relative[range.clone()]);
    format!(
        "{}{}{}",
        &relative[..range.start],
        wrapped,
        &relative[range.end..]
    )
}

/// `announced` without its scheme and authority: a reference every client resolves against
/// the URL it used (egressd's), never one that leads it to another host. Read as the WHATWG
/// URL standard reads it (MCP's TypeScript SDK resolves it with `new URL`): tabs and line
/// breaks are dropped, leading and trailing controls and spaces trimmed, `\` is `/`, and
/// `https:host` (a special scheme without slashes) names a host too.
fn origin_relative(announced: &str) -> String {
    let cleaned;
    let mut s = announced;
    if s.contains(['\t', '\n', '\r']) {
        cleaned = s.replace(['\t', '\n', '\r'], "");
        s = &cleaned;
    }
    s = s.trim_matches(|c: char| c.is_whitespace() || c.is_ascii_control());
    // `\` is `/` to WHATWG parsers.
    const SLASHES: [char; 2] = ['/', '\\'];
    // Any scheme (RFC 3986 §3.1): a letter, then letters, digits, `+`, `-`, `.`, then `:`.
    let scheme = s.find(':').filter(|&colon| {
        let mut chars = s[..colon].chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    let mut rooted = false;
    if let Some(colon) = scheme {
        s = &s[colon + 1..];
        rooted = true;
    }
    // An authority: `//host` (after a scheme or not); kept from the path on.
    if s.starts_with(SLASHES) && s[1..].starts_with(SLASHES) {
        let host = s.trim_start_matches(SLASHES);
        s = host.find(['/', '\\', '?', '#']).map_or("", |i| &host[i..]);
        rooted = true;
    }
    if rooted || s.starts_with(SLASHES) {
        // One `/`, then the path: more would start an authority again.
        format!("/{}", s.trim_start_matches(SLASHES))
    } else {
        s.to_owned()
    }
}

/// A request's session, when its query carries one egressd wrapped: the endpoint, and the
/// path and query with the server's own value back. `Ok(None)`: no wrapped session here.
pub fn unwrap_request(
    path_and_query: &str,
    key: &SessionKey,
) -> Result<Option<(SessionHome, String)>, super::session::Invalid> {
    let Some(q) = path_and_query.find('?') else {
        return Ok(None);
    };
    let Some(range) = session_value(&path_and_query[q + 1..]) else {
        return Ok(None);
    };
    let range = q + 1 + range.start..q + 1 + range.end;
    let value = &path_and_query[range.clone()];
    if !super::session::is_wrapped(value) {
        return Ok(None);
    }
    let (home, upstream) = key.unwrap(value)?;
    let restored = format!(
        "{}{}{}",
        &path_and_query[..range.start],
        upstream,
        &path_and_query[range.end..]
    );
    Ok(Some((home, restored)))
}

/// Rewrites the `endpoint` event of a legacy event stream as it passes; every other byte is
/// relayed unchanged. Complete events are let through as soon as they are complete; only an
/// event still arriving is held, and once the endpoint event has passed (or the stream's first
/// [`Self::HOLD_LIMIT`] bytes went by without one) nothing is held at all. The bytes sent are
/// the same however the stream is split into chunks.
pub struct EndpointEvent<F> {
    rewrite: Option<F>,
    held: Vec<u8>,
    /// Bytes of the stream already sent on (before `held`).
    passed: usize,
}

impl<F: FnOnce(&str) -> String> EndpointEvent<F> {
    /// Bytes looked at for the endpoint event before giving up on finding it: it must end
    /// within the stream's first `HOLD_LIMIT` bytes.
    pub const HOLD_LIMIT: usize = 64 << 10;

    pub fn new(rewrite: F) -> Self {
        EndpointEvent {
            rewrite: Some(rewrite),
            held: Vec::new(),
            passed: 0,
        }
    }

    /// Whether the rewrite is over (everything passes untouched from now on).
    pub fn done(&self) -> bool {
        self.rewrite.is_none()
    }

    /// The bytes to send on for `chunk`.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.rewrite.is_none() {
            return chunk.to_vec();
        }
        self.held.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.held.len());
        let mut start = 0;
        while let Some(end) = event_end(&self.held[start..]) {
            // Judged on the event's place in the stream, not on what this chunk brought: an
            // event ending past the limit is never rewritten, however the bytes arrived.
            if self.passed + start + end > Self::HOLD_LIMIT {
                self.rewrite = None;
                break;
            }
            let event = &self.held[start..start + end];
            match self.endpoint_data(event) {
                Some((line, data)) => {
                    let rewrite = self.rewrite.take().expect("present until the rewrite");
                    let data = String::from_utf8_lossy(data).into_owned();
                    out.extend_from_slice(&event[..line.start]);
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(rewrite(&data).as_bytes());
                    out.extend_from_slice(&event[line.end..]);
                }
                None => out.extend_from_slice(event),
            }
            start += end;
            if self.rewrite.is_none() {
                break;
            }
        }
        let rest = self.held.split_off(start);
        self.passed += start;
        if self.rewrite.is_none() || self.passed + rest.len() > Self::HOLD_LIMIT {
            // Found, or not coming: the rest goes on as it is.
            self.rewrite = None;
            out.extend_from_slice(&rest);
            self.held = Vec::new();
        } else {
            self.held = rest;
        }
        out
    }

    /// The held bytes, when the stream ends.
    pub fn finish(&mut self) -> Vec<u8> {
        self.rewrite = None;
        std::mem::take(&mut self.held)
    }

    /// In an `endpoint` event: the span of its `data:` line (without the line ending) and the
    /// data itself.
    fn endpoint_data<'a>(&self, event: &'a [u8]) -> Option<(std::ops::Range<usize>, &'a [u8])> {
        let mut is_endpoint = false;
        let mut data = None;
        let mut offset = 0;
        for line in event.split_inclusive(|b| *b == b'\n') {
            let content = line
                .strip_suffix(b"\n")
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .unwrap_or(line);
            if let Some(name) = content.strip_prefix(b"event:") {
                is_endpoint = name.trim_ascii() == b"endpoint";
            } else if let Some(d) = content.strip_prefix(b"data:") {
                let d = d.strip_prefix(b" ").unwrap_or(d);
                data = Some((offset..offset + content.len(), d));
            }
            offset += line.len();
        }
        data.filter(|_| is_endpoint)
    }
}

/// The length of the first complete event in `bytes` (through its blank line).
fn event_end(bytes: &[u8]) -> Option<usize> {
    let mut previous_newline = None;
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'\n' {
            // A blank line: this newline follows another one (with at most a `\r` between).
            if let Some(p) = previous_newline {
                if i == p + 1 || (i == p + 2 && bytes[p + 1] == b'\r') {
                    return Some(i + 1);
                }
            }
            previous_newline = Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SessionKey {
        SessionKey::generate()
    }

    fn home() -> SessionHome {
        SessionHome {
            backend: "default/tools".into(),
            port: 8080,
            endpoint: "10.0.0.7:8080".parse().unwrap(),
        }
    }

    #[test]
    fn the_announced_url_is_made_relative_and_its_session_wrapped() {
        let key = key();
        for (announced, before, after) in [
            ("/messages?sessionId=abc", "/messages?sessionId=", ""),
            (
                "http://10.0.0.7:8080/messages/?session_id=abc&x=1",
                "/messages/?session_id=",
                "&x=1",
            ),
            ("https://mcp.example.com?sessionId=abc", "/?sessionId=", ""),
        ] {
            let rewritten = rewrite_endpoint(announced, &key, &home());
            assert!(rewritten.starts_with(before), "{rewritten}");
            assert!(rewritten.ends_with(after), "{rewritten}");
            let (issued, restored) = unwrap_request(&rewritten, &key).unwrap().expect("wrapped");
            assert_eq!(issued, home());
            assert_eq!(restored, format!("{before}abc{after}"));
        }
        assert_eq!(rewrite_endpoint("/messages", &key, &home()), "/messages");
        assert_eq!(unwrap_request("/messages?sessionId=abc", &key), Ok(None));
        for forged in [
            "/messages?sessionId=egd2.AAAA.BBBB",
            "/messages?sessionId=egd1.AAAA.BBBB",
        ] {
            assert!(unwrap_request(forged, &key).is_err(), "{forged}");
        }
    }

    #[test]
    fn only_the_endpoint_event_changes_however_the_bytes_arrive() {
        let stream = ": hello\n\nevent: endpoint\r\ndata: /messages?sessionId=s1\r\n\r\nevent: message\ndata: {\"id\":1}\n\n";
        let expected = ": hello\n\nevent: endpoint\r\ndata: /m?sessionId=X\r\n\r\nevent: message\ndata: {\"id\":1}\n\n";
        for split in 1..stream.len() {
            let mut rewrite = EndpointEvent::new(|data: &str| {
                assert_eq!(data, "/messages?sessionId=s1");
                "/m?sessionId=X".to_owned()
            });
            let (a, b) = stream.as_bytes().split_at(split);
            let mut out = rewrite.feed(a);
            out.extend(rewrite.feed(b));
            out.extend(rewrite.finish());
            assert_eq!(
                String::from_utf8(out).unwrap(),
                expected,
                "split at {split}"
            );
        }
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/mcp_stream.rs`): a first event bigger than the
    /// hold limit, then the endpoint event, was rewritten when the bytes came in one piece and
    /// passed unrewritten when they came in several.
    #[test]
    fn the_endpoint_event_is_rewritten_alike_however_a_big_stream_is_split() {
        const LIMIT: usize = EndpointEvent::<fn(&str) -> String>::HOLD_LIMIT;
        let endpoint_event = "event: endpoint\ndata: /m?sessionId=s\n\n";
        for (padding, rewritten) in [(LIMIT + 100, false), (LIMIT - 200, true)] {
            let stream = format!(": {}\n\n{endpoint_event}", "x".repeat(padding));
            let expected = if rewritten {
                stream.replace("/m?sessionId=s", "/m?sessionId=X")
            } else {
                stream.clone()
            };
            for chunk in [stream.len(), 1000, 7] {
                let mut rewrite = EndpointEvent::new(|data: &str| {
                    assert_eq!(data, "/m?sessionId=s");
                    "/m?sessionId=X".to_owned()
                });
                let mut out = Vec::new();
                for piece in stream.as_bytes().chunks(chunk) {
                    out.extend(rewrite.feed(piece));
                }
                out.extend(rewrite.finish());
                assert!(
                    out == expected.as_bytes(),
                    "padding {padding}, chunks of {chunk}: rewritten {}",
                    String::from_utf8_lossy(&out).contains("sessionId=X")
                );
            }
        }
    }

    /// Found by fuzzing: announced URLs that a client resolves to another host than egressd
    /// (another scheme's case, a network-path reference, backslashes and tabs as the WHATWG
    /// URL parser reads them, `https:host`) kept their origin.
    #[test]
    fn announced_endpoints_never_lead_the_client_to_another_host() {
        let key = key();
        for (announced, expected) in [
            ("HTTPS://evil.example/messages?x=1", "/messages?x=1"),
            ("Http://10.0.0.7:8080", "/"),
            ("//evil.example/messages?x=1", "/messages?x=1"),
            ("http://10.0.0.7:8080//evil.example/m", "/evil.example/m"),
            ("/\\evil.example/m", "/m"),
            ("\\\\evil.example/m", "/m"),
            ("/\t/evil.example/m", "/m"),
            ("\u{1}//evil.example/m", "/m"),
            ("https:evil.example/m", "/evil.example/m"),
            ("data: {\"jsonrpc\":\"2.0\",", "/ {\"jsonrpc\":\"2.0\","),
            ("messages?x=1", "messages?x=1"),
            ("?x=1", "?x=1"),
        ] {
            assert_eq!(
                rewrite_endpoint(announced, &key, &home()),
                expected,
                "{announced:?}"
            );
        }
        let rewritten = rewrite_endpoint("HTTPS://evil.example/m?sessionId=abc", &key, &home());
        assert!(rewritten.starts_with("/m?sessionId=egd2."), "{rewritten}");
    }

    #[test]
    fn a_stream_without_an_endpoint_event_passes_unheld_after_the_limit() {
        let mut rewrite = EndpointEvent::new(|_: &str| unreachable!());
        let big = vec![b'x'; EndpointEvent::<fn(&str) -> String>::HOLD_LIMIT + 1];
        assert_eq!(rewrite.feed(&big).len(), big.len());
        assert!(rewrite.done());
        assert_eq!(rewrite.feed(b"data: y\n\n"), b"data: y\n\n");
    }
}
