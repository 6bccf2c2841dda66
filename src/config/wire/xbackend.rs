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
pub struct XBackendSpec {
    /// `ExternalHostname` (the only type egressd serves).
    #[serde(rename = "type")]
    pub kind: Spanned<XBackendType>,
    /// The one port to connect to.
    pub port: Spanned<XBackendPort>,
    /// Where to connect, for type `ExternalHostname`.
    pub external_hostname: Option<Spanned<ExternalHostname>>,
    /// Type `EndpointSelector` selects cluster pods: egressd reads no cluster.
    pub endpoint_selector: Option<Spanned<NotYetSupported>>,
    /// `HTTP` when omitted.
    pub protocol: Option<Spanned<XBackendProtocol>>,
    /// Omitted: no TLS (Gateway API's reading; egressd's own `Backend` defaults to verified
    /// TLS instead).
    pub tls: Option<Spanned<XBackendTls>>,
}

/// The port: `number` (the upstream type), or `port` with an optional `name` (the spelling
/// of Service ports, which manifests also use); exactly one of `number` and `port`.
#[apply(wire!)]
pub struct XBackendPort {
    pub name: Option<String>,
    pub number: Option<Spanned<u16>>,
    pub port: Option<Spanned<u16>>,
}

#[apply(wire!)]
pub struct ExternalHostname {
    pub hostname: Spanned<String>,
}

#[apply(wire!)]
pub struct XBackendTls {
    pub mode: Spanned<XBackendTlsMode>,
    /// A `kubernetes.io/tls` Secret; set exactly when mode is `ClientAndServer`.
    pub client_certificate_ref: Option<Spanned<SecretRef>>,
    pub validation: Option<Spanned<XBackendTlsValidation>>,
}

/// The shape of BackendTLSPolicy's `validation`.
#[apply(wire!)]
pub struct XBackendTlsValidation {
    /// ConfigMaps (or Secrets) whose `ca.crt` holds the CA certificates to trust.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_certificate_refs: Vec<Spanned<SecretRef>>,
    #[serde(rename = "wellKnownCACertificates")]
    pub well_known_ca_certificates: Option<WellKnownCa>,
    /// The name the certificate must carry (and the SNI); default the external hostname.
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
}
