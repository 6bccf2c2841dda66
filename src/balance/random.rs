//! Random: each request to an endpoint drawn at random, in proportion to its weight.

use std::sync::Arc;

use super::Balancer;
use crate::upstream::group::EndpointList;
use crate::upstream::Endpoint;

#[derive(Debug, Default)]
pub struct Random;

impl Balancer for Random {
    fn pick<'a>(
        &self,
        list: &'a Arc<EndpointList>,
        _hash: Option<u64>,
    ) -> Option<&'a Arc<Endpoint>> {
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
            let w = u64::from(endpoint.weight);
            if slot < w {
                return Some(endpoint);
            }
            slot -= w;
        }
        endpoints.last()
    }
}
