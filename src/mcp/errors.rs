//! JSON-RPC server errors inside `200 OK` answers, for outlier detection: an MCP server that
//! fails answers `200` with `{"error": {"code": -32603, …}}`, which status codes never show.
//!
//! [`ErrorScan`] watches an answer's bytes as they pass (a JSON body, or the `data:` lines of
//! an event stream) without holding more than one message ([`MESSAGE_LIMIT`]); bigger
//! messages are skipped, not buffered.

use serde_json::Value;

/// The biggest message (JSON body or SSE event) scanned: 1 MiB, the SSE event size MCP asks
/// intermediaries to carry. Bigger ones pass unscanned.
pub const MESSAGE_LIMIT: usize = 1 << 20;

/// Whether a JSON-RPC error code says the server failed, not the request. Only `-32603`
/// (internal error): MCP gives the implementation-defined range (-32000..-32099) meanings
/// caused by clients too (`-32002` resource not found, `-32020` header mismatch, `-32042`
/// URL elicitation required), and tool failures are results (`isError`), not errors.
pub(crate) fn is_server_error(code: i64) -> bool {
    code == -32603
}

/// Scans one answer for JSON-RPC responses carrying a server error.
#[derive(Debug)]
pub struct ErrorScan {
    event_stream: bool,
    /// The message being collected (the JSON body, or the current event's data).
    message: Vec<u8>,
    /// An SSE line split across chunks.
    line: Vec<u8>,
    /// The current line grew over the limit: the rest of it is ignored.
    dropping_line: bool,
    /// The current message grew over [`MESSAGE_LIMIT`]: skipped to its end.
    skipping: bool,
    found: bool,
}

impl ErrorScan {
    pub fn new(event_stream: bool) -> Self {
        ErrorScan {
            event_stream,
            message: Vec::new(),
            line: Vec::new(),
            dropping_line: false,
            skipping: false,
            found: false,
        }
    }

    /// Whether a server error was seen so far.
    pub(crate) fn found(&self) -> bool {
        self.found
    }

    /// The next bytes of the answer.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.found {
            return;
        }
        if !self.event_stream {
            self.append(bytes);
            return;
        }
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            if self.dropping_line {
                self.dropping_line = !piece.ends_with(b"\n");
                continue;
            }
            if !piece.ends_with(b"\n") {
                self.line.extend_from_slice(piece);
                // Past this, the line cannot matter: a `data:` line makes the message too big
                // (as it would once complete: its data is at least the line less `data: ` and a
                // `\r`), and any other line is ignored anyway. Judged alike however the line
                // is split into chunks.
                if self.line.len() > MESSAGE_LIMIT + "data: \r".len() {
                    self.skipping |= self.line.starts_with(b"data:");
                    self.line = Vec::new();
                    self.dropping_line = true;
                }
                continue;
            }
            let line = if self.line.is_empty() {
                trim_line_end(piece).to_vec()
            } else {
                self.line.extend_from_slice(piece);
                let whole = trim_line_end(&self.line).to_vec();
                self.line.clear();
                whole
            };
            self.event_line(&line);
        }
    }

    /// The answer ended: a JSON body is judged now.
    pub fn finish(&mut self) -> bool {
        if !self.event_stream && !self.skipping {
            self.judge();
        }
        self.found
    }

    fn event_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            // A blank line dispatches the event.
            if !self.skipping {
                self.judge();
            }
            self.message.clear();
            self.skipping = false;
        } else if let Some(data) = line.strip_prefix(b"data:") {
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if !self.message.is_empty() {
                self.append(b"\n");
            }
            self.append(data);
        }
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.message.len() + bytes.len() > MESSAGE_LIMIT {
            self.message = Vec::new();
            self.skipping = true;
            return;
        }
        self.message.extend_from_slice(bytes);
    }

    fn judge(&mut self) {
        if self.message.is_empty() {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Value>(&self.message) else {
            return;
        };
        let responses = match &value {
            Value::Array(items) => items.iter().collect(),
            single => vec![single],
        };
        self.found |= responses.into_iter().any(|m| {
            m.get("error")
                .and_then(|e| e.get("code"))
                .and_then(Value::as_i64)
                .is_some_and(is_server_error)
        });
    }
}

fn trim_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERNAL: &str = r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"boom"}}"#;

    #[test]
    fn a_json_answer_is_judged_at_its_end() {
        let mut scan = ErrorScan::new(false);
        let (a, b) = INTERNAL.as_bytes().split_at(10);
        scan.feed(a);
        scan.feed(b);
        assert!(scan.finish());

        let mut scan = ErrorScan::new(false);
        scan.feed(br#"{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"bad params"}}"#);
        assert!(
            !scan.finish(),
            "a client's mistake is not the server failing"
        );
        let mut scan = ErrorScan::new(false);
        scan.feed(br#"{"jsonrpc":"2.0","id":3,"result":{"isError":true,"content":[]}}"#);
        assert!(!scan.finish(), "a failed tool is a result");
    }

    #[test]
    fn event_stream_messages_are_judged_event_by_event_across_chunks() {
        let stream = format!(
            "id: 1\nretry: 100\ndata:\n\n: keep-alive\n\nevent: message\r\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}}\r\n\r\ndata: {INTERNAL}\n\n"
        );
        for split in [1, 7, 40, stream.len() - 3] {
            let mut scan = ErrorScan::new(true);
            let (a, b) = stream.as_bytes().split_at(split);
            scan.feed(a);
            scan.feed(b);
            assert!(scan.finish(), "split at {split}");
        }
        let mut scan = ErrorScan::new(true);
        scan.feed(b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n");
        assert!(!scan.finish());
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/mcp_stream.rs`): a line over the limit that is
    /// not a `data:` line made the event unscanned when it arrived in several chunks, and was
    /// ignored (the event scanned) when it arrived in one.
    #[test]
    fn a_long_line_is_judged_alike_however_the_stream_is_split() {
        // Chunks of 4096 or 1000 bytes end inside the line, past the limit.
        let long = "x".repeat(MESSAGE_LIMIT + 10_000);
        for (line, found) in [
            (format!(": {long}"), true),
            (format!("data: {long}"), false),
        ] {
            let stream = format!("{line}\ndata: {INTERNAL}\n\n");
            for chunk in [stream.len(), 4096, 1000] {
                let mut scan = ErrorScan::new(true);
                for piece in stream.as_bytes().chunks(chunk) {
                    scan.feed(piece);
                }
                assert_eq!(scan.finish(), found, "{}…, chunks of {chunk}", &line[..8]);
            }
        }
    }

    #[test]
    fn messages_over_the_limit_are_skipped_not_buffered() {
        let mut scan = ErrorScan::new(true);
        scan.feed(b"data: ");
        scan.feed(&vec![b'x'; MESSAGE_LIMIT + 10]);
        scan.feed(b"\n\n");
        assert!(scan.message.capacity() <= MESSAGE_LIMIT && scan.line.is_empty());
        scan.feed(format!("data: {INTERNAL}\n\n").as_bytes());
        assert!(scan.finish(), "the next event is scanned again");
    }
}
