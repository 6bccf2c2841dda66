//! `Backend` (egressd.dev): a destination and exactly how to connect to it.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CertificateFiles, SecretRef};
use super::enums::{
    DestinationType, InterceptionMode, Protocol, SanType, TlsMode, TlsVersion, WellKnownCa,
};
use super::policy::TrafficPolicySpec;
use crate::config::units::GwDuration;
use crate::config::yaml::Spanned;

#[apply(wire!)]
pub struct BackendSpec {
    pub(crate) destination: Spanned<Destination>,
    /// `HTTP` when omitted.
    pub(crate) protocol: Option<Spanned<Protocol>>,
    /// `Simple` (verified TLS) when omitted: plaintext is always an explicit choice.
    pub(crate) tls: Option<Spanned<Box<BackendTls>>>,
    // Boxed, like `tls` and `trafficPolicy`: most Backends have none.
    /// Protocol-specific settings (`mcp`).
    pub(crate) protocol_options: Option<Spanned<Box<ProtocolOptions>>>,
    /// Used only when a route's primary backends are unhealthy.
    pub(crate) fallback: Option<Spanned<bool>>,
    /// Processing added to every request to this Backend (`CredentialInjector`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) extensions: Vec<Spanned<BackendExtension>>,
    // Boxed (and `tls` too): 1.5 KB (312 bytes) that most Backends do not use, kept for every
    // Backend for as long as its config serves (`/config`).
    /// Inline BackendTrafficPolicy for this Backend (no targetRefs).
    pub(crate) traffic_policy: Option<Spanned<Box<TrafficPolicySpec>>>,
}

#[apply(wire!)]
pub(crate) struct Destination {
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<DestinationType>,
    pub(crate) fqdn: Option<Spanned<FqdnDestination>>,
    pub(crate) ip: Option<Spanned<IpDestination>>,
    pub(crate) ports: Vec<Spanned<BackendPort>>,
}

#[apply(wire!)]
pub(crate) struct FqdnDestination {
    pub(crate) hostname: Spanned<String>,
    /// Send the backend hostname as `Host`/`:authority` (default true).
    pub(crate) rewrite_authority: Option<bool>,
    /// CIDRs this name may resolve to although they are refused by default: link-local
    /// (cloud metadata), unspecified, broadcast, multicast, and loopback unless the name is
    /// `localhost` or ends in `.localhost`.
    pub(crate) allowed_addresses: Option<Vec<Spanned<String>>>,
    /// A wildcard `hostname` (`*.example.com`): the concrete hosts kept at once, each with
    /// its DNS refresher and endpoints (default 256); the least recently used makes room.
    pub(crate) max_hosts: Option<Spanned<u32>>,
    /// A wildcard `hostname`: a concrete host nobody asked for this long is forgotten
    /// (default 5m).
    pub(crate) host_idle_timeout: Option<Spanned<GwDuration>>,
    /// A wildcard `hostname`: endpoints (resolved addresses) of all its concrete hosts
    /// together (default 2048); a host whose answer does not fit gets what is left, at least
    /// one.
    pub(crate) max_endpoints: Option<Spanned<u32>>,
}

#[apply(wire!)]
pub(crate) struct IpDestination {
    pub(crate) endpoints: Vec<Spanned<IpEndpoint>>,
}

#[apply(wire!)]
pub(crate) struct IpEndpoint {
    pub(crate) address: Spanned<String>,
    /// This endpoint's port, instead of the Backend port's number (two instances on one host,
    /// a blue/green pair). Only in a Backend that declares exactly one port.
    pub(crate) port: Option<Spanned<u16>>,
    /// Relative weight (default 1).
    pub(crate) weight: Option<u32>,
    pub(crate) priority: Option<Spanned<u32>>,
    // Boxed strings here and in references: the parsed config is kept while it serves, and
    // most of these are unset (an unset `Option<String>` is 24 bytes, a `Box<str>` 16).
    pub(crate) zone: Option<Box<str>>,
    /// Name of this endpoint, sent as `Host` and used for TLS when set.
    pub(crate) hostname: Option<Spanned<Box<str>>>,
}

#[apply(wire!)]
pub(crate) struct BackendPort {
    pub(crate) name: Option<String>,
    pub(crate) number: Spanned<u16>,
    /// Overrides the Backend's `protocol` for this port.
    pub(crate) protocol: Option<Spanned<Protocol>>,
    /// Overrides the Backend's `tls` for this port.
    pub(crate) tls: Option<Spanned<Box<BackendTls>>>,
    // Boxed: most ports have none, and the MCP options are a hundred bytes kept per port.
    /// Overrides the Backend's `protocolOptions` for this port.
    pub(crate) protocol_options: Option<Spanned<Box<ProtocolOptions>>>,
    /// `Enabled` (default): with `ProxyConfig.spec.tlsInterception` set, a `CONNECT` to this
    /// port (whose TLS egressd originates) is intercepted; `Disabled`: it is refused (403
    /// `connect_to_originating_port`), as without interception. Passthrough ports are never
    /// intercepted.
    pub(crate) interception: Option<Spanned<InterceptionMode>>,
}

