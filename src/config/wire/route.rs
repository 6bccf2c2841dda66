//! `HTTPRoute` (gateway.networking.k8s.io): how requests on HTTP listeners reach Backends.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{BackendRef, NotYetSupported, ParentRef};
use super::enums::{FilterType, HttpMethod, PathMatchType, PathModifierType, ValueMatchType};
use crate::config::units::GwDuration;
use crate::config::yaml::Spanned;

#[apply(wire!)]
pub(crate) struct HttpRouteSpec {
    /// Gateways (and listeners) this route attaches to; every HTTP listener when omitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) parent_refs: Vec<Spanned<ParentRef>>,
    /// Hostnames (exact or `*.suffix`) this route serves; any host when omitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) hostnames: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) rules: Vec<Spanned<HttpRouteRule>>,
}

#[apply(wire!)]
pub(crate) struct HttpRouteRule {
    pub(crate) name: Option<String>,
    /// Any of these matches selects the rule; a rule without matches matches every path (`/` prefix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) matches: Vec<HttpRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) filters: Vec<Spanned<HttpRouteFilter>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) backend_refs: Vec<Spanned<BackendRef>>,
    // Boxed: most rules set none of these, and the parsed config is kept while it serves.
    pub(crate) timeouts: Option<Spanned<Box<HttpRouteTimeouts>>>,
    pub(crate) retry: Option<Spanned<Box<HttpRouteRetry>>>,
    pub(crate) session_persistence: Option<Spanned<Box<NotYetSupported>>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HttpRouteMatch {
    pub(crate) path: Option<Spanned<PathMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) headers: Vec<Spanned<ValueMatch>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) query_params: Vec<Spanned<ValueMatch>>,
    pub(crate) method: Option<HttpMethod>,
}

#[apply(wire!)]
pub(crate) struct PathMatch {
    /// `PathPrefix` when omitted.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<PathMatchType>,
    /// `/` when omitted.
    pub(crate) value: Option<Spanned<String>>,
}

/// A header or query parameter match.
#[apply(wire!)]
pub(crate) struct ValueMatch {
    /// `Exact` when omitted.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<ValueMatchType>,
    pub(crate) name: String,
    pub(crate) value: Spanned<String>,
}

#[apply(wire!)]
pub(crate) struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub(crate) kind: FilterType,
    pub(crate) request_header_modifier: Option<HeaderModifier>,
    pub(crate) response_header_modifier: Option<HeaderModifier>,
    pub(crate) url_rewrite: Option<UrlRewrite>,
    pub(crate) request_redirect: Option<NotYetSupported>,
    pub(crate) request_mirror: Option<NotYetSupported>,
    pub(crate) extension_ref: Option<NotYetSupported>,
    pub(crate) cors: Option<NotYetSupported>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HeaderModifier {
    /// Replace (or add) these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) set: Vec<HttpHeader>,
    /// Append these values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) add: Vec<HttpHeader>,
    /// Remove these headers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) remove: Vec<String>,
}

#[apply(wire!)]
pub(crate) struct HttpHeader {
    pub(crate) name: String,
    pub(crate) value: String,
}

#[apply(wire!)]
pub(crate) struct UrlRewrite {
    /// Sent as `Host` upstream (takes precedence over the Backend's `rewriteAuthority`).
    pub(crate) hostname: Option<String>,
    pub(crate) path: Option<PathModifier>,
}

#[apply(wire!)]
pub(crate) struct PathModifier {
    #[serde(rename = "type")]
    pub(crate) kind: PathModifierType,
    pub(crate) replace_full_path: Option<String>,
    pub(crate) replace_prefix_match: Option<String>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HttpRouteTimeouts {
    /// The whole exchange, from the request's arrival to the end of the response.
    pub(crate) request: Option<GwDuration>,
    /// One attempt to a backend, until the end of its response.
    pub(crate) backend_request: Option<GwDuration>,
}

/// Gateway API `HTTPRouteRetry` (GEP-1731), mapped onto the `retry` policy.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HttpRouteRetry {
    /// Retries after the first attempt (egressd's `numRetries`; default 2).
    pub(crate) attempts: Option<u32>,
    /// Base of the jittered exponential backoff (default 25ms; the cap is 10 × this).
    pub(crate) backoff: Option<GwDuration>,
    /// Statuses retried (idempotent methods); when set, 502/503/504 are retried only if listed.
    pub(crate) codes: Option<Vec<u16>>,
}
