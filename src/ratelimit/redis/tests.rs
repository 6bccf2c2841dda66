//! The store against a real `redis-server` (tests/common/redis.rs starts one per test).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::connect::split_address;
use super::*;

#[path = "../../../tests/common/redis.rs"]
mod redis_server;

use redis_server::RedisServer;

const PREFIX: &str = "egressd:rl:";
/// How long a test waits for a condition that should come at once or after a reconnect.
const WITHIN: Duration = Duration::from_secs(15);

fn settings(address: String, timeout: Duration) -> RedisSettings {
    RedisSettings {
        address,
        tls: None,
        username: None,
        password: None,
        database: 0,
        key_prefix: PREFIX.to_owned(),
        timeout,
        connections: 2,
    }
}

fn quota(requests: u32, period: Duration) -> Quota {
    Quota { requests, period }
}

fn check(key: &str, quota: Quota) -> GlobalCheck<'_> {
    GlobalCheck { key, quota }
}

/// Polls `attempt` until it returns `Some`, for at most [`WITHIN`].
async fn poll<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `store` decides (on a key no test counts).
async fn until_up(store: &GlobalStore) {
    let probe = quota(1_000_000, Duration::from_secs(1));
    poll("the store decides", || async {
        store.acquire(&[check("{probe}", probe)]).await.ok()
    })
    .await;
}

/// Redis's clock, in milliseconds.
fn server_ms(server: &RedisServer) -> u64 {
    let time = server.command(&["TIME"]);
    let (secs, micros) = time.split_once('\n').expect("TIME: two values");
    secs.parse::<u64>().expect("seconds") * 1000 + micros.parse::<u64>().expect("micros") / 1000
}

/// Returns once at least `margin` is left of the current window of `period` on Redis's clock
/// (waiting for the next window when not: time has to pass, nothing else is awaited).
async fn fresh_window(server: &RedisServer, period: Duration, margin: Duration) {
    let p = u64::try_from(period.as_millis()).expect("period");
    let left = p - server_ms(server) % p;
    if left < u64::try_from(margin.as_millis()).expect("margin") {
        tokio::time::sleep(Duration::from_millis(left + 5)).await;
    }
}

/// The count of `key`'s windows in Redis, all windows together.
fn stored_count(server: &RedisServer, key: &str) -> u64 {
    let keys = server.command(&["KEYS", &format!("{PREFIX}{key}:*")]);
    keys.lines()
        .filter(|k| !k.is_empty())
        .map(|k| server.command(&["GET", k]).parse::<u64>().expect("a count"))
        .sum()
}

// 1. Two replicas on one Redis share one limit exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit() {
    let server = RedisServer::start();
    let timeout = Duration::from_secs(2);
    let replicas = [
        GlobalStore::start(settings(server.address(), timeout)),
        GlobalStore::start(settings(server.address(), timeout)),
    ];
    for replica in &replicas {
        until_up(replica).await;
    }
    let limit = quota(50, Duration::from_secs(10));
    fresh_window(&server, limit.period, Duration::from_secs(5)).await;

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let store = replicas[i % 2].clone();
        tasks.spawn(async move { store.acquire(&[check("{shared}", limit)]).await });
    }
    let mut allowed = 0;
    while let Some(done) = tasks.join_next().await {
        let decisions = done.expect("task").expect("a decision");
        assert_eq!(decisions.len(), 1);
        allowed += usize::from(decisions[0].allowed);
    }
    assert_eq!(allowed, 50, "allowed of 200 across two replicas, limit 50");
    assert_eq!(stored_count(&server, "{shared}"), 50, "counted in Redis");
}

