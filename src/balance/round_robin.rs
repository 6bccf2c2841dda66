//! Weighted round robin.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::Balancer;
use crate::upstream::Endpoint;

/// Round robin over endpoints. With unequal weights, each endpoint gets `weight` consecutive
/// turns out of every `sum(weights)` picks (a simple interleave; the smooth weighted variant
/// arrives with the balancing work).
#[derive(Debug, Default)]
pub struct RoundRobin {
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

impl Balancer for RoundRobin {
    fn pick<'a>(&self, endpoints: &'a [Arc<Endpoint>]) -> Option<&'a Arc<Endpoint>> {
        match endpoints.len() {
            0 => None,
            1 => endpoints.first(),
            n => {
                let turn = self.next.fetch_add(1, Ordering::Relaxed);
                if endpoints.iter().all(|e| e.weight == endpoints[0].weight) {
                    return endpoints.get(turn % n);
                }
                let total: usize = endpoints.iter().map(|e| e.weight as usize).sum();
                if total == 0 {
                    return endpoints.get(turn % n);
                }
                let mut slot = turn % total;
                for endpoint in endpoints {
                    let w = endpoint.weight as usize;
                    if slot < w {
                        return Some(endpoint);
                    }
                    slot -= w;
                }
                endpoints.last()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::pool::H1Pool;

    fn endpoint(port: u16, weight: u32) -> Arc<Endpoint> {
        Arc::new(Endpoint::new(
            ([127, 0, 0, 1], port).into(),
            weight,
            H1Pool::new(Default::default()),
            crate::upstream::h2_pool::H2Pool::new(std::time::Duration::from_secs(60)),
        ))
    }

    #[test]
    fn equal_weights_take_turns() {
        let eps = vec![endpoint(1, 1), endpoint(2, 1), endpoint(3, 1)];
        let rr = RoundRobin::new();
        let mut counts = [0; 3];
        for _ in 0..300 {
            let e = rr.pick(&eps).unwrap();
            counts[(e.addr.port() - 1) as usize] += 1;
        }
        assert_eq!(counts, [100, 100, 100]);
    }

    #[test]
    fn weights_are_respected() {
        let eps = vec![endpoint(1, 3), endpoint(2, 1)];
        let rr = RoundRobin::new();
        let mut counts = [0; 2];
        for _ in 0..400 {
            counts[(rr.pick(&eps).unwrap().addr.port() - 1) as usize] += 1;
        }
        assert_eq!(counts, [300, 100]);
    }

    #[test]
    fn empty_has_no_pick() {
        assert!(RoundRobin::new().pick(&[]).is_none());
    }
}
