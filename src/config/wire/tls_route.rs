//! `TLSRoute` (gateway.networking.k8s.io): how TLS Passthrough listeners route by the
//! ClientHello's SNI to Passthrough Backends, beyond the implicit route by Backend hostname.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{BackendRef, ParentRef};
use crate::config::yaml::Spanned;

#[apply(wire!)]
pub(crate) struct TlsRouteSpec {
    /// Gateways (and listeners) this route attaches to; every TLS Passthrough listener when
    /// omitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) parent_refs: Vec<Spanned<ParentRef>>,
    /// SNI hostnames (exact or `*.suffix`) this route serves; any SNI when omitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) hostnames: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) rules: Vec<Spanned<TlsRouteRule>>,
}

#[apply(wire!)]
pub(crate) struct TlsRouteRule {
    pub(crate) name: Option<String>,
    /// Passthrough Backends the connection goes to, picked by weight.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) backend_refs: Vec<Spanned<BackendRef>>,
}
