//! Gauges read off the serving config when `/metrics` is scraped: requests in flight and open
//! connections per Backend, endpoints by health, and seconds until each certificate file
//! expires.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::outlier::metric;
use common::proxy::{fqdn_backend, get, ip_backend, preamble, route_to, TestProxy};
use common::tls::TestCa;
use common::upstream::{full, Upstream};
use common::{eventually, poll_within};
use tokio::sync::Semaphore;

#[tokio::test]
async fn in_flight_requests_connections_endpoints_and_certificate_expiry() {
    // Holds every request until a permit is added for it.
    let release = Arc::new(Semaphore::new(0));
    let held = release.clone();
    let upstream = Upstream::start_with(move |_req| {
        let held = held.clone();
        async move {
            held.acquire().await.unwrap().forget();
            http::Response::new(full("done"))
        }
    })
    .await;
    let ca = TestCa::new("metrics CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_pem(dir.path());
    let (cert, key) = ca.client_cert("egressd").write(dir.path(), "client");
    let mutual = format!(
        "  tls:\n    mode: Mutual\n    validation:\n      caCertificateFiles: [\"{}\"]\n    clientCertificate:\n      certificateFile: \"{}\"\n      privateKeyFile: \"{}\"\n",
        ca_file.display(),
        cert.display(),
        key.display()
    );
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_to("app.test", "app")
        + &fqdn_backend("secure", "secure.test", &[443], "")
            .replace("  tls:\n    mode: InsecureDisable\n", &mutual);
    assert!(yaml.contains("mode: Mutual"), "{yaml}");
    let proxy = TestProxy::start(&yaml).await;

    let requests: Vec<_> = (0..2)
        .map(|_| {
            let addr = proxy.http();
            tokio::spawn(async move { get(addr, "app.test", "/").await })
        })
        .collect();
    let active = r#"egressd_upstream_requests_active{backend="default/app"}"#;
    assert!(
        poll_within(Duration::from_secs(5), || async {
            metric(&proxy, active).await == 2.0
        })
        .await
        .is_some(),
        "{}",
        get(proxy.admin, "localhost", "/metrics").await.text()
    );
    let open = metric(
        &proxy,
        r#"egressd_upstream_connections_open{backend="default/app"}"#,
    )
    .await;
    assert_eq!(open, 2.0, "two HTTP/1.1 connections carry the two requests");
    assert_eq!(
        metric(
            &proxy,
            r#"egressd_upstream_connections_opened{backend="default/app"}"#
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(
            &proxy,
            r#"egressd_upstream_endpoints{backend="default/app",health="healthy"}"#
        )
        .await,
        1.0
    );
    release.add_permits(2);
    for r in requests {
        assert_eq!(r.await.unwrap().status, 200);
    }
    eventually(
        "no upstream request active",
        Duration::from_secs(5),
        || async { metric(&proxy, active).await == 0.0 },
    )
    .await;

    // The client certificate is valid until 2200-01-01 (the test CA's "current" validity).
    let series = format!(
        r#"egressd_certificate_expiry_seconds{{file="{}"}}"#,
        cert.display()
    );
    let left = metric(&proxy, &series).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as f64;
    let until_2200 = 7_258_118_400.0 - now;
    assert!(
        (left - until_2200).abs() < 120.0,
        "{series} = {left}, expected about {until_2200}"
    );
    let key_series = format!(
        r#"egressd_certificate_expiry_seconds{{file="{}"}}"#,
        key.display()
    );
    let text = get(proxy.admin, "localhost", "/metrics").await.text();
    assert!(
        !text.contains(&key_series),
        "a key file has no certificate: {text}"
    );
}

/// Request counters by status class and latency histograms, per listener and per Backend;
/// connect failures by reason; config reloads by result.
#[tokio::test]
async fn request_families_move_with_traffic_errors_and_reloads() {
    let upstream = Upstream::start_with(|req: http::Request<hyper::body::Incoming>| async move {
        let status = if req.uri().path() == "/missing" {
            404
        } else {
            200
        };
        http::Response::builder()
            .status(status)
            .body(full("x"))
            .unwrap()
    })
    .await;
    let closed = common::ports::Refusing::bind();
    let gone = closed.addr;
    let yaml = preamble(None)
        + &ip_backend("app", upstream.addr, "")
        + &route_to("app.test", "app")
        + &ip_backend("gone", gone, "")
        + &route_to("gone.test", "gone");
    let proxy = TestProxy::start(&yaml).await;

    for _ in 0..3 {
        assert_eq!(get(proxy.http(), "app.test", "/").await.status, 200);
    }
    assert_eq!(get(proxy.http(), "app.test", "/missing").await.status, 404);
    assert_eq!(get(proxy.http(), "nowhere.test", "/").await.status, 403);
    assert_eq!(get(proxy.http(), "gone.test", "/").await.status, 503);

    let listener = r#"listener="default/gw/http""#;
    let app = r#"backend="default/app""#;
    for (series, expected) in [
        (format!(r#"egressd_downstream_responses_total{{{listener},class="2xx"}}"#), 3.0),
        (format!(r#"egressd_downstream_responses_total{{{listener},class="4xx"}}"#), 2.0),
        (format!(r#"egressd_downstream_responses_total{{{listener},class="5xx"}}"#), 1.0),
        (format!("egressd_downstream_response_seconds_count{{{listener}}}"), 6.0),
        (format!(r#"egressd_upstream_responses_total{{{app},class="2xx"}}"#), 3.0),
        (format!(r#"egressd_upstream_responses_total{{{app},class="4xx"}}"#), 1.0),
        (format!("egressd_upstream_response_seconds_count{{{app}}}"), 4.0),
        (
            r#"egressd_route_responses_total{route="default/app/rule/0",class="2xx"}"#.to_owned(),
            3.0,
        ),
        (
            r#"egressd_route_response_seconds_count{route="default/app/rule/0"}"#.to_owned(),
            4.0,
        ),
        (
            r#"egressd_upstream_connect_failures_total{backend="default/gone",reason="upstream_connect_failure"}"#.to_owned(),
            1.0,
        ),
    ] {
        assert_eq!(metric(&proxy, &series).await, expected, "{series}");
    }
    let sum = metric(
        &proxy,
        &format!("egressd_upstream_response_seconds_sum{{{app}}}"),
    )
    .await;
    assert!(sum > 0.0 && sum < 5.0, "{sum}");

    let reloads = r#"egressd_config_reloads_total{result="success"}"#;
    let before = metric(&proxy, reloads).await;
    proxy.reload().await;
    assert_eq!(metric(&proxy, reloads).await, before + 1.0);
    proxy.rewrite("kind: Nonsense\n");
    assert!(proxy.egressd().reload().await.is_err());
    assert_eq!(
        metric(&proxy, r#"egressd_config_reloads_total{result="failure"}"#).await,
        1.0
    );
}

/// What a Prometheus user expects of `/metrics`: the Prometheus text format unless the
/// scraper asks for OpenMetrics (by `Accept`, as Prometheus does), the `process_*` metrics and
/// `egressd_build_info`, and the series of fixed label sets at 0 before anything happened.
#[tokio::test]
async fn metrics_speak_both_formats_with_process_metrics_and_known_series_at_zero() {
    let upstream = Upstream::start("app").await;
    let yaml =
        preamble(None) + &ip_backend("app", upstream.addr, "") + &route_to("app.test", "app");
    let proxy = TestProxy::start(&yaml).await;
    assert_eq!(get(proxy.http(), "app.test", "/").await.status, 200);

    let plain = get(proxy.admin, "localhost", "/metrics").await;
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = plain.text();
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE egressd_downstream_requests_total counter\n"),
        "{text}"
    );
    for series in [
        "egressd_config_reloads_total{result=\"failure\"} 0",
        "egressd_downstream_send_timeouts_total{reason=\"send_timeout\"} 0",
        "egressd_downstream_connection_timeouts_total{reason=\"idle_timeout\"} 0",
        "egressd_downstream_connections_refused_total{reason=\"max_connections\"} 0",
        "egressd_upstream_tls_failures_total{cause=\"unknown_ca\"} 0",
        "egressd_buffered_body_overflows_total{action=\"refused\"} 0",
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE process_start_time_seconds gauge",
        &format!(
            "egressd_build_info{{version=\"{}\",commit=",
            env!("CARGO_PKG_VERSION")
        ),
        "egressd_route_responses_total{route=\"default/app/rule/0\",class=\"2xx\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(series)),
            "{series} in:\n{text}"
        );
    }
    // Every HTTP/1.1 test process here has several file descriptors and megabytes resident.
    let fds = common::proxy::sample(&text, "process_open_fds");
    assert!(fds >= 3.0, "{fds}");

    let request = http::Request::get(format!("http://{}/metrics", proxy.admin))
        .header("host", "localhost")
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .body(common::proxy::ClientBody::default())
        .unwrap();
    let om = common::proxy::fetch(proxy.admin, request).await;
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let om = om.text();
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(
        om.contains("# TYPE egressd_downstream_requests counter\n"),
        "{om}"
    );
}
