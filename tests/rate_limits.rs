//! Local rate limits (`rateLimit.local`, docs/rate-limits.md): the quota a rule lets through,
//! the 429 clients get past it (with `Retry-After` and the IETF `RateLimit` fields), selectors
//! (`Distinct` headers and client identities, methods, paths), `mode: Report`, policies
//! attached to a Gateway per route or `shared`, counters kept across a reload, and exactness
//! with four workers. Upstreams are real servers on loopback.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::binary::Egressd;
use common::proxy::{
    collect, get_with_headers, ip_backend, json_lines, preamble_with, request, route_to,
    ClientBody, TestProxy,
};
use common::tls::{provider, San, TestCa};
use common::upstream::Upstream;
use http::StatusCode;
use hyper_util::rt::TokioIo;

/// An IP Backend `name` for `addr` whose inline policy has `rate_limit` (a YAML flow mapping).
fn limited_backend(name: &str, addr: SocketAddr, rate_limit: &str) -> String {
    ip_backend(
        name,
        addr,
        &format!("  trafficPolicy:\n    rateLimit: {rate_limit}\n"),
    )
}

/// The head of a config with the access log (JSON) in `log`.
fn head_logging(log: &std::path::Path) -> String {
    preamble_with(None, "").replace(
        "  accessLog:\n    enabled: false\n",
        &format!(
            "  accessLog: {{format: JSON, path: \"{}\"}}\n",
            log.display()
        ),
    )
}

async fn get_host(
    proxy: &TestProxy,
    host: &str,
    headers: &[(&str, &str)],
) -> common::proxy::Response {
    get_with_headers(proxy.http(), host, "/", headers).await
}

/// Statuses of `n` GETs of `host` with `headers`, one after the other.
async fn statuses(proxy: &TestProxy, host: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get_host(proxy, host, headers).await.status.as_u16());
    }
    out
}

/// Backend `api` with `rate_limit`, routed from `api.test`, behind an egressd logging JSON to
/// a file: the upstream, the proxy, and the log's path (in the returned directory).
async fn logged_api(
    rate_limit: &str,
) -> (Upstream, TestProxy, std::path::PathBuf, tempfile::TempDir) {
    let upstream = Upstream::start("api").await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let yaml = head_logging(&log)
        + &limited_backend("api", upstream.addr, rate_limit)
        + &route_to("api.test", "api");
    let proxy = TestProxy::start(&yaml).await;
    (upstream, proxy, log, dir)
}

#[tokio::test]
async fn past_its_quota_a_request_gets_429_with_retry_after_and_the_ratelimit_fields() {
    let (upstream, proxy, log, _dir) =
        logged_api("{local: {rules: [{name: per-hour, limit: {requests: 3, unit: Hour}}]}}").await;

    assert_eq!(statuses(&proxy, "api.test", &[], 3).await, [200, 200, 200]);
    let r = get_host(&proxy, "api.test", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(r.error_code(), Some("rate_limited"));
    assert_eq!(
        upstream.request_count(),
        3,
        "the fourth never went upstream"
    );
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    // At most two windows: the rest of this one, and as much of the next as it takes for this
    // window's requests, weighted by their overlap, to leave room.
    assert!((1..=7200).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"per-hour\";q=3;w=3600")
    );
    assert_eq!(
        r.header("ratelimit"),
        Some(format!("\"per-hour\";r=0;t={retry}").as_str())
    );
    assert!(
        r.text().contains("Backend default/api") && r.text().contains("per-hour"),
        "the reply names the policy and rule: {}",
        r.text()
    );
    let series = |decision: &str| {
        format!("egressd_ratelimit_decisions_total{{policy=\"Backend default/api\",rule=\"per-hour\",decision=\"{decision}\"}}")
    };
    assert_eq!(proxy.metric(&series("allowed")), 3.0);
    assert_eq!(proxy.metric(&series("limited")), 1.0);
    let line = common::poll_within(std::time::Duration::from_secs(5), || async {
        json_lines(&log).into_iter().find(|l| l["status"] == 429)
    })
    .await
    .unwrap_or_else(|| panic!("a 429 line: {:?}", json_lines(&log)));
    assert_eq!(line["error"], "rate_limited");
    assert_eq!(line["rate_limit"], "limited Backend default/api/per-hour");
    assert!(json_lines(&log)
        .iter()
        .filter(|l| l["status"] == 200)
        .all(|l| l.get("rate_limit").is_none()));
}

