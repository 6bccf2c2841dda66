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
    pub(crate) gateway_class_name: Option<String>,
    pub(crate) listeners: Vec<Spanned<Listener>>,
    /// Gateway-wide TLS settings towards backends.
    pub(crate) tls: Option<Spanned<GatewayTls>>,
    /// Not supported: egressd binds the listener `address` field instead.
    pub(crate) addresses: Option<Spanned<NotYetSupported>>,
    pub(crate) infrastructure: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub(crate) struct Listener {
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) protocol: Spanned<ListenerProtocol>,
    /// egressd extension: the address to bind (default `0.0.0.0`).
    pub(crate) address: Option<Spanned<String>>,
    /// Only requests for this hostname (or wildcard) are served by the listener.
    pub(crate) hostname: Option<Spanned<String>>,
    pub(crate) tls: Option<Spanned<ListenerTls>>,
    pub(crate) allowed_routes: Option<AllowedRoutes>,
}

#[apply(wire!)]
pub(crate) struct ListenerTls {
    pub(crate) mode: Option<ListenerTlsMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) certificate_refs: Vec<Spanned<SecretRef>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) certificate_files: Vec<CertificateFiles>,
    /// egressd extension: clients present certificates, verified against these CAs; the
    /// certificate's SPIFFE ID (else its subject CN) is the client's identity.
    pub(crate) frontend_validation: Option<Spanned<FrontendValidation>>,
}

/// `tls.frontendValidation` of an HTTPS listener.
#[apply(wire!)]
pub(crate) struct FrontendValidation {
    /// PEM files of the CAs client certificates must chain to, relative to this YAML file.
    pub(crate) ca_certificate_files: Vec<Spanned<String>>,
    /// `Require` (default): a client without a valid certificate cannot connect.
    /// `AllowMissing`: one without a certificate connects with no identity (an invalid
    /// certificate is still refused).
    pub(crate) mode: Option<Spanned<FrontendValidationMode>>,
}

#[apply(wire!)]
pub(crate) struct AllowedRoutes {
    pub(crate) namespaces: Option<RouteNamespaces>,
    pub(crate) kinds: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub(crate) struct RouteNamespaces {
    /// `Same` (default) or `All`.
    pub(crate) from: Option<Spanned<FromNamespaces>>,
    pub(crate) selector: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub(crate) struct GatewayTls {
    pub(crate) backend: Option<GatewayBackendTls>,
}

#[apply(wire!)]
pub(crate) struct GatewayBackendTls {
    /// Default client certificate for `Mutual` Backends.
    pub(crate) client_certificate_ref: Option<Spanned<SecretRef>>,
}
