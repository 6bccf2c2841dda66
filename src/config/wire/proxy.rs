//! `ProxyConfig` (egressd.dev): process-wide settings. At most one per config.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::NotYetSupported;
use super::enums::{AccessLogFormat, OutboundPolicy};
use crate::config::units::GwDuration;
use crate::config::yaml::Spanned;

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyConfigSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<AdminSpec>,
    /// `RegistryOnly` (default): only declared destinations are reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_policy: Option<Spanned<OutboundPolicy>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<AccessLogSpec>,
    /// Hostnames (exact or `*.suffix`) no Backend may name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_hostnames: Vec<Spanned<String>>,
    /// Name servers for FQDN destinations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<ProxyDnsSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_identity: Option<Spanned<PlatformIdentity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Spanned<NotYetSupported>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdminSpec {
    /// `127.0.0.1:15000` by default. Binding a non-loopback address exposes config dumps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Spanned<String>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainSpec {
    /// On SIGTERM, in-flight requests get at most this long to finish (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GwDuration>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessLogSpec {
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `JSON` (default) or `Text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<AccessLogFormat>,
    /// `stdout` (default), `stderr` or a file path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyDnsSpec {
    /// `ip:port` of DNS servers to ask instead of the system's (`/etc/resolv.conf`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<Spanned<String>>,
}

/// The workload identity a platform (e.g. a SPIFFE agent) keeps current on disk, used by
/// Backends with `tls.mode: PlatformProvided`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlatformIdentity {
    /// PEM certificate chain presented as the client certificate.
    pub certificate_file: String,
    pub private_key_file: String,
    /// PEM trust bundle; verifies PlatformProvided Backends that set no CA of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificate_file: Option<String>,
}
