//! `pick()` cost per balancer and endpoint count (criterion).
//!
//!     cargo bench --bench balance
//!
//! Endpoints carry a spread of active requests (0..8), as under load; the weighted variants
//! give every endpoint a different weight, which switches LeastRequest to its EDF schedule.
//! Consistent-hash picks get a different request hash each time (the ring or table is built when
//! the list is prepared, before measuring); `hash_key` measures hashing a request's key.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use egressd::balance::{
    Balancer, ConsistentHash, ConsistentHashSettings, EndpointList, HashKey, HashTable,
    LeastRequest, LeastRequestSettings, Random, RoundRobin,
};
use egressd::upstream::endpoint::ActiveRequest;
use egressd::upstream::pool::H1Pool;
use egressd::upstream::Endpoint;

const SIZES: [usize; 4] = [2, 10, 100, 1000];

/// `n` endpoints, and the in-flight request guards that give them their load.
fn endpoints(n: usize, weighted: bool) -> (Vec<Arc<Endpoint>>, Vec<ActiveRequest>) {
    let list: Vec<Arc<Endpoint>> = (0..n)
        .map(|i| {
            let addr = ([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 443).into();
            let weight = if weighted { 1 + (i % 7) as u32 } else { 1 };
            Arc::new(Endpoint::new(addr, weight, H1Pool::new(Default::default())))
        })
        .collect();
    let held = list
        .iter()
        .enumerate()
        .flat_map(|(i, e)| (0..i % 8).map(|_| e.start_request()).collect::<Vec<_>>())
        .collect();
    (list, held)
}

fn bench_picks(c: &mut Criterion) {
    let balancers: Vec<(&str, bool, Box<dyn Balancer<Endpoint>>)> = vec![
        (
            "LeastRequest/p2c",
            false,
            Box::new(LeastRequest::new(LeastRequestSettings::default())),
        ),
        (
            "LeastRequest/edf",
            true,
            Box::new(LeastRequest::new(LeastRequestSettings::default())),
        ),
        ("RoundRobin/equal", false, Box::new(RoundRobin::new())),
        ("RoundRobin/smooth", true, Box::new(RoundRobin::new())),
        ("Random/equal", false, Box::new(Random)),
        ("Random/weighted", true, Box::new(Random)),
    ];
    for (name, weighted, balancer) in &balancers {
        let mut group = c.benchmark_group(format!("pick/{name}"));
        for n in SIZES {
            let (list, _held) = endpoints(n, *weighted);
            let list = Arc::new(EndpointList::resolved(list));
            // As a group publishes it: prepared before any pick.
            balancer.prepare(&list);
            group.bench_with_input(BenchmarkId::from_parameter(n), &list, |b, list| {
                b.iter(|| black_box(balancer.pick(black_box(list), None)).map(|e| e.weight))
            });
        }
        group.finish();
        // Two threads picking from the same list at once, as two workers do: what one pick
        // costs each of them (a pick that takes a shared lock pays for the cache line moving
        // between cores).
        let mut group = c.benchmark_group(format!("pick_2_threads/{name}"));
        let (list, _held) = endpoints(100, *weighted);
        let list = Arc::new(EndpointList::resolved(list));
        balancer.prepare(&list);
        group.bench_with_input(BenchmarkId::from_parameter(100), &list, |b, list| {
            b.iter_custom(|iters| {
                let start = std::time::Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..2 {
                        s.spawn(|| {
                            for _ in 0..iters {
                                black_box(balancer.pick(black_box(list), None));
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
        group.finish();
    }
}

fn bench_consistent_hash(c: &mut Criterion) {
    let tables = [
        ("RingHash", HashTable::default()),
        ("Maglev", HashTable::Maglev { size: 65537 }),
    ];
    for (name, table) in tables {
        let balancer = ConsistentHash::new(ConsistentHashSettings {
            key: HashKey::SourceIp,
            table,
        });
        let mut group = c.benchmark_group(format!("pick/ConsistentHash/{name}"));
        for n in SIZES {
            let (list, _held) = endpoints(n, false);
            let list = Arc::new(EndpointList::resolved(list));
            // Built here, not in the measurement.
            balancer.prepare(&list);
            let mut hash = 0u64;
            group.bench_with_input(BenchmarkId::from_parameter(n), &list, |b, list| {
                b.iter(|| {
                    // A different point each time (odd constant: visits every u64).
                    hash = hash.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    black_box(balancer.pick(black_box(list), Some(hash))).map(|e| e.weight)
                })
            });
        }
        group.finish();
    }
    // Building for a new endpoint list (done when the list is published).
    let mut group = c.benchmark_group("build/ConsistentHash");
    for n in [10, 100, 1000] {
        let (list, _held) = endpoints(n, false);
        group.bench_with_input(BenchmarkId::new("RingHash", n), &list, |b, list| {
            b.iter(|| egressd::balance::ring_hash::Ring::build(list, 1024, 8 << 20).len())
        });
        group.bench_with_input(BenchmarkId::new("Maglev", n), &list, |b, list| {
            b.iter(|| egressd::balance::maglev::Maglev::build(list, 65537).pick(1))
        });
    }
    group.finish();
    // Hashing the key of a request with a dozen headers.
    let mut headers = http::HeaderMap::new();
    for i in 0..10 {
        headers.insert(
            http::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
            http::HeaderValue::from_static("some value"),
        );
    }
    headers.insert("x-user", http::HeaderValue::from_static("user-1234567"));
    headers.insert(
        http::header::COOKIE,
        http::HeaderValue::from_static("theme=dark; lang=en; session=0123456789abcdef; x=y"),
    );
    let client = std::net::IpAddr::from([10, 1, 2, 3]);
    let mut group = c.benchmark_group("hash_key");
    for (name, key) in [
        (
            "Header",
            HashKey::Header(http::HeaderName::from_static("x-user")),
        ),
        ("Cookie", HashKey::Cookie("session".into())),
        ("SourceIP", HashKey::SourceIp),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| key.hash(black_box(&headers), black_box(client)))
        });
    }
    group.finish();
}

/// Recording a result on the hot path: a success (loads only) and a failure (increments).
fn bench_record(c: &mut Criterion) {
    use egressd::balance::outlier::{Outcome, OutlierSettings};
    let (list, _held) = endpoints(10, false);
    let group = egressd::upstream::EndpointGroup::new_static(
        list.clone(),
        || Box::new(LeastRequest::new(LeastRequestSettings::default())),
        egressd::upstream::group::GroupSettings {
            outlier: OutlierSettings {
                consecutive_gateway_errors: None,
                ..OutlierSettings::default()
            },
            ..Default::default()
        },
    );
    let mut g = c.benchmark_group("record");
    g.bench_function("success", |b| {
        b.iter(|| group.record(black_box(&list[3]), Outcome::Success))
    });
    g.bench_function("gateway_error", |b| {
        b.iter(|| group.record(black_box(&list[3]), Outcome::GatewayError))
    });
    g.finish();
}

/// `EndpointGroup::pick`: the balancer plus the group's pickable levels (one level, and two
/// levels sharing the load 70/30).
fn bench_group_pick(c: &mut Criterion) {
    let mut g = c.benchmark_group("group_pick/LeastRequest");
    let (list, _held) = endpoints(100, false);
    let one = egressd::upstream::EndpointGroup::new_static(
        list,
        || Box::new(LeastRequest::new(LeastRequestSettings::default())),
        egressd::upstream::GroupSettings::default(),
    );
    g.bench_function("one_level/100", |b| {
        b.iter(|| black_box(one.pick(None)).map(|e| e.weight))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = bench_picks, bench_consistent_hash, bench_record, bench_group_pick
}
criterion_main!(benches);
