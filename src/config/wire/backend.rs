//! `Backend` (egressd.dev): a destination and exactly how to connect to it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CertificateFiles, NotYetSupported, SecretRef};
use super::enums::{DestinationType, Protocol, SanType, TlsMode, TlsVersion, WellKnownCa};
use super::policy::TrafficPolicySpec;
use crate::config::yaml::Spanned;

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendSpec {
    pub destination: Spanned<Destination>,
    /// `HTTP` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Spanned<Protocol>>,
    /// `Simple` (verified TLS) when omitted: plaintext is always an explicit choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Spanned<BackendTls>>,
    /// Protocol-specific settings (`mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_options: Option<Spanned<ProtocolOptions>>,
    /// Used only when a route's primary backends are unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Spanned<bool>>,
    /// Processing added to every request to this Backend (`CredentialInjector`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<Spanned<BackendExtension>>,
    /// Inline BackendTrafficPolicy for this Backend (no targetRefs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<Spanned<TrafficPolicySpec>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Destination {
    #[serde(rename = "type")]
    pub kind: Spanned<DestinationType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<Spanned<FqdnDestination>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Spanned<IpDestination>>,
    pub ports: Vec<Spanned<BackendPort>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FqdnDestination {
    pub hostname: Spanned<String>,
    /// Send the backend hostname as `Host`/`:authority` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite_authority: Option<bool>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpDestination {
    pub endpoints: Vec<Spanned<IpEndpoint>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpEndpoint {
    pub address: Spanned<String>,
    /// This endpoint's port, instead of the Backend port's number (two instances on one host,
    /// a blue/green pair). Only in a Backend that declares exactly one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Spanned<u16>>,
    /// Relative weight (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Spanned<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Name of this endpoint, sent as `Host` and used for TLS when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<Spanned<String>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub number: Spanned<u16>,
    /// Overrides the Backend's `protocol` for this port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Spanned<Protocol>>,
    /// Overrides the Backend's `tls` for this port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Spanned<BackendTls>>,
    /// Overrides the Backend's `protocolOptions` for this port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_options: Option<Spanned<ProtocolOptions>>,
}

/// `protocolOptions`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProtocolOptions {
    /// For `protocol: MCP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Spanned<McpOptions>>,
}

/// `protocolOptions.mcp`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpOptions {
    /// The MCP endpoint's path (default `/mcp`); other paths are plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Spanned<String>>,
    /// `StreamableHTTP` (default), or `SSE`: the legacy HTTP+SSE transport (2024-11-05), `path`
    /// then being the event stream's (default `/sse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Spanned<String>>,
    /// The one protocol version the server speaks (e.g. `2025-11-25`); requests carrying
    /// another `MCP-Protocol-Version` get 400, so pin it only for a server that speaks just
    /// that one. Unset (recommended): any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Spanned<String>>,
    /// `Stateful` (default): every request of a session goes to the endpoint that issued
    /// it. `Stateless`: balanced per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_routing: Option<Spanned<String>>,
    /// Which tools clients may call: `allow` (only these) and `deny` (never these); exact
    /// names or a prefix ending in `*`. A denied `tools/call` gets a JSON-RPC error from
    /// egressd and never reaches the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Spanned<McpToolPolicy>>,
}

/// `protocolOptions.mcp.tools`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpToolPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Spanned<TlsMode>>,
    /// Server name sent in the ClientHello; never copied from the client's Host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<TlsValidation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<CertificateFiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_ref: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_version: Option<TlsVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alpn_protocols: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsValidation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub well_known_ca_certificates: Option<WellKnownCa>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_certificate_files: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_certificate_refs: Vec<SecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubjectAltName {
    #[serde(rename = "type")]
    pub kind: SanType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

/// `spec.extensions[]`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendExtension {
    /// Names the extension in logs, errors and `x-egressd-error` details.
    pub name: Spanned<String>,
    /// `CredentialInjector` (the only type this build has).
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
    /// When the extension cannot do its work (an unreadable credential): `false` (default)
    /// answers 503 and sends nothing upstream; `true` sends the request without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_open: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Spanned<CredentialInjectorConfig>>,
}

/// `config` of a `CredentialInjector`: puts a credential the application never sees into a
/// request header.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialInjectorConfig {
    /// The header to set (default `Authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<Spanned<String>>,
    /// Put before the credential, e.g. `"Bearer "` (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Replace a value the client sent (default `true`); `false` keeps the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
    pub credential: Spanned<CredentialSource>,
}

/// Where a credential comes from.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialSource {
    /// A file holding the credential (trailing line breaks ignored); watched, a change applies
    /// without a restart. Relative to the YAML file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_file: Option<Spanned<String>>,
    /// A Secret's `credential` key (not supported yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<Spanned<NotYetSupported>>,
}
