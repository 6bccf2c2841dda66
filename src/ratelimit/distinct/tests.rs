use std::time::Duration;

use super::*;

fn quota(requests: u32) -> Quota {
    Quota {
        requests,
        period: Duration::from_secs(60),
    }
}

#[test]
fn a_flood_of_values_stays_within_max_entries() {
    let table = DistinctCounters::new(10_000);
    let q = quota(10);
    for i in 0..100_000u32 {
        let key = table.value_hash(format!("client-{i}").as_bytes());
        assert!(table.acquire(key, q, 1_000).allowed);
        if i % 97 == 0 {
            assert!(table.len() <= 10_000, "{} entries at {i}", table.len());
        }
    }
    let held = table.len();
    assert!(held <= 10_000 && held > 5_000, "{held}");
    // Every value counted once: each is either held or was evicted.
    assert_eq!(table.evicted() + held as u64, 100_000);
}

#[test]
fn idle_counters_are_not_counted_as_evicted() {
    let table = DistinctCounters::new(64);
    let q = quota(10);
    for i in 0..1_000u64 {
        table.acquire(table.value_hash(&i.to_le_bytes()), q, 0);
    }
    let left = table.len() as u64;
    assert_eq!(table.evicted() + left, 1_000);
    // Four minutes on, the counters left count nothing: turning them out evicts nothing, and
    // 1,000 new values (about 62 a shard, a generation holds 2) turn all of them out.
    for i in 1_000..2_000u64 {
        table.acquire(table.value_hash(&i.to_le_bytes()), q, 240_000);
    }
    assert_eq!(table.evicted() + table.len() as u64, 2_000 - left);
}

#[test]
fn a_value_in_use_keeps_its_count_through_floods() {
    let table = DistinctCounters::new(10_000);
    let hot = table.value_hash(b"hot");
    let q = quota(21);
    let mut flood = 0u32;
    for _ in 0..21 {
        assert!(table.acquire(hot, q, 5_000).allowed);
        // 2,000 new values (about 125 a shard, a generation holds 312) between two requests.
        for _ in 0..2_000 {
            flood += 1;
            table.acquire(table.value_hash(&flood.to_le_bytes()), q, 5_000);
        }
    }
    // 42,000 values went through a table of 10,000; the hot one still has its 21.
    assert!(table.evicted() > 30_000);
    assert!(!table.acquire(hot, q, 5_000).allowed);
    assert_eq!(table.used_max(q, 5_000), 21);
}

#[test]
fn values_are_limited_separately() {
    let table = DistinctCounters::new(1_000);
    let q = quota(2);
    let (a, b) = (table.value_hash(b"alice"), table.value_hash(b"bob"));
    assert_ne!(a, b);
    assert!(table.acquire(a, q, 0).allowed);
    assert!(table.acquire(a, q, 0).allowed);
    assert!(!table.acquire(a, q, 0).allowed);
    assert!(table.acquire(b, q, 0).allowed);
    assert_eq!(table.len(), 2);
    // Giving one back to alice lets one more of hers through; bob's count is his own.
    table.release(a, q, 0);
    assert!(table.acquire(a, q, 0).allowed);
    assert!(table.acquire(b, q, 0).allowed);
    assert!(!table.acquire(b, q, 0).allowed);
    // Releasing a value never seen creates nothing.
    table.release(table.value_hash(b"carol"), q, 0);
    assert_eq!(table.len(), 2);
}

#[test]
fn threads_get_exactly_the_limit_through_per_value() {
    let table = DistinctCounters::new(1_000);
    let q = quota(100);
    let keys: Vec<u64> = (0..8u8).map(|i| table.value_hash(&[i])).collect();
    let allowed: Vec<AtomicU64> = keys.iter().map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..300 {
                    for (key, n) in keys.iter().zip(&allowed) {
                        if table.acquire(*key, q, 7_000).allowed {
                            n.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for n in &allowed {
        assert_eq!(n.load(Ordering::Relaxed), 100);
    }
}

#[test]
fn max_bytes_follows_hashbrowns_tables() {
    assert_eq!(std::mem::size_of::<(u64, WindowCounter)>(), 24);
    let table = DistinctCounters::new(10_000);
    let own = std::mem::size_of::<DistinctCounters>();
    // cap 312: 356 × 8/7 → 512 buckets of 25 bytes, + 16, in 32 tables.
    assert_eq!(table.max_bytes() - own, 32 * (512 * 25 + 16));
    assert_eq!(buckets(1), 4);
    assert_eq!(buckets(14), 16);
    assert_eq!(buckets(15), 32);
    assert_eq!(buckets(28), 32);
    assert_eq!(buckets(29), 64);
}

#[test]
fn value_hashes_differ_per_table() {
    let (one, two) = (DistinctCounters::new(32), DistinctCounters::new(32));
    assert_eq!(one.value_hash(b"v"), one.value_hash(b"v"));
    assert_ne!(one.value_hash(b"v"), two.value_hash(b"v"));
}
