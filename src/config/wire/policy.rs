//! `BackendTrafficPolicy` (egressd.dev) and its inline form `Backend.spec.trafficPolicy`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{NotYetSupported, PolicyTargetRef};
use super::enums::{ConsistentHashType, HealthCheckType, LoadBalancerType, LookupFamily};
use crate::config::units::{GwDuration, Quantity};
use crate::config::yaml::Spanned;

/// Declares the policy sections once, for both the standalone kind (with `targetRefs`) and the
/// inline form. serde cannot combine `flatten` with `deny_unknown_fields`, hence the macro.
macro_rules! policy_sections {
    ($(#[$meta:meta])* pub struct $name:ident { $($extra:tt)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
        #[serde(rename_all = "camelCase", deny_unknown_fields)]
        pub struct $name {
            $($extra)*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub load_balancer: Option<Spanned<LoadBalancer>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub health_check: Option<Spanned<HealthCheck>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub circuit_breaker: Option<Spanned<CircuitBreaker>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub retry: Option<Spanned<RetrySpec>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub timeout: Option<Spanned<TimeoutPolicy>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub tcp_keepalive: Option<Spanned<TcpKeepaliveConfig>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub dns: Option<Spanned<DnsPolicy>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub http2: Option<Spanned<Http2Policy>>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub http_upgrade: Option<Spanned<Vec<HttpUpgrade>>>,
        }
    };
}

policy_sections! {
    /// A standalone policy attached to Backends, Gateways or HTTPRoutes through `targetRefs`.
    pub struct BackendTrafficPolicySpec {
        pub target_refs: Vec<Spanned<PolicyTargetRef>>,
    }
}

policy_sections! {
    /// The policy sections, as written inline in `Backend.spec.trafficPolicy`.
    pub struct TrafficPolicySpec {}
}

impl BackendTrafficPolicySpec {
    /// The sections without the target references.
    pub fn sections(&self) -> TrafficPolicySpec {
        TrafficPolicySpec {
            load_balancer: self.load_balancer.clone(),
            health_check: self.health_check.clone(),
            circuit_breaker: self.circuit_breaker.clone(),
            retry: self.retry.clone(),
            timeout: self.timeout.clone(),
            tcp_keepalive: self.tcp_keepalive.clone(),
            dns: self.dns.clone(),
            http2: self.http2.clone(),
            http_upgrade: self.http_upgrade.clone(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancer {
    #[serde(rename = "type")]
    pub kind: Spanned<LoadBalancerType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub least_request: Option<Spanned<LeastRequestConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<Spanned<SlowStartConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<Spanned<ConsistentHashConfig>>,
}

/// `loadBalancer.consistentHash` (type `ConsistentHash`): what requests are hashed by, and
/// the ring or table that maps hashes to endpoints (`ringHash` when neither is given).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConsistentHashConfig {
    /// `Header`, `Cookie` or `SourceIP`.
    #[serde(rename = "type")]
    pub kind: Spanned<ConsistentHashType>,
    /// The header whose (first) value is hashed, for type `Header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<Spanned<HashHeader>>,
    /// The cookie whose value is hashed, for type `Cookie`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<Spanned<HashCookie>>,
    /// Ring hash (Envoy's `RING_HASH`), the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<Spanned<RingHashConfig>>,
    /// Maglev (Envoy's `MAGLEV`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev: Option<Spanned<MaglevConfig>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HashHeader {
    pub name: Spanned<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HashCookie {
    pub name: Spanned<String>,
    /// Generating the cookie when the request has none (Envoy's `ttl`): not supported yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Spanned<NotYetSupported>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Spanned<NotYetSupported>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RingHashConfig {
    /// Fewest points on the ring (default 1024; at most 8Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<Spanned<u64>>,
    /// Most points on the ring (default and largest 8Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_ring_size: Option<Spanned<u64>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MaglevConfig {
    /// Slots in the lookup table: a prime, at most 5000011 (default 65537).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_size: Option<Spanned<u64>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeoutPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpTimeouts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpTimeouts>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpTimeouts {
    /// Time allowed to establish an upstream connection (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<GwDuration>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpTimeouts {
    /// The whole exchange, until the end of the response (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<GwDuration>,
    /// Longest silence, in either direction, on a request or response in progress (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_idle_timeout: Option<GwDuration>,
    /// How long an idle pooled upstream connection is kept (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_idle_timeout: Option<GwDuration>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DnsPolicy {
    /// Re-resolve when the record's TTL expires (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub respect_dns_ttl: Option<bool>,
    /// Re-resolution interval when TTLs are not respected (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_refresh_rate: Option<GwDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup_family: Option<LookupFamily>,
}

/// A protocol upgrade requests may ask for (`httpUpgrade: [{type: websocket}]`; `[]` refuses
/// every upgrade).
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpUpgrade {
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
}

/// HTTP/2 towards the Backend's endpoints (a connection-level section).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Http2Policy {
    /// Streams one upstream connection carries at most; past it (or past the server's own
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`, whichever is smaller) another connection is opened.
    /// Default: the server's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<Spanned<u32>>,
    /// Receive window per stream (default 2Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_stream_window_size: Option<Spanned<Quantity>>,
    /// Receive window per connection (default 5Mi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_connection_window_size: Option<Spanned<Quantity>>,
    /// PINGs that detect a dead connection while streams are open (default: off, as in Envoy;
    /// many gRPC servers close connections that ping more often than every 5 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_keepalive: Option<Http2Keepalive>,
}

#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Http2Keepalive {
    /// Time between PINGs.
    pub interval: Spanned<GwDuration>,
    /// How long to wait for the PING's answer before closing the connection (default 20s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GwDuration>,
}

/// `tcpKeepalive`: TCP keepalive probes on upstream connections (connection level).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpKeepaliveConfig {
    /// Idle time before the first probe (default 7200s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_time: Option<Spanned<GwDuration>>,
    /// Time between probes (default 75s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Spanned<GwDuration>>,
    /// Unanswered probes before the connection is dropped (default 9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Spanned<u32>>,
}

/// `loadBalancer.slowStart`: endpoints that just became ready get a growing share of traffic.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlowStartConfig {
    /// How long the ramp lasts (required).
    pub window: Spanned<GwDuration>,
    /// Shape of the ramp: 1.0 linear, larger ramps up faster at first (default 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggression: Option<Spanned<f64>>,
    /// The smallest share, in percent of the full weight (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_weight_percent: Option<Spanned<u32>>,
}

/// `loadBalancer.leastRequest`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeastRequestConfig {
    /// Endpoints sampled per pick when weights are equal (2..=16, default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice_count: Option<Spanned<u32>>,
    /// Exponent of `active + 1` in `weight / (active + 1)^bias` (default 1.0; 0 ignores load).
    /// Setting it makes even equal weights use the weighted schedule, as in Envoy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_request_bias: Option<Spanned<f64>>,
    /// Sample distinct endpoints (default true); false samples with replacement like Envoy,
    /// so the busier of two endpoints is still chosen a quarter of the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinct_choices: Option<bool>,
}

/// `healthCheck`: passive (outlier detection) and, later, active checks.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    /// Below this percentage of healthy endpoints, picks ignore health (Envoy's panic mode;
    /// default 50, 0 disables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panic_threshold: Option<Spanned<u32>>,
    /// Outlier detection from live traffic.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "outlierDetection"
    )]
    pub passive: Option<Spanned<PassiveHealthCheck>>,
    /// Active checks: egressd probes every endpoint on a timer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<Spanned<ActiveHealthCheck>>,
}

/// `healthCheck.active`. See docs/balancing-and-health.md for defaults and semantics.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActiveHealthCheck {
    /// `HTTP` (a request over a new connection made as the Backend port says), `TCP` (a
    /// connect) or `MCP` (`initialize`, `ping`, then `DELETE` of the session; one `ping` for
    /// the stateless protocol).
    #[serde(rename = "type")]
    pub kind: Spanned<HealthCheckType>,
    /// Time between two checks of one endpoint (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Spanned<GwDuration>>,
    /// Random extra time added to each interval, up to this (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_jitter: Option<Spanned<GwDuration>>,
    /// A check without a passing answer within this time fails (default 1s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Spanned<GwDuration>>,
    /// Failed checks in a row that mark a healthy endpoint unhealthy (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_threshold: Option<Spanned<u32>>,
    /// Passed checks in a row that mark an unhealthy endpoint healthy (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_threshold: Option<Spanned<u32>>,
    /// A passing check ends an outlier ejection at once (default true, as in Envoy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uneject_on_pass: Option<bool>,
    /// The request of `type: HTTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<Spanned<HttpHealthCheck>>,
}

/// `healthCheck.active.http`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpHealthCheck {
    /// Path (and query) requested (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Spanned<String>>,
    /// Method (default GET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Spanned<String>>,
    /// `Host` sent (default: the Backend's hostname, or the endpoint address for IP Backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Spanned<String>>,
    /// Statuses that pass (default [200], as in Envoy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_statuses: Option<Vec<Spanned<u16>>>,
}

/// `healthCheck.passive` (outlier detection). See docs/balancing-and-health.md for defaults
/// and semantics.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PassiveHealthCheck {
    /// How often ejections are reviewed (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Spanned<GwDuration>>,
    /// Consecutive 502/503/504, connect failures, resets and timeouts that eject (default 5,
    /// enforced; 0 turns it off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<Spanned<u32>>,
    /// Consecutive 5xx (and the failures above) that eject; detected at 5 and enforced only
    /// when set (0 turns detection off).
    #[serde(
        default,
        rename = "consecutive5XxErrors",
        skip_serializing_if = "Option::is_none"
    )]
    pub consecutive_5xx_errors: Option<Spanned<u32>>,
    /// Consecutive local-origin failures (connect failures, resets, timeouts, TLS and
    /// protocol errors) that eject, when `splitExternalLocalOriginErrors` is on (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<Spanned<u32>>,
    /// Count failures egressd saw itself apart from HTTP statuses (default false: they count
    /// as gateway errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    /// Eject endpoints failing at least `threshold` percent of an interval's requests
    /// (off unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_percentage: Option<Spanned<FailurePercentageConfig>>,
    /// Eject endpoints whose success rate is far below the group's mean (off unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<Spanned<SuccessRateConfig>>,
    /// First ejection's length; the n-th consecutive one lasts n times this (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<Spanned<GwDuration>>,
    /// Longest ejection (default max(300s, base)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_time: Option<Spanned<GwDuration>>,
    /// Random extra ejection time, up to this (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_time_jitter: Option<Spanned<GwDuration>>,
    /// Most endpoints ejected at once, in percent of the group (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<Spanned<u32>>,
    /// One endpoint may always be ejected, whatever maxEjectionPercent says (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_eject_one_endpoint: Option<bool>,
}

