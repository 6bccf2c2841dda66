//! Least request: send the request where the fewest are in flight.
//!
//! - Equal weights (and no explicit `activeRequestBias`): the best of `choiceCount` random
//!   endpoints by active requests ("power of two choices"). egressd samples *distinct*
//!   endpoints, so the busiest of two is never chosen; Envoy samples with replacement (the
//!   busier of two hosts still gets 25% of picks), available as `distinctChoices: false`.
//! - Unequal weights, an explicit bias, or an endpoint in slow start: earliest-deadline-first
//!   on `weight / (active + 1)^bias` (Envoy's weighted least request). Each worker thread
//!   keeps its own schedule for a list, as each Envoy worker has its own load balancer: a
//!   pick takes no lock, and a new list (published whenever an endpoint joins, leaves or
//!   comes back) starts new schedules.

use std::cell::RefCell;
use std::sync::Arc;

use thread_local::ThreadLocal;

use super::edf::Edf;
use super::list::Prepared as ListPrepared;
use super::slow_start::{now_ms, ramp_until_ms, SlowStartSettings};
use super::{Balancer, Candidate, EndpointList};

/// The largest `choiceCount` accepted.
pub(crate) const MAX_CHOICES: usize = 16;

/// `loadBalancer.leastRequest`, resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeastRequestSettings {
    /// Endpoints sampled per pick (≥ 2).
    pub(crate) choice_count: u32,
    /// Exponent of `active + 1` in the weighted schedule.
    pub(crate) active_request_bias: f64,
    /// Whether the bias was set explicitly (then the weighted schedule is used even with equal
    /// weights, as in current Envoy).
    pub(crate) bias_explicit: bool,
    /// Sample distinct endpoints (egressd) or with replacement (Envoy).
    pub(crate) distinct_choices: bool,
    /// `loadBalancer.slowStart`.
    pub(crate) slow_start: Option<SlowStartSettings>,
}

impl Default for LeastRequestSettings {
    fn default() -> Self {
        LeastRequestSettings {
            choice_count: 2,
            active_request_bias: 1.0,
            bias_explicit: false,
            distinct_choices: true,
            slow_start: None,
        }
    }
}

/// Slow-start settings and the time of the pick, while some endpoint is in slow start.
type Ramp<'s> = Option<(&'s SlowStartSettings, u64)>;

/// Each worker thread's weighted schedule over one list.
type Schedules = ThreadLocal<RefCell<Edf>>;

#[derive(Debug)]
pub struct LeastRequest {
    settings: LeastRequestSettings,
}

/// What a list carries for least request.
#[derive(Debug)]
pub(super) struct Prepared {
    /// Until when some endpoint of the list is in slow start ([`now_ms`] milliseconds; 0:
    /// none, or no slow start configured): until then picks use the weighted schedule.
    ramp_until_ms: u64,
    /// The weighted schedules, made by each thread's first weighted pick; only for a list
    /// whose picks can be weighted (a per-thread table is 520 bytes, and a gateway has
    /// thousands of lists, most with equal weights).
    schedules: Option<Box<Schedules>>,
}

impl LeastRequest {
    pub fn new(settings: LeastRequestSettings) -> Self {
        LeastRequest { settings }
    }

    fn prepared_for<E: Candidate>(&self, list: &EndpointList<E>) -> Prepared {
        let ramp_until_ms = self
            .settings
            .slow_start
            .as_ref()
            .map_or(0, |slow| ramp_until_ms(slow, &list.endpoints));
        let weighted = ramp_until_ms > 0 || self.settings.bias_explicit || !list.weights.uniform;
        Prepared {
            ramp_until_ms,
            schedules: weighted.then(|| Box::new(ThreadLocal::new())),
        }
    }

