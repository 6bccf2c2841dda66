//! `BackendTrafficPolicy` (egressd.dev) and its inline form `Backend.spec.trafficPolicy`.

use macro_rules_attribute::apply;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{NotYetSupported, PolicyTargetRef};
use super::enums::{ConsistentHashType, HealthCheckType, LoadBalancerType, LookupFamily};
use super::rate_limit::RateLimitSpec;
use crate::config::units::{GwDuration, Quantity};
use crate::config::yaml::Spanned;

/// Declares the policy sections once, for both the standalone kind (with `targetRefs`) and the
/// inline form. serde cannot combine `flatten` with `deny_unknown_fields`, hence the macro.
macro_rules! policy_sections {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($extra:tt)* }) => {
        $(#[$meta])*
        #[apply(wire!)]
        #[derive(Default)]
        $vis struct $name {
            $($extra)*
            $vis load_balancer: Option<Spanned<LoadBalancer>>,
            $vis health_check: Option<Spanned<HealthCheck>>,
            $vis circuit_breaker: Option<Spanned<CircuitBreaker>>,
            $vis retry: Option<Spanned<RetrySpec>>,
            $vis timeout: Option<Spanned<TimeoutPolicy>>,
            $vis tcp_keepalive: Option<Spanned<TcpKeepaliveConfig>>,
            $vis dns: Option<Spanned<DnsPolicy>>,
            $vis http2: Option<Spanned<Http2Policy>>,
            $vis http_upgrade: Option<Spanned<Vec<HttpUpgrade>>>,
            /// Requests per unit of time (docs/rate-limits.md).
            $vis rate_limit: Option<Spanned<RateLimitSpec>>,
        }
    };
}

policy_sections! {
    /// A standalone policy attached to Backends, Gateways or HTTPRoutes through `targetRefs`.
    pub(crate) struct BackendTrafficPolicySpec {
        pub(crate) target_refs: Vec<Spanned<PolicyTargetRef>>,
    }
}

policy_sections! {
    /// The policy sections, as written inline in `Backend.spec.trafficPolicy`.
    pub(crate) struct TrafficPolicySpec {}
}

impl BackendTrafficPolicySpec {
    /// The sections without the target references.
    pub(crate) fn sections(&self) -> TrafficPolicySpec {
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
            rate_limit: self.rate_limit.clone(),
        }
    }
}

#[apply(wire!)]
pub(crate) struct LoadBalancer {
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<LoadBalancerType>,
    pub(crate) least_request: Option<Spanned<LeastRequestConfig>>,
    pub(crate) slow_start: Option<Spanned<SlowStartConfig>>,
    pub(crate) consistent_hash: Option<Spanned<ConsistentHashConfig>>,
}

/// `loadBalancer.consistentHash` (type `ConsistentHash`): what requests are hashed by, and
/// the ring or table that maps hashes to endpoints (`ringHash` when neither is given).
#[apply(wire!)]
pub(crate) struct ConsistentHashConfig {
    /// `Header`, `Cookie` or `SourceIP`.
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<ConsistentHashType>,
    /// The header whose (first) value is hashed, for type `Header`.
    pub(crate) header: Option<Spanned<HashHeader>>,
    /// The cookie whose value is hashed, for type `Cookie`.
    pub(crate) cookie: Option<Spanned<HashCookie>>,
    /// Ring hash (Envoy's `RING_HASH`), the default.
    pub(crate) ring_hash: Option<Spanned<RingHashConfig>>,
    /// Maglev (Envoy's `MAGLEV`).
    pub(crate) maglev: Option<Spanned<MaglevConfig>>,
}

#[apply(wire!)]
pub(crate) struct HashHeader {
    pub(crate) name: Spanned<String>,
}

