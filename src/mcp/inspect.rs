//! A bounded look at MCP requests: the JSON-RPC method and, for `tools/call`, the tool name —
//! for the access log, metrics and the tool policy. Bodies up to [`BODY_LIMIT`] are parsed;
//! the `Mcp-Method` / `Mcp-Name` headers (SEP-2243, protocol 2026-07-28) are read when present,
//! checked against the body when egressd has it, and stand in for it when it does not.

use data_encoding::BASE64;
use serde_json::Value;

/// MCP request bodies up to this size are read before forwarding and inspected (the size MCP
/// asks intermediaries to accept). Larger ones stream uninspected — unless a tool policy must
/// see them, then they are refused (413).
pub(crate) const BODY_LIMIT: u64 = 4 << 20;

/// `Mcp-Method`: the JSON-RPC method, mirrored by 2026-07-28 clients.
pub const METHOD_HEADER: http::HeaderName = http::HeaderName::from_static("mcp-method");
/// `Mcp-Name`: the tool, prompt, resource URI or task the request names.
pub const NAME_HEADER: http::HeaderName = http::HeaderName::from_static("mcp-name");

/// One JSON-RPC request of a message (a batch holds several).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    pub method: Option<String>,
    /// `params.name` of a `tools/call`.
    pub tool: Option<String>,
    /// What `Mcp-Name` mirrors: `params.name` (tools, prompts), `params.uri` (resources) or
    /// `params.taskId` (tasks).
    pub name: Option<String>,
    /// The request's id (absent for notifications).
    pub id: Option<Value>,
}

/// The calls in a JSON-RPC message body (empty if it is not JSON).
pub fn calls(body: &[u8]) -> Vec<Call> {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    match value {
        Value::Array(items) => items.iter().map(call).collect(),
        single => vec![call(&single)],
    }
}

fn call(v: &Value) -> Call {
    let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
    let name = method
        .as_deref()
        .and_then(name_field)
        .and_then(|field| v.get("params")?.get(field)?.as_str().map(str::to_owned));
    let tool = name
        .clone()
        .filter(|_| method.as_deref() == Some("tools/call"));
    Call {
        method,
        tool,
        name,
        id: v.get("id").cloned(),
    }
}

/// The `params` field `Mcp-Name` mirrors for `method` (SEP-2243).
fn name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}

/// What a request's `Mcp-Method` / `Mcp-Name` headers say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Mirrored {
    pub(crate) method: Option<String>,
    /// Decoded (`=?base64?…?=` values are Base64).
    pub(crate) name: Option<String>,
}

impl Mirrored {
    /// Reads the headers; an error names a header that is repeated or cannot be read (these
    /// are singletons: two values would let intermediaries disagree about the request).
    pub fn from_headers(headers: &http::HeaderMap) -> Result<Mirrored, String> {
        let single = |name: &http::HeaderName| -> Result<Option<&str>, String> {
            let mut values = headers.get_all(name).iter();
            let Some(value) = values.next() else {
                return Ok(None);
            };
            if values.next().is_some() {
                return Err(format!("{name} is repeated"));
            }
            value
                .to_str()
                .map(Some)
                .map_err(|_| format!("{name} is not visible ASCII"))
        };
        let name = match single(&NAME_HEADER)? {
            Some(raw) => Some(decode_header_value(raw).ok_or("mcp-name is not valid Base64")?),
            None => None,
        };
        Ok(Mirrored {
            method: single(&METHOD_HEADER)?.map(str::to_owned),
            name,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.method.is_none() && self.name.is_none()
    }

    /// How the headers contradict the body's (single) call, if they do. A header the client
    /// left out is not a contradiction: only 2026-07-28 clients send them.
    pub fn contradiction(&self, call: &Call) -> Option<String> {
        if let Some(method) = &self.method {
            if call.method.as_deref() != Some(method) {
                return Some(format!(
                    "Mcp-Method `{method}` is not the body's method `{}`",
                    call.method.as_deref().unwrap_or("")
                ));
            }
        }
        if let Some(name) = &self.name {
            if call.name.as_deref() != Some(name) {
                return Some(format!(
                    "Mcp-Name `{name}` is not the body's `{}`",
                    call.name.as_deref().unwrap_or("")
                ));
            }
        }
        None
    }

    /// The call the headers describe, for a body egressd did not read.
    pub fn as_call(&self) -> Option<Call> {
        let method = self.method.clone()?;
        let tool = self.name.clone().filter(|_| method == "tools/call");
        Some(Call {
            method: Some(method),
            tool,
            name: self.name.clone(),
            id: None,
        })
    }
}

/// A header value as SEP-2243 encodes it: plain, or `=?base64?<standard Base64>?=` for values
/// that are not visible ASCII.
fn decode_header_value(raw: &str) -> Option<String> {
    match raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(encoded) => String::from_utf8(BASE64.decode(encoded.as_bytes()).ok()?).ok(),
        None => Some(raw.to_owned()),
    }
}

/// The JSON-RPC error for headers that contradict the body (`-32020`, HTTP 400), as MCP servers
/// answer it.
pub fn header_mismatch_reply(id: Option<&Value>, reason: &str) -> Vec<u8> {
    error_reply(id, -32020, reason)
}

/// The answer to a call over a rate limit: a JSON-RPC server error (-32029, in the range JSON-RPC
/// leaves to implementations) the SDKs raise as the call's error, with the seconds to wait in
/// `data.retryAfter`.
pub fn rate_limited_reply(id: Option<&Value>, message: &str, retry_after_secs: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {"code": -32029, "message": message, "data": {"retryAfter": retry_after_secs}},
    }))
    .unwrap_or_default()
}

