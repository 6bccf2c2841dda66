//! `rateLimit` sections → [`RateLimitPolicy`]s (docs/rate-limits.md).
//!
//! Each section (of a `BackendTrafficPolicy`, or inline in a Backend) is checked once, into a
//! [`Template`]: its rules with their selectors, no counters. A request policy that takes the
//! section (by the usual precedence) gets an instance for its *scope*: the Backend (or route)
//! the section applies to, or the whole policy for `shared` rules. Counters are kept across
//! reloads by (policy, rule, scope): editing a policy does not hand every client a fresh quota.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{at, At, Cx};
use crate::config::wire::enums::{
    EgressPolicyMode, RateLimitHeaderType, RateLimitPathType, RateLimitSourceType, RateLimitType,
    RateLimitUnit,
};
use crate::config::wire::rate_limit::{
    RateLimitRule, RateLimitRules, RateLimitSelector, RateLimitSpec,
};
use crate::config::yaml::{Pos, Spanned};
use crate::config::ObjectId;
use crate::ratelimit::distinct::DistinctCounters;
use crate::ratelimit::redis::{RedisSettings, RedisTls};
use crate::ratelimit::rules::{
    ClientsMatch, Counter, HeaderMatch, LocalCounter, McpMatch, PathMatch, RateLimitPolicy, Rule,
    Selector, SourceMatch, ValueMatch,
};
use crate::ratelimit::window::WindowCounter;
use crate::ratelimit::Quota;

/// Envoy Gateway's bounds: rules per list, selectors per rule, headers per selector.
const MAX_LOCAL_RULES: usize = 16;
const MAX_GLOBAL_RULES: usize = 256;
const MAX_SELECTORS: usize = 8;
const MAX_HEADERS: usize = 128;
/// Counters a `Distinct` local rule keeps unless `maxDistinctValues` says otherwise (Envoy
/// Gateway's fixed `max_dynamic_descriptors`).
pub(crate) const DEFAULT_MAX_DISTINCT_VALUES: u32 = 10_000;

/// A checked `rateLimit` section, without counters.
#[derive(Debug)]
pub(crate) struct Template {
    name: Arc<str>,
    report: bool,
    local: Vec<RuleTemplate>,
    global: Vec<RuleTemplate>,
}

#[derive(Debug)]
struct RuleTemplate {
    label: Arc<str>,
    quota: Quota,
    selectors: Arc<[Selector]>,
    distinct: bool,
    shared: bool,
}

/// Where a section is written, for its diagnostics.
pub(crate) struct SectionSite<'a> {
    pub(crate) file: &'a std::path::Path,
    pub(crate) id: &'a ObjectId,
    /// `spec` or `spec.trafficPolicy`.
    pub(crate) prefix: &'a str,
    /// Whether `ProxyConfig.spec.rateLimit.redis` is configured.
    pub(crate) has_redis: bool,
}

impl<'a> SectionSite<'a> {
    fn at(&self, pos: Pos, field: impl std::fmt::Display) -> At<'a> {
        at(
            self.file,
            self.id,
            pos,
            format!("{}.rateLimit{field}", self.prefix),
        )
    }
}

/// Checks a `rateLimit` section; `None` when it has errors (reported).
pub(crate) fn template(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    name: Arc<str>,
    spec: &Spanned<RateLimitSpec>,
) -> Option<Arc<Template>> {
    let before = cx.error_count();
    let s = &spec.value;
    if s.local.is_none() && s.global.is_none() {
        cx.error(
            site.at(spec.pos, ""),
            "rateLimit needs `local` or `global` rules",
            "e.g. local: {rules: [{limit: {requests: 100, unit: Minute}}]}",
        );
    }
    if let Some(kind) = &s.kind {
        let (named, set) = match kind.value {
            RateLimitType::Local => ("local", s.local.is_some()),
            RateLimitType::Global => ("global", s.global.is_some()),
        };
        if !set {
            cx.error(
                site.at(kind.pos, ".type"),
                format!("type says {named} rules, but `{named}` is not set"),
                format!("add `{named}: {{rules: [...]}}`, or drop `type`"),
            );
        }
    }
    if let Some(global) = &s.global {
        if !site.has_redis {
            cx.error(
                site.at(global.pos, ".global"),
                "global rules count in Redis, and ProxyConfig.spec.rateLimit.redis is not set",
                "set ProxyConfig.spec.rateLimit.redis.address, or make the rules local",
            );
        }
    }
    let local = rules(cx, site, "local", s.local.as_ref(), MAX_LOCAL_RULES);
    let global = rules(cx, site, "global", s.global.as_ref(), MAX_GLOBAL_RULES);
    if cx.error_count() > before {
        return None;
    }
    Some(Arc::new(Template {
        name,
        report: s
            .mode
            .as_ref()
            .is_some_and(|m| m.value == EgressPolicyMode::Report),
        local,
        global,
    }))
}