#[tokio::test]
async fn a_distinct_header_gets_a_quota_per_value_and_requests_without_it_are_not_counted() {
    let upstream = Upstream::start("api").await;
    let rule = "{local: {rules: [{clientSelectors: [{headers: [{name: x-team, type: Distinct}]}], limit: {requests: 2, unit: Hour}}]}}";
    let yaml = preamble_with(None, "")
        + &limited_backend("api", upstream.addr, rule)
        + &route_to("api.test", "api");
    let proxy = TestProxy::start(&yaml).await;

    let a = [("x-team", "a")];
    let b = [("x-team", "b")];
    assert_eq!(statuses(&proxy, "api.test", &a, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&proxy, "api.test", &b, 3).await, [200, 200, 429]);
    assert_eq!(
        statuses(&proxy, "api.test", &[], 5).await,
        [200; 5],
        "a request without the header is not one the rule selects"
    );
    let r = get_host(&proxy, "api.test", &a).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"local[0]\";q=2;w=3600")
    );
}

#[tokio::test]
async fn selectors_pick_the_requests_a_rule_counts() {
    let upstream = Upstream::start("api").await;
    // POSTs under /v1/charges, not from the `x-internal: yes` caller: 1 an hour.
    let rule = "{local: {rules: [{name: charges, clientSelectors: [{methods: [{value: POST}], path: {value: /v1/charges}, headers: [{name: x-internal, value: \"yes\", invert: true}], sourceCIDR: {value: 127.0.0.0/8}}], limit: {requests: 1, unit: Minute}}]}}";
    let yaml = preamble_with(None, "")
        + &limited_backend("api", upstream.addr, rule)
        + &route_to("api.test", "api");
    let proxy = TestProxy::start(&yaml).await;
    let send = |method: &'static str, path: &'static str, internal: bool| {
        let addr = proxy.http();
        async move {
            let mut req = request(method, "api.test", path);
            if internal {
                req = req.header("x-internal", "yes");
            }
            common::proxy::fetch(addr, req.body(ClientBody::default()).unwrap())
                .await
                .status
                .as_u16()
        }
    };
    assert_eq!(send("POST", "/v1/charges/1", false).await, 200);
    assert_eq!(send("POST", "/v1/charges", false).await, 429);
    assert_eq!(
        send("GET", "/v1/charges", false).await,
        200,
        "GET is not selected"
    );
    assert_eq!(
        send("POST", "/v1/chargesx", false).await,
        200,
        "a path element prefix"
    );
    assert_eq!(send("POST", "/v1/refunds", false).await, 200);
    assert_eq!(
        send("POST", "/v1/charges", true).await,
        200,
        "inverted header"
    );
}

#[tokio::test]
async fn in_report_mode_requests_over_the_limit_pass_and_are_recorded() {
    let (upstream, proxy, log, _dir) = logged_api(
        "{mode: Report, local: {rules: [{name: trial, limit: {requests: 1, unit: Hour}}]}}",
    )
    .await;

    assert_eq!(statuses(&proxy, "api.test", &[], 3).await, [200, 200, 200]);
    assert_eq!(upstream.request_count(), 3);
    let series = "egressd_ratelimit_decisions_total{policy=\"Backend default/api\",rule=\"trial\",decision=\"would_limit\"}";
    assert_eq!(proxy.metric(series), 2.0);
    let lines = common::poll_within(std::time::Duration::from_secs(5), || async {
        let lines: Vec<_> = json_lines(&log)
            .into_iter()
            .filter(|l| l["rate_limit"] == "would_limit Backend default/api/trial")
            .collect();
        (lines.len() == 2).then_some(lines)
    })
    .await
    .unwrap_or_else(|| panic!("two would_limit lines: {:?}", json_lines(&log)));
    assert!(lines
        .iter()
        .all(|l| l["status"] == 200 && l.get("error").is_none()));
}

/// A BackendTrafficPolicy on the Gateway with two routes to one Backend: counters per route,
/// unless the rule is `shared`.
fn gateway_policy(shared: bool) -> String {
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {{name: gw-limits}}\nspec:\n  targetRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, name: gw}}]\n  rateLimit: {{local: {{rules: [{{name: two, shared: {shared}, limit: {{requests: 2, unit: Hour}}}}]}}}}\n"
    )
}

#[tokio::test]
async fn a_gateway_policy_counts_per_route_unless_its_rule_is_shared() {
    for shared in [false, true] {
        let upstream = Upstream::start("api").await;
        let yaml = preamble_with(None, "")
            + &ip_backend("api", upstream.addr, "")
            + &route_to("a.test", "api")
                .replace("metadata: {name: api}", "metadata: {name: route-a}")
            + &route_to("b.test", "api")
                .replace("metadata: {name: api}", "metadata: {name: route-b}")
            + &gateway_policy(shared);
        let proxy = TestProxy::start(&yaml).await;
        let a = statuses(&proxy, "a.test", &[], 3).await;
        let b = statuses(&proxy, "b.test", &[], 3).await;
        if shared {
            assert_eq!((a, b), (vec![200, 200, 429], vec![429, 429, 429]), "shared");
        } else {
            assert_eq!(
                (a, b),
                (vec![200, 200, 429], vec![200, 200, 429]),
                "per route"
            );
        }
    }
}

