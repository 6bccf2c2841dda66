//! Consistent hashing through the egressd binary against real upstreams on 127.0.0.1,
//! 127.0.0.2 and 127.0.0.3 (one ephemeral port): a user (header or cookie) always reaches the
//! same upstream, different users spread over all of them, and by source IP every request of
//! one client lands on one upstream.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use common::binary::{Egressd, LISTENER};
use common::proxy::{get, get_with_headers, preamble};
use common::upstream::Upstream;

const HOST: &str = "chash.test";
const USERS: usize = 60;
const REPEATS: usize = 4;

/// Three upstreams, named by their last address byte.
async fn upstreams() -> Vec<Upstream> {
    let port = common::ports::shared_port();
    let mut all = Vec::new();
    for last in [1u8, 2, 3] {
        let addr = SocketAddr::new([127, 0, 0, last].into(), port);
        all.push(Upstream::start_on(&last.to_string(), addr).await);
    }
    all
}

/// egressd with one Backend over `upstreams` balanced by `consistent_hash` (a flow mapping).
async fn start(upstreams: &[Upstream], consistent_hash: &str) -> (tempfile::TempDir, Egressd) {
    let endpoints: String = upstreams
        .iter()
        .map(|u| format!("      - {{address: {}}}\n", u.addr.ip()))
        .collect();
    let yaml = preamble(None)
        + &format!(
            "---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: api}}\nspec:\n  destination:\n    type: IP\n    ip:\n      endpoints:\n{endpoints}    ports: [{{number: {port}}}]\n  tls: {{mode: InsecureDisable}}\n  trafficPolicy:\n    loadBalancer:\n      type: ConsistentHash\n      consistentHash: {consistent_hash}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: api}}\nspec:\n  hostnames: [{HOST}]\n  rules: [{{backendRefs: [{{name: api}}]}}]\n",
            port = upstreams[0].addr.port()
        );
    let dir = tempfile::tempdir().expect("config dir");
    std::fs::write(dir.path().join("egressd.yaml"), yaml).expect("write config");
    let egressd = Egressd::spawn(dir.path()).await;
    (dir, egressd)
}

/// Sends `REPEATS` requests per user with `headers(user)`; returns the upstream each user
/// reached, asserting it was the same every time.
async fn upstream_per_user(
    proxy: SocketAddr,
    headers: impl Fn(usize) -> (&'static str, String),
) -> HashMap<usize, String> {
    let mut reached = HashMap::new();
    for user in 0..USERS {
        let (name, value) = headers(user);
        for i in 0..REPEATS {
            let response =
                get_with_headers(proxy, HOST, &format!("/{user}/{i}"), &[(name, &value)]).await;
            assert_eq!(response.status, 200, "{}", response.text());
            let upstream = response.text();
            let first = reached.entry(user).or_insert_with(|| upstream.clone());
            assert_eq!(
                *first, upstream,
                "user {user} ({name}: {value}) moved from upstream {first} to {upstream}"
            );
        }
    }
    reached
}

fn assert_spread(reached: &HashMap<usize, String>) {
    let used: HashSet<&String> = reached.values().collect();
    // 60 users over 3 upstreams: all three are used unless the hash is broken (a miss has
    // probability 3 × (2/3)^60, about 1e-10).
    assert_eq!(used.len(), 3, "users reached only {used:?}");
}

#[tokio::test]
async fn the_same_header_value_always_reaches_the_same_upstream() {
    let ups = upstreams().await;
    let (_dir, egressd) = start(&ups, "{type: Header, header: {name: x-user}}").await;
    let proxy = egressd.listener_addr(LISTENER).await;
    let reached = upstream_per_user(proxy, |u| ("x-user", format!("user-{u}"))).await;
    assert_spread(&reached);
    assert_eq!(
        ups.iter().map(Upstream::request_count).sum::<usize>(),
        USERS * REPEATS
    );

    // Requests without the header are still served (at a random point of the ring).
    for i in 0..10 {
        assert_eq!(
            get(proxy, HOST, &format!("/anonymous/{i}")).await.status,
            200
        );
    }
}

#[tokio::test]
async fn the_same_cookie_always_reaches_the_same_upstream_with_maglev() {
    let ups = upstreams().await;
    let (_dir, egressd) = start(
        &ups,
        "{type: Cookie, cookie: {name: session}, maglev: {tableSize: 65537}}",
    )
    .await;
    let proxy = egressd.listener_addr(LISTENER).await;
    let reached = upstream_per_user(proxy, |u| {
        ("cookie", format!("theme=dark; session=s{u}; a=b"))
    })
    .await;
    assert_spread(&reached);
}

#[tokio::test]
async fn one_client_address_reaches_one_upstream() {
    let ups = upstreams().await;
    let (_dir, egressd) = start(&ups, "{type: SourceIP}").await;
    let proxy = egressd.listener_addr(LISTENER).await;
    // Every request comes from 127.0.0.1, whatever its headers or connection.
    let reached = upstream_per_user(proxy, |u| ("x-user", format!("user-{u}"))).await;
    let used: HashSet<&String> = reached.values().collect();
    assert_eq!(used.len(), 1, "one client reached {used:?}");
}
