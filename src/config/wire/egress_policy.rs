//! `EgressPolicy` (egressd.dev): which clients may reach which destinations.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::enums::EgressPolicyMode;
use crate::config::yaml::Spanned;

#[apply(wire!)]
pub(crate) struct EgressPolicySpec {
    /// `Enforce` (default): a client the policy does not list is refused (403
    /// `client_not_allowed`). `Report`: it passes, and the refusal `Enforce` would make is
    /// logged, counted and listed in `/blocked`.
    pub(crate) mode: Option<Spanned<EgressPolicyMode>>,
    /// The clients the policy lets through; a client matching any entry of any list is in.
    pub(crate) clients: Spanned<EgressClients>,
    /// The destinations the policy covers: only the clients it lists reach them.
    pub(crate) to: Spanned<EgressDestinations>,
}

/// `EgressPolicy.spec.clients`. Names match exactly, or by prefix when they end in `*`
/// (`spiffe://cluster.local/ns/payments/*`).
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct EgressClients {
    /// SPIFFE IDs: the `spiffe://` URI SAN of the client certificate (HTTPS listeners with
    /// `tls.frontendValidation`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) spiffe_ids: Vec<Spanned<String>>,
    /// Subject common names of client certificates that carry no SPIFFE ID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) subject_names: Vec<Spanned<String>>,
    /// Source addresses (CIDRs; a bare address is one host), in canonical form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) cidrs: Vec<Spanned<String>>,
    /// Users authenticated by `Proxy-Authorization: Basic`
    /// (`ProxyConfig.spec.clientPolicy.proxyUsers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) proxy_users: Vec<Spanned<String>>,
}

/// `EgressPolicy.spec.to`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct EgressDestinations {
    /// Backends, by name (namespace: the policy's unless given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) backend_refs: Vec<Spanned<EgressBackendRef>>,
    /// Destination hostnames, exact or `*.suffix` (one or more labels): a Backend's
    /// `fqdn.hostname`, or the host of an undeclared destination.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) hostnames: Vec<Spanned<String>>,
}

/// A Backend an `EgressPolicy` covers.
#[apply(wire!)]
pub(crate) struct EgressBackendRef {
    /// `egressd.dev` (default).
    pub(crate) group: Option<String>,
    /// `Backend` (default).
    pub(crate) kind: Option<String>,
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
}
