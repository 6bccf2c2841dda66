//! `HTTPRoute` (gateway.networking.k8s.io): how requests on HTTP listeners reach Backends.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{BackendRef, NotYetSupported, ParentRef};
use super::enums::{FilterType, HttpMethod, PathMatchType, PathModifierType, ValueMatchType};
use crate::config::units::GwDuration;
use crate::config::yaml::Spanned;

#[apply(wire!)]
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

#[apply(wire!)]
pub struct HttpRouteRule {
    pub name: Option<String>,
    /// Any of these matches selects the rule; a rule without matches matches every path (`/` prefix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Spanned<HttpRouteFilter>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<Spanned<BackendRef>>,
    // Boxed: most rules set none of these, and the parsed config is kept while it serves.
    pub timeouts: Option<Spanned<Box<HttpRouteTimeouts>>>,
    pub retry: Option<Spanned<Box<HttpRouteRetry>>>,
    pub session_persistence: Option<Spanned<Box<NotYetSupported>>>,
}

#[apply(wire!)]
#[derive(Default)]
pub struct HttpRouteMatch {
    pub path: Option<Spanned<PathMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<Spanned<ValueMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<Spanned<ValueMatch>>,
    pub method: Option<HttpMethod>,
}

#[apply(wire!)]
pub struct PathMatch {
    /// `PathPrefix` when omitted.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<PathMatchType>,
    /// `/` when omitted.
    pub value: Option<Spanned<String>>,
}

/// A header or query parameter match.
#[apply(wire!)]
pub struct ValueMatch {
    /// `Exact` when omitted.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ValueMatchType>,
    pub name: String,
    pub value: Spanned<String>,
}

#[apply(wire!)]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub kind: FilterType,
    pub request_header_modifier: Option<HeaderModifier>,
    pub response_header_modifier: Option<HeaderModifier>,
    pub url_rewrite: Option<UrlRewrite>,
    pub request_redirect: Option<NotYetSupported>,
    pub request_mirror: Option<NotYetSupported>,
    pub extension_ref: Option<NotYetSupported>,
    pub cors: Option<NotYetSupported>,
}

#[apply(wire!)]
#[derive(Default)]
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

#[apply(wire!)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[apply(wire!)]
pub struct UrlRewrite {
    /// Sent as `Host` upstream (takes precedence over the Backend's `rewriteAuthority`).
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[apply(wire!)]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub kind: PathModifierType,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
}

#[apply(wire!)]
#[derive(Default)]
pub struct HttpRouteTimeouts {
    /// The whole exchange, from the request's arrival to the end of the response.
    pub request: Option<GwDuration>,
    /// One attempt to a backend, until the end of its response.
    pub backend_request: Option<GwDuration>,
}

/// Gateway API `HTTPRouteRetry` (GEP-1731), mapped onto the `retry` policy.
#[apply(wire!)]
#[derive(Default)]
pub struct HttpRouteRetry {
    /// Retries after the first attempt (egressd's `numRetries`; default 2).
    pub attempts: Option<u32>,
    /// Base of the jittered exponential backoff (default 25ms; the cap is 10 × this).
    pub backoff: Option<GwDuration>,
    /// Statuses retried (idempotent methods); when set, 502/503/504 are retried only if listed.
    pub codes: Option<Vec<u16>>,
}