// 2. One call decides all of a request's rules: one denies, none counts.
#[tokio::test]
async fn a_denying_rule_leaves_the_others_uncounted() {
    let server = RedisServer::start();
    let store = GlobalStore::start(settings(server.address(), Duration::from_secs(2)));
    until_up(&store).await;
    let minute = Duration::from_secs(60);
    let (wide, narrow) = (quota(10, minute), quota(1, minute));
    fresh_window(&server, minute, Duration::from_secs(5)).await;

    let first = store
        .acquire(&[check("{wide}", wide), check("{narrow}", narrow)])
        .await
        .expect("first");
    assert!(first[0].allowed && first[1].allowed, "{first:?}");
    assert_eq!((first[0].remaining, first[1].remaining), (9, 0));

    // The narrow rule first this time: decisions come in the checks' order.
    let second = store
        .acquire(&[check("{narrow}", narrow), check("{wide}", wide)])
        .await
        .expect("second");
    assert!(!second[0].allowed, "narrow denies: {second:?}");
    assert_eq!(second[0].remaining, 0);
    assert!(second[0].reset > Duration::ZERO);
    assert!(second[1].allowed, "wide alone would allow: {second:?}");
    assert_eq!(
        second[1].remaining, 9,
        "wide not counted by a denied request"
    );

    let third = store
        .acquire(&[check("{wide}", wide)])
        .await
        .expect("third");
    assert!(third[0].allowed);
    assert_eq!(
        third[0].remaining, 8,
        "wide counted twice in all: {third:?}"
    );
    assert_eq!(stored_count(&server, "{wide}"), 2);
    assert_eq!(stored_count(&server, "{narrow}"), 1);
}

// Redis forgot the script (SCRIPT FLUSH, a restart, a failover): it is loaded again.
#[tokio::test]
async fn a_forgotten_script_is_loaded_again() {
    let server = RedisServer::start();
    let store = GlobalStore::start(settings(server.address(), Duration::from_secs(2)));
    until_up(&store).await;
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]), "OK");
    let limit = quota(5, Duration::from_secs(60));
    let decided = store
        .acquire(&[check("{f}", limit)])
        .await
        .expect("a decision");
    assert!(decided[0].allowed);
    assert_eq!(
        server.command(&["SCRIPT", "EXISTS", script().get_hash()]),
        "1"
    );
}

/// Calls made by [`load`]'s workers: when each started, how long it took, whether it decided.
#[derive(Clone, Copy, Debug)]
struct Call {
    after_fault: bool,
    took: Duration,
    ok: bool,
}

/// Workers calling `acquire` in a loop until `stop`, recording every call.
fn load(
    store: &Arc<GlobalStore>,
    fault: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
    calls: &Arc<Mutex<Vec<Call>>>,
) -> tokio::task::JoinSet<()> {
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (store, fault, stop, calls) =
            (store.clone(), fault.clone(), stop.clone(), calls.clone());
        workers.spawn(async move {
            let limit = quota(u32::MAX, Duration::from_secs(60));
            while !stop.load(Ordering::Relaxed) {
                let after_fault = fault.load(Ordering::SeqCst);
                let started = Instant::now();
                let ok = store.acquire(&[check("{load}", limit)]).await.is_ok();
                let took = started.elapsed();
                calls.lock().unwrap().push(Call {
                    after_fault,
                    took,
                    ok,
                });
            }
        });
    }
    workers
}

