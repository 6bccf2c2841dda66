//! BackendTrafficPolicy attachment and section precedence (docs/configuration.md, "Precedence").
//!
//! Each top-level section is taken whole from the most specific source that sets it:
//! HTTPRoute rule fields > policy targeting the HTTPRoute > `Backend.spec.trafficPolicy` >
//! policy targeting the Backend > policy targeting a Gateway > defaults. Two policies at one
//! rank: the lower `namespace/name` wins and the other is `Conflicted`. Connection-level
//! sections belong to the Backend's endpoint pool, so a route-level policy that sets one is
//! `Overridden`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use super::policy_checks::check_sections;
use super::rate_limit::{Scope, SectionSite, Template};
use super::{at, Cx, Interner};
use crate::config::wire::common::PolicyTargetRef;
use crate::config::wire::policy::{BackendTrafficPolicySpec, TimeoutPolicy, TrafficPolicySpec};
use crate::config::wire::{Kind, Object, EGRESSD_GROUP, GATEWAY_GROUP, GATEWAY_X_GROUP};
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId, Reason};
use crate::snapshot::{RateLimitRef, RequestPolicy};

/// A policy's sections with the policy's identity.
pub(crate) struct Source<'a> {
    pub(crate) id: &'a ObjectId,
    pub(crate) spec: TrafficPolicySpec,
}

type Key = (Kind, String, String);

/// Policies by what they target, each list sorted by `namespace/name`.
pub(crate) struct PolicyIndex<'a> {
    by_target: HashMap<Key, Vec<Source<'a>>>,
    /// Policies targeting any Gateway, sorted: connection-level sections from a Gateway apply to
    /// every Backend behind it, and endpoint pools are shared between Gateways.
    gateways: Vec<Source<'a>>,
    /// The request policies made so far, one object per distinct value (see [`Interner`]).
    request_policies: std::cell::RefCell<Interner<RequestPolicy>>,
    /// Checked `rateLimit` sections, by the policy (or the Backend, inline) writing them.
    rate_limits: HashMap<ObjectId, Arc<Template>>,
    /// Their instances per scope (see [`super::rate_limit`]), made as request policies ask.
    rate_limit_instances: std::cell::RefCell<HashMap<(usize, String), RateLimitRef>>,
    /// `ProxyConfig.spec.rateLimit.maxDistinctValues`.
    max_distinct: usize,
}

/// The kind of the object `policy`'s target `i` names, when it can be targeted, is in the
/// policy's namespace and exists; else `None`, reported. Warns about the sections an HTTPRoute
/// target ignores.
fn check_target(
    cx: &mut Cx,
    set: &ConfigSet,
    policy: &Object<BackendTrafficPolicySpec>,
    i: usize,
    t: &Spanned<PolicyTargetRef>,
) -> Option<Kind> {
    let (file, id) = (&*policy.file, &policy.id);
    let field = format!("spec.targetRefs[{i}]");
    let kind = target_kind(cx, file, id, t, &field)?;
    if let Some(ns) = &t.namespace {
        if **ns != *id.namespace {
            cx.error(
                at(file, id, t.pos, field),
                "a policy can only target objects in its own namespace",
                "move the policy to the target's namespace",
            );
            return None;
        }
    }
    if t.section_name.is_some() {
        cx.not_yet(
            at(file, id, t.pos, format!("{field}.sectionName")),
            "targetRefs[].sectionName",
            "",
        );
        return None;
    }
    let named = |o: &ObjectId| o.namespace == id.namespace && *o.name == *t.name;
    let exists = match kind {
        Kind::Backend => set.backends.iter().any(|o| named(&o.id)),
        Kind::Gateway => set.gateways.iter().any(|o| named(&o.id)),
        _ => set.http_routes.iter().any(|o| named(&o.id)),
    };
    if !exists {
        cx.missing_ref(
            at(file, id, t.pos, field),
            format!(
                "target {} {}/{} does not exist",
                kind.name(),
                id.namespace,
                t.name
            ),
            "check the name and namespace, or add the object",
        );
        return None;
    }
    if kind == Kind::HttpRoute {
        let spec = policy.spec.sections();
        for name in CONNECTION_SECTIONS.iter().filter(|n| section_set(&spec, n)) {
            cx.warn(
                at(file, id, t.pos, format!("spec.{name}")),
                Reason::Overridden,
                format!("`{name}` configures the Backend's endpoint pool and is ignored on an HTTPRoute target"),
                "attach it to the Backend instead",
            );
        }
    }
    Some(kind)
}

