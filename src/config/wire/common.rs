//! Wire types shared by several kinds: object metadata, references, and the placeholder for
//! fields that are part of the model but not implemented yet.

use std::collections::BTreeMap;

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kubernetes-style object metadata. Only the fields egressd uses are accepted.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct ObjectMeta {
    pub(crate) name: String,
    /// Defaults to `default`.
    pub(crate) namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

/// A field of the config model that this build parses but does not implement yet. Setting it is
/// an error ("not supported yet"), never silently ignored.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(transparent)]
pub(crate) struct NotYetSupported(pub(crate) serde_json::Value);

/// A reference to a Backend from a route (`backendRefs[]`).
#[apply(wire!)]
pub(crate) struct BackendRef {
    /// `egressd.dev` (default).
    pub(crate) group: Option<Box<str>>,
    /// `Backend` (default).
    pub(crate) kind: Option<Box<str>>,
    pub(crate) name: String,
    /// Same namespace as the route by default.
    pub(crate) namespace: Option<Box<str>>,
    /// Required when the Backend has several ports.
    pub(crate) port: Option<u16>,
    /// Relative weight among the rule's backendRefs (default 1; 0 disables).
    pub(crate) weight: Option<u32>,
    /// Per-backend filters (not supported yet).
    pub(crate) filters: Option<Box<NotYetSupported>>,
}

/// A reference from a route to the Gateway (listener) it attaches to.
#[apply(wire!)]
pub(crate) struct ParentRef {
    pub(crate) group: Option<Box<str>>,
    pub(crate) kind: Option<Box<str>>,
    pub(crate) namespace: Option<Box<str>>,
    pub(crate) name: String,
    /// Listener name; all HTTP listeners of the Gateway when omitted.
    pub(crate) section_name: Option<Box<str>>,
    pub(crate) port: Option<u16>,
}

/// A reference from a policy to the object it applies to.
#[apply(wire!)]
pub(crate) struct PolicyTargetRef {
    pub(crate) group: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) section_name: Option<String>,
}

/// A reference to a `Secret`/`ConfigMap` holding PEM material.
#[apply(wire!)]
pub(crate) struct SecretRef {
    /// `""` (the core group, the default).
    pub(crate) group: Option<String>,
    /// `Secret` (the default; CA references also take `ConfigMap`).
    pub(crate) kind: Option<String>,
    pub(crate) name: String,
    /// The referrer's namespace by default.
    pub(crate) namespace: Option<String>,
}

/// A certificate chain and private key read from PEM files.
#[apply(wire!)]
pub(crate) struct CertificateFiles {
    pub(crate) certificate_file: String,
    pub(crate) private_key_file: String,
}
