//! Wire types shared by several kinds: object metadata, references, and the placeholder for
//! fields that are part of the model but not implemented yet.

use std::collections::BTreeMap;

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kubernetes-style object metadata. Only the fields egressd uses are accepted.
#[apply(wire!)]
#[derive(Default)]
pub struct ObjectMeta {
    pub name: String,
    /// Defaults to `default`.
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A field of the config model that this build parses but does not implement yet. Setting it is
/// an error ("not supported yet"), never silently ignored.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct NotYetSupported(pub serde_json::Value);

/// A reference to a Backend from a route (`backendRefs[]`).
#[apply(wire!)]
pub struct BackendRef {
    /// `egressd.dev` (default).
    pub group: Option<Box<str>>,
    /// `Backend` (default).
    pub kind: Option<Box<str>>,
    pub name: String,
    /// Same namespace as the route by default.
    pub namespace: Option<Box<str>>,
    /// Required when the Backend has several ports.
    pub port: Option<u16>,
    /// Relative weight among the rule's backendRefs (default 1; 0 disables).
    pub weight: Option<u32>,
    /// Per-backend filters (not supported yet).
    pub filters: Option<Box<NotYetSupported>>,
}

/// A reference from a route to the Gateway (listener) it attaches to.
#[apply(wire!)]
pub struct ParentRef {
    pub group: Option<Box<str>>,
    pub kind: Option<Box<str>>,
    pub namespace: Option<Box<str>>,
    pub name: String,
    /// Listener name; all HTTP listeners of the Gateway when omitted.
    pub section_name: Option<Box<str>>,
    pub port: Option<u16>,
}

/// A reference from a policy to the object it applies to.
#[apply(wire!)]
pub struct PolicyTargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    pub section_name: Option<String>,
}

/// A reference to a `Secret`/`ConfigMap` holding PEM material.
#[apply(wire!)]
pub struct SecretRef {
    /// `""` (the core group, the default).
    pub group: Option<String>,
    /// `Secret` (the default; CA references also take `ConfigMap`).
    pub kind: Option<String>,
    pub name: String,
    /// The referrer's namespace by default.
    pub namespace: Option<String>,
}

/// A certificate chain and private key read from PEM files.
#[apply(wire!)]
pub struct CertificateFiles {
    pub certificate_file: String,
    pub private_key_file: String,
}