/// Runs [`load`], applies `fault` once 50 calls succeeded, and stops after 200 calls that
/// started after it; every call must end within `timeout` + 20 ms, and every call started
/// after the fault must fail.
async fn decisions_stay_bounded(
    server: RedisServer,
    fault: impl FnOnce(RedisServer) -> RedisServer + Send + 'static,
) -> (RedisServer, Arc<GlobalStore>) {
    let timeout = Duration::from_millis(50);
    let store = GlobalStore::start(settings(server.address(), timeout));
    until_up(&store).await;
    let (faulted, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let calls = Arc::new(Mutex::new(Vec::new()));
    let workers = load(&store, &faulted, &stop, &calls);
    let count = |after: bool| {
        let calls = calls.lock().unwrap();
        calls
            .iter()
            .filter(|c| c.after_fault == after && (after || c.ok))
            .count()
    };
    poll("50 decisions before the fault", || async {
        (count(false) >= 50).then_some(())
    })
    .await;
    let server = tokio::task::spawn_blocking(move || fault(server))
        .await
        .expect("fault");
    faulted.store(true, Ordering::SeqCst);
    poll("200 calls after the fault", || async {
        (count(true) >= 200).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    workers.join_all().await;

    let calls = calls.lock().unwrap().clone();
    let slowest = calls.iter().map(|c| c.took).max().expect("calls");
    let bound = timeout + Duration::from_millis(20);
    assert!(
        slowest < bound,
        "slowest of {} calls: {slowest:?}",
        calls.len()
    );
    let decided_after = calls.iter().filter(|c| c.after_fault && c.ok).count();
    assert_eq!(
        decided_after, 0,
        "calls started after the fault that decided"
    );
    (server, store)
}

// 3a. A killed Redis: every call fails within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_fails_calls_within_the_timeout() {
    decisions_stay_bounded(RedisServer::start(), |mut server| {
        server.kill();
        server
    })
    .await;
}

// 3b. A frozen Redis (SIGSTOP: connections open, no answer): the same; the silent connections
// are given up for new ones (which fail while it is frozen), and decisions resume once it thaws.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_fails_calls_within_the_timeout() {
    let (server, store) = decisions_stay_bounded(RedisServer::start(), |server| {
        server.stop();
        server
    })
    .await;
    poll("a new connection tried", || async {
        let limit = quota(u32::MAX, Duration::from_secs(60));
        let _ = store.acquire(&[check("{load}", limit)]).await;
        (store.health().failed_connects > 0).then_some(())
    })
    .await;
    server.cont();
    until_up(&store).await;
}

// 4. Redis restarted on the same port: the store reconnects by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_reconnects_after_a_restart() {
    let server = RedisServer::start();
    let store = GlobalStore::start(settings(server.address(), Duration::from_millis(200)));
    until_up(&store).await;
    assert_eq!(store.health().state, StoreState::Up);

    let mut server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.kill();
        server
    })
    .await
    .expect("kill");
    let limit = quota(10, Duration::from_secs(60));
    let error = poll("an error once Redis is gone", || async {
        store.acquire(&[check("{k}", limit)]).await.err()
    })
    .await;
    assert_eq!(error.kind(), "unavailable", "{error}");
    assert!(matches!(store.health().state, StoreState::Down { .. }));

    server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .expect("restart");
    let decision = poll("a decision after the restart", || async {
        store.acquire(&[check("{k}", limit)]).await.ok()
    })
    .await;
    assert!(decision[0].allowed);
    assert_eq!(store.health().state, StoreState::Up);
    assert!(store.health().errors.unavailable > 0);
    drop(server);
}

const USER: &str = "egressd-rl";
const PASSWORD: &str = "s3cret-Pa55word";

