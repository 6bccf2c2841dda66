//! Slow start: an endpoint that just became ready (new in the group, back from an ejection, or
//! healthy again by active checks) gets a share of traffic that grows over `window`, instead of
//! its full share at once — a cold cache or a just-restarted JVM is not swamped.
//!
//! Envoy's formula (`reference/balancing-and-outliers.md` §1.6):
//! `weight × max(min_weight_percent / 100, (max(t, 1 ms) / window)^(1 / aggression))`, where `t`
//! is the time since the endpoint became ready. egressd also starts slow start when an
//! endpoint comes back from an outlier ejection (Envoy only after active checks or when the
//! host is added): a recovering endpoint is the one most likely to fall over again under a
//! full share.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::Candidate;

/// `loadBalancer.slowStart`, resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlowStartSettings {
    pub(crate) window: Duration,
    /// 1.0 grows linearly; larger values ramp up faster at first.
    pub(crate) aggression: f64,
    /// The smallest factor, as a fraction (minWeightPercent / 100).
    pub(crate) min_factor: f64,
}

impl Default for SlowStartSettings {
    fn default() -> Self {
        SlowStartSettings {
            window: Duration::from_secs(30),
            aggression: 1.0,
            min_factor: 0.1,
        }
    }
}

/// Milliseconds since this process's first call: the clock endpoints' ready times use (fits
/// an atomic, unlike `Instant`).
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl SlowStartSettings {
    /// The weight factor of an endpoint ready since `ready_ms`, at `now_ms`; 1.0 once the
    /// window has passed.
    pub(crate) fn factor(&self, ready_ms: u64, now_ms: u64) -> f64 {
        let window = self.window.as_millis() as u64;
        let t = now_ms.saturating_sub(ready_ms).max(1);
        if window == 0 || t >= window {
            return 1.0;
        }
        let time_factor = t as f64 / window as f64;
        let aggression = if self.aggression.is_finite() && self.aggression > 0.0 {
            self.aggression
        } else {
            1.0
        };
        let factor = if aggression == 1.0 {
            time_factor
        } else {
            time_factor.powf(1.0 / aggression)
        };
        factor.max(self.min_factor)
    }
}

/// Until when some endpoint of `endpoints` is in slow start (in [`now_ms`] milliseconds; 0
/// for an empty list). Computed once per list: lists are rebuilt whenever an endpoint joins or
/// comes back, which is when slow start begins.
pub(crate) fn ramp_until_ms<E: Candidate>(
    settings: &SlowStartSettings,
    endpoints: &[Arc<E>],
) -> u64 {
    let newest = endpoints.iter().map(|e| e.ready_since_ms()).max();
    newest.map_or(0, |n| n + settings.window.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factor_follows_envoys_formula() {
        let s = SlowStartSettings {
            window: Duration::from_secs(10),
            aggression: 1.0,
            min_factor: 0.1,
        };
        assert_eq!(s.factor(0, 5_000), 0.5);
        assert_eq!(s.factor(0, 500), 0.1, "floored at minWeightPercent");
        assert_eq!(s.factor(0, 10_000), 1.0);
        assert_eq!(s.factor(1_000, 100_000), 1.0);
        let aggressive = SlowStartSettings {
            aggression: 2.0,
            ..s
        };
        assert!(
            (aggressive.factor(0, 2_500) - 0.5).abs() < 1e-9,
            "sqrt(0.25)"
        );
        let broken = SlowStartSettings {
            aggression: f64::NAN,
            ..s
        };
        assert_eq!(
            broken.factor(0, 5_000),
            0.5,
            "aggression NaN falls back to 1"
        );
    }
}
