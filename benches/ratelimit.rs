//! Rate-limit counting cost per matching rule (criterion); #33 asks for at most 100 ns.
//!
//!     cargo bench --bench ratelimit
//!
//! One rule's sliding-window counter, always allowing (a huge limit) and always denying (the
//! limit reached: the retry-after is computed each time); a `Distinct` rule's table when the
//! value already has a counter (10,000 values present); hashing a 32-byte value; reading the
//! counters' clock (once per request, not per rule).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use egressd::ratelimit::bench_support::{now_ms, Counter, Distinct};

const MINUTE: Duration = Duration::from_secs(60);

fn bench_window(c: &mut Criterion) {
    let mut g = c.benchmark_group("window_acquire");
    let counter = Counter::default();
    let mut now = 0u64;
    g.bench_function("allowed", |b| {
        b.iter(|| {
            // Moving through the minute (and into later ones, rolling over now and then).
            now += 1;
            counter.acquire(black_box(u32::MAX), MINUTE, black_box(now))
        })
    });
    let full = Counter::default();
    for _ in 0..1_000 {
        full.acquire(1_000, MINUTE, 30_000);
    }
    assert!(!full.acquire(1_000, MINUTE, 30_000).0);
    g.bench_function("denied", |b| {
        b.iter(|| full.acquire(black_box(1_000), MINUTE, black_box(30_000)))
    });
    g.finish();
}

fn bench_distinct(c: &mut Criterion) {
    let mut g = c.benchmark_group("distinct");
    let table = Distinct::new(100_000);
    let keys: Vec<u64> = (0..10_000u32)
        .map(|i| table.value_hash(format!("user-{i:08}").as_bytes()))
        .collect();
    for key in &keys {
        table.acquire(*key, u32::MAX, MINUTE, 1_000);
    }
    assert_eq!(table.entries(), 10_000);
    let mut i = 0usize;
    g.bench_function("acquire_hit/10000", |b| {
        b.iter(|| {
            // A different value each time (a stride visiting all of them).
            i = (i + 7_919) % keys.len();
            table.acquire(black_box(keys[i]), u32::MAX, MINUTE, black_box(1_000))
        })
    });
    let value = [0x5a_u8; 32];
    g.bench_function("value_hash/32B", |b| {
        b.iter(|| table.value_hash(black_box(&value)))
    });
    g.finish();
    c.bench_function("clock/now_ms", |b| b.iter(now_ms));
}

criterion_group!(benches, bench_window, bench_distinct);
criterion_main!(benches);
