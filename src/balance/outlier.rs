//! Outlier detection (passive health checking): endpoints that fail in a row, or fail far more
//! often than their peers, are ejected from balancing for a while, longer each time they are
//! ejected again soon after.
//!
//! Semantics follow Envoy's outlier detector (`docs/balancing-and-health.md`) with egressd's
//! defaults (docs/configuration.md): consecutive gateway errors (502/503/504, connect failures, resets,
//! timeouts) eject at 5 and are enforced by default; consecutive 5xx count every 5xx, are
//! always detected at their threshold and eject only when configured; with
//! `splitExternalLocalOriginErrors`, failures egressd saw itself (connect failures, resets,
//! timeouts, TLS and protocol errors) feed a separate consecutive-local-origin detector and
//! only HTTP statuses feed the others. Success-rate and failure-percentage detection run on
//! the interval tick over the previous interval's counts, when configured. At most
//! `maxEjectionPercent` (50) of a group is ejected at once, but one endpoint always may be
//! (`alwaysEjectOneEndpoint`). An ejection lasts `min(base × multiplier, max) + jitter`; the
//! multiplier grows with each ejection and shrinks by one for each interval an endpoint stays
//! healthy after its return. Unejection happens on the interval tick, or at once when an
//! active health check passes (see `health`).
//!
//! Hot path: recording a result is a relaxed atomic increment or a reset of the counters (plus
//! two increments when rate detection is on). Ejecting and unejecting take the group's mutex
//! (rare) and publish a new list of pickable endpoints.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// `healthCheck.passive`, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutlierSettings {
    pub interval: Duration,
    /// Enforced consecutive gateway errors (None: off).
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive 5xx: always detected at this count (Envoy's default 5)...
    pub consecutive_5xx: u32,
    /// ...and ejecting only when `consecutive5XxErrors` is set.
    pub enforce_5xx: bool,
    /// Count local-origin failures apart from HTTP statuses.
    pub split_local_origin: bool,
    /// Consecutive local-origin failures that eject (split mode only).
    pub consecutive_local_origin: u32,
    pub success_rate: Option<SuccessRateSettings>,
    pub failure_percentage: Option<FailurePercentageSettings>,
    pub base_ejection_time: Duration,
    pub max_ejection_time: Duration,
    pub max_ejection_jitter: Duration,
    pub max_ejection_percent: u32,
    pub always_eject_one: bool,
    /// Percentage of healthy endpoints below which picks ignore health (0: never).
    pub panic_threshold: u32,
}

impl Default for OutlierSettings {
    fn default() -> Self {
        OutlierSettings {
            interval: Duration::from_secs(10),
            consecutive_gateway_errors: Some(5),
            consecutive_5xx: 5,
            enforce_5xx: false,
            split_local_origin: false,
            consecutive_local_origin: 5,
            success_rate: None,
            failure_percentage: None,
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_jitter: Duration::ZERO,
            max_ejection_percent: 50,
            always_eject_one: true,
            panic_threshold: 50,
        }
    }
}

impl OutlierSettings {
    /// Whether requests must be counted per interval (rate-based detection is on).
    pub(crate) fn counts_rates(&self) -> bool {
        self.success_rate.is_some() || self.failure_percentage.is_some()
    }
}

/// `successRate`: eject endpoints whose success rate is more than `stdev_factor / 1000`
/// standard deviations below the mean of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SuccessRateSettings {
    pub(crate) stdev_factor: u32,
    pub(crate) minimum_hosts: u32,
    pub(crate) request_volume: u32,
}

impl Default for SuccessRateSettings {
    fn default() -> Self {
        SuccessRateSettings {
            stdev_factor: 1900,
            minimum_hosts: 5,
            request_volume: 100,
        }
    }
}

/// `failurePercentage`: eject endpoints failing at least `threshold` percent of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FailurePercentageSettings {
    pub(crate) threshold: u32,
    pub(crate) minimum_hosts: u32,
    pub(crate) request_volume: u32,
}

impl Default for FailurePercentageSettings {
    fn default() -> Self {
        FailurePercentageSettings {
            threshold: 85,
            minimum_hosts: 5,
            request_volume: 50,
        }
    }
}

/// How one exchange with an endpoint went, as outlier detection sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Any response below 500.
    Success,
    /// 500, 501, 505..599.
    ServerError,
    /// 502, 503, 504.
    GatewayError,
    /// No (usable) response: connect failure, reset, timeout, TLS or protocol failure. Counts
    /// as a gateway error unless local-origin errors are split out.
    LocalOriginFailure,
}

