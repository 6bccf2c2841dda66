//! BackendTrafficPolicy attachment and section precedence (CONFIG.md, "Precedence").
//!
//! Each top-level section is taken whole from the most specific source that sets it:
//! HTTPRoute rule fields > policy targeting the HTTPRoute > `Backend.spec.trafficPolicy` >
//! policy targeting the Backend > policy targeting a Gateway > defaults. Two policies at one
//! rank: the lower `namespace/name` wins and the other is `Conflicted`. Connection-level
//! sections belong to the Backend's endpoint pool, so a route-level policy that sets one is
//! `Overridden`.

use std::collections::HashMap;
use std::time::Duration;

use super::{at, Cx};
use crate::config::wire::policy::{TimeoutPolicy, TrafficPolicySpec};
use crate::config::wire::{Kind, EGRESSD_GROUP, GATEWAY_GROUP};
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId, Reason};
use crate::runtime::snapshot::RequestPolicy;

/// A policy's sections with the policy's identity.
pub(crate) struct Source<'a> {
    pub id: &'a ObjectId,
    pub spec: TrafficPolicySpec,
}

type Key = (Kind, String, String);

/// Policies by what they target, each list sorted by `namespace/name`.
pub(crate) struct PolicyIndex<'a> {
    by_target: HashMap<Key, Vec<Source<'a>>>,
    /// Policies targeting any Gateway, sorted: connection-level sections from a Gateway apply to
    /// every Backend behind it, and endpoint pools are shared between Gateways.
    gateways: Vec<Source<'a>>,
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
    pub fn build(cx: &mut Cx, set: &'a ConfigSet) -> Self {
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
                let field = format!("spec.targetRefs[{i}]");
                let kind = match (t.group.as_str(), t.kind.as_str()) {
                    (EGRESSD_GROUP, "Backend") => Kind::Backend,
                    (GATEWAY_GROUP, "Gateway") => Kind::Gateway,
                    (GATEWAY_GROUP, "HTTPRoute") => Kind::HttpRoute,
                    (g, k) => {
                        cx.error(
                            at(file, id, t.pos, field),
                            format!("cannot target {k} in group `{g}`"),
                            "target `egressd.dev` Backend, or `gateway.networking.k8s.io` Gateway or HTTPRoute",
                        );
                        continue;
                    }
                };
                if let Some(ns) = &t.namespace {
                    if ns != id.namespace.as_str() {
                        cx.error(
                            at(file, id, t.pos, field),
                            "a policy can only target objects in its own namespace",
                            "move the policy to the target's namespace",
                        );
                        continue;
                    }
                }
                if t.section_name.is_some() {
                    cx.not_yet(
                        at(file, id, t.pos, format!("{field}.sectionName")),
                        "targetRefs[].sectionName",
                        "[balance]",
                    );
                    continue;
                }
                let exists = match kind {
                    Kind::Backend => set
                        .backends
                        .iter()
                        .any(|o| o.id.namespace == id.namespace && o.id.name == t.name),
                    Kind::Gateway => set
                        .gateways
                        .iter()
                        .any(|o| o.id.namespace == id.namespace && o.id.name == t.name),
                    _ => set
                        .http_routes
                        .iter()
                        .any(|o| o.id.namespace == id.namespace && o.id.name == t.name),
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
                    continue;
                }
                if kind == Kind::HttpRoute {
                    let spec = p.spec.sections();
                    for name in CONNECTION_SECTIONS.iter().filter(|n| section_set(&spec, n)) {
                        cx.warn(
                            at(file, id, t.pos, format!("spec.{name}")),
                            Reason::Overridden,
                            format!("`{name}` configures the Backend's endpoint pool and is ignored on an HTTPRoute target"),
                            "attach it to the Backend instead",
                        );
                    }
                }
                let source = Source {
                    id,
                    spec: p.spec.sections(),
                };
                by_target
                    .entry((kind, id.namespace.clone(), t.name.clone()))
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
        let index = PolicyIndex {
            by_target,
            gateways,
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
    pub fn backend_section<T: Clone>(
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
    pub fn request_policy(
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

/// Gateway API: a zero timeout disables it.
fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

const ALL_SECTIONS: [&str; 9] = [
    "loadBalancer",
    "healthCheck",
    "circuitBreaker",
    "retry",
    "timeout",
    "tcpKeepalive",
    "dns",
    "http2",
    "httpUpgrade",
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
        _ => false,
    }
}

/// Reports sections and values this build does not implement, wherever a policy is written.
pub(crate) fn check_sections(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    spec: &TrafficPolicySpec,
    prefix: &str,
) {
    let pending = [(
        "tcpKeepalive",
        spec.tcp_keepalive.as_ref().map(|s| s.pos),
        "[balance]",
    )];
    for (name, pos, issue) in pending {
        if let Some(pos) = pos {
            cx.not_yet(at(file, id, pos, format!("{prefix}.{name}")), name, issue);
        }
    }
    if let Some(h2) = &spec.http2 {
        check_http2(cx, file, id, &h2.value, prefix);
    }
    if let Some(upgrades) = &spec.http_upgrade {
        for (i, u) in upgrades.value.iter().enumerate() {
            if !u.kind.value.eq_ignore_ascii_case("websocket") {
                cx.not_yet(
                    at(
                        file,
                        id,
                        u.kind.pos,
                        format!("{prefix}.httpUpgrade[{i}].type"),
                    ),
                    &format!(
                        "upgrade type `{}` (this build relays websocket)",
                        u.kind.value
                    ),
                    "[h2]",
                );
            }
        }
    }
    if let Some(lb) = &spec.load_balancer {
        check_load_balancer(cx, file, id, &lb.value, prefix);
    }
    if let Some(cb) = &spec.circuit_breaker {
        let cb = &cb.value;
        let field = |name: &str| format!("{prefix}.circuitBreaker.{name}");
        for (name, v) in [
            ("maxConnections", &cb.max_connections),
            ("maxPendingRequests", &cb.max_pending_requests),
            ("maxParallelRetries", &cb.max_parallel_retries),
            ("retryBudget", &cb.retry_budget),
        ] {
            if let Some(v) = v {
                cx.not_yet(at(file, id, v.pos, field(name)), name, "[balance]");
            }
        }
        if let Some(v) = cb.max_parallel_requests.as_ref().filter(|v| v.value == 0) {
            cx.error(
                at(file, id, v.pos, field("maxParallelRequests")),
                "maxParallelRequests must be at least 1",
                "e.g. 1024; a Backend that must take no traffic has no route to it",
            );
        }
    }
    if let Some(r) = &spec.retry {
        if let Some(triggers) = r.value.retry_on.as_ref().and_then(|o| o.triggers.as_ref()) {
            for (i, t) in triggers.iter().enumerate() {
                if !RETRY_TRIGGERS.contains(&t.value.as_str()) {
                    cx.error(
                        at(
                            file,
                            id,
                            t.pos,
                            format!("{prefix}.retry.retryOn.triggers[{i}]"),
                        ),
                        format!("unknown retry trigger `{}`", t.value),
                        format!("one of {}", RETRY_TRIGGERS.join(", ")),
                    );
                }
            }
        }
    }
    if let Some(hc) = &spec.health_check {
        check_health_check(cx, file, id, &hc.value, prefix);
    }
    if let Some(t) = &spec.timeout {
        if t.tcp
            .as_ref()
            .and_then(|tcp| tcp.connect_timeout)
            .is_some_and(|d| d.0.is_zero())
        {
            cx.error(
                at(
                    file,
                    id,
                    t.pos,
                    format!("{prefix}.timeout.tcp.connectTimeout"),
                ),
                "connectTimeout must be greater than zero",
                "e.g. 10s",
            );
        }
    }
}

/// Largest HTTP/2 flow-control window (RFC 9113 §6.9.1).
const MAX_WINDOW: u64 = (1 << 31) - 1;

fn check_http2(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    h2: &crate::config::wire::policy::Http2Policy,
    prefix: &str,
) {
    if let Some(v) = h2.max_concurrent_streams.as_ref().filter(|v| v.value == 0) {
        cx.error(
            at(
                file,
                id,
                v.pos,
                format!("{prefix}.http2.maxConcurrentStreams"),
            ),
            "maxConcurrentStreams must be at least 1",
            "e.g. 100; leave it out to follow the server's own limit",
        );
    }
    for (name, value) in [
        ("initialStreamWindowSize", &h2.initial_stream_window_size),
        (
            "initialConnectionWindowSize",
            &h2.initial_connection_window_size,
        ),
    ] {
        if let Some(v) = value
            .as_ref()
            .filter(|v| v.value.0 < 65_535 || v.value.0 > MAX_WINDOW)
        {
            cx.error(
                at(file, id, v.pos, format!("{prefix}.http2.{name}")),
                format!(
                    "{name} {} is out of range (65535 to 2147483647 bytes)",
                    v.value
                ),
                "HTTP/2 windows are at least 64Ki-1 and below 2Gi, e.g. 1Mi",
            );
        }
    }
    if let Some(k) = &h2.connection_keepalive {
        if k.interval.value.0.is_zero() {
            cx.error(
                at(
                    file,
                    id,
                    k.interval.pos,
                    format!("{prefix}.http2.connectionKeepalive.interval"),
                ),
                "keepalive interval must be greater than zero",
                "e.g. 30s, or remove connectionKeepalive to send no PINGs",
            );
        }
    }
}

fn check_load_balancer(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    lb: &crate::config::wire::policy::LoadBalancer,
    prefix: &str,
) {
    use crate::config::wire::enums::LoadBalancerType;
    if lb.kind.value == LoadBalancerType::ConsistentHash {
        cx.not_yet(
            at(file, id, lb.kind.pos, format!("{prefix}.loadBalancer.type")),
            "loadBalancer type ConsistentHash",
            "[balance]",
        );
    }
    for (name, v) in [
        ("slowStart", &lb.slow_start),
        ("consistentHash", &lb.consistent_hash),
    ] {
        if let Some(v) = v {
            cx.not_yet(
                at(file, id, v.pos, format!("{prefix}.loadBalancer.{name}")),
                name,
                "[balance]",
            );
        }
    }
    let Some(lr) = &lb.least_request else {
        return;
    };
    if lb.kind.value != LoadBalancerType::LeastRequest {
        cx.error(
            at(
                file,
                id,
                lr.pos,
                format!("{prefix}.loadBalancer.leastRequest"),
            ),
            format!(
                "leastRequest settings do not apply to type {}",
                lb.kind.value
            ),
            "remove leastRequest, or set type: LeastRequest",
        );
    }
    if let Some(c) = lr
        .value
        .choice_count
        .as_ref()
        .filter(|c| !(2..=crate::balance::MAX_CHOICES as u32).contains(&c.value))
    {
        cx.error(
            at(
                file,
                id,
                c.pos,
                format!("{prefix}.loadBalancer.leastRequest.choiceCount"),
            ),
            format!(
                "choiceCount {} is out of range (2 to {})",
                c.value,
                crate::balance::MAX_CHOICES
            ),
            "2 (power of two choices) balances well; more choices approach a full scan",
        );
    }
    if let Some(b) = lr
        .value
        .active_request_bias
        .as_ref()
        .filter(|b| !b.value.is_finite() || b.value < 0.0)
    {
        cx.error(
            at(
                file,
                id,
                b.pos,
                format!("{prefix}.loadBalancer.leastRequest.activeRequestBias"),
            ),
            format!(
                "activeRequestBias {} must be a number of at least 0",
                b.value
            ),
            "1.0 weighs by weight/(active+1); 0 ignores load",
        );
    }
}

fn check_health_check(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    hc: &crate::config::wire::policy::HealthCheck,
    prefix: &str,
) {
    let field = |name: &str| format!("{prefix}.healthCheck.{name}");
    if let Some(a) = &hc.active {
        cx.not_yet(
            at(file, id, a.pos, field("active")),
            "active health checks",
            "[balance]",
        );
    }
    if let Some(t) = hc.panic_threshold.as_ref().filter(|t| t.value > 100) {
        cx.error(
            at(file, id, t.pos, field("panicThreshold")),
            format!("panicThreshold {} is above 100", t.value),
            "a percentage of healthy endpoints, 0 to 100 (0: never balance over unhealthy ones)",
        );
    }
    let Some(p) = &hc.passive else {
        return;
    };
    let p = &p.value;
    for (name, v) in [
        (
            "consecutiveLocalOriginFailures",
            &p.consecutive_local_origin_failures,
        ),
        (
            "splitExternalLocalOriginErrors",
            &p.split_external_local_origin_errors,
        ),
        ("failurePercentage", &p.failure_percentage),
        ("successRate", &p.success_rate),
    ] {
        if let Some(v) = v {
            cx.not_yet(
                at(file, id, v.pos, field(&format!("passive.{name}"))),
                name,
                "[balance]",
            );
        }
    }
    for (name, v) in [
        ("interval", &p.interval),
        ("baseEjectionTime", &p.base_ejection_time),
    ] {
        if let Some(v) = v.as_ref().filter(|v| v.value.0.is_zero()) {
            cx.error(
                at(file, id, v.pos, field(&format!("passive.{name}"))),
                format!("{name} must be greater than zero"),
                "e.g. 10s",
            );
        }
    }
    if let (Some(base), Some(max)) = (&p.base_ejection_time, &p.max_ejection_time) {
        if max.value.0 < base.value.0 {
            cx.error(
                at(file, id, max.pos, field("passive.maxEjectionTime")),
                format!(
                    "maxEjectionTime {} is shorter than baseEjectionTime {}",
                    max.value, base.value
                ),
                "the longest ejection must be at least the first one",
            );
        }
    }
    if let Some(v) = p.max_ejection_percent.as_ref().filter(|v| v.value > 100) {
        cx.error(
            at(file, id, v.pos, field("passive.maxEjectionPercent")),
            format!("maxEjectionPercent {} is above 100", v.value),
            "a percentage of the Backend port's endpoints, 0 to 100",
        );
    }
}

const RETRY_TRIGGERS: [&str; 5] = [
    "connect-failure",
    "refused-stream",
    "reset",
    "gateway-error",
    "retriable-status-codes",
];

/// `retry` over the defaults (triggers validated by `check_sections`).
fn retry_policy(
    spec: &crate::config::wire::policy::RetrySpec,
) -> crate::runtime::snapshot::RetryPolicy {
    let mut p = crate::runtime::snapshot::RetryPolicy::default();
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

/// What a matched HTTPRoute rule says itself.
#[derive(Clone, Copy)]
pub struct RouteSettings<'a> {
    pub id: &'a ObjectId,
    pub timeouts: Option<&'a crate::config::wire::route::HttpRouteTimeouts>,
    pub retry: Option<&'a crate::config::wire::route::HttpRouteRetry>,
}

/// Gateway API `HTTPRouteRetry` onto egressd's retry policy.
fn route_retry(
    r: &crate::config::wire::route::HttpRouteRetry,
) -> crate::runtime::snapshot::RetryPolicy {
    let mut p = crate::runtime::snapshot::RetryPolicy::default();
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