/// `healthCheck.passive.failurePercentage`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailurePercentageConfig {
    /// Failure percentage (0-100) at which an endpoint is ejected (default 85).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<Spanned<u32>>,
    /// Endpoints with enough requests needed before anything is ejected (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_hosts: Option<Spanned<u32>>,
    /// Requests in the interval for an endpoint to be judged (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_volume: Option<Spanned<u32>>,
}

/// `healthCheck.passive.successRate`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuccessRateConfig {
    /// Ejected below `mean - stdevFactor/1000 × stdev` (default 1900).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdev_factor: Option<Spanned<u32>>,
    /// Endpoints with enough requests needed before anything is ejected (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_hosts: Option<Spanned<u32>>,
    /// Requests in the interval for an endpoint to be judged (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_volume: Option<Spanned<u32>>,
}

/// `circuitBreaker`: limits that turn overload into fast 503s instead of queues.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CircuitBreaker {
    /// Requests in flight to one Backend port, all endpoints together (default 1024); one
    /// more gets 503 `overflow` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_requests: Option<Spanned<u32>>,
    /// Connections open to the Backend port's endpoints at once (default 1024). At the limit
    /// a request without a free pooled connection waits for one (or for a connection to close).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<Spanned<u32>>,
    /// Requests waiting for a connection at once (default 1024); one more gets 503 `overflow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_requests: Option<Spanned<u32>>,
    /// Retries in progress at once (default 1024; Envoy's is 3); past it, the failed attempt's
    /// answer is final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_retries: Option<Spanned<u32>>,
    /// Retries in progress as a share of the requests in flight; replaces
    /// `maxParallelRetries` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<Spanned<RetryBudgetConfig>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryBudgetConfig {
    /// Percent of the requests in flight that may be retries (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<Spanned<f64>>,
    /// Retries always allowed, however few requests are in flight (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_retry_concurrency: Option<Spanned<u32>>,
}

/// `retry`: sending a failed request again, when that is safe.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts after the first (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_retries: Option<Spanned<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<RetryOn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_retry: Option<PerRetry>,
    /// Request bodies up to this size, with a known length, are held so they can be sent
    /// again (default 64Ki; 0: only body-less requests are retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_body_limit: Option<Quantity>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryOn {
    /// `connect-failure`, `refused-stream`, `reset`, `gateway-error`, `retriable-status-codes`
    /// (default: the first four).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triggers: Option<Vec<Spanned<String>>>,
    /// Statuses retried with `retriable-status-codes` (setting them turns that trigger on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status_codes: Option<Vec<Spanned<u16>>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerRetry {
    /// Time allowed for each attempt until the response headers (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Spanned<GwDuration>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_off: Option<BackOff>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackOff {
    /// Fully jittered exponential backoff: retry n waits a random time up to
    /// min(base × 2^(n-1), max) (defaults 25ms and 250ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_interval: Option<GwDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<GwDuration>,
}