/// The kind a target's group and kind name: a Backend (or XBackend), a Gateway or an
/// HTTPRoute; `None` (reported) for anything else.
fn target_kind(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    t: &Spanned<PolicyTargetRef>,
    field: &str,
) -> Option<Kind> {
    match (t.group.as_str(), t.kind.as_str()) {
        (EGRESSD_GROUP, "Backend") | (GATEWAY_X_GROUP, "XBackend") => Some(Kind::Backend),
        (GATEWAY_GROUP, "Gateway") => Some(Kind::Gateway),
        (GATEWAY_GROUP, "HTTPRoute") => Some(Kind::HttpRoute),
        (g, k) => {
            cx.error(
                at(file, id, t.pos, field),
                format!("cannot target {k} in group `{g}`"),
                "target `egressd.dev` Backend, or `gateway.networking.k8s.io` Gateway or HTTPRoute",
            );
            None
        }
    }
}

/// Sections that configure the endpoint pool, not a request.
const CONNECTION_SECTIONS: [&str; 6] = [
    "loadBalancer",
    "healthCheck",
    "circuitBreaker",
    "dns",
    "tcpKeepalive",
    "http2",
];

impl<'a> PolicyIndex<'a> {
    /// Checks every BackendTrafficPolicy (in `namespace/name` order) and indexes its valid
    /// targets; reports policies at one rank that conflict.
    pub(crate) fn build(cx: &mut Cx, set: &'a ConfigSet) -> Self {
        let mut by_target: HashMap<Key, Vec<Source<'a>>> = HashMap::new();
        let mut policies: Vec<_> = set.policies.iter().collect();
        policies.sort_by(|a, b| a.id.cmp(&b.id));
        for p in policies {
            let (file, id) = (&*p.file, &p.id);
            check_sections(cx, file, id, &p.spec.sections(), "spec");
            if p.spec.target_refs.is_empty() {
                cx.error(
                    at(file, id, p.pos, "spec.targetRefs"),
                    "a policy needs at least one targetRef",
                    "name a Backend, Gateway or HTTPRoute",
                );
            }
            for (i, t) in p.spec.target_refs.iter().enumerate() {
                let Some(kind) = check_target(cx, set, p, i, t) else {
                    continue;
                };
                let source = Source {
                    id,
                    spec: p.spec.sections(),
                };
                by_target
                    .entry((kind, id.namespace.to_string(), t.name.clone()))
                    .or_default()
                    .push(source);
            }
        }
        let mut gateways = Vec::new();
        for ((kind, _, _), sources) in &by_target {
            if *kind == Kind::Gateway {
                gateways.extend(sources.iter().map(|s| Source {
                    id: s.id,
                    spec: s.spec.clone(),
                }));
            }
        }
        gateways.sort_by(|a, b| a.id.cmp(b.id));
        let (rate_limits, max_distinct) = rate_limit_templates(cx, set);
        let index = PolicyIndex {
            by_target,
            gateways,
            request_policies: Default::default(),
            rate_limits,
            rate_limit_instances: Default::default(),
            max_distinct,
        };
        index.report_conflicts(cx, set);
        index
    }

    /// Policies at one rank that set the same section: the lower `namespace/name` wins.
    fn report_conflicts(&self, cx: &mut Cx, set: &ConfigSet) {
        for sources in self.by_target.values() {
            for name in ALL_SECTIONS {
                let setters: Vec<&Source<'_>> = sources
                    .iter()
                    .filter(|s| section_set(&s.spec, name))
                    .collect();
                for loser in setters.iter().skip(1) {
                    let Some(p) = set.policies.iter().find(|p| &p.id == loser.id) else {
                        continue;
                    };
                    cx.warn(
                        at(&p.file, &p.id, p.pos, format!("spec.{name}")),
                        Reason::Conflicted,
                        format!(
                            "`{name}` is also set by {} on the same target, which wins",
                            setters[0].id
                        ),
                        "set each section in one policy per target",
                    );
                }
            }
        }
    }

    fn sources(&self, kind: Kind, ns: &str, name: &str) -> &[Source<'a>] {
        self.by_target
            .get(&(kind, ns.to_owned(), name.to_owned()))
            .map_or(&[], Vec::as_slice)
    }