impl Outcome {
    pub(crate) fn of_status(status: u16) -> Outcome {
        match status {
            502..=504 => Outcome::GatewayError,
            500..=599 => Outcome::ServerError,
            _ => Outcome::Success,
        }
    }

    fn is_failure(self) -> bool {
        self != Outcome::Success
    }
}

/// Why an endpoint was ejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EjectReason {
    ConsecutiveGatewayErrors,
    Consecutive5xx,
    ConsecutiveLocalOriginFailures,
    SuccessRate,
    FailurePercentage,
}

impl EjectReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EjectReason::ConsecutiveGatewayErrors => "consecutive_gateway_errors",
            EjectReason::Consecutive5xx => "consecutive_5xx",
            EjectReason::ConsecutiveLocalOriginFailures => "consecutive_local_origin_failures",
            EjectReason::SuccessRate => "success_rate",
            EjectReason::FailurePercentage => "failure_percentage",
        }
    }

    /// Whether this detector ejects under `settings` (the others are detected and counted).
    pub(crate) fn enforced(self, settings: &OutlierSettings) -> bool {
        match self {
            EjectReason::Consecutive5xx => settings.enforce_5xx,
            _ => true,
        }
    }
}

/// What became of a detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ejected,
    /// The detector is not enforced (consecutive 5xx without `consecutive5XxErrors`).
    NotEnforced,
    /// `maxEjectionPercent` reached (Envoy's `ejections_overflow`).
    OverMaxEjectionPercent,
    /// The endpoint is already ejected (Envoy drops these events).
    AlreadyEjected,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Ejected => "ejected",
            Verdict::NotEnforced => "not_enforced",
            Verdict::OverMaxEjectionPercent => "over_max_ejection_percent",
            Verdict::AlreadyEjected => "already_ejected",
        }
    }
}

/// A detector fired for an endpoint, and what was done about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detection {
    pub(crate) reason: EjectReason,
    pub(crate) verdict: Verdict,
}

impl From<Detection> for crate::telemetry::metrics::DetectionEvent {
    fn from(d: Detection) -> Self {
        crate::telemetry::metrics::DetectionEvent {
            reason: d.reason.as_str(),
            verdict: d.verdict.as_str(),
            ejected: d.verdict == Verdict::Ejected,
        }
    }
}

/// Per-endpoint outlier state; lives in the `Endpoint`, so it survives reloads.
#[derive(Debug, Default)]
pub(crate) struct OutlierState {
    consecutive_gateway: AtomicU32,
    consecutive_5xx: AtomicU32,
    consecutive_local: AtomicU32,
    /// This interval's requests and failures (rate detection only), taken at each tick.
    interval_requests: AtomicU32,
    interval_failures: AtomicU32,
    ejected: AtomicBool,
    /// Changed only under the group's ejection lock. Made by the first ejection: most
    /// endpoints are never ejected, and 20,000 of them would carry 1.1 MB of it.
    detail: Mutex<Option<Box<Ejection>>>,
}

/// The slow-changing part of an endpoint's outlier state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ejection {
    pub(crate) ejected_at: Option<Instant>,
    /// How long the current (or last) ejection lasts.
    pub(crate) duration: Duration,
    /// Ejections back to back make each one longer: `base × multiplier`.
    pub(crate) multiplier: u32,
    pub(crate) last_unejected: Option<Instant>,
    pub(crate) reason: Option<EjectReason>,
    pub(crate) ejections: u64,
}

/// Plain load first: the common case (nothing to reset) writes nothing.
fn reset(counter: &AtomicU32) {
    if counter.load(Ordering::Relaxed) != 0 {
        counter.store(0, Ordering::Relaxed);
    }
}

fn bump(counter: &AtomicU32) -> u32 {
    counter.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
}

