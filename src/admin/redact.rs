//! The config dump, with secrets removed.

use serde_json::{json, Value};

use crate::config::wire::secret::KeyedData;
use crate::config::wire::{Kind, Object};
use crate::config::ConfigSet;

/// What replaces a redacted value.
const REDACTED: &str = "<redacted>";

/// Every object of the config, as written, with the values that may be secrets replaced by
/// `<redacted>` (see [`redact`]); names, paths and hostnames stay visible.
pub(crate) fn config_dump(set: &ConfigSet) -> Value {
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
            for o in $list {
                push(
                    $kind,
                    serde_json::to_value(o.meta()).unwrap_or(Value::Null),
                    serde_json::to_value(&o.spec).unwrap_or(Value::Null),
                );
            }
        };
    }
    dump!(&set.proxy_configs, Kind::ProxyConfig);
    dump!(&set.gateways, Kind::Gateway);
    dump!(&set.http_routes, Kind::HttpRoute);
    dump!(&set.tls_routes, Kind::TlsRoute);
    // XBackends are in `backends` too, mapped: they are shown as written.
    let backends = set.backends.iter().filter(|o| &*o.id.kind == "Backend");
    dump!(backends, Kind::Backend);
    dump!(&set.xbackends, Kind::XBackend);
    dump!(&set.policies, Kind::BackendTrafficPolicy);
    dump!(&set.egress_policies, Kind::EgressPolicy);
    for o in &set.secrets {
        objects.push(secret_dump(o));
    }
    json!({ "files": set.files, "objects": objects })
}

/// A Secret or ConfigMap: its type and the names of its keys, never their values (a CA
/// bundle is no secret, but one rule for both kinds leaves nothing to get wrong).
fn secret_dump(o: &Object<KeyedData>) -> Value {
    let kind = if &*o.id.kind == "Secret" {
        Kind::Secret
    } else {
        Kind::ConfigMap
    };
    let keys: serde_json::Map<String, Value> = o
        .spec
        .entries
        .keys()
        .map(|k| (k.clone(), Value::String(REDACTED.into())))
        .collect();
    let mut doc = json!({
        "apiVersion": kind.api_versions()[0],
        "kind": kind.name(),
        "metadata": serde_json::to_value(o.meta()).unwrap_or(Value::Null),
        "data": keys,
    });
    if kind == Kind::Secret {
        doc["type"] = Value::String(o.spec.secret_type().to_owned());
    }
    doc
}

/// Redacts by shape, not by header name, so that no naming convention can leak a secret:
///
/// - every `{name, value}` pair: the headers a `RequestHeaderModifier` or
///   `ResponseHeaderModifier` sets or adds (`X-Upstream-Bearer`, `X-Signature`, ...) and every
///   header or query parameter match value, wherever the kind puts them (HTTPRoute filters
///   and matches today, policies later); the name stays;
/// - every `credential` (a CredentialInjector's source).
///
/// Secrets and ConfigMaps show their key names only ([`secret_dump`]).
///
/// A path match (`{type, value}`) has no `name` and stays visible.
fn redact(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let pair = map.get("name").is_some_and(Value::is_string);
            for (k, child) in map.iter_mut() {
                if (k == "value" && pair) || k == "credential" {
                    *child = Value::String(REDACTED.into());
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
    fn redacts_every_name_value_pair_and_keeps_names_and_paths() {
        let mut v = json!({
            "set": [{"name": "Authorization", "value": "Bearer x"}, {"name": "x-team", "value": "a"}],
            "path": {"type": "PathPrefix", "value": "/v1"},
            "credential": {"valueFile": "/k"},
        });
        redact(&mut v);
        assert_eq!(v["set"][0]["value"], REDACTED);
        assert_eq!(v["set"][1]["value"], REDACTED);
        assert_eq!(v["set"][1]["name"], "x-team");
        assert_eq!(v["path"]["value"], "/v1");
        assert_eq!(v["credential"], REDACTED);
    }
}
