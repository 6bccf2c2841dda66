//! MCP request inspection: the JSON-RPC calls of a body, the `Mcp-Method` / `Mcp-Name`
//! headers, and the `tools/list` filter.
//!
//! Besides never panicking: headers that mirror a body's call (as a 2026-07-28 client writes
//! them, Base64 for values that are not visible ASCII) never contradict it; filtering a tool
//! list twice gives what filtering it once gave, and leaves no denied tool; the JSON-RPC
//! errors egressd answers are JSON carrying the request's id.

#![no_main]

use egressd::mcp::inspect::{
    calls, denied_reply, header_mismatch_reply, method_label, Call, Mirrored, ToolPolicy,
    METHOD_HEADER, NAME_HEADER,
};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let found = calls(data);
    for call in &found {
        let _ = method_label(call.method.as_deref().unwrap_or(""));
        mirror_round_trip(call);
        let tool = call.tool.as_deref().unwrap_or("");
        for reply in [
            denied_reply(call.id.as_ref(), tool),
            header_mismatch_reply(call.id.as_ref(), tool),
        ] {
            let reply: Value = serde_json::from_slice(&reply).expect("a reply is JSON");
            assert_eq!(
                reply.get("id"),
                Some(call.id.as_ref().unwrap_or(&Value::Null))
            );
        }
    }

    // The same bytes as the headers' raw values: first line `Mcp-Method`, second `Mcp-Name`.
    let mut lines = data.split(|b| *b == b'\n');
    let mut headers = HeaderMap::new();
    for name in [METHOD_HEADER, NAME_HEADER] {
        if let Some(Ok(value)) = lines.next().map(HeaderValue::from_bytes) {
            headers.insert(name, value);
        }
    }
    if let Ok(mirrored) = Mirrored::from_headers(&headers) {
        if let Some(call) = mirrored.as_call() {
            assert_eq!(mirrored.contradiction(&call), None);
        }
        for call in &found {
            let _ = mirrored.contradiction(call);
        }
    }

    let policy = ToolPolicy {
        allow: (data.len() % 2 == 1).then(|| vec!["read_*".to_owned(), "search".to_owned()]),
        deny: vec!["rm".to_owned(), "read_secret*".to_owned()],
    };
    for event_stream in [false, true] {
        let Some(once) = policy.filter_tools_list(data, event_stream) else {
            continue;
        };
        let twice = policy.filter_tools_list(&once, event_stream);
        assert_eq!(
            twice.as_deref(),
            Some(&once[..]),
            "filtering is not idempotent"
        );
        if !event_stream {
            let value: Value = serde_json::from_slice(&once).expect("a filtered list is JSON");
            for tool in value["result"]["tools"].as_array().into_iter().flatten() {
                let name = tool["name"].as_str().expect("a kept tool has a name");
                assert!(policy.permits(name), "denied tool {name:?} kept");
            }
        }
    }
});

/// The headers a client mirroring `call` sends are read back as no contradiction of it.
fn mirror_round_trip(call: &Call) {
    let mut headers = HeaderMap::new();
    if let Some(method) = &call.method {
        // Methods are mirrored as they are (only `Mcp-Name` has a Base64 form): one that is
        // not visible ASCII cannot be mirrored, and is refused as such.
        let Some(value) = HeaderValue::from_str(method)
            .ok()
            .filter(|v| v.to_str().is_ok())
        else {
            return;
        };
        headers.insert(METHOD_HEADER, value);
    }
    if let Some(name) = &call.name {
        let plain = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
            && !name.starts_with(' ')
            && !name.ends_with(' ')
            && !name.starts_with("=?base64?");
        let value = if plain {
            name.clone()
        } else {
            format!("=?base64?{}?=", base64(name.as_bytes()))
        };
        headers.insert(NAME_HEADER, HeaderValue::from_str(&value).expect("ASCII"));
    }
    let mirrored = Mirrored::from_headers(&headers).expect("mirrored headers are readable");
    assert_eq!(mirrored.contradiction(call), None, "{headers:?}");
}

/// Standard Base64 with padding (RFC 4648 §4), as SEP-2243 asks.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
