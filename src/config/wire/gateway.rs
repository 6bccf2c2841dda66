//! `Gateway` (gateway.networking.k8s.io): the listeners egressd accepts traffic on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CertificateFiles, NotYetSupported, SecretRef};
use super::enums::{FromNamespaces, ListenerProtocol, ListenerTlsMode};
use crate::config::yaml::Spanned;

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySpec {
    /// Accepted for compatibility with Gateway API manifests and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_class_name: Option<String>,
    pub listeners: Vec<Spanned<Listener>>,
    /// Gateway-wide TLS settings towards backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Spanned<GatewayTls>>,
    /// Not supported: egressd binds the listener `address` field instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Spanned<NotYetSupported>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure: Option<Spanned<NotYetSupported>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    pub port: u16,
    pub protocol: Spanned<ListenerProtocol>,
    /// egressd extension: the address to bind (default `0.0.0.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Spanned<String>>,
    /// Only requests for this hostname (or wildcard) are served by the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Spanned<ListenerTls>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ListenerTlsMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_refs: Vec<SecretRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_files: Vec<CertificateFiles>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedRoutes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Spanned<NotYetSupported>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteNamespaces {
    /// `Same` (default) or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Spanned<FromNamespaces>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Spanned<NotYetSupported>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<GatewayBackendTls>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayBackendTls {
    /// Default client certificate for `Mutual` Backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_ref: Option<SecretRef>,
}
