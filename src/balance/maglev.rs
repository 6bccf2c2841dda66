//! Maglev (Eisenbud et al., NSDI '16), as Envoy builds it: a lookup table of a prime number of
//! slots, filled by the endpoints in turns, each claiming the next free slot of its own
//! permutation `(offset + skip × j) mod M` (offset and skip from two xxHash64s of its address).
//! A heavier endpoint takes a turn more often (Envoy's weighted fill), so its share of slots
//! follows its weight. A request goes to slot `hash mod M`: one array read per pick.
//!
//! Endpoints fill in address order, so the table depends only on the set of addresses and
//! weights; removing one of N endpoints moves its own slots and only a few others.

use std::sync::Arc;

use super::hash_key::hash_bytes;
use super::Candidate;

/// Envoy's default table size (a prime).
pub(crate) const DEFAULT_TABLE_SIZE: u64 = 65537;
/// The largest table accepted (the bound Istio documents for Envoy; 20 MiB of slots).
pub(crate) const MAX_TABLE_SIZE: u64 = 5_000_011;

/// A filled Maglev table of endpoint indices.
#[derive(Debug)]
pub struct Maglev {
    table: Vec<u32>,
}

/// One endpoint while the table is filled.
struct Filler {
    index: u32,
    /// The current slot of the permutation: `(offset + skip × j) mod M`, stepped by adding
    /// `skip` (one add and compare instead of a multiply and a division per probe).
    slot: u64,
    skip: u64,
    weight: f64,
    target: f64,
}

impl Filler {
    fn step(&mut self, size: u64) {
        // slot < size and skip < size: one subtraction keeps it in range.
        self.slot += self.skip;
        if self.slot >= size {
            self.slot -= size;
        }
    }
}

impl Maglev {
    /// The table of `endpoints` with `size` slots; `size` must be prime (checked by config
    /// validation: with a composite size some permutations would not reach every slot).
    pub fn build<E: Candidate>(endpoints: &[Arc<E>], size: u64) -> Maglev {
        if endpoints.is_empty() || size < 2 {
            return Maglev { table: Vec::new() };
        }
        let max_weight = f64::from(
            endpoints
                .iter()
                .map(|e| e.weight().max(1))
                .max()
                .unwrap_or(1),
        );
        let mut fillers: Vec<(String, Filler)> = endpoints
            .iter()
            .enumerate()
            .map(|(index, e)| {
                let key = e.addr().to_string();
                let h0 = hash_bytes(key.as_bytes());
                let h1 = xxhash_rust::xxh64::xxh64(key.as_bytes(), 1);
                let filler = Filler {
                    index: index as u32,
                    slot: h0 % size,
                    skip: h1 % (size - 1) + 1,
                    weight: f64::from(e.weight().max(1)) / max_weight,
                    target: 0.0,
                };
                (key, filler)
            })
            .collect();
        // The fill order decides ties between endpoints: make it the addresses' order, not the
        // list's.
        fillers.sort_by(|a, b| a.0.cmp(&b.0));
        let mut fillers: Vec<Filler> = fillers.into_iter().map(|(_, f)| f).collect();

        const EMPTY: u32 = u32::MAX;
        let mut table = vec![EMPTY; size as usize];
        let mut filled = 0u64;
        let mut turn = 1u64;
        while filled < size {
            for f in fillers.iter_mut() {
                if filled == size {
                    break;
                }
                // An endpoint of the heaviest weight fills a slot every turn; one of a third of
                // it, every third turn.
                if (turn as f64) * f.weight < f.target {
                    continue;
                }
                f.target += 1.0;
                while table[f.slot as usize] != EMPTY {
                    f.step(size);
                }
                table[f.slot as usize] = f.index;
                f.step(size);
                filled += 1;
            }
            turn += 1;
        }
        Maglev { table }
    }

    /// The endpoint index for `hash`.
    pub fn pick(&self, hash: u64) -> Option<usize> {
        let len = self.table.len() as u64;
        if len == 0 {
            return None;
        }
        self.table.get((hash % len) as usize).map(|&i| i as usize)
    }
}

/// Whether `n` is prime (trial division: table sizes are at most a few million, checked once
/// per config).
pub(crate) fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::super::test_support::endpoint;
    use super::*;

    #[test]
    fn primes() {
        assert!([2, 3, 5, 7, 251, 65537, 5_000_011]
            .iter()
            .all(|&n| is_prime(n)));
        assert!(![0, 1, 4, 9, 65536, 65535, 1_000_000]
            .iter()
            .any(|&n| is_prime(n)));
    }

    #[test]
    fn every_slot_is_filled_in_proportion_to_weight() {
        let eps = vec![endpoint(1, 1), endpoint(2, 3)];
        let m = Maglev::build(&eps, 65537);
        assert!(m.table.iter().all(|&i| i < 2));
        let light = m.table.iter().filter(|&&i| i == 0).count() as f64 / 65537.0;
        assert!((light - 0.25).abs() < 0.001, "{light}");
    }

    #[test]
    fn empty_table_picks_nothing() {
        assert_eq!(
            Maglev::build::<super::super::test_support::Endpoint>(&[], 65537).pick(1),
            None
        );
    }

    #[test]
    fn order_of_the_list_does_not_matter() {
        let eps = vec![endpoint(1, 1), endpoint(2, 2), endpoint(3, 1)];
        let reversed: Vec<_> = eps.iter().rev().cloned().collect();
        let (a, b) = (Maglev::build(&eps, 251), Maglev::build(&reversed, 251));
        for slot in 0..251u64 {
            assert_eq!(
                eps[a.pick(slot).unwrap()].addr,
                reversed[b.pick(slot).unwrap()].addr
            );
        }
    }
}