/// A policy on one HTTPRoute outranks the Gateway's for that route's requests (the usual
/// precedence); the other route keeps the Gateway's.
#[tokio::test]
async fn a_route_policy_outranks_the_gateways() {
    let upstream = Upstream::start("api").await;
    let route_policy = "---\napiVersion: egressd.dev/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: route-a-limits}\nspec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: route-a}]\n  rateLimit: {local: {rules: [{name: one, limit: {requests: 1, unit: Hour}}]}}\n";
    let yaml = preamble_with(None, "")
        + &ip_backend("api", upstream.addr, "")
        + &route_to("a.test", "api").replace("metadata: {name: api}", "metadata: {name: route-a}")
        + &route_to("b.test", "api").replace("metadata: {name: api}", "metadata: {name: route-b}")
        + &gateway_policy(false)
        + route_policy;
    let proxy = TestProxy::start(&yaml).await;
    assert_eq!(statuses(&proxy, "a.test", &[], 3).await, [200, 429, 429]);
    assert_eq!(statuses(&proxy, "b.test", &[], 3).await, [200, 200, 429]);
    let r = get_host(&proxy, "a.test", &[]).await;
    assert!(r.text().contains("default/route-a-limits"), "{}", r.text());
}

#[tokio::test]
async fn a_reload_keeps_what_the_counters_counted() {
    let upstream = Upstream::start("api").await;
    let other = Upstream::start("other").await;
    let rule = "{local: {rules: [{name: two, limit: {requests: 2, unit: Hour}}]}}";
    let yaml = preamble_with(None, "")
        + &limited_backend("api", upstream.addr, rule)
        + &route_to("api.test", "api");
    let proxy = TestProxy::start(&yaml).await;
    assert_eq!(statuses(&proxy, "api.test", &[], 2).await, [200, 200]);

    // An unrelated change: a new Backend and route.
    proxy.rewrite(
        &(yaml.clone() + &ip_backend("other", other.addr, "") + &route_to("other.test", "other")),
    );
    let generation = proxy.generation();
    assert!(proxy.reload().await > generation);
    assert_eq!(statuses(&proxy, "other.test", &[], 1).await, [200]);
    assert_eq!(
        statuses(&proxy, "api.test", &[], 1).await,
        [429],
        "the quota used before the reload stays used"
    );
}

/// An HTTPS listener requiring client certificates, and the `pay` Backend limited to 2 an
/// hour per client identity: counted in this process, and in Redis.
#[tokio::test]
async fn a_distinct_client_identity_gets_its_own_quota() {
    for counts in ["local", "global"] {
        let redis = common::redis::RedisServer::start();
        identity_quota(counts, &redis.address()).await;
    }
}

async fn identity_quota(counts: &str, redis: &str) {
    let upstream = Upstream::start("pay").await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mesh");
    let server = ca.server_cert(&[San::dns("egress.test")]);
    let (cert, key) = server.write(dir.path(), "server");
    let ca_file = ca.write_pem(dir.path());
    let tls = format!(
        "    protocol: HTTPS\n    tls:\n      certificateFiles: [{{certificateFile: {}, privateKeyFile: {}}}]\n      frontendValidation: {{caCertificateFiles: [{}], mode: Require}}\n",
        cert.display(),
        key.display(),
        ca_file.display()
    );
    let rule = format!("{{{counts}: {{rules: [{{name: per-workload, clientSelectors: [{{clients: {{type: Distinct, spiffeIds: [\"spiffe://test.example/*\"]}}}}], limit: {{requests: 2, unit: Hour}}}}]}}}}");
    let proxy_spec = format!("  rateLimit: {{redis: {{address: \"{redis}\"}}}}\n");
    let yaml = preamble_with(None, &proxy_spec).replace("    protocol: HTTP\n", &tls)
        + &limited_backend("pay", upstream.addr, &rule)
        + &route_to("pay.test", "pay");
    let proxy = TestProxy::start(&yaml).await;
    let edge = proxy.listener("default/gw/http");
    let client = |spiffe: &str| {
        let cert = ca.client_cert_with("workload", &[San::uri(spiffe)]);
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(ca.root_store())
            .with_client_auth_cert(cert.cert_chain(), cert.private_key())
            .unwrap();
        Arc::new(config)
    };
    let a = client("spiffe://test.example/ns/a/sa/app");
    let b = client("spiffe://test.example/ns/b/sa/app");
    let mut seen = Vec::new();
    for config in [&a, &a, &a, &b, &b, &b] {
        seen.push(tls_get(edge, config.clone(), "pay.test").await);
    }
    assert_eq!(seen, [200, 200, 429, 200, 200, 429], "{counts}");
}