    /// A connection-level section for a Backend: inline > Backend policies > Gateway policies.
    pub(crate) fn backend_section<T: Clone>(
        &self,
        backend: &ObjectId,
        inline: Option<&TrafficPolicySpec>,
        get: impl Fn(&TrafficPolicySpec) -> Option<&Spanned<T>>,
    ) -> Option<T> {
        inline
            .and_then(&get)
            .or_else(|| {
                self.sources(Kind::Backend, &backend.namespace, &backend.name)
                    .iter()
                    .find_map(|s| get(&s.spec))
            })
            .or_else(|| self.gateways.iter().find_map(|s| get(&s.spec)))
            .map(|s| s.value.clone())
    }

    /// A request-level section by precedence: policy targeting the HTTPRoute >
    /// `Backend.spec.trafficPolicy` > policy targeting the Backend > policy targeting the
    /// Gateway.
    fn request_section<T: Clone>(
        &self,
        route: Option<&ObjectId>,
        backend: &ObjectId,
        inline: Option<&TrafficPolicySpec>,
        gateway: &ObjectId,
        get: impl Fn(&TrafficPolicySpec) -> Option<&Spanned<T>>,
    ) -> Option<T> {
        let from = |kind: Kind, id: &ObjectId| {
            self.sources(kind, &id.namespace, &id.name)
                .iter()
                .find_map(|s| get(&s.spec))
        };
        route
            .and_then(|id| from(Kind::HttpRoute, id))
            .or_else(|| inline.and_then(&get))
            .or_else(|| from(Kind::Backend, backend))
            .or_else(|| from(Kind::Gateway, gateway))
            .map(|s| s.value.clone())
    }

    /// The request policy for a request to `backend`, routed by `route` (if any) on `gateway`.
    /// Route rule fields (timeouts, retry) come first, then policies by precedence.
    pub(crate) fn request_policy(
        &self,
        route: Option<RouteSettings<'_>>,
        backend: &ObjectId,
        inline: Option<&TrafficPolicySpec>,
        gateway: &ObjectId,
    ) -> Arc<RequestPolicy> {
        let policy = self.resolve_request_policy(route, backend, inline, gateway);
        self.request_policies.borrow_mut().get(policy)
    }

    fn resolve_request_policy(
        &self,
        route: Option<RouteSettings<'_>>,
        backend: &ObjectId,
        inline: Option<&TrafficPolicySpec>,
        gateway: &ObjectId,
    ) -> RequestPolicy {
        let route_id = route.map(|r| r.id);
        let timeout: Option<TimeoutPolicy> =
            self.request_section(route_id, backend, inline, gateway, |s| s.timeout.as_ref());
        let upgrades = self.request_section(route_id, backend, inline, gateway, |s| {
            s.http_upgrade.as_ref()
        });
        let rule_retry = route.and_then(|r| r.retry).map(route_retry);
        let retry = self.request_section(route_id, backend, inline, gateway, |s| s.retry.as_ref());
        let mut policy = RequestPolicy {
            retry: rule_retry.or_else(|| retry.as_ref().map(retry_policy)),
            rate_limit: self.rate_limit(route_id, backend, inline, gateway),
            ..RequestPolicy::default()
        };
        // Websocket upgrades are allowed unless a policy lists upgrades without it.
        if let Some(list) = upgrades {
            policy.websocket = list
                .iter()
                .any(|u| u.kind.value.eq_ignore_ascii_case("websocket"));
        }
        if let Some(t) = timeout {
            if let Some(d) = t.tcp.as_ref().and_then(|tcp| tcp.connect_timeout) {
                policy.connect_timeout = d.into();
            }
            if let Some(http) = &t.http {
                if let Some(d) = http.request_timeout {
                    policy.request_timeout = nonzero(d.into());
                }
                if let Some(d) = http.stream_idle_timeout {
                    policy.stream_idle_timeout = nonzero(d.into());
                }
            }
        }
        // HTTPRoute rule fields outrank every policy.
        if let Some(RouteSettings {
            timeouts: Some(rule),
            ..
        }) = route
        {
            if let Some(d) = rule.request {
                policy.request_timeout = nonzero(d.into());
            }
            if let Some(d) = rule.backend_request {
                policy.backend_request_timeout = nonzero(d.into());
            }
        }
        policy
    }
}

