//! Prometheus metrics. Handles are created once; the hot path only increments atomics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod exposition;
mod registration;

/// The `reason`s of `egressd_downstream_connections_refused_total`.
pub(crate) const CONNECTION_REFUSALS: [&str; 3] = [
    "max_connections",
    "admin_max_connections",
    "admin_idle_evicted",
];
/// The `reason`s of `egressd_downstream_connection_timeouts_total`, in the order of
/// `listener::watchdog::Expiry`.
pub(crate) const CONNECTION_TIMEOUTS: [&str; 2] = ["header_read_timeout", "idle_timeout"];
/// The `reason`s of `egressd_downstream_send_timeouts_total`, in the order of
/// `http::sending::Cut`.
pub(crate) const SEND_TIMEOUTS: [&str; 3] =
    ["send_timeout", "request_timeout", "stream_idle_timeout"];
/// The `cause`s of `egressd_upstream_tls_failures_total`, in the order of
/// `upstream::tls::TlsFailure`.
pub(crate) const UPSTREAM_TLS_CAUSES: [&str; 10] = [
    "unknown_ca",
    "expired",
    "not_yet_valid",
    "name_mismatch",
    "bad_certificate",
    "client_cert_required",
    "plaintext_peer",
    "handshake_timeout",
    "protocol_version",
    "handshake_failed",
];

/// The `reason`s of `egressd_interception_handshake_failures_total`: the client's TLS alert
/// when it refused egressd's certificate, or what else ended the handshake.
pub(crate) const INTERCEPTION_HANDSHAKE_FAILURES: [&str; 8] = [
    "unknown_ca",
    "bad_certificate",
    "certificate_unknown",
    "other_alert",
    "sni_mismatch",
    "not_tls",
    "timeout",
    "closed",
];

/// `egressd_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BuildLabel {
    pub(crate) version: &'static str,
    pub(crate) commit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    pub(crate) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CodeLabel {
    pub(crate) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TlsLabel {
    pub(crate) tls: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: &'static str,
}

/// A rate limit rule.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PolicyRuleLabel {
    pub(crate) policy: String,
    pub(crate) rule: String,
}

/// A rate limit rule and what it decided.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RateLimitLabel {
    pub(crate) policy: String,
    pub(crate) rule: String,
    pub(crate) decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CauseLabel {
    pub(crate) cause: &'static str,
}