/// `GET /` for `host` over a new TLS connection: the status.
async fn tls_get(addr: SocketAddr, config: Arc<rustls::ClientConfig>, host: &str) -> u16 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect("egress.test".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = request("GET", host, "/")
        .body(ClientBody::default())
        .unwrap();
    collect(sender.send_request(req).await.unwrap())
        .await
        .status
        .as_u16()
}

/// Four workers, 10,000 requests at once over 100 connections, a limit of 1,000 a day:
/// exactly 1,000 pass (the counter is one for the process, not one per worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_four_workers_exactly_the_quota_passes() {
    let upstream = Upstream::start("api").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = preamble_with(None, "")
        + &limited_backend(
            "api",
            upstream.addr,
            "{local: {rules: [{limit: {requests: 1000, unit: Day}}]}}",
        )
        + &route_to("api.test", "api");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let egressd = Egressd::spawn_with(dir.path(), &["--workers", "4"]).await;
    let listener = egressd.listener_addr("default/gw/http").await;
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = common::proxy::Conn::open(listener).await;
                let mut counts = [0usize; 2];
                for _ in 0..100 {
                    let req = request("GET", "api.test", "/")
                        .body(ClientBody::default())
                        .unwrap();
                    match conn.fetch(req).await.status.as_u16() {
                        200 => counts[0] += 1,
                        429 => counts[1] += 1,
                        other => panic!("status {other}"),
                    }
                }
                counts
            })
        })
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        let [a, b] = t.await.unwrap();
        ok += a;
        limited += b;
    }
    assert_eq!((ok, limited), (1000, 9000));
    assert_eq!(upstream.request_count(), 1000);
}

/// `egressd validate` of `yaml` (written as `egressd.yaml`): ok, and the report.
fn validate(yaml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let v = egressd::commands::validate(&[dir.path().to_path_buf()]);
    (v.ok, v.report)
}

#[test]
fn mistakes_in_a_rate_limit_are_errors_at_their_line() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let cases = [
        (
            "{global: {rules: [{limit: {requests: 5, unit: Minute}}]}}",
            "spec.trafficPolicy.rateLimit.global",
            "ProxyConfig.spec.rateLimit.redis is not set",
        ),
        (
            "{local: {rules: [{clientSelectors: [{headers: [{name: x-team, type: Distinct, value: a}]}], limit: {requests: 5, unit: Minute}}]}}",
            "spec.trafficPolicy.rateLimit.local.rules[0].clientSelectors[0].headers[0]",
            "Distinct header match takes neither",
        ),
        (
            "{local: {rules: [{limit: {requests: 0, unit: Minute}}]}}",
            "spec.trafficPolicy.rateLimit.local.rules[0].limit.requests",
            "at least 1",
        ),
        (
            "{local: {rules: [{clientSelectors: [{path: {type: RegularExpression, value: \"/(\"}}], limit: {requests: 5, unit: Minute}}]}}",
            "spec.trafficPolicy.rateLimit.local.rules[0].clientSelectors[0].path.value",
            "invalid regular expression",
        ),
        (
            "{local: {rules: [{clientSelectors: [{clients: {spiffeIds: [\"team-a\"]}}], limit: {requests: 5, unit: Minute}}]}}",
            "spec.trafficPolicy.rateLimit.local.rules[0].clientSelectors[0].clients.spiffeIds[0]",
            "a SPIFFE ID starts with spiffe://",
        ),
        (
            "{local: {rules: [{limit: {requests: 5, unit: Week}}]}}",
            "unit",
            "Week",
        ),
        (
            "{type: Global, local: {rules: [{limit: {requests: 5, unit: Minute}}]}}",
            "spec.trafficPolicy.rateLimit.type",
            "`global` is not set",
        ),
    ];
    for (rate_limit, field, message) in cases {
        let yaml = preamble_with(None, "") + &limited_backend("api", addr, rate_limit);
        let (ok, report) = validate(&yaml);
        assert!(!ok, "{rate_limit}: accepted\n{report}");
        assert!(
            report.contains(field) && report.contains(message) && report.contains("egressd.yaml:"),
            "{rate_limit}: the report names the file, line, field ({field}) and problem ({message}):\n{report}"
        );
    }
    let good = preamble_with(None, "")
        + &limited_backend(
            "api",
            addr,
            "{local: {rules: [{limit: {requests: 5, unit: Minute}}]}}",
        );
    let (ok, report) = validate(&good);
    assert!(ok, "{report}");
}

