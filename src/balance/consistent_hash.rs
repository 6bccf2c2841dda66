//! Consistent hashing: requests with the same key (header, cookie, client IP) go to the same
//! endpoint for as long as it stays pickable, and when endpoints come and go only the keys
//! of those endpoints move.
//!
//! The ring or table is built for one endpoint list (the group's `pickable` list: ejected
//! endpoints are left out, so their keys move to the others and come back when they return)
//! when that list is published, and travels with it: a pick is a hash lookup.

use std::sync::Arc;

use super::hash_key::HashKey;
use super::list::Prepared as ListPrepared;
use super::maglev::Maglev;
use super::ring_hash::Ring;
use super::{Balancer, Candidate, EndpointList};

/// `loadBalancer.consistentHash`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsistentHashSettings {
    pub key: HashKey,
    pub table: HashTable,
}

/// Which structure maps hashes to endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashTable {
    /// Ring hash with this many points at least and at most.
    RingHash { min_size: u64, max_size: u64 },
    /// Maglev with this (prime) number of slots.
    Maglev { size: u64 },
}

impl Default for HashTable {
    fn default() -> Self {
        HashTable::RingHash {
            min_size: super::ring_hash::DEFAULT_MIN_RING_SIZE,
            max_size: super::ring_hash::DEFAULT_MAX_RING_SIZE,
        }
    }
}

#[derive(Debug)]
pub struct ConsistentHash {
    settings: ConsistentHashSettings,
}

/// A list's ring or table.
#[derive(Debug)]
pub(super) enum Lookup {
    Ring(Ring),
    Maglev(Maglev),
}

impl Lookup {
    fn pick(&self, hash: u64) -> Option<usize> {
        match self {
            Lookup::Ring(r) => r.pick(hash),
            Lookup::Maglev(m) => m.pick(hash),
        }
    }
}

impl ConsistentHash {
    pub fn new(settings: ConsistentHashSettings) -> Self {
        ConsistentHash { settings }
    }

    fn build<E: Candidate>(&self, list: &EndpointList<E>) -> ListPrepared {
        ListPrepared::ConsistentHash(match self.settings.table {
            HashTable::RingHash { min_size, max_size } => {
                Lookup::Ring(Ring::build(&list.endpoints, min_size, max_size))
            }
            HashTable::Maglev { size } => Lookup::Maglev(Maglev::build(&list.endpoints, size)),
        })
    }
}

