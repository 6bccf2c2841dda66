//! The config dump, with secrets removed.

use serde_json::{json, Value};

use crate::config::wire::Kind;
use crate::config::ConfigSet;

/// Header names whose values are credentials.
fn is_sensitive_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
    ]
    .contains(&n.as_str())
        || [
            "token",
            "secret",
            "key",
            "password",
            "auth",
            "credential",
            "session",
        ]
        .iter()
        .any(|w| n.contains(w))
}

/// Every object of the config, as written, with header values of credential-looking headers
/// replaced by `<redacted>`.
pub fn config_dump(set: &ConfigSet) -> Value {
    let mut objects = Vec::new();
    let mut push = |kind: Kind, meta: Value, spec: Value| {
        let mut doc = json!({
            "apiVersion": kind.api_versions()[0],
            "kind": kind.name(),
            "metadata": meta,
            "spec": spec,
        });
        redact(&mut doc);
        objects.push(doc);
    };
    macro_rules! dump {
        ($list:expr, $kind:expr) => {
            for o in &$list {
                push(
                    $kind,
                    serde_json::to_value(&o.meta).unwrap_or(Value::Null),
                    serde_json::to_value(&o.spec).unwrap_or(Value::Null),
                );
            }
        };
    }
    dump!(set.proxy_configs, Kind::ProxyConfig);
    dump!(set.gateways, Kind::Gateway);
    dump!(set.http_routes, Kind::HttpRoute);
    dump!(set.tls_routes, Kind::TlsRoute);
    dump!(set.backends, Kind::Backend);
    dump!(set.policies, Kind::BackendTrafficPolicy);
    json!({ "files": set.files, "objects": objects })
}

fn redact(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let sensitive = map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(is_sensitive_header);
            for (k, child) in map.iter_mut() {
                if (k == "value" && sensitive) || k == "credential" {
                    *child = Value::String("<redacted>".into());
                } else {
                    redact(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credential_headers() {
        let mut v = json!({"set": [{"name": "Authorization", "value": "Bearer x"}, {"name": "x-team", "value": "a"}]});
        redact(&mut v);
        assert_eq!(v["set"][0]["value"], "<redacted>");
        assert_eq!(v["set"][1]["value"], "a");
    }
}
