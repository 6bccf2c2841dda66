//! Bounds on what clients control (a leaf module: it imports nothing of egressd).
//!
//! - [`insert_bounded`]: maps keyed by what clients choose (hostnames) have a size cap, so a
//!   client trying random hosts cannot grow egressd's memory: when the map is full, a new key
//!   makes room by evicting the entry used least recently.
//! - [`budget`]: the process-wide byte budget of bodies held whole.
//! - [`file`]: files the config names, read only when regular and up to a bound.
//! - [`rate`]: a token bucket (DNS lookups of names clients choose).
//! - [`share`]: a count shared by many holders (the endpoints of hosts clients name).

pub(crate) mod budget;
pub(crate) mod file;
pub(crate) mod rate;
pub(crate) mod share;

use std::collections::HashMap;
use std::hash::Hash;

/// Inserts `key` → `value`; when `map` already holds `capacity` entries, first removes the one
/// whose `last_used` is oldest. O(n) only when a new key arrives at a full map.
pub(crate) fn insert_bounded<K, V, T>(
    map: &mut HashMap<K, V>,
    capacity: usize,
    key: K,
    value: V,
    last_used: impl Fn(&V) -> T,
) where
    K: Hash + Eq + Clone,
    T: Ord,
{
    if map.len() >= capacity && !map.contains_key(&key) {
        let oldest = map
            .iter()
            .min_by_key(|(_, v)| last_used(v))
            .map(|(k, _)| k.clone());
        if let Some(oldest) = oldest {
            map.remove(&oldest);
        }
    }
    map.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_makes_room() {
        let mut map = HashMap::new();
        insert_bounded(&mut map, 2, "a", 1, |v| *v);
        insert_bounded(&mut map, 2, "b", 2, |v| *v);
        insert_bounded(&mut map, 2, "a", 3, |v| *v);
        assert_eq!(map.len(), 2, "replacing a key evicts nothing");
        insert_bounded(&mut map, 2, "c", 4, |v| *v);
        assert_eq!(map.len(), 2);
        assert!(!map.contains_key("b"), "b was used least recently");
    }
}
