//! Ring hash ("ketama"), as Envoy builds it: every endpoint is hashed onto a ring of `u64`s
//! many times (`"<address>_<i>"`, xxHash64), in proportion to its weight; a request goes to
//! the first point at or after its own hash, wrapping around.
//!
//! Points depend only on the endpoint's address, so when an endpoint comes or goes only the keys
//! of the arcs it owned move (about 1/N of them), and two proxies (or two configs) with the same
//! endpoints agree on every key. With IP endpoints the points are the very ones Envoy computes.

use std::fmt::Write as _;
use std::sync::Arc;

use super::hash_key::hash_bytes;
use super::Candidate;

/// Envoy's defaults and bounds.
pub(crate) const DEFAULT_MIN_RING_SIZE: u64 = 1024;
pub(crate) const DEFAULT_MAX_RING_SIZE: u64 = 8 * 1024 * 1024;
pub(crate) const MAX_RING_SIZE: u64 = 8 * 1024 * 1024;

/// A built ring: point hashes sorted, and the endpoint index of each point beside them (two
/// arrays, so the binary search walks packed `u64`s).
#[derive(Debug)]
pub struct Ring {
    hashes: Vec<u64>,
    endpoints: Vec<u32>,
}

impl Ring {
    /// The ring of `endpoints`: the lightest endpoint gets `r` points, the others
    /// `r × weight / lightest`, where `r` is Envoy's count (enough for `min_size` points in all)
    /// rounded up to a power of two, and scaled down if the ring would pass `max_size`.
    ///
    /// The rounding is egressd's: Envoy keeps the ring near `min_size`, so when one of 10
    /// endpoints goes every other one gains a tenth more points, and those new points take
    /// keys from the other survivors (about 5% of all keys move between endpoints that did not
    /// change). Rounded, the counts stay the same until the total weight doubles or halves,
    /// so only the keys of the endpoint that went move. The ring has `min_size` to
    /// `2 × min_size` points; each endpoint's points are exactly the first ones Envoy gives it.
    pub fn build<E: Candidate>(endpoints: &[Arc<E>], min_size: u64, max_size: u64) -> Ring {
        let total: u64 = endpoints.iter().map(|e| u64::from(e.weight().max(1))).sum();
        let Some(lightest) = endpoints.iter().map(|e| e.weight().max(1)).min() else {
            return Ring {
                hashes: Vec::new(),
                endpoints: Vec::new(),
            };
        };
        let lightest = u64::from(lightest);
        // Points of the lightest endpoint: Envoy's ceil(min_size × lightest / total), rounded.
        let envoy = (min_size.max(1) * lightest).div_ceil(total).max(1);
        let per_lightest = (envoy.next_power_of_two() as f64)
            .min(max_size.max(1) as f64 * lightest as f64 / total as f64);
        let mut points: Vec<(u64, u32)> = Vec::new();
        let mut key = String::with_capacity(64);
        for (index, endpoint) in endpoints.iter().enumerate() {
            // Each count depends only on the endpoint's own weight (not on the list's order).
            let share = u64::from(endpoint.weight().max(1)) as f64 / lightest as f64;
            let count = (per_lightest * share).round().max(1.0) as u64;
            key.clear();
            // Infallible: writing to a String.
            let _ = write!(key, "{}_", endpoint.addr());
            let prefix = key.len();
            for i in 0..count {
                key.truncate(prefix);
                let _ = write!(key, "{i}");
                points.push((hash_bytes(key.as_bytes()), index as u32));
            }
        }
        // Ties (two addresses hashing alike) are ordered by address, not list order, so the
        // ring is the same whatever order the endpoints were listed in.
        points.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                endpoints[a.1 as usize]
                    .addr()
                    .cmp(&endpoints[b.1 as usize].addr())
            })
        });
        Ring {
            hashes: points.iter().map(|p| p.0).collect(),
            endpoints: points.iter().map(|p| p.1).collect(),
        }
    }

    /// The endpoint index for `hash`: the first point at or after it, else the first point.
    pub(crate) fn pick(&self, hash: u64) -> Option<usize> {
        let at = self.hashes.partition_point(|&h| h < hash);
        let at = if at == self.hashes.len() { 0 } else { at };
        self.endpoints.get(at).map(|&i| i as usize)
    }

    /// Points on the ring.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::endpoint;
    use super::*;

    #[test]
    fn ring_size_is_envoys_rounded_up_to_a_power_of_two_per_endpoint() {
        let eps: Vec<_> = (1..=3).map(|p| endpoint(p, 1)).collect();
        // Envoy gives each of 3 equal endpoints ceil(1024/3) = 342 points; rounded: 512.
        assert_eq!(Ring::build(&eps, 1024, MAX_RING_SIZE).len(), 1536);
        // Two of them: 512 each as well (a survivor's points do not change).
        assert_eq!(Ring::build(&eps[..2], 1024, MAX_RING_SIZE).len(), 1024);
        // More endpoints than the minimum: one point each.
        let many: Vec<_> = (1..=2000).map(|p| endpoint(p, 1)).collect();
        assert_eq!(Ring::build(&many, 1024, MAX_RING_SIZE).len(), 2000);
        // Capped by the maximum.
        assert_eq!(Ring::build(&eps, 1024, 30).len(), 30);
        // Weights 1:3: the lightest gets 1024/4 rounded up = 256, the other 768.
        let weighted = vec![endpoint(1, 1), endpoint(2, 3)];
        let ring = Ring::build(&weighted, 1024, MAX_RING_SIZE);
        assert_eq!(ring.len(), 1024);
        assert_eq!(ring.endpoints.iter().filter(|&&i| i == 0).count(), 256);
    }

    #[test]
    fn empty_ring_picks_nothing() {
        assert_eq!(
            Ring::build::<super::super::test_support::Endpoint>(&[], 1024, MAX_RING_SIZE).pick(42),
            None
        );
    }

    #[test]
    fn a_hash_past_the_last_point_wraps_to_the_first() {
        let eps = vec![endpoint(1, 1), endpoint(2, 1)];
        let ring = Ring::build(&eps, 4, MAX_RING_SIZE);
        assert_eq!(ring.pick(u64::MAX), Some(ring.endpoints[0] as usize));
        assert_eq!(ring.pick(0), Some(ring.endpoints[0] as usize));
        assert_eq!(ring.pick(ring.hashes[1]), Some(ring.endpoints[1] as usize));
    }

    #[test]
    fn order_of_the_list_does_not_matter() {
        let eps = vec![endpoint(1, 1), endpoint(2, 2), endpoint(3, 1)];
        let reversed: Vec<_> = eps.iter().rev().cloned().collect();
        let (a, b) = (
            Ring::build(&eps, 1024, MAX_RING_SIZE),
            Ring::build(&reversed, 1024, MAX_RING_SIZE),
        );
        for k in 0..1000u64 {
            let h = hash_bytes(&k.to_le_bytes());
            let pa = &eps[a.pick(h).unwrap()];
            let pb = &reversed[b.pick(h).unwrap()];
            assert_eq!(pa.addr, pb.addr);
        }
    }
}