fn rules(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    list: &str,
    rules: Option<&Spanned<RateLimitRules>>,
    max: usize,
) -> Vec<RuleTemplate> {
    let Some(rules) = rules else {
        return Vec::new();
    };
    if rules.value.rules.is_empty() || rules.value.rules.len() > max {
        cx.error(
            site.at(rules.pos, format_args!(".{list}.rules")),
            format!("{list} rules: between 1 and {max}"),
            "one rule per limit; selectors pick the requests each counts",
        );
    }
    let mut labels = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, rule) in rules.value.rules.iter().enumerate() {
        let field = format!(".{list}.rules[{i}]");
        let label: Arc<str> = match &rule.value.name {
            Some(n) => n.value.as_str().into(),
            None => format!("{list}[{i}]").into(),
        };
        if !labels.insert(label.clone()) {
            cx.error(
                site.at(rule.pos, format_args!("{field}.name")),
                format!("two rules are named `{label}`"),
                "give each rule its own name (metrics and logs name rules by it)",
            );
        }
        if let Some(t) = rule_template(cx, site, &field, label, &rule.value) {
            out.push(t);
        }
    }
    out
}

fn rule_template(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    label: Arc<str>,
    rule: &RateLimitRule,
) -> Option<RuleTemplate> {
    for (set, name) in [(&rule.cost, "cost"), (&rule.shadow_mode, "shadowMode")] {
        if let Some(v) = set {
            let what = format!("rateLimit rules' `{name}`");
            cx.not_yet(site.at(v.pos, format_args!("{field}.{name}")), &what, "");
        }
    }
    let limit = &rule.limit.value;
    if limit.requests.value == 0 {
        cx.error(
            site.at(limit.requests.pos, format_args!("{field}.limit.requests")),
            "requests must be at least 1",
            "to refuse every request, use an EgressPolicy or a route without the Backend",
        );
    }
    let period = rule_period(cx, site, field, &rule.limit);
    if rule.client_selectors.len() > MAX_SELECTORS {
        cx.error(
            site.at(rule.limit.pos, format_args!("{field}.clientSelectors")),
            format!("at most {MAX_SELECTORS} client selectors per rule"),
            "split the rule",
        );
    }
    let mut selectors = Vec::new();
    for (j, s) in rule.client_selectors.iter().enumerate() {
        let at_sel = format!("{field}.clientSelectors[{j}]");
        selectors.push(selector(cx, site, &at_sel, s)?);
    }
    let distinct = selectors.iter().any(selector_is_distinct);
    Some(RuleTemplate {
        label,
        quota: Quota {
            requests: limit.requests.value.max(1),
            period: period?,
        },
        selectors: selectors.into(),
        distinct,
        shared: rule.shared.unwrap_or(false),
    })
}

/// The period of `limit`: its `unit`, or its `interval` (whole seconds, at most a day).
fn rule_period(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    limit: &Spanned<crate::config::wire::rate_limit::RateLimitValue>,
) -> Option<Duration> {
    let here = |f: &str| site.at(limit.pos, format_args!("{field}.limit{f}"));
    match (&limit.value.unit, &limit.value.interval) {
        (Some(unit), None) => Some(period(unit.value)),
        (None, Some(interval)) => {
            let d = interval.value.0;
            let whole = d.subsec_nanos() == 0 && d >= Duration::from_secs(1);
            if whole && d <= Duration::from_secs(86_400) {
                Some(d)
            } else {
                let here = site.at(interval.pos, format_args!("{field}.limit.interval"));
                cx.error(
                    here,
                    "interval: whole seconds, from 1s to 24h",
                    "e.g. 10s, 15m",
                );
                None
            }
        }
        _ => {
            cx.error(
                here(""),
                "a limit needs exactly one of `unit` and `interval`",
                "e.g. {requests: 600, unit: Minute} or {requests: 50, interval: 10s}",
            );
            None
        }
    }
}

fn period(unit: RateLimitUnit) -> Duration {
    Duration::from_secs(match unit {
        RateLimitUnit::Second => 1,
        RateLimitUnit::Minute => 60,
        RateLimitUnit::Hour => 3600,
        RateLimitUnit::Day => 86_400,
    })
}