// 5a. TLS (the test CA, the address's IP or a server name) and an ACL user.
#[tokio::test]
async fn tls_and_an_acl_user() {
    let server = RedisServer::options()
        .tls()
        .with_acl_user(USER, PASSWORD)
        .start();
    let ca = server.ca_pem().expect("CA").as_bytes().to_vec();
    let with = |address: String, server_name: Option<&str>| RedisSettings {
        tls: Some(RedisTls {
            ca_pem: Some(ca.clone()),
            server_name: server_name.map(str::to_owned),
        }),
        username: Some(USER.to_owned()),
        password: Some(PASSWORD.to_owned()),
        database: 3,
        ..settings(address, Duration::from_secs(2))
    };
    for settings in [
        with(server.address(), None),
        with(server.address(), Some("localhost")),
        with(format!("localhost:{}", server.port()), None),
    ] {
        let store = GlobalStore::start(settings.clone());
        until_up(&store).await;
        let decided = store
            .acquire(&[check("{tls}", quota(5, Duration::from_secs(60)))])
            .await
            .expect("a decision over TLS");
        assert!(decided[0].allowed, "{settings:?}");
    }
    // Every counter in database 3.
    let keyspace = server.command(&["INFO", "keyspace"]);
    assert!(keyspace.contains("db3:keys="), "{keyspace}");
    assert!(!keyspace.contains("db0:"), "{keyspace}");

    // Redis's certificate does not chain to the system's roots, nor name another host.
    for tls in [
        RedisTls {
            ca_pem: None,
            server_name: None,
        },
        RedisTls {
            ca_pem: Some(ca.clone()),
            server_name: Some("redis.example".to_owned()),
        },
    ] {
        let store = GlobalStore::start(RedisSettings {
            tls: Some(tls),
            ..with(server.address(), None)
        });
        let error = poll("a certificate error", || async {
            store
                .acquire(&[check("{tls}", quota(5, Duration::from_secs(60)))])
                .await
                .err()
        })
        .await;
        assert_eq!(error.kind(), "other", "{error}");
        assert!(error.to_string().contains("certificate"), "{error}");
    }
}

// 5b. Wrong or missing credentials: Auth with the server's message, in health too; the
// password appears nowhere.
#[tokio::test]
async fn wrong_credentials_are_an_auth_error_with_the_servers_message() {
    let server = RedisServer::options().with_acl_user(USER, PASSWORD).start();
    let wrong = "not-the-Pa55word";
    for (password, code) in [(Some(wrong), "WRONGPASS"), (None, "NOAUTH")] {
        let store = GlobalStore::start(RedisSettings {
            username: Some(USER.to_owned()),
            password: password.map(str::to_owned),
            ..settings(server.address(), Duration::from_millis(500))
        });
        let error = poll("an auth error", || async {
            match store
                .acquire(&[check("{a}", quota(5, Duration::from_secs(60)))])
                .await
            {
                Err(StoreError::Auth(message)) => Some(message),
                _ => None,
            }
        })
        .await;
        assert!(error.starts_with(code), "{error}");
        let StoreState::Down { error: shown, .. } = store.health().state else {
            panic!("health: {:?}", store.health())
        };
        assert!(shown.contains(code), "{shown}");
        assert!(store.health().errors.auth > 0);
        for text in [
            format!("{:?}", store.settings()),
            format!("{store:?}"),
            format!("{shown} {error}"),
        ] {
            assert!(!text.contains(wrong), "password shown: {text}");
        }
    }
    let debug = format!("{:?}", settings(server.address(), Duration::ZERO));
    assert!(debug.contains("password: None"), "{debug}");
}

/// Log lines written while a test runs on this thread.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// 5c. A wrong password is one ERROR line naming the address and the server's message, not
// one per retry. (A current-thread runtime: the connection tasks log on this thread.)
#[tokio::test]
async fn a_wrong_password_is_logged_once() {
    let server = RedisServer::options().with_acl_user(USER, PASSWORD).start();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let store = GlobalStore::start(RedisSettings {
        username: Some(USER.to_owned()),
        password: Some("wrong".to_owned()),
        connections: 3,
        ..settings(server.address(), Duration::from_millis(500))
    });
    poll("five failed connection attempts", || async {
        (store.health().failed_connects >= 5).then_some(())
    })
    .await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).expect("UTF-8 log");
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(errors[0].contains(&server.address()), "{}", errors[0]);
    assert!(errors[0].contains("WRONGPASS"), "{}", errors[0]);
}

