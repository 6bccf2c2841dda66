//! `/endpoints`: per Backend port and endpoint, what balancing, outlier detection and active
//! health checks see.

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::balance::health::HealthState;
use crate::snapshot::{BackendPort, Snapshot};
use crate::telemetry::time::rfc3339;

pub(super) fn endpoints(snapshot: &Snapshot) -> Value {
    let now = Instant::now();
    let mut backends = Vec::new();
    for backend in &snapshot.backends {
        for port in &backend.ports {
            // A wildcard Backend's port: its endpoints are per concrete host, each an entry
            // of its own naming the host, after the port's (which says how many there are).
            let hosts = port.wildcard.as_ref().map(|w| w.hosts_of_port(port.number));
            let mut entry = port_json(&backend.label, port, now);
            entry["wildcardHosts"] = json!(hosts.as_ref().map(Vec::len));
            backends.push(entry);
            for (host, host_port) in hosts.into_iter().flatten() {
                let mut entry = port_json(&backend.label, &host_port, now);
                entry["host"] = json!(host);
                backends.push(entry);
            }
        }
    }
    json!({ "generation": snapshot.generation, "backends": backends })
}

/// One Backend port (or one concrete host of a wildcard Backend's port) and its endpoints.
fn port_json(label: &str, port: &BackendPort, now: Instant) -> Value {
    let group = &port.endpoints;
    let list = group.list();
    let endpoints: Vec<Value> = list
        .endpoints
        .iter()
        .map(|e| {
            let ejection = e.outlier.ejection();
            let ejected = e.outlier.is_ejected();
            let remaining_ms = ejection.ejected_at.filter(|_| ejected).map(|at| {
                (at + ejection.duration)
                    .saturating_duration_since(now)
                    .as_millis() as u64
            });
            let (gateway, server, local) = e.outlier.consecutive();
            let checked = group.active_settings().is_some();
            let unhealthy = checked && e.health.is_unhealthy();
            let health = if ejected {
                "ejected"
            } else if unhealthy {
                "unhealthy"
            } else {
                "healthy"
            };
            json!({
                "address": e.addr.to_string(),
                "weight": e.weight,
                "effectiveWeight": group.effective_weight(e),
                "priority": e.priority,
                "health": health,
                "activeHealth": checked.then(|| active_health(&e.health)),
                "activeRequests": e.active_requests(),
                // Slow start counts from here (created, back from ejection, healthy).
                "readyForMs": crate::balance::slow_start::now_ms()
                    .saturating_sub(e.ready_since_ms()),
                "lastFailure": e.last_failure().map(|f| json!({
                    "at": rfc3339(f.at),
                    "detail": f.detail,
                })),
                "totalRequests": e.total_requests(),
                "ejection": {
                    "ejected": ejected,
                    "remainingMs": remaining_ms,
                    "multiplier": ejection.multiplier,
                    "ejections": ejection.ejections,
                    "lastReason": ejection.reason.map(|r| r.as_str()),
                },
                "consecutiveGatewayErrors": gateway,
                "consecutive5xx": server,
                "consecutiveLocalOriginFailures": local,
                "http2Connections": e.h2_if_used().map_or(0, |h2| h2.connection_count()),
                "idleHttp1Connections": e.pool.idle_count(),
            })
        })
        .collect();
    let [connections, requests, retries, pending] = group.breaker().usage();
    let limits = group.breaker().settings();
    json!({
        "backend": label,
        "port": port.number,
        "circuitBreaker": {
            "connections": connections,
            "maxConnections": limits.max_connections,
            "parallelRequests": requests,
            "maxParallelRequests": limits.max_parallel_requests,
            "pendingRequests": pending,
            "maxPendingRequests": limits.max_pending_requests,
            "parallelRetries": retries,
        },
        "resolved": list.resolved,
        "lastError": list.last_error,
        "endpoints": endpoints,
    })
}

/// An endpoint's active health: `unknown` until its first check, then `healthy`/`unhealthy`
/// (which the first check leaves as it was: endpoints start healthy).
fn active_health(health: &HealthState) -> Value {
    let d = health.detail();
    let state = match (d.last_check, health.is_unhealthy()) {
        (None, _) => "unknown",
        (Some(_), true) => "unhealthy",
        (Some(_), false) => "healthy",
    };
    json!({
        "state": state,
        "lastCheck": d.last_check.map(rfc3339),
        "lastResult": d.last_pass.map(|pass| if pass { "pass" } else { "fail" }),
        "lastFailure": d.last_failure,
        "consecutivePasses": d.consecutive_passes,
        "consecutiveFailures": d.consecutive_failures,
    })
}

