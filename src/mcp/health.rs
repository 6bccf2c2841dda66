//! The messages of an MCP active health check (`healthCheck.active.type: MCP`) and the reading
//! of their answers; the connection and the order of steps are `upstream::health_check`'s.

use http::{HeaderName, HeaderValue};
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// The newest protocol version with an `initialize` handshake; later ones are stateless.
pub(crate) const LATEST_WITH_INITIALIZE: &str = "2025-11-25";

/// An answer bigger than this is not read further (1 MiB, the SSE event size MCP asks for).
const ANSWER_LIMIT: usize = 1 << 20;

/// Whether `version` is the stateless protocol (2026-07-28 or later): no session, each
/// request carries its own context. Versions are dates, so they compare as strings.
pub(crate) fn is_stateless(version: &str) -> bool {
    version >= "2026-07-28"
}

fn client_info() -> Value {
    json!({"name": "egressd-health-check", "version": env!("CARGO_PKG_VERSION")})
}

/// `initialize` with `version` (else [`LATEST_WITH_INITIALIZE`]; the server may answer another).
pub(crate) fn initialize(id: u64, version: Option<&str>) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": version.unwrap_or(LATEST_WITH_INITIALIZE),
            "capabilities": {},
            "clientInfo": client_info(),
        },
    })
}

pub(crate) fn initialized() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

/// `ping`; for the stateless protocol with the per-request context it requires in `_meta`.
pub(crate) fn ping(id: u64, stateless_version: Option<&str>) -> Value {
    match stateless_version {
        Some(version) => json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "ping",
            "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientInfo": client_info(),
                "io.modelcontextprotocol/clientCapabilities": {},
            }},
        }),
        None => json!({"jsonrpc": "2.0", "id": id, "method": "ping"}),
    }
}

/// The headers of a request after `initialize`: the session, the negotiated version, and the
/// `Mcp-Method` mirror 2026-07-28 servers require.
pub(crate) fn headers(
    session: Option<HeaderValue>,
    version: &str,
    method: &'static str,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = vec![(
        super::inspect::METHOD_HEADER,
        HeaderValue::from_static(method),
    )];
    if let Ok(version) = HeaderValue::from_str(version) {
        headers.push((super::PROTOCOL_VERSION, version));
    }
    if let Some(session) = session {
        headers.push((super::SESSION_ID, session));
    }
    headers
}

/// How long the rest of an event stream is waited for once its response arrived: servers
/// close it right after (then the connection can carry the next step), or keep it open (an
/// event store's stream, kept for resumption; then the next step needs a new connection).
const STREAM_END_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// An answer read: the JSON-RPC result, and whether its body was read to the end (over
/// HTTP/1.1 a connection carries the next request only then).
pub(crate) struct Answer {
    pub(crate) result: Result<Value, String>,
    pub(crate) finished: bool,
}

/// The `result` of the JSON-RPC response `id` in `answer` (JSON, or the event stream a POST
/// may be answered with, read until that response arrives and, briefly, to its end); an error
/// says what came instead.
pub(crate) async fn read_result(answer: http::Response<hyper::body::Incoming>, id: u64) -> Answer {
    let status = answer.status();
    if status != http::StatusCode::OK {
        return Answer {
            result: Err(format!("status {status}")),
            finished: false,
        };
    }
    let event_stream = super::is_event_stream(answer.headers());
    let mut body = answer.into_body();
    let mut received = Vec::new();
    let mut found: Option<Result<Value, String>> = None;
    loop {
        let next = match &found {
            None => body.frame().await,
            // The response is in: wait a little for the stream's end, no longer.
            Some(_) => match tokio::time::timeout(STREAM_END_GRACE, body.frame()).await {
                Ok(next) => next,
                Err(_) => {
                    return Answer {
                        result: found.unwrap_or_else(|| Err("no response".into())),
                        finished: false,
                    }
                }
            },
        };
        let Some(frame) = next else {
            break;
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                return Answer {
                    result: found.unwrap_or_else(|| Err(format!("answer broke off: {e}"))),
                    finished: false,
                }
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received.extend_from_slice(&data);
        if received.len() > ANSWER_LIMIT {
            return Answer {
                result: found.unwrap_or_else(|| Err(format!("answer over {ANSWER_LIMIT} bytes"))),
                finished: false,
            };
        }
        // An event stream may stay open after the response: stop waiting for it soon.
        if event_stream && found.is_none() {
            found = response_in_events(&received, id);
        }
    }
    let result = if event_stream {
        found
            .or_else(|| response_in_events(&received, id))
            .unwrap_or_else(|| Err("the event stream ended without the response".into()))
    } else {
        serde_json::from_slice::<Value>(&received)
            .map_err(|e| format!("answer is not JSON: {e}"))
            .and_then(|message| {
                result_of(&message, id)
                    .unwrap_or_else(|| Err("the answer is not the response".into()))
            })
    };
    Answer {
        result,
        finished: true,
    }
}

/// The response `id` among the complete events of `stream`, if one has arrived.
fn response_in_events(stream: &[u8], id: u64) -> Option<Result<Value, String>> {
    let text = String::from_utf8_lossy(stream).replace("\r\n", "\n");
    let complete = &text[..text.rfind("\n\n")?];
    complete.split("\n\n").find_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        let message: Value = serde_json::from_str(&data.join("\n")).ok()?;
        result_of(&message, id)
    })
}

fn result_of(message: &Value, id: u64) -> Option<Result<Value, String>> {
    if message.get("id").and_then(Value::as_u64) != Some(id) {
        return None;
    }
    Some(match (message.get("result"), message.get("error")) {
        (Some(result), _) => Ok(result.clone()),
        (None, Some(error)) => Err(format!("error {error}")),
        (None, None) => Err("a response without result or error".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_response_is_found_among_events() {
        let stream = b"id: 0/1\nretry: 3000\ndata:\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n";
        assert_eq!(response_in_events(stream, 2), Some(Ok(json!({}))));
        assert_eq!(response_in_events(stream, 3), None);
        assert_eq!(
            response_in_events(&stream[..stream.len() - 1], 2),
            None,
            "incomplete"
        );
        let error = b"data: {\"jsonrpc\":\"2.0\",\"id\":2,\"error\":{\"code\":-32603}}\r\n\r\n";
        assert!(response_in_events(error, 2)
            .unwrap()
            .unwrap_err()
            .contains("-32603"));
    }

    #[test]
    fn versions_from_2026_07_28_are_stateless() {
        assert!(!is_stateless("2025-11-25"));
        assert!(is_stateless("2026-07-28"));
    }
}
