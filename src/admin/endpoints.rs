//! `/endpoints`: per Backend port and endpoint, what balancing and outlier detection see.

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::runtime::snapshot::Snapshot;

pub(super) fn endpoints(snapshot: &Snapshot) -> Value {
    let now = Instant::now();
    let backends: Vec<Value> = snapshot
        .backends
        .iter()
        .flat_map(|backend| {
            backend.ports.iter().map(move |port| {
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
                        json!({
                            "address": e.addr.to_string(),
                            "weight": e.weight,
                            "health": if ejected { "ejected" } else { "healthy" },
                            "activeRequests": e.active_requests(),
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
                            "http2Connections": e.h2.connection_count(),
                            "idleHttp1Connections": e.pool.idle_count(),
                        })
                    })
                    .collect();
                let [connections, requests, retries, pending] = group.breaker().usage();
                let limits = group.breaker().settings();
                json!({
                    "backend": backend.label.as_ref(),
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
            })
        })
        .collect();
    json!({ "generation": snapshot.generation, "backends": backends })
}
