//! `rateLimit`, a section of `BackendTrafficPolicy` (and `Backend.spec.trafficPolicy`), in
//! Envoy Gateway's spelling, with egressd's additions: client identities, MCP calls, and
//! `mode: Report`. Semantics in docs/rate-limits.md.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::NotYetSupported;
use super::egress_policy::EgressClients;
use super::enums::{
    EgressPolicyMode, RateLimitHeaderType, RateLimitPathType, RateLimitSourceType, RateLimitType,
    RateLimitUnit,
};
use crate::config::units::GwDuration;
use crate::config::yaml::Spanned;

/// `rateLimit`: local rules (counted in this process) and global rules (counted in Redis,
/// for every replica together); both may be set.
#[apply(wire!)]
pub(crate) struct RateLimitSpec {
    /// `Local` or `Global`, as Envoy Gateway writes it: names the section that must be set.
    /// Optional: whichever of `local` and `global` is set applies.
    #[serde(rename = "type")]
    pub(crate) kind: Option<Spanned<RateLimitType>>,
    /// `Enforce` (default): a request over a limit is refused (429 `rate_limited`).
    /// `Report`: it passes; the refusal is counted and logged ("would limit").
    pub(crate) mode: Option<Spanned<EgressPolicyMode>>,
    pub(crate) local: Option<Spanned<RateLimitRules>>,
    pub(crate) global: Option<Spanned<RateLimitRules>>,
}

#[apply(wire!)]
pub(crate) struct RateLimitRules {
    /// Every matching rule counts the request; a request over any of them is refused.
    pub(crate) rules: Vec<Spanned<RateLimitRule>>,
}

#[apply(wire!)]
pub(crate) struct RateLimitRule {
    /// The rule's name in metrics, logs and `/status` (default: its index).
    pub(crate) name: Option<Spanned<String>>,
    /// Which requests the rule counts: all of a selector's parts must match, and every
    /// selector must (none: every request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) client_selectors: Vec<Spanned<RateLimitSelector>>,
    pub(crate) limit: Spanned<RateLimitValue>,
    /// On a Gateway with several routes: one counter for all of them (`true`) or one per
    /// route (default `false`).
    pub(crate) shared: Option<bool>,
    /// Envoy Gateway's per-request cost: not supported yet (every request costs 1).
    pub(crate) cost: Option<Spanned<NotYetSupported>>,
    /// Envoy Gateway's `shadowMode`: use `mode: Report` instead.
    pub(crate) shadow_mode: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub(crate) struct RateLimitValue {
    /// Requests per unit (at least 1).
    pub(crate) requests: Spanned<u32>,
    /// `Second`, `Minute`, `Hour` or `Day`.
    pub(crate) unit: Option<Spanned<RateLimitUnit>>,
    /// egressd: any period in whole seconds (`10s`, `15m`), instead of `unit`.
    pub(crate) interval: Option<Spanned<GwDuration>>,
}

/// One client selector: every part given must match.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RateLimitSelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) headers: Vec<Spanned<RateLimitHeaderMatch>>,
    /// The request method is one of these (an entry with `invert: true`: is not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) methods: Vec<Spanned<RateLimitMethodMatch>>,
    pub(crate) path: Option<Spanned<RateLimitPathMatch>>,
    /// The client's source address (`Exact`: inside the CIDR; `Distinct`: one counter per
    /// address inside it).
    #[serde(rename = "sourceCIDR")]
    pub(crate) source_cidr: Option<Spanned<RateLimitSourceMatch>>,
    /// egressd: the client's identity, in `EgressPolicy`'s `clients` syntax.
    pub(crate) clients: Option<Spanned<RateLimitClients>>,
    /// egressd: MCP calls (requests to a `protocol: MCP` Backend's endpoint path).
    pub(crate) mcp: Option<Spanned<RateLimitMcpMatch>>,
    /// Envoy Gateway's query parameter match: not supported yet.
    pub(crate) query_params: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
pub(crate) struct RateLimitHeaderMatch {
    pub(crate) name: Spanned<String>,
    /// `Exact` (default), `RegularExpression`, or `Distinct` (one counter per value; the
    /// header must be present).
    #[serde(rename = "type")]
    pub(crate) kind: Option<Spanned<RateLimitHeaderType>>,
    /// The value (`Exact`, `RegularExpression`); not with `Distinct`.
    pub(crate) value: Option<Spanned<String>>,
    /// Matches when the header does not match (not with `Distinct`).
    pub(crate) invert: Option<bool>,
}

#[apply(wire!)]
pub(crate) struct RateLimitMethodMatch {
    pub(crate) value: Spanned<String>,
    pub(crate) invert: Option<bool>,
}

#[apply(wire!)]
pub(crate) struct RateLimitPathMatch {
    /// `PathPrefix` (default), `Exact` or `RegularExpression`.
    #[serde(rename = "type")]
    pub(crate) kind: Option<Spanned<RateLimitPathType>>,
    pub(crate) value: Spanned<String>,
    pub(crate) invert: Option<bool>,
}

#[apply(wire!)]
pub(crate) struct RateLimitSourceMatch {
    /// `Exact` (default) or `Distinct`.
    #[serde(rename = "type")]
    pub(crate) kind: Option<Spanned<RateLimitSourceType>>,
    /// A CIDR (a bare address is one host).
    pub(crate) value: Spanned<String>,
    pub(crate) invert: Option<bool>,
}

/// `clients`: the identities of `EgressPolicy.spec.clients` (serde cannot flatten that struct
/// into one that denies unknown fields, so its lists are repeated); no list matches every
/// client.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RateLimitClients {
    /// `Exact` (default): the clients listed share one counter. `Distinct`: one counter per
    /// client identity (SPIFFE ID, else certificate subject, else proxy user, else address).
    #[serde(rename = "type")]
    pub(crate) kind: Option<Spanned<RateLimitSourceType>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) spiffe_ids: Vec<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) subject_names: Vec<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) cidrs: Vec<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) proxy_users: Vec<Spanned<String>>,
}

impl RateLimitClients {
    /// The lists, as `EgressPolicy` writes them.
    pub(crate) fn lists(&self) -> EgressClients {
        EgressClients {
            spiffe_ids: self.spiffe_ids.clone(),
            subject_names: self.subject_names.clone(),
            cidrs: self.cidrs.clone(),
            proxy_users: self.proxy_users.clone(),
        }
    }
}

/// `mcp`: JSON-RPC methods and tool names of MCP calls.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RateLimitMcpMatch {
    /// JSON-RPC methods (`tools/call`, `resources/read`, ...); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) methods: Vec<Spanned<String>>,
    /// Tool names of `tools/call` (exact, or a prefix ending in `*`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tools: Vec<Spanned<String>>,
}
