//! Gauges read off the serving config when `/metrics` is scraped: requests in flight and open
//! connections per Backend, endpoints by health, and seconds until each certificate file
//! expires.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::outlier::metric;
use common::proxy::{eventually, fqdn_backend, get, ip_backend, preamble, route_to, TestProxy};
use common::tls::TestCa;
use common::upstream::{full, Upstream};
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
        eventually(Duration::from_secs(5), || async {
            metric(&proxy, active).await == 2.0
        })
        .await,
        "{}",
        get(proxy.admin, "admin", "/metrics").await.text()
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
            r#"egressd_upstream_endpoints{backend="default/app",health="healthy"}"#
        )
        .await,
        1.0
    );
    release.add_permits(2);
    for r in requests {
        assert_eq!(r.await.unwrap().status, 200);
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            metric(&proxy, active).await == 0.0
        })
        .await
    );

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
    let text = get(proxy.admin, "admin", "/metrics").await.text();
    assert!(
        !text.contains(&key_series),
        "a key file has no certificate: {text}"
    );
}