/// 100,000 distinct values under a `Distinct` rule: the rule keeps at most
/// `maxDistinctValues` counters (forgetting the oldest), and egressd's memory grows by no more
/// than the table's documented bound (plus slack for the allocator). A second rule refuses
/// every request after the first, so that the upstream costs the test nothing: the `Distinct`
/// rule still makes (and gives back) a counter per value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_distinct_values_keep_the_table_within_its_bound() {
    const VALUES: usize = 100_000;
    const CONNECTIONS: usize = 4;
    let upstream = Upstream::start("api").await;
    let dir = tempfile::tempdir().unwrap();
    let rules = "{local: {rules: [{name: per-key, clientSelectors: [{headers: [{name: x-api-key, type: Distinct}]}], limit: {requests: 5, unit: Hour}}, {name: one, limit: {requests: 1, unit: Day}}]}}";
    let yaml = preamble_with(None, "  rateLimit: {maxDistinctValues: 10000}\n")
        + &limited_backend("api", upstream.addr, rules)
        + &route_to("api.test", "api");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let egressd = Egressd::spawn(dir.path()).await;
    let listener = egressd.listener_addr("default/gw/http").await;
    // Warm up (allocator arenas, connection buffers), then measure the growth.
    let statuses = pipelined(listener, 0, 20_000, CONNECTIONS).await;
    assert_eq!(
        (statuses[0], statuses[1]),
        (1, 19_999),
        "one passed, the rest refused"
    );
    let before = egressd.rss_kib();
    pipelined(listener, 20_000, VALUES, CONNECTIONS).await;
    let after = egressd.rss_kib();
    let status = egressd.status().await;
    let rule = &status["rateLimits"][0]["rules"][0];
    assert_eq!(rule["name"], "per-key");
    let held = rule["distinctValues"].as_u64().unwrap();
    assert!((1..=10_000).contains(&held), "{rule}");
    let series =
        "egressd_ratelimit_distinct_values{policy=\"Backend default/api\",rule=\"per-key\"}";
    assert_eq!(egressd.metric(series).await, held as f64);
    let bound_kib = rule["maxBytes"].as_u64().unwrap() / 1024;
    assert!(
        after.saturating_sub(before) <= bound_kib + 4 * 1024,
        "RSS grew from {before} KiB to {after} KiB; the table's bound is {bound_kib} KiB"
    );
    assert_eq!(upstream.request_count(), 1);
}

/// Requests for keys `from..to`, each with its own long `x-api-key`, pipelined over
/// `connections` connections (the last request of each closes it): how many got 200 and 429.
async fn pipelined(listener: SocketAddr, from: usize, to: usize, connections: usize) -> [usize; 2] {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            tokio::spawn(async move {
                let keys: Vec<usize> = (from + c..to).step_by(connections).collect();
                let mut stream = tokio::net::TcpStream::connect(listener).await.unwrap();
                let (mut read, mut write) = stream.split();
                let writer = async {
                    let mut batch = Vec::new();
                    for (n, key) in keys.iter().enumerate() {
                        let close = if n + 1 == keys.len() { "Connection: close\r\n" } else { "" };
                        // Long, client-chosen values: the table holds their hashes.
                        batch.extend_from_slice(
                            format!("GET / HTTP/1.1\r\nHost: api.test\r\nx-api-key: {key:08}-{}\r\n{close}\r\n", "k".repeat(200)).as_bytes(),
                        );
                        if batch.len() > 64 * 1024 {
                            write.write_all(&batch).await.unwrap();
                            batch.clear();
                        }
                    }
                    write.write_all(&batch).await.unwrap();
                };
                let mut answers = Vec::new();
                let reader = read.read_to_end(&mut answers);
                let (_, read) = tokio::join!(writer, reader);
                read.unwrap();
                let text = String::from_utf8_lossy(&answers);
                [text.matches("HTTP/1.1 200 ").count(), text.matches("HTTP/1.1 429 ").count()]
            })
        })
        .collect();
    let mut counts = [0; 2];
    for t in tasks {
        let [ok, limited] = t.await.unwrap();
        counts[0] += ok;
        counts[1] += limited;
    }
    assert_eq!(counts[0] + counts[1], to - from, "every request answered");
    counts
}