// 6a. A denial's reset is when a request is allowed again (1 s windows).
#[tokio::test]
async fn a_request_is_allowed_again_after_the_reset() {
    let server = RedisServer::start();
    let store = GlobalStore::start(settings(server.address(), Duration::from_secs(2)));
    until_up(&store).await;
    let second = quota(2, Duration::from_secs(1));
    fresh_window(&server, second.period, Duration::from_millis(600)).await;
    for _ in 0..2 {
        let allowed = store
            .acquire(&[check("{r}", second)])
            .await
            .expect("allowed");
        assert!(allowed[0].allowed);
    }
    let before = server_ms(&server);
    let denied = store
        .acquire(&[check("{r}", second)])
        .await
        .expect("denied");
    let answered = tokio::time::Instant::now();
    let after = server_ms(&server);
    assert!(!denied[0].allowed);
    // Two counted in this window, none in the one before: the next window at half its length
    // (one of the two still weighs 1/2 there), from whenever in [before, after] it decided.
    let expected = |now: u64| 1000 - now % 1000 + 500;
    let reset = u64::try_from(denied[0].reset.as_millis()).expect("ms");
    if before / 1000 == after / 1000 {
        assert!(
            (expected(after)..=expected(before)).contains(&reset),
            "reset {reset} ms, between {} and {}",
            expected(after),
            expected(before)
        );
    }
    tokio::time::sleep_until(answered + denied[0].reset).await;
    let again = store.acquire(&[check("{r}", second)]).await.expect("again");
    assert!(again[0].allowed, "allowed once the reset passed: {again:?}");
}

