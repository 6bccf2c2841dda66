//! Every metric egressd exports, made and registered (name and help) in the order `/metrics`
//! lists them.

use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{
    latency_histogram, ActionLabel, BuildLabel, CauseLabel, Metrics, ReasonLabel, ResultLabel,
    TlsLabel, CONNECTION_REFUSALS, CONNECTION_TIMEOUTS, INTERCEPTION_HANDSHAKE_FAILURES,
    RATELIMIT_REDIS_ERRORS, SEND_TIMEOUTS, UPSTREAM_TLS_CAUSES,
};

impl Default for Metrics {
    /// Every metric made, then registered group by group (the order `/metrics` lists them).
    fn default() -> Self {
        let mut root = Registry::default();
        // Under the prefix: egressd's own; beside it, the `process_*` metrics every client
        // library exports under those names.
        let registry = root.sub_registry_with_prefix("egressd");
        let metrics = Metrics::unregistered();
        metrics.register_config_and_connections(registry);
        metrics.register_tls_websockets_and_outliers(registry);
        metrics.register_mcp_and_destinations(registry);
        metrics.register_responses(registry);
        metrics.register_upstream_state(registry);
        registry.register(
            "build_info",
            "The version of egressd serving and the commit it was built from (always 1)",
            metrics.build_info.clone(),
        );
        root.register_collector(Box::new(super::exposition::ProcessCollector));
        metrics.preset_known_series();
        Metrics {
            registry: root,
            ..metrics
        }
    }
}

impl Metrics {
    /// Every handle made, none registered yet (and an empty registry).
    fn unregistered() -> Self {
        Metrics {
            registry: Registry::default(),
            reloads: Default::default(),
            generation: Default::default(),
            last_reload_success: Default::default(),
            requests: Default::default(),
            local_replies: Default::default(),
            downstream_connections: Default::default(),
            downstream_connections_refused: Default::default(),
            downstream_accept_errors: Default::default(),
            downstream_connection_timeouts: Default::default(),
            downstream_send_timeouts: Default::default(),
            access_log_dropped: Default::default(),
            upstream_tls_failures: Default::default(),
            insecure_upstreams: Default::default(),
            downstream_tls_handshake_failures: Default::default(),
            interception_handshake_failures: Default::default(),
            intercepted_tunnels: Default::default(),
            interception_leaves_cached: Default::default(),
            interception_leaves_minted: Default::default(),
            tls_passthrough_rejected: Default::default(),
            ratelimit_decisions: Default::default(),
            ratelimit_redis_errors: Default::default(),
            ratelimit_failure_mode: Default::default(),
            ratelimit_distinct_values: Default::default(),
            ratelimit_distinct_evictions: Default::default(),
            websockets_active: Default::default(),
            websocket_bytes: Default::default(),
            outlier_ejections: Default::default(),
            outlier_detections: Default::default(),
            overflows: Default::default(),
            mcp_requests: Default::default(),
            mcp_tools_denied: Default::default(),
            mcp_tool_calls: Default::default(),
            mcp_tool_names: Default::default(),
            blocked: Default::default(),
            blocked_hosts: Default::default(),
            audited: Default::default(),
            audited_hosts: Default::default(),
            client_policy: Default::default(),
            policy_clients: Default::default(),
            downstream_responses: Default::default(),
            downstream_latency: Family::new_with_constructor(latency_histogram),
            route_responses: Default::default(),
            route_latency: Family::new_with_constructor(latency_histogram),
            upstream_responses: Default::default(),
            upstream_latency: Family::new_with_constructor(latency_histogram),
            upstream_connect_failures: Default::default(),
            upstream_failures: Default::default(),
            upstream_requests_active: Default::default(),
            upstream_connections_open: Default::default(),
            upstream_connections_opened: Default::default(),
            upstream_endpoints: Default::default(),
            certificate_expiry: Default::default(),
            undeclared_destinations: Default::default(),
            buffered_body_bytes: Default::default(),
            buffered_body_overflows: Default::default(),
            retries: Default::default(),
            health_checks: Default::default(),
            build_info: Default::default(),
            dns: Default::default(),
        }
    }

