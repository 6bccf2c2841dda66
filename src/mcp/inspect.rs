//! A bounded look at MCP requests: the JSON-RPC method and, for `tools/call`, the tool name —
//! for the access log and the tool policy. Only bodies egressd already holds (known length,
//! at most [`INSPECT_LIMIT`]) are parsed; the stateless protocol's `Mcp-Method` / `Mcp-Name`
//! headers are used when present.

use serde_json::Value;

/// Request bodies up to this size are read before forwarding and inspected; larger ones, and
/// bodies without a declared length, stream uninspected.
pub const INSPECT_LIMIT: u64 = 1 << 20;

/// One JSON-RPC request of a message (a batch holds several).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Call {
    pub method: Option<String>,
    /// `params.name` of a `tools/call`.
    pub tool: Option<String>,
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
    let tool = (method.as_deref() == Some("tools/call"))
        .then(|| v.get("params")?.get("name")?.as_str().map(str::to_owned))
        .flatten();
    Call {
        method,
        tool,
        id: v.get("id").cloned(),
    }
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
    serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {
            "code": -32602,
            "message": format!("tool `{tool}` is not allowed by this egress proxy's policy"),
        },
    }))
    .unwrap_or_default()
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
                id: Some(serde_json::json!(7))
            }]
        );
        let batch = calls(br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#);
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[1].method.as_deref(), Some("tools/list"));
        assert!(calls(b"not json").is_empty());
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
pub const FILTER_LIMIT: usize = 4 << 20;

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
