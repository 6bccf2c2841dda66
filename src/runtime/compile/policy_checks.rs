//! Validation of the policy sections, wherever a policy is written (standalone
//! `BackendTrafficPolicy` or inline `Backend.spec.trafficPolicy`): values out of range are
//! positioned errors, parts of the model this build does not implement are "not supported yet".

use super::{at, Cx};
use crate::config::wire::policy::{self, TrafficPolicySpec};
use crate::config::ObjectId;

/// Reports sections and values this build does not implement, wherever a policy is written.
pub(crate) fn check_sections(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    spec: &TrafficPolicySpec,
    prefix: &str,
) {
    if let Some(k) = &spec.tcp_keepalive {
        check_tcp_keepalive(cx, file, id, &k.value, prefix);
    }
    if let Some(h2) = &spec.http2 {
        check_http2(cx, file, id, &h2.value, prefix);
    }
    if let Some(upgrades) = &spec.http_upgrade {
        check_http_upgrades(cx, file, id, &upgrades.value, prefix);
    }
    if let Some(lb) = &spec.load_balancer {
        check_load_balancer(cx, file, id, &lb.value, prefix);
    }
    if let Some(cb) = &spec.circuit_breaker {
        check_circuit_breaker(cx, file, id, &cb.value, prefix);
    }
    if let Some(r) = &spec.retry {
        check_retry(cx, file, id, &r.value, prefix);
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

/// `tcpKeepalive`: whole seconds, and at least one probe.
fn check_tcp_keepalive(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    k: &policy::TcpKeepaliveConfig,
    prefix: &str,
) {
    for (name, v) in [("idleTime", &k.idle_time), ("interval", &k.interval)] {
        if let Some(v) = v
            .as_ref()
            .filter(|v| v.value.0 < std::time::Duration::from_secs(1))
        {
            cx.error(
                at(file, id, v.pos, format!("{prefix}.tcpKeepalive.{name}")),
                format!(
                    "{name} {} is below 1s (the kernel counts whole seconds)",
                    v.value
                ),
                "e.g. 60s",
            );
        }
    }
    if let Some(p) = k.probes.as_ref().filter(|p| p.value == 0) {
        cx.error(
            at(file, id, p.pos, format!("{prefix}.tcpKeepalive.probes")),
            "probes must be at least 1",
            "e.g. 9",
        );
    }
}

/// `httpUpgrade`: websocket is the only upgrade this build relays.
fn check_http_upgrades(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    upgrades: &[policy::HttpUpgrade],
    prefix: &str,
) {
    for (i, u) in upgrades.iter().enumerate() {
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

/// `circuitBreaker`: limits of at least 1, a retry budget that is a percentage.
fn check_circuit_breaker(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    cb: &policy::CircuitBreaker,
    prefix: &str,
) {
    let field = |name: &str| format!("{prefix}.circuitBreaker.{name}");
    for (name, v) in [
        ("maxParallelRequests", &cb.max_parallel_requests),
        ("maxConnections", &cb.max_connections),
    ] {
        if let Some(v) = v.as_ref().filter(|v| v.value == 0) {
            cx.error(
                at(file, id, v.pos, field(name)),
                format!("{name} must be at least 1"),
                "e.g. 1024; a Backend that must take no traffic has no route to it",
            );
        }
    }
    if let Some(p) = cb
        .retry_budget
        .as_ref()
        .and_then(|b| b.value.percent.as_ref())
        .filter(|p| !(0.0..=100.0).contains(&p.value))
    {
        cx.error(
            at(file, id, p.pos, field("retryBudget.percent")),
            format!("percent {} is not between 0 and 100", p.value),
            "a share of the requests in flight, e.g. 20",
        );
    }
}

/// `retry.retryOn.triggers`: each one of [`RETRY_TRIGGERS`].
fn check_retry(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    r: &policy::RetrySpec,
    prefix: &str,
) {
    let Some(triggers) = r.retry_on.as_ref().and_then(|o| o.triggers.as_ref()) else {
        return;
    };
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
        if let Some(v) = value.as_ref().filter(|v| {
            // The same bounds as the downstream settings (RFC 9113 §6.9.1, §6.9.2).
            use crate::snapshot::Http2ServerSettings as H2;
            v.value.0 < u64::from(H2::SPEC_CONNECTION_WINDOW_SIZE)
                || v.value.0 > u64::from(H2::MAX_WINDOW_SIZE)
        }) {
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
    super::consistent_hash::check(cx, file, id, lb, prefix);
    if let Some(slow) = &lb.slow_start {
        check_slow_start(cx, file, id, lb, slow, prefix);
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

fn check_slow_start(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    lb: &crate::config::wire::policy::LoadBalancer,
    slow: &crate::config::yaml::Spanned<crate::config::wire::policy::SlowStartConfig>,
    prefix: &str,
) {
    use crate::config::wire::enums::LoadBalancerType;
    let field = |name: &str| format!("{prefix}.loadBalancer.slowStart{name}");
    if lb.kind.value != LoadBalancerType::LeastRequest {
        cx.error(
            at(file, id, slow.pos, field("")),
            format!("slowStart is not supported with type {}", lb.kind.value),
            "use type: LeastRequest, or remove slowStart",
        );
    }
    let s = &slow.value;
    if s.window.value.0.is_zero() {
        cx.error(
            at(file, id, s.window.pos, field(".window")),
            "window must be greater than zero",
            "e.g. 30s",
        );
    }
    if let Some(a) = s
        .aggression
        .as_ref()
        .filter(|a| !a.value.is_finite() || a.value <= 0.0)
    {
        cx.error(
            at(file, id, a.pos, field(".aggression")),
            format!("aggression {} must be a number above 0", a.value),
            "1.0 ramps up linearly; larger values ramp up faster at first",
        );
    }
    if let Some(m) = s.min_weight_percent.as_ref().filter(|m| m.value > 100) {
        cx.error(
            at(file, id, m.pos, field(".minWeightPercent")),
            format!("minWeightPercent {} is above 100", m.value),
            "a percentage of the full weight, 0 to 100",
        );
    }
}

/// `healthCheck`: active checks, the panic threshold, then passive (outlier) detection.
fn check_health_check(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    hc: &policy::HealthCheck,
    prefix: &str,
) {
    if let Some(a) = &hc.active {
        super::health::check_active(cx, file, id, &a.value, prefix);
    }
    if let Some(t) = hc.panic_threshold.as_ref().filter(|t| t.value > 100) {
        cx.error(
            at(
                file,
                id,
                t.pos,
                format!("{prefix}.healthCheck.panicThreshold"),
            ),
            format!("panicThreshold {} is above 100", t.value),
            "a percentage of healthy endpoints, 0 to 100 (0: never balance over unhealthy ones)",
        );
    }
    if let Some(p) = &hc.passive {
        check_passive(cx, file, id, &p.value, prefix);
    }
}

/// `healthCheck.passive`: positive intervals, percentages up to 100, and local-origin
/// failures counted only when split out.
fn check_passive(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    p: &policy::PassiveHealthCheck,
    prefix: &str,
) {
    let field = |name: &str| format!("{prefix}.healthCheck.passive.{name}");
    for (name, v) in [
        ("interval", &p.interval),
        ("baseEjectionTime", &p.base_ejection_time),
    ] {
        if let Some(v) = v.as_ref().filter(|v| v.value.0.is_zero()) {
            cx.error(
                at(file, id, v.pos, field(name)),
                format!("{name} must be greater than zero"),
                "e.g. 10s",
            );
        }
    }
    if let (Some(base), Some(max)) = (&p.base_ejection_time, &p.max_ejection_time) {
        if max.value.0 < base.value.0 {
            cx.error(
                at(file, id, max.pos, field("maxEjectionTime")),
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
            at(file, id, v.pos, field("maxEjectionPercent")),
            format!("maxEjectionPercent {} is above 100", v.value),
            "a percentage of the Backend port's endpoints, 0 to 100",
        );
    }
    if let Some(v) = &p.consecutive_local_origin_failures {
        if p.split_external_local_origin_errors != Some(true) {
            cx.error(
                at(file, id, v.pos, field("consecutiveLocalOriginFailures")),
                "consecutiveLocalOriginFailures applies only when local-origin errors are split out",
                "add `splitExternalLocalOriginErrors: true`, or remove it (connect failures, \
                 resets and timeouts then count as gateway errors)",
            );
        }
    }
    if let Some(t) = p
        .failure_percentage
        .as_ref()
        .and_then(|f| f.value.threshold.as_ref())
        .filter(|t| t.value > 100)
    {
        cx.error(
            at(file, id, t.pos, field("failurePercentage.threshold")),
            format!("threshold {} is above 100", t.value),
            "a percentage of an endpoint's requests that failed, 0 to 100",
        );
    }
}

pub(super) const RETRY_TRIGGERS: [&str; 10] = [
    "connect-failure",
    "refused-stream",
    "reset",
    "gateway-error",
    "retriable-status-codes",
    "cancelled",
    "deadline-exceeded",
    "resource-exhausted",
    "internal",
    "unavailable",
];
