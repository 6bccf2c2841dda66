//! Round robin, smooth when weighted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::list::Prepared as ListPrepared;
use super::{Balancer, Candidate, EndpointList};

/// The longest weighted cycle unrolled for a list: above it, weights are scaled down to fit
/// (each keeps at least one turn), so 4 bytes × this bounds a list's order.
const MAX_CYCLE: u64 = 1 << 16;

/// Round robin over endpoints. Equal weights take turns (one atomic counter, kept across
/// lists, so reloads do not restart the rotation). Unequal weights follow smooth weighted round
/// robin (nginx's): every turn adds each endpoint's weight to its running score, takes the
/// highest score and subtracts the total from it, so weights 5:1:1 give `a a b a c a a`
/// rather than five `a` in a row. That cycle is unrolled once per list, when the list is
/// published; picks walk it with an atomic cursor.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

/// A list's smooth weighted cycle and the cursor walking it.
#[derive(Debug)]
pub(super) struct Prepared {
    /// Endpoint indices in the order of one cycle.
    order: Box<[u32]>,
    next: AtomicUsize,
}

impl RoundRobin {
    pub fn new() -> Self {
        // Start at a random offset so that many proxies restarted together do not all send
        // their first requests to the first address.
        RoundRobin {
            next: AtomicUsize::new(fastrand::usize(..1024)),
        }
    }
}

/// One cycle of smooth weighted round robin over `weights`: `total / gcd` turns, each weight
/// taking its share of them (scaled down to [`MAX_CYCLE`] turns when longer).
fn smooth_cycle(weights: &[u32]) -> Box<[u32]> {
    let divisor = weights
        .iter()
        .fold(0u64, |g, &w| gcd(g, u64::from(w)))
        .max(1);
    let mut reduced: Vec<u64> = weights.iter().map(|&w| u64::from(w) / divisor).collect();
    let total: u64 = reduced.iter().sum();
    if total > MAX_CYCLE {
        for w in &mut reduced {
            *w = (*w * MAX_CYCLE / total).max(1);
        }
    }
    let total: i64 = reduced.iter().map(|&w| w as i64).sum();
    let mut scores = vec![0i64; reduced.len()];
    let mut order = Vec::with_capacity(total.max(0) as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, &w) in reduced.iter().enumerate() {
            scores[i] += w as i64;
            if scores[i] > scores[best] {
                best = i;
            }
        }
        scores[best] -= total;
        order.push(best as u32);
    }
    order.into_boxed_slice()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn prepared_for<E: Candidate>(list: &EndpointList<E>) -> ListPrepared {
    let weights: Vec<u32> = list.endpoints.iter().map(|e| e.weight()).collect();
    ListPrepared::RoundRobin(Prepared {
        order: smooth_cycle(&weights),
        next: AtomicUsize::new(0),
    })
}

impl<E: Candidate> Balancer<E> for RoundRobin {
    fn prepare(&self, list: &EndpointList<E>) {
        if !list.weights.uniform {
            list.prepared(|| prepared_for(list));
        }
    }

    fn pick<'a>(&self, list: &'a EndpointList<E>, _hash: Option<u64>) -> Option<&'a Arc<E>> {
        let (endpoints, weights) = (&list.endpoints[..], list.weights);
        match endpoints.len() {
            0 => None,
            1 => endpoints.first(),
            n if weights.uniform => {
                let turn = self.next.fetch_add(1, Ordering::Relaxed);
                endpoints.get(turn % n)
            }
            n => match list.prepared(|| prepared_for(list)) {
                ListPrepared::RoundRobin(cycle) if !cycle.order.is_empty() => {
                    let turn = cycle.next.fetch_add(1, Ordering::Relaxed);
                    endpoints.get(cycle.order[turn % cycle.order.len()] as usize)
                }
                // All weights 0, or another balancer's list (never in a group): plain turns.
                _ => endpoints.get(self.next.fetch_add(1, Ordering::Relaxed) % n),
            },
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
    fn long_cycles_are_scaled_down_and_keep_every_endpoint() {
        let cycle = smooth_cycle(&[1, 100_000, 300_000]);
        assert!(cycle.len() as u64 <= MAX_CYCLE + 3, "{}", cycle.len());
        let count = |i: u32| cycle.iter().filter(|&&x| x == i).count() as f64;
        assert!(count(0) >= 1.0, "the lightest keeps a turn");
        assert!((count(2) / count(1) - 3.0).abs() < 0.01);
        assert_eq!(&*smooth_cycle(&[2, 4]), &[1, 0, 1], "reduced by the gcd");
        assert!(smooth_cycle(&[0, 0]).is_empty());
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