/// Per Backend: bounded by the config, not by traffic.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendLabel {
    pub(crate) backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerLabel {
    pub(crate) listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerClassLabel {
    pub(crate) listener: String,
    /// `1xx` .. `5xx`.
    pub(crate) class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabel {
    pub(crate) route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteClassLabel {
    pub(crate) route: String,
    pub(crate) class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendClassLabel {
    pub(crate) backend: String,
    pub(crate) class: &'static str,
}

const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Latency buckets in seconds: 0.5 ms to a minute (MCP and streaming calls run long).
const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// One listener's or Backend's request counters by status class and its latency histogram,
/// looked up once (per connection, or per Backend and config) so that counting a request is
/// an atomic increment and one histogram observation, no label lookup.
#[derive(Debug)]
pub(crate) struct RequestStats {
    responses: [Counter; 5],
    latency: Histogram,
}

impl RequestStats {
    /// Counts a response of `status` that took `elapsed`.
    pub(crate) fn record(&self, status: u16, elapsed: std::time::Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses[class].inc();
        self.latency.observe(elapsed.as_secs_f64());
    }
}

/// The `x-egressd-error` codes of failures to open a connection, each counted per Backend in
/// `egressd_upstream_connect_failures_total{backend,reason}`.
pub(crate) const CONNECT_FAILURE_CODES: [&str; 3] = [
    "upstream_connect_failure",
    "upstream_connect_timeout",
    "upstream_tls_failure",
];

/// The `x-egressd-error` codes of attempts that failed after the connection was there (no
/// response head came), each counted per Backend in
/// `egressd_upstream_failures_total{backend,reason}`.
pub(crate) const FAILURE_CODES: [&str; 3] = [
    "upstream_reset",
    "upstream_timeout",
    "upstream_protocol_error",
];

/// The decision counters of one rate limit rule, resolved once per rule and config
/// generation.
#[derive(Debug)]
pub(crate) struct RateLimitStats {
    pub(crate) allowed: Counter,
    pub(crate) limited: Counter,
    pub(crate) would_limit: Counter,
}

impl Metrics {
    /// The counters of rule `rule` of rate limit policy `policy`.
    pub(crate) fn ratelimit_stats(&self, policy: &str, rule: &str) -> RateLimitStats {
        let counter = |decision| {
            self.ratelimit_decisions
                .get_or_create(&RateLimitLabel {
                    policy: policy.to_owned(),
                    rule: rule.to_owned(),
                    decision,
                })
                .clone()
        };
        RateLimitStats {
            allowed: counter("allowed"),
            limited: counter("limited"),
            would_limit: counter("would_limit"),
        }
    }
}

/// The `reason`s of `egressd_ratelimit_redis_errors_total`.
pub(crate) const RATELIMIT_REDIS_ERRORS: [&str; 4] = ["unavailable", "timeout", "auth", "other"];

/// The per-attempt metrics of one Backend, resolved once per Backend and config generation:
/// a request costs atomic increments, never a label lookup.
#[derive(Debug)]
pub(crate) struct BackendStats {
    /// Upstream responses by status class, and attempt latency.
    pub(crate) responses: RequestStats,
    retries: Counter,
    /// One per [`CONNECT_FAILURE_CODES`] entry, in that order.
    connect_failures: [Counter; CONNECT_FAILURE_CODES.len()],
    /// One per [`FAILURE_CODES`] entry, in that order.
    failures: [Counter; FAILURE_CODES.len()],
}

impl BackendStats {
    /// Counts a retry sent (`egressd_upstream_retries_total`).
    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    /// Counts a failure to connect with code `code`, one of [`CONNECT_FAILURE_CODES`] (other
    /// codes are not connect failures and are not counted here).
    pub(crate) fn connect_failed(&self, code: &str) {
        count_code(&self.connect_failures, &CONNECT_FAILURE_CODES, code);
    }

    /// Counts an attempt that failed after connecting with code `code`, one of
    /// [`FAILURE_CODES`] (other codes are not counted here).
    pub(crate) fn failed(&self, code: &str) {
        count_code(&self.failures, &FAILURE_CODES, code);
    }
}

/// Increments the counter of `code` among `codes` (its counters in the same order), if any.
fn count_code(counters: &[Counter], codes: &[&str], code: &str) {
    if let Some(i) = codes.iter().position(|c| *c == code) {
        counters[i].inc();
    }
}

/// One counter per code of `codes` (in that order) in `family`, labelled with `backend`.
fn reason_counters<const N: usize>(
    family: &Family<BackendReasonLabel, Counter>,
    backend: &str,
    codes: [&'static str; N],
) -> [Counter; N] {
    codes.map(|reason| {
        family
            .get_or_create(&BackendReasonLabel {
                backend: backend.to_owned(),
                reason,
            })
            .clone()
    })
}

/// One series per status class of `responses` and the `latency` series of one label set.
fn request_stats<C, L>(
    responses: &Family<C, Counter>,
    class_label: impl Fn(&'static str) -> C,
    latency: &LatencyFamily<L>,
    latency_label: &L,
) -> RequestStats
where
    C: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug,
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug,
{
    RequestStats {
        responses: CLASSES.map(|class| responses.get_or_create(&class_label(class)).clone()),
        latency: latency.get_or_create(latency_label).clone(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendHealthLabel {
    pub(crate) backend: String,
    /// `healthy`, `ejected` or `unhealthy`.
    pub(crate) health: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FileLabel {
    pub(crate) file: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendDirectionLabel {
    pub(crate) backend: String,
    /// `upstream` (client → Backend) or `downstream`.
    pub(crate) direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendReasonLabel {
    pub(crate) backend: String,
    pub(crate) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendToolLabel {
    pub(crate) backend: String,
    pub(crate) tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ActionLabel {
    pub(crate) action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClientPolicyLabel {
    /// `namespace/name` of the EgressPolicy, or `clientPolicy.default`.
    pub(crate) policy: String,
    /// `client_denied` or `would_deny`.
    pub(crate) decision: &'static str,
    /// The client's identity (SPIFFE ID, `CN=…`, `user …`) or address; capped.
    pub(crate) client: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HostLabel {
    pub(crate) host: String,
}

/// How many distinct values a label taken from traffic (MCP tool names, blocked hosts) may
/// have; later ones count as `other`, so clients cannot grow the label set without bound.
pub(crate) const TRAFFIC_LABELS: usize = 256;

/// The longest value a traffic-derived label may have: a host name's longest (253 bytes);
/// tool names are far shorter in practice (MCP suggests at most 128).
pub(crate) const MAX_TRAFFIC_LABEL_BYTES: usize = 253;

/// The values a traffic-derived label has taken so far (at most [`TRAFFIC_LABELS`]).
#[derive(Debug, Default)]
struct CappedLabel(std::sync::Mutex<std::collections::HashSet<String>>);

impl CappedLabel {
    /// `value` itself while there is room (or it already has a series), else `other`; a
    /// value longer than [`MAX_TRAFFIC_LABEL_BYTES`] is `other` too, so the set is bounded in
    /// bytes as well as in entries.
    fn label(&self, value: &str) -> String {
        if value.len() > MAX_TRAFFIC_LABEL_BYTES {
            return "other".to_owned();
        }
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(value) || seen.len() < TRAFFIC_LABELS {
            seen.insert(value.to_owned());
            value.to_owned()
        } else {
            "other".to_owned()
        }
    }
}

/// An outlier detection as the metrics count it (from `balance::outlier::Detection`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DetectionEvent {
    pub(crate) reason: &'static str,
    pub(crate) verdict: &'static str,
    /// Whether the endpoint was ejected (`egressd_outlier_ejections_total`).
    pub(crate) ejected: bool,
}

/// `egressd_health_checks_total{backend,result}` for one Backend, resolved once per checker.
#[derive(Clone, Debug, Default)]
pub(crate) struct CheckCounters {
    pub(crate) pass: Counter,
    pub(crate) fail: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DetectionLabel {
    pub(crate) backend: String,
    pub(crate) reason: &'static str,
    /// `ejected`, `not_enforced`, `over_max_ejection_percent`, `already_ejected`.
    pub(crate) verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BackendResultLabel {
    pub(crate) backend: String,
    /// `pass` or `fail`.
    pub(crate) result: &'static str,
}

/// Every metric egressd exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    build_info: Family<BuildLabel, Gauge>,
    pub(crate) reloads: Family<ResultLabel, Counter>,
    pub(crate) generation: Gauge,
    pub(crate) last_reload_success: Gauge,
    pub requests: Counter,
    pub(crate) local_replies: Family<CodeLabel, Counter>,
    pub(crate) downstream_connections: Gauge,
    /// Client connections closed at accept, by reason (`max_connections`,
    /// `admin_max_connections`).
    pub(crate) downstream_connections_refused: Family<ReasonLabel, Counter>,
    /// Failed `accept` calls (e.g. out of file descriptors).
    pub(crate) downstream_accept_errors: Counter,
    /// Client connections closed by egressd's timers, by reason (`header_read_timeout`,
    /// `idle_timeout`).
    pub(crate) downstream_connection_timeouts: Family<ReasonLabel, Counter>,
    /// Responses cut because the client did not read them, by the limit that ran out
    /// (`listener::sending`).
    pub(crate) downstream_send_timeouts: Family<ReasonLabel, Counter>,
    pub(crate) access_log_dropped: Counter,
    pub(crate) upstream_tls_failures: Family<CauseLabel, Counter>,
    pub(crate) insecure_upstreams: Gauge,
    pub(crate) downstream_tls_handshake_failures: Counter,
    /// Intercepted tunnels whose TLS handshake with the client failed, by reason
    /// ([`INTERCEPTION_HANDSHAKE_FAILURES`]).
    pub(crate) interception_handshake_failures: Family<ReasonLabel, Counter>,
    /// CONNECT tunnels served as HTTP (intercepted TLS, or plaintext), by `tls`.
    pub(crate) intercepted_tunnels: Family<TlsLabel, Counter>,
    /// Read off the serving config's interceptor at each scrape: hosts whose certificates are
    /// cached, and certificates made since start.
    pub(crate) interception_leaves_cached: Gauge,
    pub(crate) interception_leaves_minted: Counter,
    pub(crate) tls_passthrough_rejected: Family<CauseLabel, Counter>,
    /// Rate limit decisions by policy, rule and decision (`allowed`, `limited`,
    /// `would_limit`): labels from the config, never from distinct values.
    pub(crate) ratelimit_decisions: Family<RateLimitLabel, Counter>,
    /// Decisions Redis could not make, by reason (`unavailable`, `timeout`, `auth`, `other`).
    pub(crate) ratelimit_redis_errors: Family<ReasonLabel, Counter>,
    /// Read off the serving config at each scrape, per `Distinct` local rule (its scopes
    /// summed): counters held, and counters forgotten while they still counted something.
    pub(crate) ratelimit_distinct_values: Family<PolicyRuleLabel, Gauge>,
    pub(crate) ratelimit_distinct_evictions: Family<PolicyRuleLabel, Gauge>,
    /// Requests let through (`Open`) or refused (`Closed`) because Redis could not decide.
    pub(crate) ratelimit_failure_mode: Family<ActionLabel, Counter>,
    pub(crate) websockets_active: Family<BackendLabel, Gauge>,
    pub(crate) websocket_bytes: Family<BackendDirectionLabel, Counter>,
    pub(crate) outlier_ejections: Family<BackendReasonLabel, Counter>,
    pub(crate) outlier_detections: Family<DetectionLabel, Counter>,
    pub(crate) overflows: Family<BackendReasonLabel, Counter>,
    /// MCP requests by Backend and JSON-RPC method (`reason` holds the method label).
    pub(crate) mcp_requests: Family<BackendReasonLabel, Counter>,
    pub(crate) mcp_tools_denied: Family<BackendLabel, Counter>,
    pub(crate) mcp_tool_calls: Family<BackendToolLabel, Counter>,
    mcp_tool_names: CappedLabel,
    pub(crate) blocked: Family<HostLabel, Counter>,
    blocked_hosts: CappedLabel,
    pub(crate) audited: Family<HostLabel, Counter>,
    audited_hosts: CappedLabel,
    pub(crate) client_policy: Family<ClientPolicyLabel, Counter>,
    policy_clients: CappedLabel,
    /// Read off the serving snapshot when `/metrics` is scraped (see `admin`): nothing on
    /// the hot path.
    pub(crate) downstream_responses: Family<ListenerClassLabel, Counter>,
    pub(crate) downstream_latency: LatencyFamily<ListenerLabel>,
    pub(crate) route_responses: Family<RouteClassLabel, Counter>,
    pub(crate) route_latency: LatencyFamily<RouteLabel>,
    pub(crate) upstream_responses: Family<BackendClassLabel, Counter>,
    pub(crate) upstream_latency: LatencyFamily<BackendLabel>,
    /// Upstream connections that could not be made, by Backend and error code.
    pub(crate) upstream_connect_failures: Family<BackendReasonLabel, Counter>,
    /// Attempts that failed after connecting (reset, timeout, not HTTP), by Backend and code.
    pub(crate) upstream_failures: Family<BackendReasonLabel, Counter>,
    pub(crate) upstream_requests_active: Family<BackendLabel, Gauge>,
    pub(crate) upstream_connections_open: Family<BackendLabel, Gauge>,
    pub(crate) upstream_connections_opened: Family<BackendLabel, Gauge>,
    pub(crate) upstream_endpoints: Family<BackendHealthLabel, Gauge>,
    pub(crate) certificate_expiry: Family<FileLabel, Gauge>,
    /// Undeclared destinations kept now (`undeclaredDestinations.maxDestinations` bounds it).
    pub(crate) undeclared_destinations: Gauge,
    /// Bytes of bodies egressd holds whole now (`bufferedBodies.budget` bounds them).
    pub(crate) buffered_body_bytes: Gauge,
    /// Bodies the buffer budget had no room for, by what happened to them.
    pub(crate) buffered_body_overflows: Family<ActionLabel, Counter>,
    pub(crate) retries: Family<BackendLabel, Counter>,
    pub(crate) health_checks: Family<BackendResultLabel, Counter>,
    /// Counted by the DNS refreshers (the state registry holds clones).
    pub(crate) dns: DnsStats,
}

/// What DNS resolution counts: kept by the state registry, whose refreshers run apart from
/// any request (clones of one set of handles, registered with the rest).
#[derive(Clone, Debug, Default)]
pub(crate) struct DnsStats {
    /// DNS refreshers running: one per FQDN Backend port, wildcard Backend host and
    /// undeclared destination kept.
    pub(crate) refreshers: Gauge,
    /// Answers cut to a limit, by Backend and the limit (`max_addresses_per_answer`,
    /// `max_endpoints`).
    pub(crate) truncated: Family<BackendReasonLabel, Counter>,
    /// Lookups of names clients chose over `dns.maxLookupsPerSecond`, by what became of them:
    /// `refused` (a new name: 503 `dns_rate_limited`), `delayed` (a refresh: put off).
    pub(crate) rate_limited: Family<ActionLabel, Counter>,
}

impl Metrics {
    /// Counts an inspected `tools/call` of `tool` (labelled `other` once [`TRAFFIC_LABELS`]
    /// names are in use).
    pub(crate) fn mcp_tool_call(&self, backend: &str, tool: &str) {
        self.mcp_tool_calls
            .get_or_create(&BackendToolLabel {
                backend: backend.to_owned(),
                tool: self.mcp_tool_names.label(tool),
            })
            .inc();
    }

    /// The handles for requests on `listener`.
    pub(crate) fn listener_stats(&self, listener: &str) -> RequestStats {
        let name = || listener.to_owned();
        request_stats(
            &self.downstream_responses,
            |class| ListenerClassLabel {
                listener: name(),
                class,
            },
            &self.downstream_latency,
            &ListenerLabel { listener: name() },
        )
    }

    /// The handles for requests matched by route rule `route`.
    pub(crate) fn route_stats(&self, route: &str) -> RequestStats {
        let label = Self::route_label(route);
        let name = || label.clone();
        request_stats(
            &self.route_responses,
            |class| RouteClassLabel {
                route: name(),
                class,
            },
            &self.route_latency,
            &RouteLabel { route: name() },
        )
    }

    /// The handles for requests to `backend`.
    pub(crate) fn backend_stats(&self, backend: &str) -> BackendStats {
        let name = || backend.to_owned();
        BackendStats {
            responses: request_stats(
                &self.upstream_responses,
                |class| BackendClassLabel {
                    backend: name(),
                    class,
                },
                &self.upstream_latency,
                &BackendLabel { backend: name() },
            ),
            retries: self
                .retries
                .get_or_create(&BackendLabel { backend: name() })
                .clone(),
            connect_failures: reason_counters(
                &self.upstream_connect_failures,
                backend,
                CONNECT_FAILURE_CODES,
            ),
            failures: reason_counters(&self.upstream_failures, backend, FAILURE_CODES),
        }
    }

    /// Counts a body the buffer budget had no room for (`no_room` or `refused`).
    pub(crate) fn buffered_body_overflow(&self, action: &'static str) {
        self.buffered_body_overflows
            .get_or_create(&ActionLabel { action })
            .inc();
    }

    /// Counts a refused destination (labelled `other` once [`TRAFFIC_LABELS`] hosts are in
    /// use).
    pub(crate) fn blocked(&self, host: &str) {
        self.blocked
            .get_or_create(&HostLabel {
                host: self.blocked_hosts.label(host),
            })
            .inc();
    }

    /// Counts a use of an undeclared destination under `AuditOnly` (hosts capped as for
    /// [`Metrics::blocked`]).
    pub(crate) fn audited(&self, host: &str) {
        self.audited
            .get_or_create(&HostLabel {
                host: self.audited_hosts.label(host),
            })
            .inc();
    }

    /// Counts a client an EgressPolicy refused or would refuse.
    pub(crate) fn client_policy(&self, policy: &str, decision: &'static str, client: &str) {
        self.client_policy
            .get_or_create(&ClientPolicyLabel {
                policy: policy.to_owned(),
                decision,
                client: self.policy_clients.label(client),
            })
            .inc();
    }

    /// Counts a request or retry a circuit breaker turned away (`limit`: the limit's label,
    /// `max_parallel_requests`, ...).
    pub(crate) fn overflow(&self, backend: &str, limit: &'static str) {
        self.overflows
            .get_or_create(&BackendReasonLabel {
                backend: backend.to_owned(),
                reason: limit,
            })
            .inc();
    }

    /// Counts an outlier detection (rare: the label lookups are fine here).
    pub(crate) fn outlier_detection(&self, backend: &str, d: DetectionEvent) {
        self.outlier_detections
            .get_or_create(&DetectionLabel {
                backend: backend.to_owned(),
                reason: d.reason,
                verdict: d.verdict,
            })
            .inc();
        if d.ejected {
            self.outlier_ejections
                .get_or_create(&BackendReasonLabel {
                    backend: backend.to_owned(),
                    reason: d.reason,
                })
                .inc();
        }
    }

    /// The pass and fail counters of one Backend's health checks.
    pub(crate) fn health_check_counters(&self, backend: &str) -> CheckCounters {
        let counter = |result| {
            self.health_checks
                .get_or_create(&BackendResultLabel {
                    backend: backend.to_owned(),
                    result,
                })
                .clone()
        };
        CheckCounters {
            pass: counter("pass"),
            fail: counter("fail"),
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition a scraper whose `Accept` is `accept` asked for, and its content type:
    /// OpenMetrics when it asks for it, else the Prometheus text format.
    pub fn encode_for(&self, accept: Option<&str>) -> (String, &'static str) {
        let openmetrics = self.encode();
        if exposition::wants_openmetrics(accept) {
            (openmetrics, exposition::OPENMETRICS)
        } else {
            (
                exposition::to_prometheus_text(&openmetrics),
                exposition::PROMETHEUS_TEXT,
            )
        }
    }

    /// The label of HTTPRoute rule `name` (`HTTPRoute ns/route rule 2`, as logs show it) in
    /// metrics: `ns/route/rule/2`, without spaces.
    pub(crate) fn route_label(name: &str) -> String {
        let name = name.strip_prefix("HTTPRoute ").unwrap_or(name);
        name.replace(" rule ", "/rule/").replace(' ', "_")
    }
}