#[apply(wire!)]
pub(crate) struct HashCookie {
    pub(crate) name: Spanned<String>,
    /// Generating the cookie when the request has none (Envoy's `ttl`): not supported yet.
    pub(crate) ttl: Option<Spanned<NotYetSupported>>,
    pub(crate) attributes: Option<Spanned<NotYetSupported>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RingHashConfig {
    /// Fewest points on the ring (default 1024; at most 8Mi).
    pub(crate) minimum_ring_size: Option<Spanned<u64>>,
    /// Most points on the ring (default and largest 8Mi).
    pub(crate) maximum_ring_size: Option<Spanned<u64>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct MaglevConfig {
    /// Slots in the lookup table: a prime, at most 5000011 (default 65537).
    pub(crate) table_size: Option<Spanned<u64>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct TimeoutPolicy {
    pub(crate) tcp: Option<TcpTimeouts>,
    pub(crate) http: Option<HttpTimeouts>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct TcpTimeouts {
    /// Time allowed to establish an upstream connection (default 10s).
    pub(crate) connect_timeout: Option<GwDuration>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HttpTimeouts {
    /// The whole exchange, until the end of the response (default: none).
    pub(crate) request_timeout: Option<GwDuration>,
    /// Longest silence, in either direction, on a request or response in progress (default 5m).
    pub(crate) stream_idle_timeout: Option<GwDuration>,
    /// How long an idle pooled upstream connection is kept (default 60s).
    pub(crate) connection_idle_timeout: Option<GwDuration>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct DnsPolicy {
    /// Re-resolve when the record's TTL expires (default true).
    pub(crate) respect_dns_ttl: Option<bool>,
    /// Re-resolution interval when TTLs are not respected (default 30s).
    pub(crate) dns_refresh_rate: Option<GwDuration>,
    pub(crate) lookup_family: Option<LookupFamily>,
}

/// A protocol upgrade requests may ask for (`httpUpgrade: [{type: websocket}]`; `[]` refuses
/// every upgrade).
#[apply(wire!)]
pub(crate) struct HttpUpgrade {
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<String>,
}

/// HTTP/2 towards the Backend's endpoints (a connection-level section).
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct Http2Policy {
    /// Streams one upstream connection carries at most; past it (or past the server's own
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`, whichever is smaller) another connection is opened.
    /// Default: the server's limit.
    pub(crate) max_concurrent_streams: Option<Spanned<u32>>,
    /// Streams one upstream connection carries in all; then it takes no new stream, closes
    /// when its streams end, and the next request opens another (default 1000, what common
    /// servers allow a connection; 0: no cap of egressd's own).
    pub(crate) max_requests_per_connection: Option<Spanned<u32>>,
    /// Receive window per stream (default 2Mi).
    pub(crate) initial_stream_window_size: Option<Spanned<Quantity>>,
    /// Receive window per connection (default 5Mi).
    pub(crate) initial_connection_window_size: Option<Spanned<Quantity>>,
    /// PINGs that detect a dead connection while streams are open (default: off, as in Envoy;
    /// many gRPC servers close connections that ping more often than every 5 minutes).
    pub(crate) connection_keepalive: Option<Http2Keepalive>,
}

#[apply(wire!)]
pub(crate) struct Http2Keepalive {
    /// Time between PINGs.
    pub(crate) interval: Spanned<GwDuration>,
    /// How long to wait for the PING's answer before closing the connection (default 20s).
    pub(crate) timeout: Option<GwDuration>,
}

/// `tcpKeepalive`: TCP keepalive probes on upstream connections (connection level).
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct TcpKeepaliveConfig {
    /// Idle time before the first probe (default 7200s).
    pub(crate) idle_time: Option<Spanned<GwDuration>>,
    /// Time between probes (default 75s).
    pub(crate) interval: Option<Spanned<GwDuration>>,
    /// Unanswered probes before the connection is dropped (default 9).
    pub(crate) probes: Option<Spanned<u32>>,
}

/// `loadBalancer.slowStart`: endpoints that just became ready get a growing share of traffic.
#[apply(wire!)]
pub(crate) struct SlowStartConfig {
    /// How long the ramp lasts (required).
    pub(crate) window: Spanned<GwDuration>,
    /// Shape of the ramp: 1.0 linear, larger ramps up faster at first (default 1.0).
    pub(crate) aggression: Option<Spanned<f64>>,
    /// The smallest share, in percent of the full weight (default 10).
    pub(crate) min_weight_percent: Option<Spanned<u32>>,
}

/// `loadBalancer.leastRequest`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct LeastRequestConfig {
    /// Endpoints sampled per pick when weights are equal (2..=16, default 2).
    pub(crate) choice_count: Option<Spanned<u32>>,
    /// Exponent of `active + 1` in `weight / (active + 1)^bias` (default 1.0; 0 ignores load).
    /// Setting it makes even equal weights use the weighted schedule, as in Envoy.
    pub(crate) active_request_bias: Option<Spanned<f64>>,
    /// Sample distinct endpoints (default true); false samples with replacement like Envoy,
    /// so the busier of two endpoints is still chosen a quarter of the time.
    pub(crate) distinct_choices: Option<bool>,
}

/// `healthCheck`: passive (outlier detection) and, later, active checks.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HealthCheck {
    /// Below this percentage of healthy endpoints, picks ignore health (Envoy's panic mode;
    /// default 50, 0 disables).
    pub(crate) panic_threshold: Option<Spanned<u32>>,
    /// Outlier detection from live traffic.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "outlierDetection"
    )]
    pub(crate) passive: Option<Spanned<PassiveHealthCheck>>,
    /// Active checks: egressd probes every endpoint on a timer.
    pub(crate) active: Option<Spanned<ActiveHealthCheck>>,
}

/// `healthCheck.active`. See docs/balancing-and-health.md for defaults and semantics.
#[apply(wire!)]
pub(crate) struct ActiveHealthCheck {
    /// `HTTP` (a request over a new connection made as the Backend port says), `TCP` (a
    /// connect) or `MCP` (`initialize`, `ping`, then `DELETE` of the session; one `ping` for
    /// the stateless protocol).
    #[serde(rename = "type")]
    pub(crate) kind: Spanned<HealthCheckType>,
    /// Time between two checks of one endpoint (default 10s).
    pub(crate) interval: Option<Spanned<GwDuration>>,
    /// Random extra time added to each interval, up to this (default 0).
    pub(crate) interval_jitter: Option<Spanned<GwDuration>>,
    /// A check without a passing answer within this time fails (default 1s).
    pub(crate) timeout: Option<Spanned<GwDuration>>,
    /// Failed checks in a row that mark a healthy endpoint unhealthy (default 3).
    pub(crate) unhealthy_threshold: Option<Spanned<u32>>,
    /// Passed checks in a row that mark an unhealthy endpoint healthy (default 1).
    pub(crate) healthy_threshold: Option<Spanned<u32>>,
    /// A passing check ends an outlier ejection at once (default true, as in Envoy).
    pub(crate) uneject_on_pass: Option<bool>,
    /// The request of `type: HTTP`.
    pub(crate) http: Option<Spanned<HttpHealthCheck>>,
}

/// `healthCheck.active.http`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct HttpHealthCheck {
    /// Path (and query) requested (default `/`).
    pub(crate) path: Option<Spanned<String>>,
    /// Method (default GET).
    pub(crate) method: Option<Spanned<String>>,
    /// `Host` sent (default: the Backend's hostname, or the endpoint address for IP Backends).
    pub(crate) host: Option<Spanned<String>>,
    /// Statuses that pass (default [200], as in Envoy).
    pub(crate) expected_statuses: Option<Vec<Spanned<u16>>>,
}

/// `healthCheck.passive` (outlier detection). See docs/balancing-and-health.md for defaults
/// and semantics.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct PassiveHealthCheck {
    /// How often ejections are reviewed (default 10s).
    pub(crate) interval: Option<Spanned<GwDuration>>,
    /// Consecutive 502/503/504, connect failures, resets and timeouts that eject (default 5,
    /// enforced; 0 turns it off).
    pub(crate) consecutive_gateway_errors: Option<Spanned<u32>>,
    /// Consecutive 5xx (and the failures above) that eject; detected at 5 and enforced only
    /// when set (0 turns detection off).
    #[serde(
        default,
        rename = "consecutive5XxErrors",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) consecutive_5xx_errors: Option<Spanned<u32>>,
    /// Consecutive local-origin failures (connect failures, resets, timeouts, TLS and
    /// protocol errors) that eject, when `splitExternalLocalOriginErrors` is on (default 5).
    pub(crate) consecutive_local_origin_failures: Option<Spanned<u32>>,
    /// Count failures egressd saw itself apart from HTTP statuses (default false: they count
    /// as gateway errors).
    pub(crate) split_external_local_origin_errors: Option<bool>,
    /// Eject endpoints failing at least `threshold` percent of an interval's requests
    /// (off unless set).
    pub(crate) failure_percentage: Option<Spanned<FailurePercentageConfig>>,
    /// Eject endpoints whose success rate is far below the group's mean (off unless set).
    pub(crate) success_rate: Option<Spanned<SuccessRateConfig>>,
    /// First ejection's length; the n-th consecutive one lasts n times this (default 30s).
    pub(crate) base_ejection_time: Option<Spanned<GwDuration>>,
    /// Longest ejection (default max(300s, base)).
    pub(crate) max_ejection_time: Option<Spanned<GwDuration>>,
    /// Random extra ejection time, up to this (default 0).
    pub(crate) max_ejection_time_jitter: Option<Spanned<GwDuration>>,
    /// Most endpoints ejected at once, in percent of the group (default 50).
    pub(crate) max_ejection_percent: Option<Spanned<u32>>,
    /// One endpoint may always be ejected, whatever maxEjectionPercent says (default true).
    pub(crate) always_eject_one_endpoint: Option<bool>,
}

/// `healthCheck.passive.failurePercentage`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct FailurePercentageConfig {
    /// Failure percentage (0-100) at which an endpoint is ejected (default 85).
    pub(crate) threshold: Option<Spanned<u32>>,
    /// Endpoints with enough requests needed before anything is ejected (default 5).
    pub(crate) minimum_hosts: Option<Spanned<u32>>,
    /// Requests in the interval for an endpoint to be judged (default 50).
    pub(crate) request_volume: Option<Spanned<u32>>,
}

/// `healthCheck.passive.successRate`.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct SuccessRateConfig {
    /// Ejected below `mean - stdevFactor/1000 × stdev` (default 1900).
    pub(crate) stdev_factor: Option<Spanned<u32>>,
    /// Endpoints with enough requests needed before anything is ejected (default 5).
    pub(crate) minimum_hosts: Option<Spanned<u32>>,
    /// Requests in the interval for an endpoint to be judged (default 100).
    pub(crate) request_volume: Option<Spanned<u32>>,
}

/// `circuitBreaker`: limits that turn overload into fast 503s instead of queues.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct CircuitBreaker {
    /// Requests in flight to one Backend port, all endpoints together (default 1024); one
    /// more gets 503 `overflow` at once.
    pub(crate) max_parallel_requests: Option<Spanned<u32>>,
    /// Connections open to the Backend port's endpoints at once (default 1024). At the limit
    /// a request without a free pooled connection waits for one (or for a connection to close).
    pub(crate) max_connections: Option<Spanned<u32>>,
    /// Requests waiting for a connection at once (default 1024); one more gets 503 `overflow`.
    pub(crate) max_pending_requests: Option<Spanned<u32>>,
    /// Retries in progress at once (default 1024; Envoy's is 3); past it, the failed attempt's
    /// answer is final.
    pub(crate) max_parallel_retries: Option<Spanned<u32>>,
    /// Retries in progress as a share of the requests in flight; replaces
    /// `maxParallelRetries` when set.
    pub(crate) retry_budget: Option<Spanned<RetryBudgetConfig>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RetryBudgetConfig {
    /// Percent of the requests in flight that may be retries (default 20).
    pub(crate) percent: Option<Spanned<f64>>,
    /// Retries always allowed, however few requests are in flight (default 3).
    pub(crate) min_retry_concurrency: Option<Spanned<u32>>,
}

/// `retry`: sending a failed request again, when that is safe.
#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RetrySpec {
    /// Attempts after the first (default 2).
    pub(crate) num_retries: Option<Spanned<u32>>,
    pub(crate) retry_on: Option<RetryOn>,
    pub(crate) per_retry: Option<PerRetry>,
    /// Request bodies up to this size, with a known length, are held so they can be sent
    /// again (default 64Ki; 0: only body-less requests are retried).
    pub(crate) replay_body_limit: Option<Quantity>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct RetryOn {
    /// `connect-failure`, `refused-stream`, `reset`, `gateway-error`, `retriable-status-codes`
    /// (default: the first four).
    pub(crate) triggers: Option<Vec<Spanned<String>>>,
    /// Statuses retried with `retriable-status-codes` (setting them turns that trigger on).
    pub(crate) http_status_codes: Option<Vec<Spanned<u16>>>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct PerRetry {
    /// Time allowed for each attempt until the response headers (default: none).
    pub(crate) timeout: Option<Spanned<GwDuration>>,
    pub(crate) back_off: Option<BackOff>,
}

#[apply(wire!)]
#[derive(Default)]
pub(crate) struct BackOff {
    /// Fully jittered exponential backoff: retry n waits a random time up to
    /// min(base × 2^(n-1), max) (defaults 25ms and 250ms).
    pub(crate) base_interval: Option<GwDuration>,
    pub(crate) max_interval: Option<GwDuration>,
}