fn selector_is_distinct(s: &Selector) -> bool {
    s.headers
        .iter()
        .any(|h| matches!(h.value, ValueMatch::Distinct))
        || s.source.as_ref().is_some_and(|m| m.distinct)
        || s.clients.as_ref().is_some_and(|c| c.distinct)
}

/// One client selector; `None` when it has errors (reported).
fn selector(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    s: &Spanned<RateLimitSelector>,
) -> Option<Selector> {
    let before = cx.error_count();
    let v = &s.value;
    if let Some(q) = &v.query_params {
        let here = site.at(q.pos, format_args!("{field}.queryParams"));
        cx.not_yet(here, "rateLimit selectors' `queryParams`", "");
    }
    if v.headers.len() > MAX_HEADERS {
        cx.error(
            site.at(s.pos, format_args!("{field}.headers")),
            format!("at most {MAX_HEADERS} headers per selector"),
            "split the selector",
        );
    }
    let mut out = Selector::default();
    for (k, h) in v.headers.iter().enumerate() {
        if let Some(m) = header_match(cx, site, &format!("{field}.headers[{k}]"), h) {
            out.headers.push(m);
        }
    }
    for (k, m) in v.methods.iter().enumerate() {
        match http::Method::from_bytes(m.value.value.as_bytes()) {
            Ok(method) => out.methods.push((method, m.value.invert.unwrap_or(false))),
            Err(_) => cx.error(
                site.at(m.pos, format_args!("{field}.methods[{k}].value")),
                format!("`{}` is not a method", m.value.value.value),
                "e.g. GET, POST, CONNECT",
            ),
        }
    }
    if let Some(p) = &v.path {
        out.path = path_match(cx, site, &format!("{field}.path"), p);
    }
    if let Some(src) = &v.source_cidr {
        out.source = source_match(cx, site, &format!("{field}.sourceCIDR"), src);
    }
    if let Some(c) = &v.clients {
        out.clients = Some(clients_match(cx, site, &format!("{field}.clients"), c));
    }
    if let Some(m) = &v.mcp {
        out.mcp = Some(mcp_match(cx, site, &format!("{field}.mcp"), m));
    }
    (cx.error_count() == before).then_some(out)
}

fn header_match(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    h: &Spanned<crate::config::wire::rate_limit::RateLimitHeaderMatch>,
) -> Option<HeaderMatch> {
    let v = &h.value;
    let Ok(name) = http::HeaderName::from_bytes(v.name.value.as_bytes()) else {
        cx.error(
            site.at(v.name.pos, format_args!("{field}.name")),
            format!("`{}` is not a header name", v.name.value),
            "e.g. x-team",
        );
        return None;
    };
    let kind = v
        .kind
        .as_ref()
        .map_or(RateLimitHeaderType::Exact, |k| k.value);
    let invert = v.invert.unwrap_or(false);
    let value = match (kind, &v.value) {
        (RateLimitHeaderType::Distinct, None) if !invert => ValueMatch::Distinct,
        (RateLimitHeaderType::Distinct, _) => {
            cx.error(
                site.at(h.pos, field),
                "a Distinct header match takes neither `value` nor `invert`",
                "each value of the header gets its own counter",
            );
            return None;
        }
        (_, None) => {
            cx.error(
                site.at(h.pos, format_args!("{field}.value")),
                "an Exact or RegularExpression header match needs `value`",
                "or `type: Distinct` for one counter per value",
            );
            return None;
        }
        (RateLimitHeaderType::Exact, Some(value)) => {
            ValueMatch::Exact(value.value.as_bytes().into())
        }
        (RateLimitHeaderType::RegularExpression, Some(value)) => ValueMatch::Regex(anchored(
            cx,
            site.at(value.pos, format_args!("{field}.value")),
            &value.value,
        )?),
    };
    Some(HeaderMatch {
        name,
        value,
        invert,
    })
}

/// `pattern` compiled to match whole values (as Envoy's RE2 matches do).
fn anchored(cx: &mut Cx, here: At<'_>, pattern: &str) -> Option<regex::Regex> {
    match regex::Regex::new(&format!("^(?:{pattern})$")) {
        Ok(re) => Some(re),
        Err(e) => {
            cx.error(
                here,
                format!("invalid regular expression: {e}"),
                "RE2 syntax",
            );
            None
        }
    }
}