fn error_reply(id: Option<&Value>, code: i64, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    }))
    .unwrap_or_default()
}

/// `method` as a metrics label: MCP's own methods by name, anything else `other` (labels stay
/// bounded whatever clients send).
pub fn method_label(method: &str) -> &'static str {
    const KNOWN: [&str; 22] = [
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "sampling/createMessage",
        "elicitation/create",
        "roots/list",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
        "notifications/roots/list_changed",
        "tasks/get",
        "tasks/list",
    ];
    KNOWN
        .iter()
        .find(|k| **k == method)
        .copied()
        .unwrap_or("other")
}

/// Which tools a Backend's clients may call (`protocolOptions.mcp.tools`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolPolicy {
    /// When set, only these tools.
    pub allow: Option<Vec<String>>,
    /// Never these (checked after `allow`).
    pub deny: Vec<String>,
}

impl ToolPolicy {
    /// Whether `tool` may be called. Names match exactly, or by prefix with a trailing `*`.
    pub fn permits(&self, tool: &str) -> bool {
        let matches = |pattern: &String| match pattern.strip_suffix('*') {
            Some(prefix) => tool.starts_with(prefix),
            None => pattern == tool,
        };
        self.allow.as_ref().is_none_or(|a| a.iter().any(matches)) && !self.deny.iter().any(matches)
    }
}

