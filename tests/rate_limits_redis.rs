//! Global rate limits (`rateLimit.global`, docs/rate-limits.md) against a real `redis-server`
//! the tests start on a loopback port (Debian's, installed when missing): two egressd
//! processes sharing one quota, `Distinct` values, Redis killed, frozen and restarted under
//! `failureMode: Open` and `Closed`, TLS with an ACL user, a wrong password, and the worked
//! example of the docs.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use common::binary::Egressd;
use common::dns::TestDns;
use common::proxy::{ip_backend, preamble_with, request, route_to, ClientBody, Conn};
use common::redis::RedisServer;
use common::upstream::Upstream;

/// `ProxyConfig.spec.rateLimit.redis` lines for `redis` with `extra` fields (flow mapping
/// entries), and the listener.
fn head(redis: &str, extra: &str) -> String {
    preamble_with(
        None,
        &format!("  rateLimit:\n    redis: {{address: \"{redis}\"{extra}}}\n"),
    )
}

/// Backend `api` for `upstream` with `rate_limit` inline, routed from `api.test`.
fn limited(upstream: SocketAddr, rate_limit: &str) -> String {
    ip_backend(
        "api",
        upstream,
        &format!("  trafficPolicy:\n    rateLimit: {rate_limit}\n"),
    ) + &route_to("api.test", "api")
}

/// An egressd process on `yaml` (its own config directory) and its listener.
async fn replica(yaml: &str) -> (Egressd, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("egressd.yaml"), yaml).unwrap();
    let egressd = Egressd::spawn_with(dir.path(), &["--no-watch"]).await;
    let listener = egressd.listener_addr("default/gw/http").await;
    (egressd, listener, dir)
}

/// `n` GETs of `api.test` with `headers` over one connection: the statuses.
async fn burst(listener: SocketAddr, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut conn = Conn::open(listener).await;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut req = request("GET", "api.test", "/");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        out.push(
            conn.fetch(req.body(ClientBody::default()).unwrap())
                .await
                .status
                .as_u16(),
        );
    }
    out
}

