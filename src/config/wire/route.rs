//! `HTTPRoute` (gateway.networking.k8s.io): how requests on HTTP listeners reach Backends.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{BackendRef, NotYetSupported, ParentRef};
use super::enums::{FilterType, HttpMethod, PathMatchType, PathModifierType, ValueMatchType};
use crate::config::units::GwDuration;
use crate::config::yaml::Spanned;

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteSpec {
    /// Gateways (and listeners) this route attaches to; every HTTP listener when omitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<Spanned<ParentRef>>,
    /// Hostnames (exact or `*.suffix`) this route serves; any host when omitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<Spanned<String>>,
    #[serde(default)]
    pub rules: Vec<Spanned<HttpRouteRule>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Any of these matches selects the rule; a rule without matches matches every path (`/` prefix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Spanned<HttpRouteFilter>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<Spanned<BackendRef>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Spanned<HttpRouteTimeouts>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Spanned<HttpRouteRetry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<Spanned<NotYetSupported>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Spanned<PathMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<Spanned<ValueMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<Spanned<ValueMatch>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<HttpMethod>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathMatch {
    /// `PathPrefix` when omitted.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<PathMatchType>,
    /// `/` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Spanned<String>>,
}

/// A header or query parameter match.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValueMatch {
    /// `Exact` when omitted.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ValueMatchType>,
    pub name: String,
    pub value: Spanned<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub kind: FilterType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<NotYetSupported>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<NotYetSupported>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<NotYetSupported>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<NotYetSupported>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderModifier {
    /// Replace (or add) these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<HttpHeader>,
    /// Append these values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<HttpHeader>,
    /// Remove these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UrlRewrite {
    /// Sent as `Host` upstream (takes precedence over the Backend's `rewriteAuthority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub kind: PathModifierType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteTimeouts {
    /// The whole exchange, from the request's arrival to the end of the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<GwDuration>,
    /// One attempt to a backend, until the end of its response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<GwDuration>,
}

/// Gateway API `HTTPRouteRetry` (GEP-1731), mapped onto the `retry` policy.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteRetry {
    /// Retries after the first attempt (egressd's `numRetries`; default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Base of the jittered exponential backoff (default 25ms; the cap is 10 × this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<GwDuration>,
    /// Statuses retried (idempotent methods); when set, 502/503/504 are retried only if listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<Vec<u16>>,
}