fn path_match(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    p: &Spanned<crate::config::wire::rate_limit::RateLimitPathMatch>,
) -> Option<(PathMatch, bool)> {
    let v = &p.value;
    let value = &v.value.value;
    let kind = v
        .kind
        .as_ref()
        .map_or(RateLimitPathType::PathPrefix, |k| k.value);
    let here = || site.at(v.value.pos, format_args!("{field}.value"));
    let m = match kind {
        RateLimitPathType::RegularExpression => PathMatch::Regex(anchored(cx, here(), value)?),
        _ if !value.starts_with('/') => {
            cx.error(here(), "a path starts with `/`", "e.g. /v1/charges");
            return None;
        }
        RateLimitPathType::Exact => PathMatch::Exact(value.as_str().into()),
        RateLimitPathType::PathPrefix => PathMatch::Prefix(value.trim_end_matches('/').into()),
    };
    Some((m, v.invert.unwrap_or(false)))
}

fn source_match(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    s: &Spanned<crate::config::wire::rate_limit::RateLimitSourceMatch>,
) -> Option<SourceMatch> {
    let v = &s.value;
    let distinct = v
        .kind
        .as_ref()
        .is_some_and(|k| k.value == RateLimitSourceType::Distinct);
    let invert = v.invert.unwrap_or(false);
    if distinct && invert {
        cx.error(
            site.at(s.pos, format_args!("{field}.invert")),
            "a Distinct sourceCIDR cannot be inverted",
            "each address inside the CIDR gets its own counter",
        );
        return None;
    }
    let Some(net) = super::undeclared::parse_cidr(&v.value.value) else {
        cx.error(
            site.at(v.value.pos, format_args!("{field}.value")),
            format!("invalid CIDR `{}`", v.value.value),
            "e.g. 10.0.0.0/8, or 0.0.0.0/0 with Distinct for one counter per address",
        );
        return None;
    };
    Some(SourceMatch {
        net: crate::upstream::address::canonical_net(net),
        distinct,
        invert,
    })
}

fn clients_match(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    c: &Spanned<crate::config::wire::rate_limit::RateLimitClients>,
) -> ClientsMatch {
    let v = &c.value;
    let lists = v.lists();
    let any = lists.spiffe_ids.is_empty()
        && lists.subject_names.is_empty()
        && lists.cidrs.is_empty()
        && lists.proxy_users.is_empty();
    let prefix = format!("{}.rateLimit{field}", site.prefix);
    ClientsMatch {
        set: (!any).then(|| super::client_policy::clients(cx, site.file, site.id, &lists, &prefix)),
        distinct: v
            .kind
            .as_ref()
            .is_some_and(|k| k.value == RateLimitSourceType::Distinct),
    }
}

fn mcp_match(
    cx: &mut Cx,
    site: &SectionSite<'_>,
    field: &str,
    m: &Spanned<crate::config::wire::rate_limit::RateLimitMcpMatch>,
) -> McpMatch {
    let mut out = McpMatch::default();
    for method in &m.value.methods {
        out.methods.push(method.value.as_str().into());
    }
    for (k, tool) in m.value.tools.iter().enumerate() {
        let name = tool.value.as_str();
        match name.strip_suffix('*') {
            Some(prefix) if !prefix.contains('*') => out.tools.push((prefix.into(), true)),
            None if !name.is_empty() && !name.contains('*') => out.tools.push((name.into(), false)),
            _ => cx.error(
                site.at(tool.pos, format_args!("{field}.tools[{k}]")),
                format!("`{name}`: a tool name, or a prefix ending in `*`"),
                "e.g. search, or github_*",
            ),
        }
    }
    out
}