    /// Every series whose labels come from a fixed set, at 0 (1 for `build_info`) from the
    /// start: a rate or an alert on them works before the first event, and an absent series
    /// means a misspelled query, not "nothing happened yet".
    fn preset_known_series(&self) {
        for result in ["success", "failure"] {
            let _ = self.reloads.get_or_create(&ResultLabel { result });
        }
        for reason in CONNECTION_REFUSALS {
            let _ = self
                .downstream_connections_refused
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in CONNECTION_TIMEOUTS {
            let _ = self
                .downstream_connection_timeouts
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in SEND_TIMEOUTS {
            let _ = self
                .downstream_send_timeouts
                .get_or_create(&ReasonLabel { reason });
        }
        for reason in INTERCEPTION_HANDSHAKE_FAILURES {
            let _ = self
                .interception_handshake_failures
                .get_or_create(&ReasonLabel { reason });
        }
        for tls in ["true", "false"] {
            let _ = self.intercepted_tunnels.get_or_create(&TlsLabel { tls });
        }
        for reason in RATELIMIT_REDIS_ERRORS {
            let _ = self
                .ratelimit_redis_errors
                .get_or_create(&ReasonLabel { reason });
        }
        for action in ["passed", "refused"] {
            let _ = self
                .ratelimit_failure_mode
                .get_or_create(&ActionLabel { action });
        }
        for cause in UPSTREAM_TLS_CAUSES {
            let _ = self
                .upstream_tls_failures
                .get_or_create(&CauseLabel { cause });
        }
        for action in ["no_room", "refused"] {
            let _ = self
                .buffered_body_overflows
                .get_or_create(&ActionLabel { action });
        }
        self.build_info
            .get_or_create(&BuildLabel {
                version: env!("CARGO_PKG_VERSION"),
                commit: option_env!("EGRESSD_BUILD_COMMIT").unwrap_or("unknown"),
            })
            .set(1);
    }

    /// The config's reloads and the client connections.
    fn register_config_and_connections(&self, registry: &mut Registry) {
        registry.register(
            "config_reloads",
            "Config reloads by result (success, failure)",
            self.reloads.clone(),
        );
        registry.register(
            "config_generation",
            "Generation of the config serving now",
            self.generation.clone(),
        );
        registry.register(
            "config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful config load",
            self.last_reload_success.clone(),
        );
        registry.register(
            "downstream_requests",
            "Requests received",
            self.requests.clone(),
        );
        registry.register(
            "local_replies",
            "Replies egressd made itself, by x-egressd-error code",
            self.local_replies.clone(),
        );
        registry.register(
            "downstream_connections_active",
            "Open client connections",
            self.downstream_connections.clone(),
        );
        registry.register("downstream_connections_refused", "Client connections closed as soon as they were accepted, by reason (max_connections, admin_max_connections, admin_idle_evicted: an idle admin connection closed to make room for a probe)", self.downstream_connections_refused.clone());
        registry.register("downstream_accept_errors", "Failed accepts on listeners and the admin port (e.g. out of file descriptors); accepting backs off meanwhile", self.downstream_accept_errors.clone());
        registry.register("downstream_send_timeouts", "Responses (HTTP/1.1 connections, HTTP/2 streams, tunnels and websockets) egressd cut because the client did not read them, by the limit that ran out while bytes waited for the client (send_timeout, request_timeout, stream_idle_timeout)", self.downstream_send_timeouts.clone());
        registry.register("downstream_connection_timeouts", "Client connections egressd closed because a timer ran out, by reason (header_read_timeout: no complete request head, TLS handshake or ClientHello in time; idle_timeout: no request for that long)", self.downstream_connection_timeouts.clone());
        registry.register(
            "access_log_dropped",
            "Access log lines dropped because the writer fell behind",
            self.access_log_dropped.clone(),
        );
    }

    /// TLS failures, websockets, outlier detection and circuit breakers.
    fn register_tls_websockets_and_outliers(&self, registry: &mut Registry) {
        registry.register(
            "upstream_tls_failures",
            "Failed TLS handshakes with upstreams, by cause",
            self.upstream_tls_failures.clone(),
        );
        registry.register("insecure_upstream_ports", "Backend ports of the serving config that send plaintext to a non-loopback destination or skip certificate verification", self.insecure_upstreams.clone());
        registry.register(
            "downstream_tls_handshake_failures",
            "Failed or timed out TLS handshakes with clients on HTTPS listeners",
            self.downstream_tls_handshake_failures.clone(),
        );
        registry.register("interception_handshake_failures", "Intercepted CONNECT tunnels whose TLS handshake with the client failed, by reason (unknown_ca, bad_certificate, certificate_unknown: the client refused egressd's certificate; sni_mismatch: the ClientHello named another host than the CONNECT)", self.interception_handshake_failures.clone());
        registry.register("intercepted_tunnels", "CONNECT tunnels whose requests egressd served through its pipeline, by tls (true: intercepted TLS; false: plaintext HTTP inside the tunnel)", self.intercepted_tunnels.clone());
        registry.register("interception_leaves_cached", "Hosts whose interception certificates egressd keeps (at most tlsInterception.leaf.cacheSize)", self.interception_leaves_cached.clone());
        registry.register(
            "interception_leaves_minted",
            "Interception certificates egressd made (on a blocking thread) since it started",
            self.interception_leaves_minted.clone(),
        );
        registry.register("ratelimit_decisions", "Rate limit decisions by policy, rule and decision (allowed, limited, would_limit: over the limit under mode Report)", self.ratelimit_decisions.clone());
        registry.register("ratelimit_redis_errors", "Global rate limit decisions Redis could not make, by reason (unavailable, timeout, auth, other)", self.ratelimit_redis_errors.clone());
        registry.register("ratelimit_distinct_values", "Counters a Distinct local rate limit rule holds (one per distinct value; at most rateLimit.maxDistinctValues per scope)", self.ratelimit_distinct_values.clone());
        registry.register("ratelimit_distinct_evictions", "Counters of a Distinct local rate limit rule forgotten while they still counted something (the table was full), since the counters were made", self.ratelimit_distinct_evictions.clone());
        registry.register("ratelimit_failure_mode", "Requests Redis could not decide on, by action (passed: failureMode Open; refused: failureMode Closed)", self.ratelimit_failure_mode.clone());
        registry.register("tls_passthrough_rejected", "Connections to TLS Passthrough listeners closed without a tunnel, by cause (not_tls, no_sni, destination_not_allowed, ...)", self.tls_passthrough_rejected.clone());
        registry.register(
            "websockets_active",
            "Open websockets, by Backend",
            self.websockets_active.clone(),
        );
        registry.register(
            "websocket_bytes",
            "Bytes relayed by closed websockets, by Backend and direction",
            self.websocket_bytes.clone(),
        );
        registry.register(
            "outlier_ejections",
            "Endpoints ejected by outlier detection, by Backend and reason",
            self.outlier_ejections.clone(),
        );
        registry.register("outlier_detections", "Outlier detectors that fired, by Backend, reason and what was done (ejected, or why not)", self.outlier_detections.clone());
        registry.register(
            "circuit_breaker_overflows",
            "Requests (or retries) turned away by a circuit breaker, by Backend and limit",
            self.overflows.clone(),
        );
    }

    /// MCP inspection, and the destinations and clients refused or audited.
    fn register_mcp_and_destinations(&self, registry: &mut Registry) {
        registry.register(
            "mcp_requests",
            "MCP requests egressd inspected, by Backend and JSON-RPC method (reason)",
            self.mcp_requests.clone(),
        );
        registry.register(
            "mcp_tool_calls_denied",
            "tools/call requests refused by a Backend's tool policy",
            self.mcp_tools_denied.clone(),
        );
        registry.register("mcp_tool_calls", "tools/call requests egressd inspected, by Backend and tool (the first 256 tool names; later ones as other)", self.mcp_tool_calls.clone());
        registry.register("blocked_requests", "Requests and connections refused because no Backend declares the destination, by host (the first 256 hosts; later ones as other)", self.blocked.clone());
        registry.register("audited_requests", "Requests and connections to undeclared destinations let through by outboundPolicy AuditOnly (what RegistryOnly would refuse), by host (the first 256 hosts; later ones as other)", self.audited.clone());
        registry.register("client_policy_decisions", "Requests and connections an EgressPolicy refused (client_denied) or, in Report mode, would refuse (would_deny), by policy and client (the first 256 clients; later ones as other)", self.client_policy.clone());
    }

    /// Responses and their latency, per listener, HTTPRoute rule and Backend.
    fn register_responses(&self, registry: &mut Registry) {
        registry.register(
            "downstream_responses",
            "Responses to clients by listener and status class (local replies included)",
            self.downstream_responses.clone(),
        );
        registry.register(
            "downstream_response_seconds",
            "From a request's arrival until its response headers went to the client, by listener",
            self.downstream_latency.clone(),
        );
        registry.register(
            "route_responses",
            "Responses to requests an HTTPRoute rule matched, by rule and status class",
            self.route_responses.clone(),
        );
        registry.register(
            "route_response_seconds",
            "From a request's arrival until its response headers, by HTTPRoute rule",
            self.route_latency.clone(),
        );
        registry.register("upstream_responses", "Responses from upstreams by Backend and status class (every attempt, retries included)", self.upstream_responses.clone());
        registry.register("upstream_response_seconds", "From sending a request upstream (connecting included) until its response headers, by Backend", self.upstream_latency.clone());
    }

    /// Upstream failures and state, buffered bodies, retries and health checks.
    fn register_upstream_state(&self, registry: &mut Registry) {
        registry.register("upstream_connect_failures", "Upstream connections that could not be made, by Backend and reason (the x-egressd-error code)", self.upstream_connect_failures.clone());
        registry.register("upstream_failures", "Upstream attempts that failed after connecting, before a response head (reset, timeout, protocol error), by Backend and reason (the x-egressd-error code)", self.upstream_failures.clone());
        registry.register(
            "upstream_requests_active",
            "Requests in flight to each Backend (all ports and endpoints)",
            self.upstream_requests_active.clone(),
        );
        registry.register(
            "upstream_connections_open",
            "Open upstream connections of each Backend (HTTP/1.1 and HTTP/2)",
            self.upstream_connections_open.clone(),
        );
        registry.register("upstream_connections_opened", "Upstream connections opened for traffic since start, per Backend (summed over its current endpoints, so it drops when endpoints leave the config)", self.upstream_connections_opened.clone());
        registry.register(
            "upstream_endpoints",
            "Endpoints of each Backend by health (healthy, ejected, unhealthy)",
            self.upstream_endpoints.clone(),
        );
        registry.register("certificate_expiry_seconds", "Seconds until the first certificate of each certificate file the config uses expires (negative once expired)", self.certificate_expiry.clone());
        registry.register("buffered_body_bytes", "Bytes of bodies egressd holds whole now (MCP inspection, tools/list filtering, retry read-ahead); at most bufferedBodies.budget", self.buffered_body_bytes.clone());
        registry.register("buffered_body_overflows", "Bodies the bufferedBodies budget had no room for: no_room (a declared length that did not fit: streamed on if the request can go without, else 503 overflow), refused (503 overflow part-way)", self.buffered_body_overflows.clone());
        registry.register("undeclared_destinations", "Undeclared destinations (AllowAny, AuditOnly) kept now, each with its pool and DNS refresher; at most undeclaredDestinations.maxDestinations", self.undeclared_destinations.clone());
        registry.register(
            "upstream_retries",
            "Requests sent again by the retry policy, by Backend",
            self.retries.clone(),
        );
        registry.register(
            "health_checks",
            "Active health checks, by Backend and result (pass, fail)",
            self.health_checks.clone(),
        );
        registry.register("dns_refreshers", "DNS refreshers running: one per FQDN Backend port, wildcard Backend host and undeclared destination kept", self.dns.refreshers.clone());
        registry.register("dns_answers_truncated", "DNS answers cut to a limit, by Backend and limit (max_addresses_per_answer: dns.maxAddressesPerAnswer; max_endpoints: the maxEndpoints of a wildcard Backend or of undeclared destinations)", self.dns.truncated.clone());
        registry.register("dns_lookups_rate_limited", "Lookups of names clients chose over dns.maxLookupsPerSecond, by action (refused: a new name, answered 503 dns_rate_limited; delayed: a refresh, put off)", self.dns.rate_limited.clone());
    }
}