impl PolicyIndex<'_> {
    /// Every rate limit instance request policies took, by policy name and scope.
    pub(crate) fn rate_limit_instances(&self) -> Vec<RateLimitRef> {
        let mut all: Vec<RateLimitRef> = self
            .rate_limit_instances
            .borrow()
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.0.name, &a.0.scope).cmp(&(&b.0.name, &b.0.scope)));
        all
    }

    /// The `rateLimit` section by precedence (policy targeting the HTTPRoute > inline >
    /// policy targeting the Backend > policy targeting the Gateway), instantiated for the
    /// scope it applies to: the route, or the Backend; a Gateway's policy counts per route
    /// (per Backend for requests no HTTPRoute routes).
    fn rate_limit(
        &self,
        route: Option<&ObjectId>,
        backend: &ObjectId,
        inline: Option<&TrafficPolicySpec>,
        gateway: &ObjectId,
    ) -> Option<RateLimitRef> {
        let setter = |kind: Kind, id: &ObjectId| {
            self.sources(kind, &id.namespace, &id.name)
                .iter()
                .find(|s| s.spec.rate_limit.is_some())
                .map(|s| s.id)
        };
        let by_route_or_backend = route.map_or(Scope::Backend(backend), Scope::Route);
        let (writer, scope) = if let Some(p) = route.and_then(|r| setter(Kind::HttpRoute, r)) {
            (p, by_route_or_backend)
        } else if inline.is_some_and(|i| i.rate_limit.is_some()) {
            (backend, Scope::Backend(backend))
        } else if let Some(p) = setter(Kind::Backend, backend) {
            (p, Scope::Backend(backend))
        } else {
            (setter(Kind::Gateway, gateway)?, by_route_or_backend)
        };
        // A section with errors has no template: its requests go unlimited (the config
        // does not serve anyway).
        let template = self.rate_limits.get(writer)?;
        let scope_key = match (&scope, template.all_shared()) {
            (_, true) => String::new(),
            (Scope::Route(id), _) => format!("r {id}"),
            (Scope::Backend(id), _) => format!("b {id}"),
        };
        let key = (Arc::as_ptr(template) as usize, scope_key);
        let mut instances = self.rate_limit_instances.borrow_mut();
        let instance = instances.entry(key).or_insert_with(|| {
            RateLimitRef(Arc::new(template.instance(&scope, self.max_distinct)))
        });
        Some(instance.clone())
    }
}

/// Every `rateLimit` section checked once: of each BackendTrafficPolicy and each Backend's
/// inline `trafficPolicy`; and `maxDistinctValues`.
fn rate_limit_templates(cx: &mut Cx, set: &ConfigSet) -> (HashMap<ObjectId, Arc<Template>>, usize) {
    let proxy = set
        .proxy_configs
        .first()
        .and_then(|pc| pc.spec.rate_limit.as_ref());
    let has_redis = proxy.is_some_and(|p| p.value.redis.is_some());
    let max_distinct = match proxy.and_then(|p| p.value.max_distinct_values.as_ref()) {
        None => super::rate_limit::DEFAULT_MAX_DISTINCT_VALUES,
        Some(m) if (32..=10_000_000).contains(&m.value) => m.value,
        Some(m) => {
            let pc = &set.proxy_configs[0];
            cx.error(
                super::at(&pc.file, &pc.id, m.pos, "spec.rateLimit.maxDistinctValues"),
                "maxDistinctValues: 32 to 10000000",
                "default 10000 (about 410 kB per Distinct rule)",
            );
            super::rate_limit::DEFAULT_MAX_DISTINCT_VALUES
        }
    };
    let mut out = HashMap::new();
    let mut add = |cx: &mut Cx,
                   file: &std::path::Path,
                   id: &ObjectId,
                   prefix: &str,
                   name: String,
                   spec: &TrafficPolicySpec| {
        let Some(section) = &spec.rate_limit else {
            return;
        };
        let site = SectionSite {
            file,
            id,
            prefix,
            has_redis,
        };
        if let Some(t) = super::rate_limit::template(cx, &site, name.into(), section) {
            out.insert(id.clone(), t);
        }
    };
    for p in &set.policies {
        let name = format!("{}/{}", p.id.namespace, p.id.name);
        add(cx, &p.file, &p.id, "spec", name, &p.spec.sections());
    }
    for b in &set.backends {
        if let Some(inline) = &b.spec.traffic_policy {
            let name = format!("Backend {}/{}", b.id.namespace, b.id.name);
            add(
                cx,
                &b.file,
                &b.id,
                "spec.trafficPolicy",
                name,
                &inline.value,
            );
        }
    }
    (
        out,
        usize::try_from(max_distinct).unwrap_or(usize::MAX).max(16),
    )
}