impl OutlierState {
    pub(crate) fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Counts a result; returns the detector whose threshold was just reached. Detection uses
    /// equality, as in Envoy, so a detector that could not eject fires again only after
    /// another full run (its counter is also reset in `try_eject`).
    pub(crate) fn record(
        &self,
        outcome: Outcome,
        settings: &OutlierSettings,
    ) -> Option<EjectReason> {
        let split = settings.split_local_origin;
        if settings.counts_rates() && !(split && outcome == Outcome::LocalOriginFailure) {
            self.interval_requests.fetch_add(1, Ordering::Relaxed);
            if outcome.is_failure() {
                self.interval_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        let outcome = match outcome {
            Outcome::LocalOriginFailure if !split => Outcome::GatewayError,
            o => o,
        };
        if split && outcome != Outcome::LocalOriginFailure {
            // An HTTP status means the connection worked: a local-origin success.
            reset(&self.consecutive_local);
        }
        match outcome {
            Outcome::Success => {
                reset(&self.consecutive_gateway);
                reset(&self.consecutive_5xx);
                None
            }
            Outcome::ServerError => {
                reset(&self.consecutive_gateway);
                (bump(&self.consecutive_5xx) == settings.consecutive_5xx)
                    .then_some(EjectReason::Consecutive5xx)
            }
            Outcome::GatewayError => {
                let g = bump(&self.consecutive_gateway);
                let n = bump(&self.consecutive_5xx);
                // Gateway first: when both thresholds are reached by one response, the
                // gateway ejection is the one that happens (as in Envoy).
                if settings.consecutive_gateway_errors == Some(g) {
                    Some(EjectReason::ConsecutiveGatewayErrors)
                } else if n == settings.consecutive_5xx {
                    Some(EjectReason::Consecutive5xx)
                } else {
                    None
                }
            }
            Outcome::LocalOriginFailure => (bump(&self.consecutive_local)
                == settings.consecutive_local_origin)
                .then_some(EjectReason::ConsecutiveLocalOriginFailures),
        }
    }

    /// This interval's counts, starting the next interval at zero.
    pub(crate) fn take_interval_counts(&self) -> IntervalCounts {
        IntervalCounts {
            requests: self.interval_requests.swap(0, Ordering::Relaxed),
            failures: self.interval_failures.swap(0, Ordering::Relaxed),
        }
    }

    fn reset_counters(&self) {
        self.consecutive_gateway.store(0, Ordering::Relaxed);
        self.consecutive_5xx.store(0, Ordering::Relaxed);
        self.consecutive_local.store(0, Ordering::Relaxed);
    }

    fn reset_counter(&self, reason: EjectReason) {
        match reason {
            EjectReason::ConsecutiveGatewayErrors => &self.consecutive_gateway,
            EjectReason::Consecutive5xx => &self.consecutive_5xx,
            EjectReason::ConsecutiveLocalOriginFailures => &self.consecutive_local,
            EjectReason::SuccessRate | EjectReason::FailurePercentage => return,
        }
        .store(0, Ordering::Relaxed);
    }

    /// A copy of the ejection details (for `/endpoints`).
    pub(crate) fn ejection(&self) -> Ejection {
        lock(&self.detail).as_deref().copied().unwrap_or_default()
    }

    /// Current runs: (gateway errors, 5xx, local-origin failures).
    pub(crate) fn consecutive(&self) -> (u32, u32, u32) {
        (
            self.consecutive_gateway.load(Ordering::Relaxed),
            self.consecutive_5xx.load(Ordering::Relaxed),
            self.consecutive_local.load(Ordering::Relaxed),
        )
    }

    /// Ejects, if the detector is enforced and the group's cap allows (`ejected_now`:
    /// endpoints of the group ejected now, `group_size`: all of them). Call under the group
    /// lock.
    pub(crate) fn try_eject(
        &self,
        reason: EjectReason,
        settings: &OutlierSettings,
        ejected_now: usize,
        group_size: usize,
        now: Instant,
    ) -> Verdict {
        // The counter that fired starts over whatever happens (Envoy: a detector that could
        // not eject fires again after another full run of errors).
        self.reset_counter(reason);
        if self.is_ejected() || group_size == 0 {
            return Verdict::AlreadyEjected;
        }
        let within_cap =
            100 * (ejected_now + 1) <= settings.max_ejection_percent as usize * group_size;
        if !(within_cap || (settings.always_eject_one && ejected_now == 0)) {
            return Verdict::OverMaxEjectionPercent;
        }
        if !reason.enforced(settings) {
            return Verdict::NotEnforced;
        }
        let mut detail = lock(&self.detail);
        let detail = detail.get_or_insert_default();
        // The multiplier grows while the ejection it gives stays below max + base.
        let base = settings.base_ejection_time;
        if base * detail.multiplier < settings.max_ejection_time + base {
            detail.multiplier += 1;
        }
        let jitter = if settings.max_ejection_jitter.is_zero() {
            Duration::ZERO
        } else {
            Duration::from_millis(fastrand::u64(
                ..=settings.max_ejection_jitter.as_millis() as u64,
            ))
        };
        detail.duration = (base * detail.multiplier).min(settings.max_ejection_time) + jitter;
        detail.ejected_at = Some(now);
        detail.reason = Some(reason);
        detail.ejections += 1;
        self.ejected.store(true, Ordering::Relaxed);
        self.reset_counters();
        Verdict::Ejected
    }

    /// Ends an ejection now (a passing active health check); the multiplier is kept, so a
    /// relapse still lasts longer. Returns whether it was ejected. Call under the group lock.
    pub(crate) fn uneject(&self, now: Instant) -> bool {
        if !self.is_ejected() {
            return false;
        }
        let mut detail = lock(&self.detail);
        self.ejected.store(false, Ordering::Relaxed);
        detail.get_or_insert_default().last_unejected = Some(now);
        self.reset_counters();
        true
    }

    /// The interval tick for this endpoint: unejects when its time is up, and takes one step
    /// off the multiplier after each healthy interval. Returns true if it was unejected.
    pub(crate) fn tick(&self, settings: &OutlierSettings, now: Instant) -> bool {
        let mut detail = lock(&self.detail);
        let Some(detail) = detail.as_deref_mut() else {
            // Never ejected (`try_eject` makes the detail): nothing to end, no multiplier.
            return false;
        };
        if self.is_ejected() {
            let due = detail
                .ejected_at
                .is_none_or(|at| now.duration_since(at) >= detail.duration);
            if due {
                self.ejected.store(false, Ordering::Relaxed);
                detail.last_unejected = Some(now);
                self.reset_counters();
                return true;
            }
        } else if detail
            .last_unejected
            .is_some_and(|at| now.duration_since(at) >= settings.interval)
        {
            detail.multiplier = detail.multiplier.saturating_sub(1);
        }
        false
    }
}

fn lock(m: &Mutex<Option<Box<Ejection>>>) -> std::sync::MutexGuard<'_, Option<Box<Ejection>>> {
    // Ejection is plain data copied in and out: a poisoned lock still holds a valid value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One endpoint's requests and failures over the last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IntervalCounts {
    pub(crate) requests: u32,
    pub(crate) failures: u32,
}

impl IntervalCounts {
    fn success_percent(self) -> f64 {
        100.0 * f64::from(self.requests - self.failures.min(self.requests))
            / f64::from(self.requests)
    }
}

/// Rate-based detection over the last interval (Envoy's `processSuccessRateEjections`).
/// `counts[i]` is `None` for endpoints that are ejected (they take no part); returns the
/// indices found to be outliers, success-rate outliers first. An endpoint found by both
/// detectors is listed once.
pub(crate) fn rate_outliers(
    counts: &[Option<IntervalCounts>],
    settings: &OutlierSettings,
) -> Vec<(usize, EjectReason)> {
    let mut found = Vec::new();
    let hosts = counts.len() as u64;
    let sr = settings.success_rate;
    let fp = settings.failure_percentage;
    let too_few = |min: Option<u32>| min.is_none_or(|m| hosts < u64::from(m));
    if too_few(sr.map(|s| s.minimum_hosts)) && too_few(fp.map(|f| f.minimum_hosts)) {
        return found;
    }
    let with_volume = |volume: u32| -> Vec<(usize, f64)> {
        counts
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.filter(|c| c.requests > 0 && c.requests >= volume)
                    .map(|c| (i, c.success_percent()))
            })
            .collect()
    };
    if let Some(sr) = sr {
        let set = with_volume(sr.request_volume);
        if !set.is_empty() && set.len() >= sr.minimum_hosts as usize {
            let n = set.len() as f64;
            let mean = set.iter().map(|(_, r)| r).sum::<f64>() / n;
            let variance = set.iter().map(|(_, r)| (r - mean).powi(2)).sum::<f64>() / n;
            let threshold = mean - f64::from(sr.stdev_factor) / 1000.0 * variance.sqrt();
            found.extend(
                set.iter()
                    .filter(|(_, r)| *r < threshold)
                    .map(|(i, _)| (*i, EjectReason::SuccessRate)),
            );
        }
    }
    if let Some(fp) = fp {
        let set = with_volume(fp.request_volume);
        if !set.is_empty() && set.len() >= fp.minimum_hosts as usize {
            for (i, rate) in set {
                let already = found.iter().any(|(j, _)| *j == i);
                if !already && 100.0 - rate >= f64::from(fp.threshold) {
                    found.push((i, EjectReason::FailurePercentage));
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OutlierSettings {
        OutlierSettings {
            enforce_5xx: true,
            max_ejection_percent: 100,
            ..OutlierSettings::default()
        }
    }

    fn eject(state: &OutlierState, s: &OutlierSettings, ejected: usize, of: usize) -> Verdict {
        state.try_eject(EjectReason::Consecutive5xx, s, ejected, of, Instant::now())
    }

    #[test]
    fn a_success_resets_the_run() {
        let s = settings();
        let state = OutlierState::default();
        assert_eq!(state.record(Outcome::ServerError, &s), None);
        assert_eq!(state.record(Outcome::Success, &s), None);
        for _ in 0..4 {
            assert_eq!(state.record(Outcome::ServerError, &s), None);
        }
        assert_eq!(
            state.record(Outcome::ServerError, &s),
            Some(EjectReason::Consecutive5xx)
        );
    }

    #[test]
    fn a_500_resets_the_gateway_run_but_not_the_5xx_run() {
        // Envoy's BasicFlowGatewayFailure: 503, 500, 503×5 → 5xx detected at the 5th
        // response (not enforced by default), gateway ejection at the 7th.
        let s = OutlierSettings::default();
        let state = OutlierState::default();
        use Outcome::{GatewayError as G, ServerError as S};
        let fired: Vec<_> = [G, S, G, G, G, G, G]
            .into_iter()
            .map(|o| state.record(o, &s))
            .collect();
        assert_eq!(fired[4], Some(EjectReason::Consecutive5xx));
        assert!(!EjectReason::Consecutive5xx.enforced(&s));
        assert_eq!(fired[6], Some(EjectReason::ConsecutiveGatewayErrors));
        assert!(fired[..4].iter().chain(&fired[5..6]).all(Option::is_none));
    }

    #[test]
    fn local_origin_failures_count_as_gateway_errors_unless_split() {
        let s = OutlierSettings::default();
        let state = OutlierState::default();
        for _ in 0..4 {
            assert_eq!(state.record(Outcome::LocalOriginFailure, &s), None);
        }
        assert_eq!(
            state.record(Outcome::LocalOriginFailure, &s),
            Some(EjectReason::ConsecutiveGatewayErrors)
        );

        // Split (Envoy's BasicFlowLocalOriginFailure): 4 failures, a connection that worked,
        // 2 failures: no detection; 5 in a row: the local-origin detector.
        let split = OutlierSettings {
            split_local_origin: true,
            ..s
        };
        let state = OutlierState::default();
        for _ in 0..4 {
            assert_eq!(state.record(Outcome::LocalOriginFailure, &split), None);
        }
        assert_eq!(state.record(Outcome::GatewayError, &split), None);
        for _ in 0..4 {
            assert_eq!(state.record(Outcome::LocalOriginFailure, &split), None);
        }
        assert_eq!(
            state.record(Outcome::LocalOriginFailure, &split),
            Some(EjectReason::ConsecutiveLocalOriginFailures)
        );
        // HTTP statuses alone feed the gateway detector: 4 more 503s complete its run of 5.
        for _ in 0..3 {
            assert_eq!(state.record(Outcome::GatewayError, &split), None);
        }
        assert_eq!(
            state.record(Outcome::GatewayError, &split),
            Some(EjectReason::ConsecutiveGatewayErrors)
        );
    }

    #[test]
    fn ejections_grow_with_the_multiplier_up_to_the_max() {
        let s = OutlierSettings {
            base_ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(25),
            ..settings()
        };
        let state = OutlierState::default();
        let t0 = Instant::now();
        let mut durations = Vec::new();
        for i in 0..4u32 {
            let at = t0 + Duration::from_secs(100 * u64::from(i));
            assert_eq!(
                state.try_eject(EjectReason::Consecutive5xx, &s, 0, 2, at),
                Verdict::Ejected
            );
            durations.push(state.ejection().duration.as_secs());
            assert!(state.tick(&s, at + Duration::from_secs(100)));
        }
        assert_eq!(durations, vec![10, 20, 25, 25]);
    }

    #[test]
    fn jitter_stays_within_its_bound() {
        let s = OutlierSettings {
            max_ejection_jitter: Duration::from_millis(50),
            ..settings()
        };
        for _ in 0..200 {
            let state = OutlierState::default();
            assert_eq!(eject(&state, &s, 0, 2), Verdict::Ejected);
            let d = state.ejection().duration;
            assert!(d >= s.base_ejection_time && d <= s.base_ejection_time + s.max_ejection_jitter);
        }
    }

    #[test]
    fn the_cap_allows_one_when_always_eject_one_is_set() {
        let s = OutlierSettings {
            max_ejection_percent: 10,
            ..settings()
        };
        assert_eq!(eject(&OutlierState::default(), &s, 0, 3), Verdict::Ejected);
        assert_eq!(
            eject(&OutlierState::default(), &s, 1, 3),
            Verdict::OverMaxEjectionPercent
        );
        let strict = OutlierSettings {
            always_eject_one: false,
            ..s
        };
        assert_eq!(
            eject(&OutlierState::default(), &strict, 0, 3),
            Verdict::OverMaxEjectionPercent
        );
        // MaxEjectionPercentageSingleHost: one endpoint, 90%: 100% > 90%.
        let single = OutlierSettings {
            max_ejection_percent: 90,
            ..strict
        };
        assert_eq!(
            eject(&OutlierState::default(), &single, 0, 1),
            Verdict::OverMaxEjectionPercent
        );
    }

    #[test]
    fn an_unenforced_detector_ejects_nothing() {
        let s = OutlierSettings::default();
        let state = OutlierState::default();
        assert_eq!(eject(&state, &s, 0, 2), Verdict::NotEnforced);
        assert!(!state.is_ejected());
    }

    fn counts(rates: &[(u32, u32)]) -> Vec<Option<IntervalCounts>> {
        rates
            .iter()
            .map(|&(requests, failures)| Some(IntervalCounts { requests, failures }))
            .collect()
    }

    #[test]
    fn success_rate_ejects_below_mean_minus_stdev_factor_stdevs() {
        let s = OutlierSettings {
            success_rate: Some(SuccessRateSettings::default()),
            ..OutlierSettings::default()
        };
        // The reference's worked example: {50,100,100,100,100} → mean 90, stdev 20,
        // threshold 52: the first is out.
        let c = counts(&[(100, 50), (100, 0), (100, 0), (100, 0), (100, 0)]);
        assert_eq!(rate_outliers(&c, &s), vec![(0, EjectReason::SuccessRate)]);
        // Four at 100% and one at 99%: still an outlier (threshold 100 - 0.96·1).
        let c = counts(&[(100, 0), (100, 0), (100, 1), (100, 0), (100, 0)]);
        assert_eq!(rate_outliers(&c, &s), vec![(2, EjectReason::SuccessRate)]);
        // Below the request volume, or too few endpoints: nothing.
        let c = counts(&[(99, 50), (100, 0), (100, 0), (100, 0), (100, 0)]);
        assert_eq!(rate_outliers(&c, &s), vec![]);
        let c = counts(&[(100, 50), (100, 0), (100, 0), (100, 0)]);
        assert_eq!(rate_outliers(&c, &s), vec![]);
        // Ejected endpoints take no part.
        let mut c = counts(&[(100, 50), (100, 0), (100, 0), (100, 0), (100, 0)]);
        c[1] = None;
        assert_eq!(rate_outliers(&c, &s), vec![]);
    }

    #[test]
    fn failure_percentage_ejects_at_its_threshold() {
        let s = OutlierSettings {
            failure_percentage: Some(FailurePercentageSettings {
                threshold: 50,
                minimum_hosts: 3,
                request_volume: 10,
            }),
            ..OutlierSettings::default()
        };
        let c = counts(&[(10, 5), (10, 4), (20, 20), (9, 9)]);
        assert_eq!(
            rate_outliers(&c, &s),
            vec![
                (0, EjectReason::FailurePercentage),
                (2, EjectReason::FailurePercentage)
            ]
        );
    }

    #[test]
    fn rates_are_counted_only_when_rate_detection_is_on() {
        let state = OutlierState::default();
        state.record(Outcome::ServerError, &OutlierSettings::default());
        assert_eq!(state.take_interval_counts(), IntervalCounts::default());
        let s = OutlierSettings {
            failure_percentage: Some(FailurePercentageSettings::default()),
            ..OutlierSettings::default()
        };
        for o in [
            Outcome::Success,
            Outcome::ServerError,
            Outcome::LocalOriginFailure,
        ] {
            state.record(o, &s);
        }
        assert_eq!(
            state.take_interval_counts(),
            IntervalCounts {
                requests: 3,
                failures: 2
            }
        );
        assert_eq!(state.take_interval_counts(), IntervalCounts::default());
    }
}
