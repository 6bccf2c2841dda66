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
use super::wire::Kind;

/// One schema that accepts any egressd document (draft-07, `oneOf` by kind).
pub fn json_schema() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let meta: Value = generator.subschema_for::<ObjectMeta>().into();
    let specs: [(Kind, Value); 7] = [
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
    ];
    let one_of: Vec<Value> = specs
        .into_iter()
        .map(|(kind, spec)| {
            json!({
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
            })
        })
        .collect();
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://egressd.dev/schema/v1alpha1.json",
        "title": "egressd config document",
        "description": "One YAML document of an egressd config directory (Gateway, HTTPRoute, TLSRoute, Backend, BackendTrafficPolicy or ProxyConfig).",
        "oneOf": one_of,
        "definitions": generator.take_definitions(true),
    })
}
