//! Wire types: the config exactly as people write it (serde + JSON Schema). Runtime code never
//! sees these; `runtime::compile` turns them into the snapshot the hot path reads.

/// The recipe of every wire struct, written once: `#[apply(wire!)]` derives what loading,
/// `/config` and `egressd schema` need (`Deserialize`, `Serialize`, `JsonSchema`, `Clone`,
/// `Debug`), takes fields in camelCase, refuses unknown fields (a typo is an error with its
/// position, never silently ignored), and leaves `None` fields out when serializing. Missing
/// `Option` fields read as `None` without `#[serde(default)]`.
macro_rules! wire {
    ($item:item) => {
        #[::serde_with_macros::skip_serializing_none]
        #[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        $item
    };
}

pub(crate) mod backend;
pub(crate) mod common;
pub(crate) mod egress_policy;
pub(crate) mod enums;
pub(crate) mod gateway;
pub(crate) mod policy;
pub(crate) mod proxy;
pub(crate) mod rate_limit;
pub(crate) mod route;
pub(crate) mod secret;
pub(crate) mod tls_route;
pub(crate) mod xbackend;

use std::path::Path;
use std::sync::Arc;

use self::common::ObjectMeta;
use crate::config::error::ObjectId;
use crate::config::yaml::Pos;

/// API group of egressd's own kinds.
pub(crate) const EGRESSD_GROUP: &str = "egressd.dev";
/// API group of the Gateway API kinds.
pub(crate) const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// API group of Gateway API's experimental kinds (`XBackend`).
pub(crate) const GATEWAY_X_GROUP: &str = "gateway.networking.x-k8s.io";

/// The kinds a config may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Gateway,
    HttpRoute,
    TlsRoute,
    Backend,
    BackendTrafficPolicy,
    ProxyConfig,
    EgressPolicy,
    XBackend,
    Secret,
    ConfigMap,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Gateway,
        Kind::HttpRoute,
        Kind::TlsRoute,
        Kind::Backend,
        Kind::BackendTrafficPolicy,
        Kind::ProxyConfig,
        Kind::EgressPolicy,
        Kind::XBackend,
        Kind::Secret,
        Kind::ConfigMap,
    ];

    /// The `kind:` value.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::TlsRoute => "TLSRoute",
            Kind::Backend => "Backend",
            Kind::BackendTrafficPolicy => "BackendTrafficPolicy",
            Kind::ProxyConfig => "ProxyConfig",
            Kind::EgressPolicy => "EgressPolicy",
            Kind::XBackend => "XBackend",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    /// The accepted `apiVersion` values; the first is canonical.
    pub fn api_versions(self) -> &'static [&'static str] {
        match self {
            Kind::Gateway | Kind::HttpRoute => &[
                "gateway.networking.k8s.io/v1",
                "gateway.networking.k8s.io/v1beta1",
                "gateway.networking.k8s.io/v1alpha2",
            ],
            // TLSRoute is served upstream by v1alpha2 (canonical); later versions accepted.
            Kind::TlsRoute => &[
                "gateway.networking.k8s.io/v1alpha2",
                "gateway.networking.k8s.io/v1alpha3",
                "gateway.networking.k8s.io/v1",
            ],
            Kind::XBackend => &["gateway.networking.x-k8s.io/v1alpha1"],
            Kind::Secret | Kind::ConfigMap => &["v1"],
            _ => &["egressd.dev/v1alpha1"],
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Kinds that belong to the model but are not implemented by this build yet.
pub(crate) const KINDS_NOT_YET_SUPPORTED: &[&str] = &["GRPCRoute", "TCPRoute", "ReferenceGrant"];

/// One parsed object with where it came from.
#[derive(Clone, Debug)]
pub struct Object<S> {
    pub id: ObjectId,
    /// `metadata.labels` and `annotations`, when it has any (most objects: none). The name
    /// and namespace are in `id`, not kept twice: a config serves as long as it is loaded.
    pub(crate) labels: Option<Box<Labels>>,
    /// Whether `metadata.namespace` was written (`id` says `default` when it was not).
    pub(crate) namespace_written: bool,
    pub(crate) file: Arc<Path>,
    /// Position of the document (its first key).
    pub(crate) pos: Pos,
    pub(crate) spec: S,
}

/// `metadata.labels` and `metadata.annotations`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Labels {
    pub(crate) labels: std::collections::BTreeMap<String, String>,
    pub(crate) annotations: std::collections::BTreeMap<String, String>,
}

impl<S> Object<S> {
    /// `metadata` as it was written.
    pub(crate) fn meta(&self) -> ObjectMeta {
        let labels = self.labels.as_deref().cloned().unwrap_or_default();
        ObjectMeta {
            name: self.id.name.to_string(),
            namespace: self
                .namespace_written
                .then(|| self.id.namespace.to_string()),
            labels: labels.labels,
            annotations: labels.annotations,
        }
    }

    #[cfg(test)]
    pub(crate) fn name(&self) -> &str {
        &self.id.name
    }
}