/// Waits, when Redis's clock is within `need` of the end of a `period` window, for the next
/// window to start: a test that counts a window's quota must not straddle two (the previous
/// window's count would weigh less as the new one goes on). Waiting for time to pass, not
/// for another task.
async fn fresh_window(redis: &RedisServer, period: Duration, need: Duration) {
    let time = redis.command(&["TIME"]);
    let mut parts = time.split_whitespace();
    let secs: u64 = parts.next().unwrap().parse().unwrap();
    let micros: u64 = parts.next().unwrap().parse().unwrap();
    let now = Duration::from_secs(secs) + Duration::from_micros(micros);
    let into = Duration::from_nanos((now.as_nanos() % period.as_nanos()) as u64);
    let left = period - into;
    if left < need {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_redis_hold_one_limit_together() {
    let redis = RedisServer::start();
    let upstream = Upstream::start("api").await;
    let yaml = head(&redis.address(), "")
        + &limited(
            upstream.addr,
            "{global: {rules: [{name: fifty, limit: {requests: 50, interval: 10s}}]}}",
        );
    let (_a, a, _da) = replica(&yaml).await;
    let (_b, b, _db) = replica(&yaml).await;
    fresh_window(&redis, Duration::from_secs(10), Duration::from_secs(4)).await;
    // Clients hit both at once: 4 connections to each, 50 requests each.
    let tasks: Vec<_> = [a, a, a, a, b, b, b, b]
        .into_iter()
        .map(|listener| tokio::spawn(async move { burst(listener, &[], 50).await }))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let passed = count(&all, 200);
    assert_eq!(passed + count(&all, 429), 400, "only 200s and 429s");
    assert!(
        (48..=52).contains(&passed),
        "50 ± 2 passed through both replicas together: {passed}"
    );
    assert_eq!(upstream.request_count(), passed);
}

#[tokio::test]
async fn a_distinct_header_is_limited_per_value_across_replicas() {
    let redis = RedisServer::start();
    let upstream = Upstream::start("api").await;
    let yaml = head(&redis.address(), "")
        + &limited(
            upstream.addr,
            "{global: {rules: [{clientSelectors: [{headers: [{name: x-team, type: Distinct}]}], limit: {requests: 3, unit: Hour}}]}}",
        );
    let (_a, a, _da) = replica(&yaml).await;
    let (_b, b, _db) = replica(&yaml).await;
    assert_eq!(burst(a, &[("x-team", "red")], 2).await, [200, 200]);
    assert_eq!(burst(b, &[("x-team", "red")], 2).await, [200, 429]);
    assert_eq!(
        burst(b, &[("x-team", "blue")], 4).await,
        [200, 200, 200, 429]
    );
    // Redis holds digests of the values, never the values.
    let keys = redis.command(&["KEYS", "*"]);
    assert!(!keys.contains("red") && !keys.contains("blue"), "{keys}");
    assert!(keys.contains("egressd:rl:"), "{keys}");
}

/// Requests through `listener` for `within`, one connection per task: each one's status and
/// how long it took.
async fn timed_load(listener: SocketAddr, within: Duration) -> Vec<(u16, Duration)> {
    let deadline = Instant::now() + within;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = Conn::open(listener).await;
                let mut out = Vec::new();
                while Instant::now() < deadline {
                    let req = request("GET", "api.test", "/")
                        .body(ClientBody::default())
                        .unwrap();
                    let started = Instant::now();
                    let status = conn.fetch(req).await.status.as_u16();
                    out.push((status, started.elapsed()));
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

const TIMEOUT_MS: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_or_frozen_redis_lets_requests_through_when_open_within_the_timeout() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start("api").await;
    let yaml = head(
        &redis.address(),
        &format!(", timeout: {TIMEOUT_MS}ms, failureMode: Open"),
    ) + &limited(
        upstream.addr,
        "{global: {rules: [{name: three, limit: {requests: 3, unit: Minute}}]}}",
    );
    let (egressd, listener, _d) = replica(&yaml).await;
    assert_eq!(burst(listener, &[], 4).await, [200, 200, 200, 429]);

    let bound = Duration::from_millis(TIMEOUT_MS + 20);
    for (what, stop) in [("frozen", true), ("killed", false)] {
        if stop {
            redis.stop();
        } else {
            redis.kill();
        }
        let load = timed_load(listener, Duration::from_millis(600)).await;
        assert!(load.len() > 8, "{what}: {} requests", load.len());
        assert!(
            load.iter().all(|(s, _)| *s == 200),
            "{what}: Open passes everything: {load:?}"
        );
        let slowest = load.iter().map(|(_, d)| *d).max().unwrap();
        assert!(
            slowest < bound,
            "{what}: the slowest request took {slowest:?} (timeout {TIMEOUT_MS}ms)"
        );
        if stop {
            redis.cont();
        }
    }
    assert!(
        egressd
            .metric("egressd_ratelimit_redis_errors_total{reason=\"timeout\"}")
            .await
            > 0.0
    );
    assert!(
        egressd
            .metric("egressd_ratelimit_failure_mode_total{action=\"passed\"}")
            .await
            > 0.0
    );
    let status = egressd.status().await;
    assert_eq!(status["redis"]["state"], "down", "{}", status["redis"]);

    // Back on the same port, empty: limiting resumes by itself.
    redis.restart();
    let resumed = common::poll_within(Duration::from_secs(10), || async {
        let statuses = burst(listener, &[], 4).await;
        statuses.contains(&429).then_some(statuses)
    })
    .await;
    assert!(resumed.is_some(), "limiting resumed after Redis came back");
    assert_eq!(egressd.status().await["redis"]["state"], "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_redis_refuses_requests_with_503_when_closed() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start("api").await;
    let yaml = head(
        &redis.address(),
        &format!(", timeout: {TIMEOUT_MS}ms, failureMode: Closed"),
    ) + &limited(
        upstream.addr,
        "{global: {rules: [{limit: {requests: 100, unit: Minute}}]}}",
    );
    let (_egressd, listener, _d) = replica(&yaml).await;
    assert_eq!(burst(listener, &[], 2).await, [200, 200]);
    redis.kill();
    let mut conn = Conn::open(listener).await;
    let r = conn
        .fetch(
            request("GET", "api.test", "/")
                .body(ClientBody::default())
                .unwrap(),
        )
        .await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert_eq!(r.error_code(), Some("rate_limit_unavailable"));
    assert_eq!(upstream.request_count(), 2);
    let load = timed_load(listener, Duration::from_millis(300)).await;
    assert!(load.iter().all(|(s, _)| *s == 503), "{load:?}");
    let slowest = load.iter().map(|(_, d)| *d).max().unwrap();
    assert!(
        slowest < Duration::from_millis(TIMEOUT_MS + 20),
        "{slowest:?}"
    );
}

/// A file holding `text`, readable by its owner alone.
fn secret_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[tokio::test]
async fn redis_over_tls_with_an_acl_user_works_and_a_wrong_password_is_a_clear_error() {
    const PASSWORD: &str = "s3cret-limits-pw";
    const WRONG: &str = "not-the-password-x";
    let redis = RedisServer::options()
        .tls()
        .with_acl_user("limits", PASSWORD)
        .start();
    let upstream = Upstream::start("api").await;
    let files = tempfile::tempdir().unwrap();
    let ca = files.path().join("redis-ca.pem");
    std::fs::write(&ca, redis.ca_pem().expect("a TLS server has a CA")).unwrap();
    let config = |password: &Path| {
        head(
            &redis.address(),
            &format!(
                ", tls: {{caCertificateFile: \"{}\", serverName: localhost}}, username: limits, password: {{valueFile: \"{}\"}}",
                ca.display(),
                password.display()
            ),
        ) + &limited(
            upstream.addr,
            "{global: {rules: [{limit: {requests: 2, unit: Minute}}]}}",
        )
    };
    let right = secret_file(files.path(), "right", PASSWORD);
    let (egressd, listener, _d) = replica(&config(&right)).await;
    assert_eq!(burst(listener, &[], 3).await, [200, 200, 429]);
    assert_eq!(egressd.status().await["redis"]["state"], "up");
    drop(egressd);

    let wrong = secret_file(files.path(), "wrong", WRONG);
    let (egressd, _listener, _d) = replica(&config(&wrong)).await;
    let status = common::poll_within(Duration::from_secs(10), || async {
        let status = egressd.status().await;
        (status["redis"]["state"] == "down").then_some(status)
    })
    .await
    .expect("/status says Redis is down");
    let error = status["redis"]["lastError"].as_str().unwrap().to_owned();
    assert!(
        error.contains("WRONGPASS") || error.contains("invalid username-password"),
        "{error}"
    );
    let log = egressd.stderr();
    assert!(
        log.contains("ERROR") && log.contains(&redis.address()) && log.contains("WRONGPASS"),
        "an error at startup naming Redis and its answer: {log}"
    );
    for text in [
        log.as_str(),
        &status.to_string(),
        &String::from_utf8_lossy(&egressd.admin_get("/config").await.unwrap().body),
    ] {
        assert!(
            !text.contains(WRONG) && !text.contains(PASSWORD),
            "a password leaked: {text}"
        );
    }
}

/// The ```yaml rate-limits-gateway block of docs/rate-limits.md.
fn documented_example() -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/rate-limits.md"))
            .expect("docs/rate-limits.md");
    let fence = "```yaml rate-limits-gateway\n";
    let start = doc.find(fence).expect("the example block") + fence.len();
    doc[start..][..doc[start..].find("```").unwrap()].to_owned()
}

/// docs/rate-limits.md's two replicas as written (Redis, listener, DNS and the API moved to
/// loopback): 600 a minute across both, and 100 an hour per team.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_two_replica_example_holds_its_limits() {
    let redis = RedisServer::start();
    let api = Upstream::start("payments").await;
    let dns = TestDns::start().await;
    dns.set("api.payments.test", &[Ipv4Addr::LOCALHOST], 60);
    let example = documented_example();
    let yaml = example
        .replace(
            "address: 127.0.0.1:6379",
            &format!("address: \"{}\"", redis.address()),
        )
        .replace(
            "address: 0.0.0.0\n    port: 15001",
            "address: 127.0.0.1\n    port: 0",
        )
        .replace("number: 80", &format!("number: {}", api.addr.port()))
        .replace(
            "      hostname: api.payments.test",
            "      hostname: api.payments.test\n      allowedAddresses: [127.0.0.0/8]",
        )
        .replace(
            "spec:\n  rateLimit:",
            &format!(
                "spec:\n  dns: {{nameservers: [\"{}\"]}}\n  rateLimit:",
                dns.addr
            ),
        );
    assert_ne!(yaml, example);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut replicas = Vec::new();
    for dir in &dirs {
        std::fs::write(dir.path().join("egressd.yaml"), &yaml).unwrap();
        let egressd = Egressd::spawn_with(dir.path(), &["--no-watch"]).await;
        let listener = egressd.listener_addr("default/gateway/http").await;
        replicas.push((egressd, listener));
    }
    let (a, b) = (replicas[0].1, replicas[1].1);
    fresh_window(&redis, Duration::from_secs(60), Duration::from_secs(15)).await;
    let get = |listener: SocketAddr, team: Option<&'static str>, n: usize| async move {
        let mut conn = Conn::open(listener).await;
        let mut out = Vec::new();
        for _ in 0..n {
            let mut req = request("GET", "api.payments.test", "/");
            if let Some(team) = team {
                req = req.header("x-team", team);
            }
            out.push(
                conn.fetch(req.body(ClientBody::default()).unwrap())
                    .await
                    .status
                    .as_u16(),
            );
        }
        out
    };
    // Team red: 100 an hour, half through each replica.
    assert_eq!(count(&get(a, Some("red"), 50).await, 200), 50);
    assert_eq!(count(&get(b, Some("red"), 50).await, 200), 50);
    assert_eq!(
        get(a, Some("red"), 1).await,
        [429],
        "per team, across replicas"
    );
    // 500 more without a team: 600 in the minute, then the 601st is refused.
    assert_eq!(count(&get(b, None, 250).await, 200), 250);
    assert_eq!(count(&get(a, None, 250).await, 200), 250);
    assert_eq!(get(b, None, 1).await, [429], "600 a minute across replicas");
    assert_eq!(api.request_count(), 600);
}
