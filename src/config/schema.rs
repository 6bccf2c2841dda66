//! JSON Schema of every kind, for editors (yaml-language-server) and CI linting.

use serde_json::{json, Value};

use super::wire::backend::BackendSpec;
use super::wire::common::ObjectMeta;
use super::wire::egress_policy::EgressPolicySpec;
use super::wire::gateway::GatewaySpec;
use super::wire::policy::BackendTrafficPolicySpec;
use super::wire::proxy::ProxyConfigSpec;
use super::wire::route::HttpRouteSpec;
use super::wire::tls_route::TlsRouteSpec;
use super::wire::xbackend::XBackendSpec;
use super::wire::Kind;

/// One schema that accepts any egressd document (draft-07, `oneOf` by kind).
pub fn json_schema() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let meta: Value = generator.subschema_for::<ObjectMeta>().into();
    let specs: [(Kind, Value); 8] = [
        (
            Kind::Gateway,
            generator.subschema_for::<GatewaySpec>().into(),
        ),
        (
            Kind::HttpRoute,
            generator.subschema_for::<HttpRouteSpec>().into(),
        ),
        (
            Kind::TlsRoute,
            generator.subschema_for::<TlsRouteSpec>().into(),
        ),
        (
            Kind::Backend,
            generator.subschema_for::<BackendSpec>().into(),
        ),
        (
            Kind::BackendTrafficPolicy,
            generator.subschema_for::<BackendTrafficPolicySpec>().into(),
        ),
        (
            Kind::ProxyConfig,
            generator.subschema_for::<ProxyConfigSpec>().into(),
        ),
        (
            Kind::EgressPolicy,
            generator.subschema_for::<EgressPolicySpec>().into(),
        ),
        (
            Kind::XBackend,
            generator.subschema_for::<XBackendSpec>().into(),
        ),
    ];
    let mut kinds: Vec<(Kind, Value)> = specs
        .into_iter()
        .map(|(kind, spec)| {
            let schema = json!({
                "title": kind.name(),
                "type": "object",
                "additionalProperties": false,
                "required": ["apiVersion", "kind", "metadata", "spec"],
                "properties": {
                    "apiVersion": {"enum": kind.api_versions()},
                    "kind": {"const": kind.name()},
                    "metadata": meta.clone(),
                    "spec": spec,
                },
            });
            (kind, schema)
        })
        .collect();
    kinds.extend([Kind::Secret, Kind::ConfigMap].map(|k| (k, keyed_data_schema(k))));
    let names: Vec<&str> = kinds.iter().map(|(k, _)| k.name()).collect();
    // Keyed by `kind` (if/then), not `oneOf`: a validator then checks a document against its
    // own kind only, and reports its mistakes, not every other kind's mismatch with it.
    let by_kind: Vec<Value> = kinds
        .into_iter()
        .map(|(kind, schema)| {
            json!({
                "if": {"required": ["kind"], "properties": {"kind": {"const": kind.name()}}},
                "then": schema,
            })
        })
        .collect();
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://egressd.dev/schema/v1alpha1.json",
        "title": "egressd config document",
        "description": "One YAML document of an egressd config directory (Gateway, HTTPRoute, TLSRoute, Backend, XBackend, BackendTrafficPolicy, ProxyConfig, EgressPolicy, Secret or ConfigMap).",
        "type": "object",
        "required": ["apiVersion", "kind"],
        "properties": {"kind": {"enum": names}},
        "allOf": by_kind,
        "definitions": generator.take_definitions(true),
    })
}

/// A Secret or ConfigMap as `kubectl get -o yaml` writes it: Kubernetes' own shape (no
/// `spec`; `metadata` holds whatever the API server adds).
fn keyed_data_schema(kind: Kind) -> Value {
    let strings = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let mut properties = json!({
        "apiVersion": {"enum": kind.api_versions()},
        "kind": {"const": kind.name()},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}},
        },
        "data": strings.clone(),
        "immutable": {"type": "boolean"},
    });
    if kind == Kind::Secret {
        properties["type"] = json!({"type": "string"});
        properties["stringData"] = strings;
    } else {
        properties["binaryData"] = strings;
    }
    json!({
        "title": kind.name(),
        "type": "object",
        "additionalProperties": false,
        "required": ["apiVersion", "kind", "metadata"],
        "properties": properties,
    })
}
