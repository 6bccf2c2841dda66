//! The counters of a `Distinct` rule: one [`WindowCounter`] per value, bounded in entries.
//!
//! Values are chosen by clients (a header, a user), so the table must not grow with what they
//! send: it holds at most `max_entries` counters. Keys are hashes of the values
//! ([`DistinctCounters::value_hash`], seeded at random per process so no client can aim at
//! one shard). The table is 16 shards, each behind its own mutex, each with two generations
//! of at most `max_entries / 32` entries:
//!
//! - a key is looked up in `current`; else moved from `previous` into `current` (so a value
//!   in use survives the next turn); else a new counter goes into `current`;
//! - when `current` is full as a key is added, `previous` is dropped (its counters that still
//!   counted something are [`DistinctCounters::evicted`]) and `current` becomes `previous`.
//!
//! Every operation is O(1) amortised: the only scan, counting what is evicted, visits each
//! entry once per turn. A dropped counter comes back empty, so a client flooding the table
//! with new values can reset the count of a value idle for about `max_entries / 2` new values
//! (a value in use is promoted on each request and keeps its count).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::window::WindowCounter;
use super::{Decision, Quota};

const SHARDS: usize = 16;

/// A shard picks its keys by bits 40..44 of the hash: the tables index buckets by the low
/// bits and tag them with the top 7, so within a shard both stay as varied as the hash.
const SHARD_SHIFT: u32 = 40;

/// Control bytes past the last bucket (hashbrown's `Group::WIDTH`: 16 with SSE2, 8 or 16
/// elsewhere).
const GROUP_WIDTH: usize = 16;

/// Keys are already hashes: the table uses them as they are.
#[derive(Clone, Copy, Debug, Default)]
struct PassThrough;

impl BuildHasher for PassThrough {
    type Hasher = PassThroughHasher;

    fn build_hasher(&self) -> PassThroughHasher {
        PassThroughHasher(0)
    }
}

#[derive(Debug)]
struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// Only `u64` keys are hashed here; anything else still gets a (poor) hash.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Table = HashMap<u64, WindowCounter, PassThrough>;

#[derive(Debug, Default)]
struct Shard {
    current: Table,
    previous: Table,
}

impl Shard {
    fn acquire(&mut self, key: u64, quota: Quota, now_ms: u64, turn: Turn<'_>) -> Decision {
        if let Some(counter) = self.current.get(&key) {
            return counter.acquire(quota, now_ms);
        }
        let counter = self.previous.remove(&key).unwrap_or_default();
        if self.current.len() >= turn.cap {
            self.turn(quota, now_ms, turn.evicted);
        }
        let decision = counter.acquire(quota, now_ms);
        self.current.insert(key, counter);
        decision
    }

    /// `previous` dropped, `current` becomes `previous` (the dropped table's memory is reused).
    fn turn(&mut self, quota: Quota, now_ms: u64, evicted: &AtomicU64) {
        let mut dropped = std::mem::take(&mut self.previous);
        let counting = dropped
            .values()
            .filter(|c| !c.is_idle(quota, now_ms))
            .count();
        if counting > 0 {
            evicted.fetch_add(counting as u64, Ordering::Relaxed);
        }
        dropped.clear();
        self.previous = std::mem::replace(&mut self.current, dropped);
    }

    fn get(&self, key: u64) -> Option<&WindowCounter> {
        self.current.get(&key).or_else(|| self.previous.get(&key))
    }

    fn counters(&self) -> impl Iterator<Item = &WindowCounter> {
        self.current.values().chain(self.previous.values())
    }
}

/// What a shard needs to turn its generations.
#[derive(Clone, Copy)]
struct Turn<'a> {
    /// Entries of one generation of one shard.
    cap: usize,
    evicted: &'a AtomicU64,
}

/// The counters of one `Distinct` rule (see the module's docs).
#[derive(Debug)]
pub(crate) struct DistinctCounters {
    shards: [Mutex<Shard>; SHARDS],
    /// Entries of one generation of one shard: `max_entries / 32`, at least 1.
    cap: usize,
    evicted: AtomicU64,
    hasher: foldhash::quality::RandomState,
}

impl DistinctCounters {
    /// At most `max_entries` counters (taken as at least 32: one per generation and shard;
    /// rounded down to a multiple of 32).
    pub(crate) fn new(max_entries: usize) -> Self {
        DistinctCounters {
            shards: std::array::from_fn(|_| Mutex::default()),
            cap: (max_entries / (SHARDS * 2)).max(1),
            evicted: AtomicU64::new(0),
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    /// The key of a value: a hash seeded at random for this table.
    pub(crate) fn value_hash(&self, value: &[u8]) -> u64 {
        self.hasher.hash_one(value)
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Shard> {
        let index = (key >> SHARD_SHIFT) as usize % SHARDS;
        // A panic cannot leave a shard half-changed in a way that matters: counts are numbers.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides one request of the value `key` (see [`WindowCounter::acquire`]).
    pub(crate) fn acquire(&self, key: u64, quota: Quota, now_ms: u64) -> Decision {
        let turn = Turn {
            cap: self.cap,
            evicted: &self.evicted,
        };
        self.shard(key).acquire(key, quota, now_ms, turn)
    }

    /// Gives back one request `acquire` counted for `key` at `now_ms` (see
    /// [`WindowCounter::release`]); nothing when the counter is gone.
    pub(crate) fn release(&self, key: u64, quota: Quota, now_ms: u64) {
        if let Some(counter) = self.shard(key).get(key) {
            counter.release(quota, now_ms);
        }
    }

    /// Entries held now.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let shard = s.lock().unwrap_or_else(PoisonError::into_inner);
                shard.current.len() + shard.previous.len()
            })
            .sum()
    }

    /// Counters evicted while they still counted something (since `new`).
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Bytes the table holds at most, for the docs and /status.
    ///
    /// Each of the 32 tables (16 shards × 2 generations) holds at most `cap = max_entries / 32`
    /// entries of `size_of::<(u64, WindowCounter)>()` = 24 bytes plus one control byte each,
    /// in hashbrown's `buckets(cap)` = the next power of two of `cap × 8 / 7` (its 7/8 load
    /// factor; 4, 8 or 16 below 15 entries), plus 16 trailing control bytes:
    /// `32 × (buckets(cap) × 25 + 16) + size_of::<DistinctCounters>()`. That is 25 × 8/7 ≈ 29
    /// bytes per entry when a table's power of two fits it closely, up to twice that when it
    /// does not: about 410 kB for 10,000 entries (cap 312, 512 buckets).
    pub(crate) fn max_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(u64, WindowCounter)>() + 1;
        let table = buckets(self.cap) * entry + GROUP_WIDTH;
        SHARDS * 2 * table + std::mem::size_of::<Self>()
    }

    /// The highest [`WindowCounter::used`] among the entries (scans them all: for the admin
    /// page only).
    pub(crate) fn used_max(&self, quota: Quota, now_ms: u64) -> u32 {
        self.shards
            .iter()
            .map(|s| {
                let shard = s.lock().unwrap_or_else(PoisonError::into_inner);
                shard
                    .counters()
                    .map(|c| c.used(quota, now_ms))
                    .max()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

/// Buckets of a hashbrown table that has grown to `cap` entries.
fn buckets(cap: usize) -> usize {
    match cap {
        0..4 => 4,
        4..8 => 8,
        8..15 => 16,
        _ => (cap.saturating_mul(8) / 7).next_power_of_two(),
    }
}

#[cfg(test)]
mod tests;