    /// `weight / (active + 1)^bias`, times the slow-start factor while `ramp` (settings and
    /// the time of this pick) says some endpoint is in slow start.
    fn effective_weight<E: Candidate>(&self, endpoint: &E, ramp: Ramp) -> f64 {
        let mut weight = f64::from(endpoint.weight());
        if let Some((slow, now)) = ramp {
            weight *= slow.factor(endpoint.ready_since_ms(), now);
        }
        let active = endpoint.active_requests() as f64 + 1.0;
        let bias = self.settings.active_request_bias;
        if bias == 1.0 {
            weight / active
        } else if bias == 0.0 {
            weight
        } else {
            weight / active.powf(bias)
        }
    }

    fn pick_weighted<'a, E: Candidate>(
        &self,
        endpoints: &'a [Arc<E>],
        schedules: &Schedules,
        ramp: Ramp,
    ) -> Option<&'a Arc<E>> {
        let weight = |i: usize| self.effective_weight(&*endpoints[i], ramp);
        let schedule = schedules.get_or(|| {
            let mut edf = Edf::new(endpoints.len(), weight);
            // Start at a random point of the schedule, so threads, replicas and restarts do
            // not all send their first requests to the same endpoints.
            for _ in 0..fastrand::usize(..endpoints.len()) {
                edf.pick_and_add(weight);
            }
            RefCell::new(edf)
        });
        // Only this thread touches its schedule, and nothing in a pick picks again: the
        // borrow is always free. Were it not, the least loaded endpoint is a fine answer.
        let Ok(mut edf) = schedule.try_borrow_mut() else {
            return least_loaded(endpoints);
        };
        let index = edf.pick_and_add(weight)?;
        endpoints.get(index)
    }

    fn pick_choices<'a, E: Candidate>(&self, endpoints: &'a [Arc<E>]) -> Option<&'a Arc<E>> {
        let n = endpoints.len();
        let k = self.settings.choice_count as usize;
        if self.settings.distinct_choices && k >= n {
            // Every endpoint is a candidate: the least loaded, ties broken at random (the
            // first on ties would take all sequential traffic to one endpoint).
            return least_loaded(endpoints);
        }
        if self.settings.distinct_choices && k == 2 {
            let a = fastrand::usize(..n);
            let mut b = fastrand::usize(..n - 1);
            if b >= a {
                b += 1;
            }
            let (ea, eb) = (&endpoints[a], &endpoints[b]);
            // Ties keep the first draw, itself random.
            return Some(if eb.active_requests() < ea.active_requests() {
                eb
            } else {
                ea
            });
        }
        let mut best: Option<&Arc<E>> = None;
        // choiceCount is at most MAX_CHOICES (config validation), and below n here when
        // distinct: redrawing duplicates ends quickly.
        let mut drawn = [usize::MAX; MAX_CHOICES];
        let mut draws = 0;
        while draws < k.min(MAX_CHOICES) {
            let i = fastrand::usize(..n);
            if self.settings.distinct_choices {
                if drawn[..draws].contains(&i) {
                    continue;
                }
                drawn[draws] = i;
            }
            draws += 1;
            let candidate = &endpoints[i];
            if best.is_none_or(|b| candidate.active_requests() < b.active_requests()) {
                best = Some(candidate);
            }
        }
        best
    }
}

/// The endpoint with the fewest requests in flight; among equals each is as likely (reservoir
/// sampling: the k-th tie replaces the choice with probability 1/k).
fn least_loaded<E: Candidate>(endpoints: &[Arc<E>]) -> Option<&Arc<E>> {
    let mut best: Option<(&Arc<E>, u64)> = None;
    let mut ties = 0u32;
    for endpoint in endpoints {
        let active = endpoint.active_requests();
        match best {
            Some((_, least)) if active > least => {}
            Some((_, least)) if active == least => {
                ties += 1;
                if fastrand::u32(..=ties) == 0 {
                    best = Some((endpoint, active));
                }
            }
            _ => {
                best = Some((endpoint, active));
                ties = 0;
            }
        }
    }
    best.map(|(endpoint, _)| endpoint)
}