/// The decision of one rule as egressd's algorithm defines it, in exact integers: allowed,
/// remaining, reset in ms.
fn reference(limit: u64, cur: u64, prev: u64, e: u64, p: u64) -> (bool, u64, u64) {
    let [limit, cur, prev, e, p] = [limit, cur, prev, e, p].map(i128::from);
    let allows = |cur: i128, prev: i128, t: i128| (cur + 1) * p + prev * (p - t) <= limit * p;
    let floor_left = |cur: i128| (limit * p - prev * (p - e) - cur * p).div_euclid(p);
    let narrow = |v: i128| u64::try_from(v.max(0)).expect("fits");
    if allows(cur, prev, e) {
        return (true, narrow(floor_left(cur + 1)), narrow(p - e));
    }
    // The first t in [from, p] where `ok(t)`, knowing ok(p) holds (monotone in t).
    let first = |from: i128, ok: &dyn Fn(i128) -> bool| {
        let (mut lo, mut hi) = (from, p);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if ok(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    let t = first(e + 1, &|t| allows(cur, prev, t));
    let wait = if t < p {
        t - e
    } else {
        p - e + first(0, &|t| allows(0, cur, t))
    };
    (false, narrow(floor_left(cur)), narrow(wait))
}

/// The script with Redis's clock replaced by the last argument (ms), to test its arithmetic at
/// chosen times.
fn script_at_fixed_time() -> String {
    let source = include_str!("script.lua");
    let clock = "redis.call('TIME')";
    assert!(source.contains(clock));
    source.replace(
        clock,
        "{ math.floor(tonumber(ARGV[#ARGV]) / 1000), (tonumber(ARGV[#ARGV]) % 1000) * 1000 }",
    )
}

/// Redis with the fixed-time script loaded, checking it case by case against [`reference`].
struct FixedTime {
    server: RedisServer,
    sha: String,
    cases: usize,
}

impl FixedTime {
    fn new() -> FixedTime {
        let server = RedisServer::start();
        let sha = server.command(&["SCRIPT", "LOAD", &script_at_fixed_time()]);
        FixedTime {
            server,
            sha,
            cases: 0,
        }
    }

    /// One rule with `cur` counted in the current window and `prev` in the one before, `e` ms
    /// into the window: the script's reply and what it counted equal the reference's.
    fn check(&mut self, limit: u64, cur: u64, prev: u64, e: u64, p: u64) {
        self.cases += 1;
        let w = 1_700_000_000_000 / p;
        let base = format!("{{fixed}}:{}", self.cases);
        let window = |w: u64| format!("{base}:{w}");
        if cur > 0 {
            self.server.command(&["SET", &window(w), &cur.to_string()]);
        }
        if prev > 0 {
            self.server
                .command(&["SET", &window(w - 1), &prev.to_string()]);
        }
        let now = (w * p + e).to_string();
        let (limit_arg, p_arg) = (limit.to_string(), p.to_string());
        let reply = self
            .server
            .command(&["EVALSHA", &self.sha, "1", &base, &limit_arg, &p_arg, &now]);
        let got: Vec<u64> = reply.lines().map(|v| v.parse().expect(&reply)).collect();
        let want = reference(limit, cur, prev, e, p);
        let inputs = format!("limit {limit} cur {cur} prev {prev} e {e} p {p}");
        assert_eq!(got, [u64::from(want.0), want.1, want.2], "{inputs}");
        let counted = self.server.command(&["GET", &window(w)]);
        let counted = counted.parse::<u64>().unwrap_or(0);
        assert_eq!(counted, cur + u64::from(want.0), "counted: {inputs}");
    }
}

// 6b. The script's numbers equal the reference's, exactly, from small limits to u32::MAX per
// day.
#[test]
fn the_script_computes_exactly_what_the_algorithm_says() {
    let mut fixed = FixedTime::new();
    let mut rng = fastrand::Rng::with_seed(33);
    let periods = [1_000, 60_000, 3_600_000, 86_400_000];
    for case in 0..1500 {
        let p: u64 = periods[case % periods.len()];
        let limit: u64 = match case % 5 {
            0 => rng.u64(1..=3),
            1 => rng.u64(1..=100),
            2 => rng.u64(1..=100_000),
            3 => u64::from(u32::MAX) - rng.u64(0..3),
            _ => rng.u64(1..=u64::from(u32::MAX)),
        };
        let prev = if rng.bool() {
            rng.u64(0..=limit)
        } else {
            limit - rng.u64(0..=limit.min(3))
        };
        let cur = if rng.bool() {
            rng.u64(0..=limit)
        } else {
            limit.saturating_sub(prev).saturating_sub(rng.u64(0..3))
        };
        let e = match case % 3 {
            0 => rng.u64(0..p),
            1 => rng.u64(0..p.min(5)),
            _ => p - 1 - rng.u64(0..p.min(5)),
        };
        fixed.check(limit, cur, prev, e, p);
    }
}

/// `a`'s inverse modulo `m` (coprime).
fn inverse(a: u64, m: u64) -> u64 {
    let (mut r0, mut r1, mut t0, mut t1) = (i128::from(m), i128::from(a % m), 0i128, 1i128);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    assert_eq!(r0, 1, "{a} and {m} are coprime");
    u64::try_from(t0.rem_euclid(i128::from(m))).expect("fits")
}

/// A number in `min..max` coprime with a day in ms (2^10 3^3 5^5).
fn coprime_with_a_day(rng: &mut fastrand::Rng, min: u64, max: u64) -> u64 {
    loop {
        let n = rng.u64(min..max);
        if [2, 3, 5].iter().all(|f| !n.is_multiple_of(*f)) {
            return n;
        }
    }
}

// 6c. Where doubles round: products of counts and a day's milliseconds past 2^53, one short of
// a multiple of the divisor, so that x * y / d in doubles lands on the next integer; each of
// the script's three divisions (by the period, by prev, by cur) at such a point.
#[test]
fn the_script_is_exact_where_doubles_round() {
    const DAY: u64 = 86_400_000;
    let max = u64::from(u32::MAX);
    let mut fixed = FixedTime::new();
    let mut rng = fastrand::Rng::with_seed(330);
    for _ in 0..100 {
        // prev * e = k * DAY - 1: floor(prev * e / DAY) is k - 1.
        let e = coprime_with_a_day(&mut rng, DAY / 2, DAY);
        let base = (DAY - 1) * inverse(e, DAY) % DAY;
        let prev = base + DAY * rng.u64(10..(max - base) / DAY);
        let f = u64::try_from(u128::from(prev) * u128::from(e) / u128::from(DAY)).expect("fits");
        // Limits where the request is allowed exactly (left 1) and denied exactly (left 0).
        for left in [1, 0] {
            let cur = rng.u64(0..1000);
            let limit = (cur + prev + left).checked_sub(f).expect("positive");
            if limit <= max {
                fixed.check(limit, cur, prev, e, DAY);
            }
        }

        // room * DAY = k * prev - 1: the first allowed time in this window.
        let prev = coprime_with_a_day(&mut rng, 1 << 31, max);
        let room = (prev - 1) * inverse(DAY % prev, prev) % prev;
        let limit = max;
        let cur = limit - 1 - room;
        fixed.check(limit, cur, prev, rng.u64(0..3), DAY);

        // (limit - 1) * DAY = k * cur - 1, cur over the limit (lowered since): the first allowed
        // time in the next window.
        let cur = coprime_with_a_day(&mut rng, 1 << 31, max);
        let limit = (cur - 1) * inverse(DAY % cur, cur) % cur + 1;
        fixed.check(limit, cur, rng.u64(0..1000), rng.u64(0..DAY), DAY);
    }
}

// The store stops its connections when dropped.
#[tokio::test]
async fn dropping_the_store_closes_its_connections() {
    let server = RedisServer::start();
    let clients = || server.command(&["CLIENT", "LIST"]).lines().count();
    let store = GlobalStore::start(RedisSettings {
        connections: 3,
        ..settings(server.address(), Duration::from_secs(1))
    });
    until_up(&store).await;
    poll("three connections and the harness's", || async {
        (clients() == 4).then_some(())
    })
    .await;
    drop(store);
    poll("only the harness's connection", || async {
        (clients() == 1).then_some(())
    })
    .await;
}

#[test]
fn addresses() {
    assert_eq!(
        split_address("127.0.0.1:6379").unwrap(),
        ("127.0.0.1", 6379)
    );
    assert_eq!(
        split_address("redis.internal:6380").unwrap(),
        ("redis.internal", 6380)
    );
    assert_eq!(split_address("[::1]:6379").unwrap(), ("::1", 6379));
    for bad in [
        "redis",
        "::1:6379",
        ":6379",
        "[::1]",
        "host:port",
        "host:70000",
    ] {
        assert!(split_address(bad).is_err(), "{bad}");
    }
}

// Not a check: how long one decision takes on loopback (`cargo test --lib
// ratelimit::redis::tests::round_trip -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement"]
async fn round_trip() {
    let server = RedisServer::start();
    let store = GlobalStore::start(settings(server.address(), Duration::from_secs(1)));
    until_up(&store).await;
    for rules in [1usize, 3] {
        let keys: Vec<String> = (0..rules).map(|i| format!("{{rt}}:{i}")).collect();
        let checks: Vec<GlobalCheck<'_>> = keys
            .iter()
            .map(|k| check(k, quota(u32::MAX, Duration::from_secs(60))))
            .collect();
        let mut took = Vec::new();
        for _ in 0..5000 {
            let started = Instant::now();
            store.acquire(&checks).await.expect("decision");
            took.push(started.elapsed());
        }
        took.sort();
        let mean = took.iter().sum::<Duration>() / 5000;
        eprintln!(
            "{rules} rule(s): mean {} µs, p50 {} µs, p99 {} µs",
            mean.as_micros(),
            took[2500].as_micros(),
            took[4950].as_micros()
        );
    }
    // Concurrent: 64 tasks at once.
    let started = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (store, done) = (store.clone(), done.clone());
        tasks.spawn(async move {
            for _ in 0..500 {
                store
                    .acquire(&[check("{rt}", quota(u32::MAX, Duration::from_secs(60)))])
                    .await
                    .expect("decision");
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tasks.join_all().await;
    let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    eprintln!("64 concurrent tasks: {rate:.0} decisions/s");
}