/// `protocolOptions`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct ProtocolOptions {
    /// For `protocol: MCP`.
    pub(crate) mcp: Option<Spanned<McpOptions>>,
}

/// `protocolOptions.mcp`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct McpOptions {
    /// The MCP endpoint's path (default `/mcp`); other paths are plain HTTP.
    pub(crate) path: Option<Spanned<String>>,
    /// `StreamableHTTP` (default), or `SSE`: the legacy HTTP+SSE transport (2024-11-05), `path`
    /// then being the event stream's (default `/sse`).
    pub(crate) transport: Option<Spanned<String>>,
    /// The one protocol version the server speaks (e.g. `2025-11-25`); requests carrying
    /// another `MCP-Protocol-Version` get 400, so pin it only for a server that speaks just
    /// that one. Unset (recommended): any.
    pub(crate) version: Option<Spanned<String>>,
    /// `Stateful` (default): every request of a session goes to the endpoint that issued
    /// it. `Stateless`: balanced per request.
    pub(crate) session_routing: Option<Spanned<String>>,
    /// Which tools clients may call: `allow` (only these) and `deny` (never these); exact
    /// names or a prefix ending in `*`. A denied `tools/call` gets a JSON-RPC error from
    /// egressd and never reaches the server.
    pub(crate) tools: Option<Spanned<McpToolPolicy>>,
}

/// `protocolOptions.mcp.tools`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct McpToolPolicy {
    pub(crate) allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) deny: Vec<String>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct BackendTls {
    pub(crate) mode: Option<Spanned<TlsMode>>,
    /// Server name sent in the ClientHello; never copied from the client's Host.
    pub(crate) sni: Option<String>,
    // Boxed: most Backends set none of these, and the parsed config is kept while it serves.
    pub(crate) validation: Option<Box<TlsValidation>>,
    pub(crate) client_certificate: Option<Box<CertificateFiles>>,
    pub(crate) client_certificate_ref: Option<Spanned<Box<SecretRef>>>,
    pub(crate) min_version: Option<TlsVersion>,
    pub(crate) max_version: Option<TlsVersion>,
    pub(crate) alpn_protocols: Option<Vec<String>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct TlsValidation {
    // Gateway API's spelling; camelCase would make it `wellKnownCaCertificates`, which
    // earlier builds took and is still accepted.
    #[serde(rename = "wellKnownCACertificates", alias = "wellKnownCaCertificates")]
    pub(crate) well_known_ca_certificates: Option<WellKnownCa>,
    /// Each with its position: a file that cannot be used is reported at its entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ca_certificate_files: Vec<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ca_certificate_refs: Vec<Spanned<SecretRef>>,
    pub(crate) hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) subject_alt_names: Vec<SubjectAltName>,
    pub(crate) insecure_skip_verify: Option<bool>,
}

#[apply(wire!)]
pub(crate) struct SubjectAltName {
    #[serde(rename = "type")]
    pub(crate) kind: SanType,
    pub(crate) hostname: Option<String>,
    pub(crate) uri: Option<String>,
}

/// `spec.extensions[]`.
#[apply(wire!)]
pub(crate) struct BackendExtension {
    /// Names the extension in logs, errors and `x-egressd-error` details.
    pub(crate) name: Spanned<String>,
    /// `CredentialInjector` (the only type this build has).
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<String>,
    /// When the extension cannot do its work (an unreadable credential): `false` (default)
    /// answers 503 and sends nothing upstream; `true` sends the request without it.
    pub(crate) fail_open: Option<bool>,
    pub(crate) config: Option<Spanned<CredentialInjectorConfig>>,
}

/// `config` of a `CredentialInjector`: puts a credential the application never sees into a
/// request header.
#[apply(wire!)]
pub(crate) struct CredentialInjectorConfig {
    /// The header to set (default `Authorization`).
    pub(crate) header: Option<Spanned<String>>,
    /// Put before the credential, e.g. `"Bearer "` (default none).
    pub(crate) prefix: Option<String>,
    /// Replace a value the client sent (default `true`); `false` keeps the client's.
    pub(crate) overwrite: Option<bool>,
    pub(crate) credential: Spanned<CredentialSource>,
}

/// Where a credential comes from.
#[apply(wire!)]
pub(crate) struct CredentialSource {
    /// A file holding the credential (trailing line breaks ignored); watched, a change applies
    /// without a restart. Relative to the YAML file.
    pub(crate) value_file: Option<Spanned<String>>,
    /// A key of a `Secret` in the config directories (`credential` by default). Exactly one of
    /// `valueFile` and `secretRef`.
    pub(crate) secret_ref: Option<Spanned<CredentialSecretRef>>,
}

/// The Secret (core `v1`, any type: `Opaque` usually) and key holding a credential.
#[apply(wire!)]
pub(crate) struct CredentialSecretRef {
    /// `""` (the core group, the default).
    pub(crate) group: Option<String>,
    /// `Secret` (the default and the only kind).
    pub(crate) kind: Option<String>,
    pub(crate) name: String,
    /// The Backend's namespace by default.
    pub(crate) namespace: Option<String>,
    /// The key whose value is the credential (default `credential`).
    pub(crate) key: Option<String>,
}