/// The gauges read off the serving snapshot, set just before `/metrics` is encoded: requests
/// in flight, open connections and endpoints by health per Backend, and seconds until each
/// certificate file expires. Series of Backends and files no longer in the config go away.
pub(super) fn refresh_gauges(shared: &crate::snapshot::shared::Shared) {
    use crate::telemetry::metrics::{BackendHealthLabel, BackendLabel, FileLabel};
    let snapshot = shared.snapshot.load();
    let m = &shared.metrics;
    m.upstream_requests_active.clear();
    m.upstream_connections_open.clear();
    m.upstream_connections_opened.clear();
    m.upstream_endpoints.clear();
    m.certificate_expiry.clear();
    for backend in &snapshot.backends {
        let label = BackendLabel {
            backend: backend.label.to_string(),
        };
        let (mut active, mut open, mut opened) = (0i64, 0i64, 0i64);
        let mut by_health = [0i64; 3];
        let hosts = backend.ports.iter().flat_map(|port| {
            port.wildcard
                .iter()
                .flat_map(|w| w.hosts_of_port(port.number))
                .map(|(_, host_port)| host_port)
        });
        let ports = backend.ports.iter().cloned().chain(hosts);
        for port in ports {
            let group = &port.endpoints;
            open += i64::from(group.breaker().usage()[0]);
            let checked = group.active_settings().is_some();
            for e in &group.list().endpoints {
                active += e.active_requests() as i64;
                opened += e.connections_opened() as i64;
                let health = if e.outlier.is_ejected() {
                    1
                } else if checked && e.health.is_unhealthy() {
                    2
                } else {
                    0
                };
                by_health[health] += 1;
            }
        }
        m.upstream_requests_active.get_or_create(&label).set(active);
        m.upstream_connections_open.get_or_create(&label).set(open);
        m.upstream_connections_opened
            .get_or_create(&label)
            .set(opened);
        for (count, health) in by_health
            .into_iter()
            .zip(["healthy", "ejected", "unhealthy"])
        {
            m.upstream_endpoints
                .get_or_create(&BackendHealthLabel {
                    backend: label.backend.clone(),
                    health,
                })
                .set(count);
        }
    }
    m.buffered_body_bytes
        .set(i64::try_from(shared.buffered_bodies.used()).unwrap_or(i64::MAX));
    let undeclared = snapshot.undeclared.as_ref().map_or(0, |u| u.len());
    m.undeclared_destinations
        .set(i64::try_from(undeclared).unwrap_or(i64::MAX));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if let Some(interceptor) = &snapshot.interception {
        m.interception_leaves_cached
            .set(i64::try_from(interceptor.cached_hosts()).unwrap_or(i64::MAX));
        m.interception_leaves_minted.inner().store(
            interceptor.minted_total(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    distinct_tables(m, &snapshot);
    for (file, not_after) in &snapshot.certificate_expiries {
        m.certificate_expiry
            .get_or_create(&FileLabel { file: file.clone() })
            .set(not_after - now);
    }
}

/// `egressd_ratelimit_distinct_values` and `_evictions` of every `Distinct` local rule.
fn distinct_tables(m: &crate::telemetry::metrics::Metrics, snapshot: &crate::snapshot::Snapshot) {
    use crate::ratelimit::rules::{Counter, LocalCounter};
    use crate::telemetry::metrics::PolicyRuleLabel;
    let mut sums: std::collections::BTreeMap<(String, String), (usize, u64)> = Default::default();
    for policy in &snapshot.rate_limits {
        for rule in policy.0.local.iter() {
            if let Counter::Local(counter) = &rule.counter {
                if let LocalCounter::Distinct(table) = &**counter {
                    let sum = sums
                        .entry((policy.0.name.to_string(), rule.label.to_string()))
                        .or_default();
                    sum.0 += table.len();
                    sum.1 += table.evicted();
                }
            }
        }
    }
    for ((policy, rule), (held, evicted)) in sums {
        let label = PolicyRuleLabel { policy, rule };
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        m.ratelimit_distinct_values
            .get_or_create(&label)
            .set(gauge(held as u64));
        m.ratelimit_distinct_evictions
            .get_or_create(&label)
            .set(gauge(evicted));
    }
}
