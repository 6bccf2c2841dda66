//! Random: each request to an endpoint drawn at random, in proportion to its weight.

use std::sync::Arc;

use super::{Balancer, Candidate, EndpointList};

#[derive(Debug, Default)]
pub struct Random;

impl<E: Candidate> Balancer<E> for Random {
    fn pick<'a>(&self, list: &'a EndpointList<E>, _hash: Option<u64>) -> Option<&'a Arc<E>> {
        let (endpoints, weights) = (&list.endpoints[..], list.weights);
        if endpoints.is_empty() {
            return None;
        }
        if weights.uniform {
            return endpoints.get(fastrand::usize(..endpoints.len()));
        }
        // Weighted: one scan (weights are small integers; no table to keep in step with the
        // endpoint list).
        let mut slot = fastrand::u64(..weights.total.max(1));
        for endpoint in endpoints {
            let w = u64::from(endpoint.weight());
            if slot < w {
                return Some(endpoint);
            }
            slot -= w;
        }
        endpoints.last()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::endpoint;
    use super::*;

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
                    let got = shares_under_load(&Random, &eps, concurrency, 20_000);
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