/// The JSON-RPC error a denied `tools/call` gets, as the server would answer an unknown tool
/// (`-32602`, invalid params), without the request reaching it.
pub fn denied_reply(id: Option<&Value>, tool: &str) -> Vec<u8> {
    error_reply(
        id,
        -32602,
        &format!("tool `{tool}` is not allowed by this egress proxy's policy"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_of_a_message_and_a_batch() {
        let one = calls(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"rm","arguments":{}}}"#);
        assert_eq!(
            one,
            vec![Call {
                method: Some("tools/call".into()),
                tool: Some("rm".into()),
                name: Some("rm".into()),
                id: Some(serde_json::json!(7))
            }]
        );
        let batch = calls(br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#);
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[1].method.as_deref(), Some("tools/list"));
        assert!(calls(b"not json").is_empty());
        let read = calls(
            br#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"file:///a"}}"#,
        );
        assert_eq!(read[0].name.as_deref(), Some("file:///a"));
        assert_eq!(read[0].tool, None);
    }

    #[test]
    fn mirrored_headers_are_read_decoded_and_checked_against_the_body() {
        let mut headers = http::HeaderMap::new();
        headers.insert(METHOD_HEADER, "tools/call".parse().unwrap());
        // "héllo" is not visible ASCII: Base64 in the sentinel.
        headers.insert(NAME_HEADER, "=?base64?aMOpbGxv?=".parse().unwrap());
        let mirrored = Mirrored::from_headers(&headers).unwrap();
        assert_eq!(mirrored.name.as_deref(), Some("héllo"));
        let body = calls(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"héllo"}}"#
                .as_bytes(),
        );
        assert_eq!(mirrored.contradiction(&body[0]), None);
        let other =
            calls(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm"}}"#);
        assert!(mirrored.contradiction(&other[0]).unwrap().contains("rm"));
        let list = calls(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert!(mirrored
            .contradiction(&list[0])
            .unwrap()
            .contains("Mcp-Method"));
        assert_eq!(mirrored.as_call().unwrap().tool.as_deref(), Some("héllo"));

        headers.append(METHOD_HEADER, "ping".parse().unwrap());
        assert!(Mirrored::from_headers(&headers)
            .unwrap_err()
            .contains("repeated"));
        assert!(Mirrored::from_headers(&http::HeaderMap::new())
            .unwrap()
            .is_empty());
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/mcp_inspect.rs`): a number id came back in
    /// egressd's own replies as another number (the parse was not correctly rounded), so a
    /// client could not match the reply to its request.
    #[test]
    fn replies_carry_the_request_id_exactly() {
        for id in [
            "1.5e200",
            "0.1",
            "7",
            "-9223372036854775808",
            "18446744073709551615",
        ] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"rm"}}}}"#
            );
            let call = &calls(body.as_bytes())[0];
            for reply in [
                denied_reply(call.id.as_ref(), "rm"),
                header_mismatch_reply(call.id.as_ref(), "x"),
            ] {
                let reply: Value = serde_json::from_slice(&reply).unwrap();
                assert_eq!(reply.get("id"), call.id.as_ref(), "{id}");
            }
        }
    }

    #[test]
    fn allow_then_deny_with_prefixes() {
        let p = ToolPolicy {
            allow: Some(vec!["read_*".into(), "search".into()]),
            deny: vec!["read_secrets".into()],
        };
        assert!(p.permits("read_file"));
        assert!(p.permits("search"));
        assert!(!p.permits("read_secrets"));
        assert!(!p.permits("delete_file"));
        assert!(ToolPolicy::default().permits("anything"));
    }
}

/// Responses to `tools/list` up to this size are read whole to be filtered.
pub(crate) const FILTER_LIMIT: usize = 4 << 20;

impl ToolPolicy {
    /// `result.tools` of a JSON-RPC response without the tools the policy denies; `None` when
    /// the message has no tool list (left as it is).
    fn filter_message(&self, message: &str) -> Option<String> {
        let mut value: Value = serde_json::from_str(message).ok()?;
        let tools = value.get_mut("result")?.get_mut("tools")?.as_array_mut()?;
        tools.retain(|t| {
            t.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| self.permits(n))
        });
        serde_json::to_string(&value).ok()
    }

    /// A `tools/list` response body without denied tools: a JSON message, or an event stream
    /// whose `data:` lines carry messages (other lines are kept byte for byte).
    pub fn filter_tools_list(&self, body: &[u8], event_stream: bool) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(body).ok()?;
        if !event_stream {
            return self.filter_message(text).map(String::into_bytes);
        }
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            let content = line.trim_end_matches(['\r', '\n']);
            let ending = &line[content.len()..];
            match content
                .strip_prefix("data:")
                .and_then(|d| self.filter_message(d.trim_start()))
            {
                Some(filtered) => {
                    out.push_str("data: ");
                    out.push_str(&filtered);
                    out.push_str(ending);
                }
                None => out.push_str(line),
            }
        }
        Some(out.into_bytes())
    }
}

#[cfg(test)]
mod filter_tests {
    use super::*;

    #[test]
    fn denied_tools_leave_json_and_event_stream_lists() {
        let p = ToolPolicy {
            allow: None,
            deny: vec!["rm".into()],
        };
        let json = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"ls"},{"name":"rm"}]}}"#;
        let out = p.filter_tools_list(json, false).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["result"]["tools"].as_array().unwrap().len(), 1);
        assert_eq!(v["result"]["tools"][0]["name"], "ls");

        let sse = "id: 1\nretry: 3000\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"tools\":[{\"name\":\"rm\"},{\"name\":\"cat\"}]}}\n\n";
        let out = String::from_utf8(p.filter_tools_list(sse.as_bytes(), true).unwrap()).unwrap();
        assert!(
            out.starts_with("id: 1\nretry: 3000\n\nevent: message\ndata: "),
            "{out}"
        );
        assert!(out.contains("\"cat\"") && !out.contains("\"rm\""), "{out}");
        assert!(out.ends_with("}\n\n"));
    }
}