impl<E: Candidate> Balancer<E> for LeastRequest {
    fn effective_weight(&self, endpoint: &E) -> f64 {
        let weight = f64::from(endpoint.weight());
        match &self.settings.slow_start {
            Some(slow) => weight * slow.factor(endpoint.ready_since_ms(), now_ms()),
            None => weight,
        }
    }

    fn prepare(&self, list: &EndpointList<E>) {
        list.prepared(|| ListPrepared::LeastRequest(self.prepared_for(list)));
    }

    fn pick<'a>(&self, list: &'a EndpointList<E>, _hash: Option<u64>) -> Option<&'a Arc<E>> {
        let (endpoints, weights) = (&list.endpoints[..], list.weights);
        if endpoints.len() < 2 {
            return endpoints.first();
        }
        // Equal weights, no explicit bias, no slow start: the choices, and nothing prepared
        // for the list is needed.
        if weights.uniform && !self.settings.bias_explicit && self.settings.slow_start.is_none() {
            return self.pick_choices(endpoints);
        }
        let ListPrepared::LeastRequest(prepared) =
            list.prepared(|| ListPrepared::LeastRequest(self.prepared_for(list)))
        else {
            // Another balancer's list: never in a group, where each level has one balancer.
            return self.pick_choices(endpoints);
        };
        // While some endpoint ramps up, its weight differs from the others': the weighted
        // schedule, as in Envoy.
        let ramp = match &self.settings.slow_start {
            Some(slow) if prepared.ramp_until_ms > 0 => {
                let now = now_ms();
                (now < prepared.ramp_until_ms).then_some((slow, now))
            }
            _ => None,
        };
        match &prepared.schedules {
            // A ramp needs `ramp_until_ms`, so a list with a ramp has schedules.
            Some(schedules)
                if ramp.is_some() || self.settings.bias_explicit || !weights.uniform =>
            {
                self.pick_weighted(endpoints, schedules, ramp)
            }
            _ => self.pick_choices(endpoints),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        assert_shares, endpoint, list, proportional, shares, shares_under_load, weight_sets,
    };
    use super::*;

    const PICKS: usize = 100_000;
    const TOLERANCE: f64 = 0.02;

    fn envoy() -> LeastRequest {
        LeastRequest::new(LeastRequestSettings {
            distinct_choices: false,
            ..LeastRequestSettings::default()
        })
    }

    fn egressd() -> LeastRequest {
        LeastRequest::new(LeastRequestSettings::default())
    }

    #[test]
    fn equal_idle_endpoints_share_evenly() {
        let eps = vec![endpoint(1, 1), endpoint(2, 1), endpoint(3, 1)];
        let third = 1.0 / 3.0;
        assert_shares(&shares(&egressd(), &eps, PICKS), &[third; 3], TOLERANCE);
        assert_shares(&shares(&envoy(), &eps, PICKS), &[third; 3], TOLERANCE);
    }

    #[test]
    fn one_busy_of_three_gets_nothing_with_distinct_choices_and_a_ninth_like_envoy() {
        let eps = vec![endpoint(1, 1), endpoint(2, 1), endpoint(3, 1)];
        let _held: Vec<_> = (0..10).map(|_| eps[2].start_request()).collect();
        assert_shares(
            &shares(&egressd(), &eps, PICKS),
            &[0.5, 0.5, 0.0],
            TOLERANCE,
        );
        // Envoy's simulation: 44.45 / 44.45 / 11.1 %.
        assert_shares(
            &shares(&envoy(), &eps, PICKS),
            &[0.4445, 0.4445, 0.111],
            TOLERANCE,
        );
    }

    #[test]
    fn two_endpoints_one_busy() {
        let eps = vec![endpoint(1, 1), endpoint(2, 1)];
        let _held = eps[1].start_request();
        assert_shares(&shares(&egressd(), &eps, PICKS), &[1.0, 0.0], TOLERANCE);
        // Envoy: 75 / 25 % (both draws land on the busy one a quarter of the time).
        assert_shares(&shares(&envoy(), &eps, PICKS), &[0.75, 0.25], TOLERANCE);
    }

    #[test]
    fn weighted_schedule_follows_weight_over_active_plus_one() {
        // Weights 2:1, idle: 66.7 / 33.3 %.
        let eps = vec![endpoint(1, 2), endpoint(2, 1)];
        assert_shares(
            &shares(&egressd(), &eps, PICKS),
            &[2.0 / 3.0, 1.0 / 3.0],
            TOLERANCE,
        );
        // The weight-2 endpoint with one request in flight: 2/2 vs 1/1, 50 / 50 %.
        let held = eps[0].start_request();
        assert_shares(&shares(&egressd(), &eps, PICKS), &[0.5, 0.5], TOLERANCE);
        drop(held);
        // Weights 2, 1, 1, the first with one in flight: a third each.
        let eps = vec![endpoint(1, 2), endpoint(2, 1), endpoint(3, 1)];
        let _held = eps[0].start_request();
        assert_shares(&shares(&egressd(), &eps, PICKS), &[1.0 / 3.0; 3], TOLERANCE);
        // Weights 1 and 3, equal load: 1:3.
        let eps = vec![endpoint(1, 1), endpoint(2, 3)];
        assert_shares(&shares(&envoy(), &eps, PICKS), &[0.25, 0.75], TOLERANCE);
    }

    #[test]
    fn explicit_bias_weighs_equal_endpoints_by_load() {
        // Envoy's EqualWeightsWithActiveRequestBias: A with 1 in flight, B idle, bias 1.0 set
        // explicitly: B gets two picks of three.
        let lr = LeastRequest::new(LeastRequestSettings {
            bias_explicit: true,
            ..LeastRequestSettings::default()
        });
        let eps = vec![endpoint(1, 1), endpoint(2, 1)];
        let _held = eps[0].start_request();
        assert_shares(&shares(&lr, &eps, 300), &[1.0 / 3.0, 2.0 / 3.0], 0.01);
    }

    #[test]
    fn bias_zero_ignores_load() {
        let lr = LeastRequest::new(LeastRequestSettings {
            active_request_bias: 0.0,
            bias_explicit: true,
            ..LeastRequestSettings::default()
        });
        let eps = vec![endpoint(1, 1), endpoint(2, 2)];
        let _held: Vec<_> = (0..5).map(|_| eps[1].start_request()).collect();
        assert_shares(
            &shares(&lr, &eps, PICKS),
            &[1.0 / 3.0, 2.0 / 3.0],
            TOLERANCE,
        );
    }

    #[test]
    fn more_choices_than_endpoints_is_a_full_scan() {
        let lr = LeastRequest::new(LeastRequestSettings {
            choice_count: 5,
            ..LeastRequestSettings::default()
        });
        let eps: Vec<_> = (1..=5).map(|p| endpoint(p, 1)).collect();
        let _held: Vec<_> = [4, 3, 2, 0, 5]
            .iter()
            .zip(&eps)
            .flat_map(|(n, e)| (0..*n).map(|_| e.start_request()).collect::<Vec<_>>())
            .collect();
        assert_shares(&shares(&lr, &eps, 1000), &[0.0, 0.0, 0.0, 1.0, 0.0], 0.0);
    }

    #[test]
    fn a_new_endpoint_list_gets_a_new_schedule() {
        let lr = egressd();
        let eps = list(vec![endpoint(1, 1), endpoint(2, 3)]);
        assert!(lr.pick(&eps, None).is_some());
        let more = vec![endpoint(1, 1), endpoint(2, 3), endpoint(3, 4)];
        assert_shares(&shares(&lr, &more, PICKS), &[0.125, 0.375, 0.5], TOLERANCE);
    }

    #[test]
    fn a_ramping_endpoint_gets_its_slow_start_share() {
        // Ready 1 s into a 10 s window: factor 0.1 (the floor); the other is past its window.
        let slow = SlowStartSettings {
            window: std::time::Duration::from_secs(10),
            ..SlowStartSettings::default()
        };
        let lr = LeastRequest::new(LeastRequestSettings {
            slow_start: Some(slow),
            ..LeastRequestSettings::default()
        });
        let eps = vec![endpoint(1, 1), endpoint(2, 1)];
        let now = 100_000;
        eps[0].set_ready_since_ms(0);
        eps[1].set_ready_since_ms(now - 1_000);
        assert!(now < ramp_until_ms(&slow, &eps));
        let schedules = Schedules::new();
        let mut counts = [0usize; 2];
        for _ in 0..11_000 {
            let picked = lr
                .pick_weighted(&eps, &schedules, Some((&slow, now)))
                .unwrap();
            counts[usize::from(Arc::ptr_eq(picked, &eps[1]))] += 1;
        }
        assert!((9_800..=10_200).contains(&counts[0]), "{counts:?}");
        // Half way through: factor 0.5, a third of the traffic.
        eps[1].set_ready_since_ms(now - 5_000);
        let schedules = Schedules::new();
        let mut counts = [0usize; 2];
        for _ in 0..9_000 {
            let picked = lr
                .pick_weighted(&eps, &schedules, Some((&slow, now)))
                .unwrap();
            counts[usize::from(Arc::ptr_eq(picked, &eps[1]))] += 1;
        }
        assert!((2_900..=3_100).contains(&counts[1]), "{counts:?}");
        // Past the window for both: no slow start.
        assert!(now + 20_000 >= ramp_until_ms(&slow, &eps));
    }

    /// What weighted least request converges to when every request lasts the same number of
    /// picks: an endpoint's pick rate is proportional to `weight / (in flight + 1)`, and its
    /// requests in flight at a pick are its share of the `concurrency - 1` others open. At
    /// concurrency 1 that is the weights' proportion; with load, unequal weights are flattened
    /// (as in Envoy). Solved by damped fixed-point iteration.
    fn expected_least_request(weights: &[u32], concurrency: usize) -> Vec<f64> {
        let others = (concurrency - 1) as f64;
        let mut share = proportional(weights);
        for _ in 0..10_000 {
            let raw: Vec<f64> = weights
                .iter()
                .zip(&share)
                .map(|(&w, &s)| f64::from(w) / (s * others + 1.0))
                .collect();
            let total: f64 = raw.iter().sum();
            for (s, r) in share.iter_mut().zip(&raw) {
                *s = 0.5 * *s + 0.5 * r / total;
            }
        }
        share
    }

    #[test]
    fn shares_hold_for_one_to_eight_endpoints_sequential_and_concurrent() {
        for n in 1..=8 {
            for weights in weight_sets(n) {
                for concurrency in [1, 8] {
                    for (mode, lr) in [("egressd", egressd()), ("envoy", envoy())] {
                        let eps: Vec<_> = weights
                            .iter()
                            .enumerate()
                            .map(|(i, &w)| endpoint(i as u16 + 1, w))
                            .collect();
                        let got = shares_under_load(&lr, &eps, concurrency, 20_000);
                        let expected = expected_least_request(&weights, concurrency);
                        let off = got
                            .iter()
                            .zip(&expected)
                            .map(|(g, e)| (g - e).abs())
                            .fold(0.0, f64::max);
                        assert!(
                            off <= 0.03,
                            "{mode}, weights {weights:?}, concurrency {concurrency}: {got:?}, expected {expected:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn after_slow_start_both_endpoints_share_sequential_traffic() {
        let slow = SlowStartSettings {
            window: std::time::Duration::from_millis(1),
            ..SlowStartSettings::default()
        };
        let lr = LeastRequest::new(LeastRequestSettings {
            slow_start: Some(slow),
            ..LeastRequestSettings::default()
        });
        let eps = vec![endpoint(1, 1), endpoint(2, 1)];
        // The second endpoint came up later; both windows are long over.
        eps[0].set_ready_since_ms(0);
        eps[1].set_ready_since_ms(1);
        assert_shares(&shares_under_load(&lr, &eps, 1, 20_000), &[0.5, 0.5], 0.03);
    }
}