/// Gateway API: a zero timeout disables it.
fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

const ALL_SECTIONS: [&str; 10] = [
    "loadBalancer",
    "healthCheck",
    "circuitBreaker",
    "retry",
    "timeout",
    "tcpKeepalive",
    "dns",
    "http2",
    "httpUpgrade",
    "rateLimit",
];

fn section_set(spec: &TrafficPolicySpec, name: &str) -> bool {
    match name {
        "loadBalancer" => spec.load_balancer.is_some(),
        "healthCheck" => spec.health_check.is_some(),
        "circuitBreaker" => spec.circuit_breaker.is_some(),
        "retry" => spec.retry.is_some(),
        "timeout" => spec.timeout.is_some(),
        "tcpKeepalive" => spec.tcp_keepalive.is_some(),
        "dns" => spec.dns.is_some(),
        "http2" => spec.http2.is_some(),
        "httpUpgrade" => spec.http_upgrade.is_some(),
        "rateLimit" => spec.rate_limit.is_some(),
        _ => false,
    }
}

/// `retry` over the defaults (triggers validated by `policy_checks`).
fn retry_policy(spec: &crate::config::wire::policy::RetrySpec) -> crate::snapshot::RetryPolicy {
    let mut p = crate::snapshot::RetryPolicy::default();
    if let Some(n) = &spec.num_retries {
        p.num_retries = n.value;
    }
    if let Some(limit) = spec.replay_body_limit {
        p.replay_body_limit = limit.0;
    }
    if let Some(on) = &spec.retry_on {
        if let Some(triggers) = &on.triggers {
            let has = |name: &str| triggers.iter().any(|t| t.value == name);
            p.connect_failure = has("connect-failure");
            p.refused_stream = has("refused-stream");
            p.reset = has("reset");
            p.gateway_error = has("gateway-error");
            p.grpc_statuses = GRPC_RETRY_TRIGGERS
                .iter()
                .filter(|(name, _)| has(name))
                .map(|(_, code)| *code)
                .collect();
        }
        if let Some(codes) = &on.http_status_codes {
            p.status_codes = codes.iter().map(|c| c.value).collect();
        }
    }
    if let Some(per) = &spec.per_retry {
        p.per_try_timeout = per.timeout.as_ref().map(|t| t.value.0);
        if let Some(b) = &per.back_off {
            if let Some(base) = b.base_interval {
                p.backoff_base = base.0;
            }
            if let Some(max) = b.max_interval {
                p.backoff_max = max.0;
            }
        }
    }
    p
}

/// gRPC retry triggers and the status each names (as Envoy's `retry_on`).
pub(super) const GRPC_RETRY_TRIGGERS: [(&str, u32); 5] = [
    ("cancelled", 1),
    ("deadline-exceeded", 4),
    ("resource-exhausted", 8),
    ("internal", 13),
    ("unavailable", 14),
];

/// What a matched HTTPRoute rule says itself.
#[derive(Clone, Copy)]
pub(crate) struct RouteSettings<'a> {
    pub(crate) id: &'a ObjectId,
    pub(crate) timeouts: Option<&'a crate::config::wire::route::HttpRouteTimeouts>,
    pub(crate) retry: Option<&'a crate::config::wire::route::HttpRouteRetry>,
}

/// Gateway API `HTTPRouteRetry` onto egressd's retry policy.
fn route_retry(r: &crate::config::wire::route::HttpRouteRetry) -> crate::snapshot::RetryPolicy {
    let mut p = crate::snapshot::RetryPolicy::default();
    if let Some(n) = r.attempts {
        p.num_retries = n;
    }
    if let Some(base) = r.backoff {
        p.backoff_base = base.0;
        p.backoff_max = (base.0 * 10).max(p.backoff_max);
    }
    if let Some(codes) = &r.codes {
        p.gateway_error = false;
        p.status_codes = codes.clone();
    }
    p
}
