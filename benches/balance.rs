//! `pick()` cost per balancer and endpoint count (criterion).
//!
//!     cargo bench --bench balance
//!
//! Endpoints carry a spread of active requests (0..8), as under load; the weighted variants
//! give every endpoint a different weight, which switches LeastRequest to its EDF schedule.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use egressd::balance::{Balancer, LeastRequest, LeastRequestSettings, Random, RoundRobin};
use egressd::upstream::endpoint::ActiveRequest;
use egressd::upstream::group::Weights;
use egressd::upstream::h2_pool::H2Pool;
use egressd::upstream::pool::H1Pool;
use egressd::upstream::Endpoint;

const SIZES: [usize; 4] = [2, 10, 100, 1000];

/// `n` endpoints, and the in-flight request guards that give them their load.
fn endpoints(n: usize, weighted: bool) -> (Vec<Arc<Endpoint>>, Vec<ActiveRequest>) {
    let list: Vec<Arc<Endpoint>> = (0..n)
        .map(|i| {
            let addr = ([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 443).into();
            let weight = if weighted { 1 + (i % 7) as u32 } else { 1 };
            Arc::new(Endpoint::new(
                addr,
                weight,
                H1Pool::new(Default::default()),
                H2Pool::new(Duration::from_secs(60)),
            ))
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
    let balancers: Vec<(&str, bool, Box<dyn Balancer>)> = vec![
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
            let weights = Weights::of(&list);
            group.bench_with_input(BenchmarkId::from_parameter(n), &list, |b, list| {
                b.iter(|| black_box(balancer.pick(black_box(list), weights)).map(|e| e.weight))
            });
        }
        group.finish();
    }
}

/// Recording a result on the hot path: a success (loads only) and a failure (increments).
fn bench_record(c: &mut Criterion) {
    use egressd::balance::outlier::{Outcome, OutlierSettings};
    let (list, _held) = endpoints(10, false);
    let group = egressd::upstream::EndpointGroup::new_static(
        list.clone(),
        Box::new(LeastRequest::new(LeastRequestSettings::default())),
        OutlierSettings {
            consecutive_gateway_errors: None,
            ..OutlierSettings::default()
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

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = bench_picks, bench_record
}
criterion_main!(benches);
