//! `XBackend` (gateway.networking.x-k8s.io/v1alpha1, Gateway API GEP-4894): the upstream
//! shape of a Backend, one external hostname and one port. Loading maps it onto egressd's
//! [`BackendSpec`](super::backend::BackendSpec) (see `config::xbackend`).

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backend::SubjectAltName;
use super::common::{NotYetSupported, SecretRef};
use super::enums::{WellKnownCa, XBackendProtocol, XBackendTlsMode, XBackendType};
use crate::config::yaml::Spanned;

#[apply(wire!)]
pub(crate) struct XBackendSpec {
    /// `ExternalHostname` (the only type egressd serves).
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<XBackendType>,
    /// The one port to connect to.
    pub(crate) port: Spanned<XBackendPort>,
    /// Where to connect, for type `ExternalHostname`.
    pub(crate) external_hostname: Option<Spanned<ExternalHostname>>,
    /// Type `EndpointSelector` selects cluster pods: egressd reads no cluster.
    pub(crate) endpoint_selector: Option<Spanned<NotYetSupported>>,
    /// `HTTP` when omitted.
    pub(crate) protocol: Option<Spanned<XBackendProtocol>>,
    /// Omitted: no TLS (Gateway API's reading; egressd's own `Backend` defaults to verified
    /// TLS instead).
    pub(crate) tls: Option<Spanned<XBackendTls>>,
}

/// The port: `number` (the upstream type), or `port` with an optional `name` (the spelling
/// of Service ports, which manifests also use); exactly one of `number` and `port`.
#[apply(wire!)]
pub(crate) struct XBackendPort {
    pub(crate) name: Option<String>,
    pub(crate) number: Option<Spanned<u16>>,
    pub(crate) port: Option<Spanned<u16>>,
}

#[apply(wire!)]
pub(crate) struct ExternalHostname {
    pub(crate) hostname: Spanned<String>,
}

#[apply(wire!)]
pub(crate) struct XBackendTls {
    pub(crate) mode: Spanned<XBackendTlsMode>,
    /// A `kubernetes.io/tls` Secret; set exactly when mode is `ClientAndServer`.
    pub(crate) client_certificate_ref: Option<Spanned<SecretRef>>,
    pub(crate) validation: Option<Spanned<XBackendTlsValidation>>,
}

/// The shape of BackendTLSPolicy's `validation`.
#[apply(wire!)]
pub(crate) struct XBackendTlsValidation {
    /// ConfigMaps (or Secrets) whose `ca.crt` holds the CA certificates to trust.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ca_certificate_refs: Vec<Spanned<SecretRef>>,
    #[serde(rename = "wellKnownCACertificates")]
    pub(crate) well_known_ca_certificates: Option<WellKnownCa>,
    /// The name the certificate must carry (and the SNI); default the external hostname.
    pub(crate) hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) subject_alt_names: Vec<SubjectAltName>,
}
