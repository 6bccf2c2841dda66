//! `Gateway` (gateway.networking.k8s.io): the listeners egressd accepts traffic on.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CertificateFiles, NotYetSupported, SecretRef};
use super::enums::{FromNamespaces, FrontendValidationMode, ListenerProtocol, ListenerTlsMode};
use crate::config::yaml::Spanned;

#[apply(wire!)]
pub struct GatewaySpec {
    /// Accepted for compatibility with Gateway API manifests and ignored.
    pub gateway_class_name: Option<String>,
    pub listeners: Vec<Spanned<Listener>>,
    /// Gateway-wide TLS settings towards backends.
    pub tls: Option<Spanned<GatewayTls>>,
    /// Not supported: egressd binds the listener `address` field instead.
    pub addresses: Option<Spanned<NotYetSupported>>,
    pub infrastructure: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub struct Listener {
    pub name: String,
    pub port: u16,
    pub protocol: Spanned<ListenerProtocol>,
    /// egressd extension: the address to bind (default `0.0.0.0`).
    pub address: Option<Spanned<String>>,
    /// Only requests for this hostname (or wildcard) are served by the listener.
    pub hostname: Option<Spanned<String>>,
    pub tls: Option<Spanned<ListenerTls>>,
    pub allowed_routes: Option<AllowedRoutes>,
}

#[apply(wire!)]
pub struct ListenerTls {
    pub mode: Option<ListenerTlsMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_refs: Vec<Spanned<SecretRef>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_files: Vec<CertificateFiles>,
    /// egressd extension: clients present certificates, verified against these CAs; the
    /// certificate's SPIFFE ID (else its subject CN) is the client's identity.
    pub frontend_validation: Option<Spanned<FrontendValidation>>,
}

/// `tls.frontendValidation` of an HTTPS listener.
#[apply(wire!)]
pub struct FrontendValidation {
    /// PEM files of the CAs client certificates must chain to, relative to this YAML file.
    pub ca_certificate_files: Vec<Spanned<String>>,
    /// `Require` (default): a client without a valid certificate cannot connect.
    /// `AllowMissing`: one without a certificate connects with no identity (an invalid
    /// certificate is still refused).
    pub mode: Option<Spanned<FrontendValidationMode>>,
}

#[apply(wire!)]
pub struct AllowedRoutes {
    pub namespaces: Option<RouteNamespaces>,
    pub kinds: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub struct RouteNamespaces {
    /// `Same` (default) or `All`.
    pub from: Option<Spanned<FromNamespaces>>,
    pub selector: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub struct GatewayTls {
    pub backend: Option<GatewayBackendTls>,
}

#[apply(wire!)]
pub struct GatewayBackendTls {
    /// Default client certificate for `Mutual` Backends.
    pub client_certificate_ref: Option<Spanned<SecretRef>>,
}