/// What a section applies to, for counters that are not `shared`.
pub(crate) enum Scope<'a> {
    Route(&'a ObjectId),
    Backend(&'a ObjectId),
}

impl Template {
    /// The section for requests of `scope`: counters found again (same policy, rule and
    /// scope as in the config before) or new.
    pub(crate) fn instance(&self, scope: &Scope<'_>, max_distinct: usize) -> RateLimitPolicy {
        let scope_key = match scope {
            Scope::Route(id) => format!("route {}/{}", id.namespace, id.name),
            Scope::Backend(id) => format!("backend {}/{}", id.namespace, id.name),
        };
        let rule = |t: &RuleTemplate, global: bool| {
            let scope = if t.shared {
                "shared"
            } else {
                scope_key.as_str()
            };
            let counter = if global {
                Counter::Global(format!("{}/{}/{scope}", self.name, t.label).into())
            } else {
                Counter::Local(local_counter(&self.name, t, scope, max_distinct))
            };
            Rule {
                label: t.label.clone(),
                quota: t.quota,
                selectors: t.selectors.clone(),
                counter,
                stats: std::sync::OnceLock::new(),
            }
        };
        let local: Box<[Rule]> = self.local.iter().map(|t| rule(t, false)).collect();
        let global: Box<[Rule]> = self.global.iter().map(|t| rule(t, true)).collect();
        let mcp = local.iter().chain(global.iter()).any(Rule::selects_mcp);
        RateLimitPolicy {
            name: self.name.clone(),
            scope: if self.all_shared() {
                "shared".into()
            } else {
                scope_key.as_str().into()
            },
            report: self.report,
            local,
            global,
            mcp,
        }
    }

    /// Whether every rule is `shared`: one instance serves every scope.
    pub(crate) fn all_shared(&self) -> bool {
        self.local.iter().chain(&self.global).all(|t| t.shared)
    }
}

/// Counters by (policy, rule, scope, table size): found again by the next config.
type CounterKey = (Arc<str>, Arc<str>, String, Option<usize>);

struct Counters {
    map: Option<HashMap<CounterKey, Weak<LocalCounter>>>,
    /// The size at which dead entries are swept next.
    sweep_at: usize,
}

fn local_counter(
    policy: &Arc<str>,
    t: &RuleTemplate,
    scope: &str,
    max_distinct: usize,
) -> Arc<LocalCounter> {
    static COUNTERS: Mutex<Counters> = Mutex::new(Counters {
        map: None,
        sweep_at: 64,
    });
    let key = (
        policy.clone(),
        t.label.clone(),
        scope.to_owned(),
        t.distinct.then_some(max_distinct),
    );
    let mut guard = COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
    let counters = &mut *guard;
    let map = counters.map.get_or_insert_with(HashMap::new);
    if let Some(counter) = map.get(&key).and_then(Weak::upgrade) {
        return counter;
    }
    if map.len() >= counters.sweep_at {
        // Forget the counters no config holds any more (amortised: the bar doubles).
        map.retain(|_, w| w.strong_count() > 0);
        counters.sweep_at = (map.len() * 2).max(64);
    }
    let counter = Arc::new(if t.distinct {
        LocalCounter::Distinct(Box::new(DistinctCounters::new(max_distinct)))
    } else {
        LocalCounter::One(WindowCounter::new())
    });
    map.insert(key, Arc::downgrade(&counter));
    counter
}

/// Redis waits at most this long per decision unless `timeout` says otherwise (Envoy
/// Gateway's default): a request is never held long by a slow or gone Redis.
pub(crate) const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(20);
/// Keys egressd writes in Redis start with this unless `keyPrefix` says otherwise.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "egressd:rl:";

/// `ProxyConfig.spec.rateLimit.redis` → the store's settings, and whether `failureMode` is
/// `Closed`. The password is read now (a file is watched: a new password reloads).
pub(crate) fn redis_settings(
    cx: &mut Cx,
    set: &crate::config::ConfigSet,
) -> (Option<RedisSettings>, bool) {
    let Some(pc) = set.proxy_configs.first() else {
        return (None, false);
    };
    let Some(spec) = pc
        .spec
        .rate_limit
        .as_ref()
        .and_then(|r| r.value.redis.as_ref())
    else {
        return (None, false);
    };
    let (file, id) = (&*pc.file, &pc.id);
    let here = |pos, f: &str| at(file, id, pos, format!("spec.rateLimit.redis{f}"));
    let r = &spec.value;
    let closed = r
        .failure_mode
        .as_ref()
        .is_some_and(|m| m.value == crate::config::wire::enums::RateLimitFailureMode::Closed);
    let before = cx.error_count();
    if !valid_address(&r.address.value) {
        cx.error(
            here(r.address.pos, ".address"),
            format!("`{}` is not host:port", r.address.value),
            "e.g. redis.egress.svc:6379 or 127.0.0.1:6379 ([::1]:6379 for IPv6)",
        );
    }
    let timeout = r
        .timeout
        .as_ref()
        .map_or(DEFAULT_REDIS_TIMEOUT, |t| t.value.0);
    if timeout.is_zero() || timeout > Duration::from_secs(10) {
        let pos = r.timeout.as_ref().map_or(spec.pos, |t| t.pos);
        cx.error(
            here(pos, ".timeout"),
            "timeout: more than 0 and at most 10s",
            "a few milliseconds on a local network (default 20ms)",
        );
    }
    let connections = r.connections.as_ref().map_or(2, |c| c.value);
    if !(1..=64).contains(&connections) {
        let pos = r.connections.as_ref().map_or(spec.pos, |c| c.pos);
        cx.error(
            here(pos, ".connections"),
            "connections: 1 to 64",
            "default 2",
        );
    }
    let password = r
        .password
        .as_ref()
        .and_then(|p| redis_password(cx, file, id, p));
    let tls = r.tls.as_ref().and_then(|t| redis_tls(cx, file, id, t));
    if cx.error_count() > before {
        return (None, closed);
    }
    let settings = RedisSettings {
        address: r.address.value.clone(),
        tls,
        username: r.username.as_ref().map(|u| u.value.clone()),
        password,
        database: r.database.as_ref().map_or(0, |d| d.value),
        key_prefix: r
            .key_prefix
            .as_ref()
            .map_or_else(|| DEFAULT_KEY_PREFIX.to_owned(), |k| k.value.clone()),
        timeout,
        connections: usize::try_from(connections).unwrap_or(2),
    };
    (Some(settings), closed)
}

/// `host:port`, with a non-empty host (an IPv6 address in brackets) and a port above 0.
fn valid_address(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && !host.contains(':') && !host.contains('/'),
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// The password in `valueFile` or the Secret key `secretRef` names (`password` by default).
fn redis_password(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    source: &Spanned<crate::config::wire::backend::CredentialSource>,
) -> Option<String> {
    let field = "spec.rateLimit.redis.password";
    let bytes: Arc<[u8]> = match (&source.value.value_file, &source.value.secret_ref) {
        (Some(path), None) => {
            let resolved = super::tls::resolve(file, &path.value);
            cx.refer(&resolved);
            let max = crate::bounded::file::MAX_CREDENTIAL_FILE;
            match crate::bounded::file::read_regular_file(&resolved, max) {
                Ok(bytes) => bytes.into(),
                Err(e) => {
                    cx.error(
                        at(file, id, path.pos, format!("{field}.valueFile")),
                        format!("{} cannot be read: {e}", resolved.display()),
                        "write the password to the file (it is watched)",
                    );
                    return None;
                }
            }
        }
        (None, Some(r)) => {
            let mut r = r.value.clone();
            r.key.get_or_insert_with(|| "password".to_owned());
            let here = at(file, id, source.pos, format!("{field}.secretRef"));
            super::secret_refs::secret_value(cx, here, &r, &id.namespace)?.0
        }
        _ => {
            cx.error(
                at(file, id, source.pos, field),
                "password needs exactly one of valueFile and secretRef",
                "password: {valueFile: /etc/egressd/redis-password}",
            );
            return None;
        }
    };
    let text = std::str::from_utf8(&bytes)
        .ok()
        .map(|t| t.trim_end_matches(['\r', '\n']));
    match text {
        Some(t) if !t.is_empty() && !t.contains(['\r', '\n']) => Some(t.to_owned()),
        _ => {
            cx.error(
                at(file, id, source.pos, field),
                "the password is empty, not UTF-8, or more than one line",
                "put the password alone in the file or Secret key",
            );
            None
        }
    }
}

/// `tls`: the CA bundle read now (and watched).
fn redis_tls(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    tls: &Spanned<crate::config::wire::proxy::RedisTlsSpec>,
) -> Option<RedisTls> {
    let mut out = RedisTls {
        ca_pem: None,
        server_name: tls.value.server_name.as_ref().map(|n| n.value.clone()),
    };
    if let Some(ca) = &tls.value.ca_certificate_file {
        let resolved = super::tls::resolve(file, &ca.value);
        cx.refer(&resolved);
        let here = || {
            at(
                file,
                id,
                ca.pos,
                "spec.rateLimit.redis.tls.caCertificateFile",
            )
        };
        match crate::bounded::file::read_regular_file(&resolved, crate::bounded::file::MAX_PEM_FILE)
        {
            Ok(pem) if pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") => {
                out.ca_pem = Some(pem);
            }
            Ok(_) => {
                cx.error(
                    here(),
                    format!("{} holds no PEM certificate", resolved.display()),
                    "a PEM bundle of CA certificates",
                );
                return None;
            }
            Err(e) => {
                cx.error(
                    here(),
                    format!("{} cannot be read: {e}", resolved.display()),
                    "check the path (relative to this YAML file)",
                );
                return None;
            }
        }
    }
    Some(out)
}