impl<E: Candidate> Balancer<E> for ConsistentHash {
    fn pick<'a>(&self, list: &'a EndpointList<E>, hash: Option<u64>) -> Option<&'a Arc<E>> {
        let endpoints = &list.endpoints;
        if endpoints.len() <= 1 {
            return endpoints.first();
        }
        // No key: a random point, as Envoy does (shares then follow the weights).
        let hash = hash.unwrap_or_else(|| fastrand::u64(..));
        let index = match list.prepared(|| self.build(list)) {
            ListPrepared::ConsistentHash(lookup) => lookup.pick(hash),
            // Another balancer's list (never in a group, where each level has one balancer).
            _ => Some((hash % endpoints.len() as u64) as usize),
        };
        endpoints.get(index?)
    }

    fn hash_key(&self) -> Option<&HashKey> {
        Some(&self.settings.key)
    }

    /// The ring or table is built when the list is published, not by the first pick after.
    fn prepare(&self, list: &EndpointList<E>) {
        if list.endpoints.len() > 1 {
            list.prepared(|| self.build(list));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::hash_key::hash_bytes;
    use super::super::test_support::{assert_shares, endpoint, list, Endpoint};
    use super::*;

    const KEYS: u64 = 100_000;

    fn ring() -> ConsistentHash {
        ConsistentHash::new(ConsistentHashSettings {
            key: HashKey::SourceIp,
            table: HashTable::default(),
        })
    }

    fn maglev() -> ConsistentHash {
        ConsistentHash::new(ConsistentHashSettings {
            key: HashKey::SourceIp,
            table: HashTable::Maglev {
                size: super::super::maglev::DEFAULT_TABLE_SIZE,
            },
        })
    }

    fn key(k: u64) -> u64 {
        hash_bytes(format!("user-{k}").as_bytes())
    }

    /// Where each of `KEYS` keys goes (endpoint port per key).
    fn placement(ch: &ConsistentHash, l: &Arc<EndpointList<Endpoint>>) -> Vec<u16> {
        (0..KEYS)
            .map(|k| ch.pick(l, Some(key(k))).expect("a pick").addr.port())
            .collect()
    }

    fn key_shares(ch: &ConsistentHash, l: &Arc<EndpointList<Endpoint>>) -> Vec<f64> {
        let mut counts = vec![0usize; l.endpoints.len()];
        for port in placement(ch, l) {
            counts[usize::from(port) - 1] += 1;
        }
        counts.iter().map(|&c| c as f64 / KEYS as f64).collect()
    }

    #[test]
    fn the_same_key_always_reaches_the_same_endpoint() {
        for ch in [ring(), maglev()] {
            let l = list((1..=5).map(|p| endpoint(p, 1)).collect());
            for k in 0..100 {
                let first = ch.pick(&l, Some(key(k))).unwrap().addr;
                assert!((0..10).all(|_| ch.pick(&l, Some(key(k))).unwrap().addr == first));
            }
            // The same addresses in another list (a reload, another replica): same answers.
            let again = list((1..=5).rev().map(|p| endpoint(p, 1)).collect());
            assert_eq!(placement(&ch, &l), placement(&ch, &again));
        }
    }

    #[test]
    fn keys_spread_by_weight() {
        for (name, ch, tolerance) in [("ring", ring(), 0.03), ("maglev", maglev(), 0.01)] {
            let equal = list((1..=4).map(|p| endpoint(p, 1)).collect());
            let got = key_shares(&ch, &equal);
            eprintln!("{name} equal: {got:?}");
            assert_shares(&got, &[0.25; 4], tolerance);
            let weighted = list(vec![endpoint(1, 1), endpoint(2, 3)]);
            let got = key_shares(&ch, &weighted);
            eprintln!("{name} 1:3: {got:?}");
            assert_shares(&got, &[0.25, 0.75], tolerance);
        }
    }

    #[test]
    fn requests_without_a_key_spread_by_weight() {
        for ch in [ring(), maglev()] {
            let l = list(vec![endpoint(1, 1), endpoint(2, 3)]);
            let mut counts = [0usize; 2];
            for _ in 0..KEYS {
                counts[usize::from(ch.pick(&l, None).unwrap().addr.port()) - 1] += 1;
            }
            let light = counts[0] as f64 / KEYS as f64;
            assert!((light - 0.25).abs() < 0.03, "{light}");
        }
    }

    #[test]
    fn removing_one_of_n_endpoints_moves_about_a_nth_of_the_keys() {
        const N: u16 = 10;
        for (name, ch) in [("ring", ring()), ("maglev", maglev())] {
            let all = list((1..=N).map(|p| endpoint(p, 1)).collect());
            let before = placement(&ch, &all);
            let gone = 4;
            let rest = list(
                (1..=N)
                    .filter(|&p| p != gone)
                    .map(|p| endpoint(p, 1))
                    .collect(),
            );
            let after = placement(&ch, &rest);
            let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
            let moved_share = moved as f64 / KEYS as f64;
            let survivors = before.iter().filter(|&&p| p != gone).count();
            let kept = before
                .iter()
                .zip(&after)
                .filter(|(b, a)| **b != gone && b == a)
                .count();
            let kept_share = kept as f64 / survivors as f64;
            eprintln!("{name}: moved {moved_share:.4}, survivors' keys kept {kept_share:.4}");
            assert!(
                moved_share < 1.5 / f64::from(N),
                "{name}: moved {moved_share}"
            );
            assert!(after.iter().all(|&p| p != gone));
            // Ring hash keeps every key of a survivor; Maglev nearly every one.
            assert!(kept_share > 0.97, "{name}: kept {kept_share}");
        }
    }

    #[test]
    fn a_new_list_gets_a_new_table() {
        for ch in [ring(), maglev()] {
            let two = list(vec![endpoint(1, 1), endpoint(2, 1)]);
            assert!(ch.pick(&two, Some(1)).is_some());
            let three = list(vec![endpoint(1, 1), endpoint(2, 1), endpoint(3, 1)]);
            let ports: std::collections::HashSet<u16> =
                placement(&ch, &three).into_iter().collect();
            assert_eq!(ports.len(), 3);
        }
    }

    #[test]
    fn empty_and_single_lists() {
        let ch = ring();
        assert!(ch.pick(&list(Vec::new()), Some(7)).is_none());
        let one = list(vec![endpoint(9, 1)]);
        assert_eq!(ch.pick(&one, Some(7)).unwrap().addr.port(), 9);
    }
}
