//! Round robin, smooth when weighted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::Balancer;
use crate::upstream::group::EndpointList;
use crate::upstream::Endpoint;

/// Round robin over endpoints. Equal weights take turns (one atomic counter). Unequal weights
/// use smooth weighted round robin (nginx's): every pick adds each endpoint's weight to its
/// running score, takes the highest score and subtracts the total from it, so weights 5:1:1
/// give `a a b a c a a` rather than five `a` in a row.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
    /// Scores of the smooth schedule, for the endpoint list they were built for.
    smooth: Mutex<Option<Smooth>>,
}

#[derive(Debug)]
struct Smooth {
    list: usize,
    scores: Vec<i64>,
}

impl RoundRobin {
    pub fn new() -> Self {
        // Start at a random offset so that many proxies restarted together do not all send
        // their first requests to the first address.
        RoundRobin {
            next: AtomicUsize::new(fastrand::usize(..1024)),
            smooth: Mutex::new(None),
        }
    }

    fn pick_smooth<'a>(&self, endpoints: &'a [Arc<Endpoint>]) -> Option<&'a Arc<Endpoint>> {
        let id = endpoints.as_ptr() as usize;
        // Only integer arithmetic happens under the lock: a panic cannot leave it inconsistent.
        let mut guard = self.smooth.lock().unwrap_or_else(|p| p.into_inner());
        if guard
            .as_ref()
            .is_none_or(|s| s.list != id || s.scores.len() != endpoints.len())
        {
            *guard = Some(Smooth {
                list: id,
                scores: vec![0; endpoints.len()],
            });
        }
        let scores = &mut guard.as_mut()?.scores;
        let mut total = 0i64;
        let mut best = 0;
        for (i, endpoint) in endpoints.iter().enumerate() {
            let w = i64::from(endpoint.weight);
            total += w;
            scores[i] += w;
            if scores[i] > scores[best] {
                best = i;
            }
        }
        scores[best] -= total;
        endpoints.get(best)
    }
}

impl Balancer for RoundRobin {
    fn pick<'a>(
        &self,
        list: &'a Arc<EndpointList>,
        _hash: Option<u64>,
    ) -> Option<&'a Arc<Endpoint>> {
        let (endpoints, weights) = (&list.endpoints[..], list.weights);
        match endpoints.len() {
            0 => None,
            1 => endpoints.first(),
            n if weights.uniform => {
                let turn = self.next.fetch_add(1, Ordering::Relaxed);
                endpoints.get(turn % n)
            }
            _ => self.pick_smooth(endpoints),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{endpoint, list, shares};
    use super::*;

    #[test]
    fn equal_weights_take_turns() {
        let eps = list(vec![endpoint(1, 1), endpoint(2, 1), endpoint(3, 1)]);
        let rr = RoundRobin::new();
        let mut counts = [0; 3];
        for _ in 0..300 {
            let e = rr.pick(&eps, None).unwrap();
            counts[(e.addr.port() - 1) as usize] += 1;
        }
        assert_eq!(counts, [100, 100, 100]);
    }

    #[test]
    fn weights_are_respected() {
        let eps = list(vec![endpoint(1, 3), endpoint(2, 1)]);
        let rr = RoundRobin::new();
        let mut counts = [0; 2];
        for _ in 0..400 {
            counts[(rr.pick(&eps, None).unwrap().addr.port() - 1) as usize] += 1;
        }
        assert_eq!(counts, [300, 100]);
        assert_eq!(
            shares(&RoundRobin::new(), &eps.endpoints, 4000),
            vec![0.75, 0.25]
        );
    }

    #[test]
    fn weighted_turns_are_interleaved_smoothly() {
        let eps = list(vec![endpoint(1, 5), endpoint(2, 1), endpoint(3, 1)]);
        let rr = RoundRobin::new();
        let picks: String = (0..7)
            .map(|_| ["a", "b", "c"][(rr.pick(&eps, None).unwrap().addr.port() - 1) as usize])
            .collect();
        assert_eq!(picks, "aabacaa");
    }

    #[test]
    fn empty_has_no_pick() {
        assert!(RoundRobin::new().pick(&list(Vec::new()), None).is_none());
    }

    #[test]
    fn shares_follow_weights_for_one_to_eight_endpoints_sequential_and_concurrent() {
        use super::super::test_support::{proportional, shares_under_load, weight_sets};
        for n in 1..=8 {
            for weights in weight_sets(n) {
                for concurrency in [1, 8] {
                    let eps: Vec<_> = weights
                        .iter()
                        .enumerate()
                        .map(|(i, &w)| endpoint(i as u16 + 1, w))
                        .collect();
                    let got = shares_under_load(&RoundRobin::new(), &eps, concurrency, 20_000);
                    let expected = proportional(&weights);
                    for (g, e) in got.iter().zip(&expected) {
                        assert!(
                            (g - e).abs() <= 0.03,
                            "weights {weights:?}, concurrency {concurrency}: {got:?}"
                        );
                    }
                }
            }
        }
    }
}
