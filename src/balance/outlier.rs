//! Outlier detection (passive health checking): endpoints that fail in a row are ejected from
//! balancing for a while, longer each time they are ejected again soon after.
//!
//! Semantics follow Envoy (`../shared/reference/balancing-and-outliers.md` §2) with egressd's
//! defaults (CONFIG.md): consecutive gateway errors (502/503/504, connect failures, resets,
//! timeouts) eject at 5 and are enforced by default; consecutive 5xx count every 5xx and eject
//! only when configured; at most `maxEjectionPercent` (50) of a group is ejected at once, but
//! one endpoint always may be (`alwaysEjectOneEndpoint`). An ejection lasts
//! `min(base × multiplier, max) + jitter`; the multiplier grows with each ejection and shrinks
//! by one for each interval an endpoint stays healthy after its return. Unejection happens on
//! the interval tick, or at once when an active health check passes (see `health`).
//!
//! Hot path: recording a result is a relaxed atomic increment or a reset of two counters.
//! Ejecting and unejecting take the group's mutex (rare) and publish a new list of pickable
//! endpoints.

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
    /// Enforced consecutive 5xx (None: off, the default).
    pub consecutive_5xx: Option<u32>,
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
            consecutive_5xx: None,
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_jitter: Duration::ZERO,
            max_ejection_percent: 50,
            always_eject_one: true,
            panic_threshold: 50,
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
    /// 502, 503, 504, or no response: connect failure, reset, timeout.
    GatewayError,
}

impl Outcome {
    pub fn of_status(status: u16) -> Outcome {
        match status {
            502..=504 => Outcome::GatewayError,
            500..=599 => Outcome::ServerError,
            _ => Outcome::Success,
        }
    }
}

/// Why an endpoint was ejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EjectReason {
    ConsecutiveGatewayErrors,
    Consecutive5xx,
}

impl EjectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EjectReason::ConsecutiveGatewayErrors => "consecutive_gateway_errors",
            EjectReason::Consecutive5xx => "consecutive_5xx",
        }
    }
}

/// Per-endpoint outlier state; lives in the `Endpoint`, so it survives reloads.
#[derive(Debug, Default)]
pub struct OutlierState {
    consecutive_gateway: AtomicU32,
    consecutive_5xx: AtomicU32,
    ejected: AtomicBool,
    /// Changed only under the group's ejection lock.
    detail: Mutex<Ejection>,
}

/// The slow-changing part of an endpoint's outlier state.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ejection {
    pub ejected_at: Option<Instant>,
    /// How long the current (or last) ejection lasts.
    pub duration: Duration,
    /// Ejections back to back make each one longer: `base × multiplier`.
    pub multiplier: u32,
    pub last_unejected: Option<Instant>,
    pub reason: Option<EjectReason>,
    pub ejections: u64,
}

impl OutlierState {
    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Relaxed)
    }

    /// Counts a result; returns the reason when a threshold was just reached.
    pub fn record(&self, outcome: Outcome, settings: &OutlierSettings) -> Option<EjectReason> {
        match outcome {
            Outcome::Success => {
                // Plain loads first: the common case writes nothing.
                if self.consecutive_gateway.load(Ordering::Relaxed) != 0 {
                    self.consecutive_gateway.store(0, Ordering::Relaxed);
                }
                if self.consecutive_5xx.load(Ordering::Relaxed) != 0 {
                    self.consecutive_5xx.store(0, Ordering::Relaxed);
                }
                None
            }
            Outcome::ServerError => {
                self.consecutive_gateway.store(0, Ordering::Relaxed);
                let n = self.consecutive_5xx.fetch_add(1, Ordering::Relaxed) + 1;
                (settings.consecutive_5xx == Some(n)).then_some(EjectReason::Consecutive5xx)
            }
            Outcome::GatewayError => {
                let g = self.consecutive_gateway.fetch_add(1, Ordering::Relaxed) + 1;
                let n = self.consecutive_5xx.fetch_add(1, Ordering::Relaxed) + 1;
                // Gateway first: when both thresholds are reached by one response, the
                // gateway ejection is the one that happens (as in Envoy).
                if settings.consecutive_gateway_errors == Some(g) {
                    Some(EjectReason::ConsecutiveGatewayErrors)
                } else if settings.consecutive_5xx == Some(n) {
                    Some(EjectReason::Consecutive5xx)
                } else {
                    None
                }
            }
        }
    }

    fn reset_counters(&self) {
        self.consecutive_gateway.store(0, Ordering::Relaxed);
        self.consecutive_5xx.store(0, Ordering::Relaxed);
    }

    fn reset_counter(&self, reason: EjectReason) {
        match reason {
            EjectReason::ConsecutiveGatewayErrors => &self.consecutive_gateway,
            EjectReason::Consecutive5xx => &self.consecutive_5xx,
        }
        .store(0, Ordering::Relaxed);
    }

    /// A copy of the ejection details (for `/endpoints`).
    pub fn ejection(&self) -> Ejection {
        *lock(&self.detail)
    }

    pub fn consecutive(&self) -> (u32, u32) {
        (
            self.consecutive_gateway.load(Ordering::Relaxed),
            self.consecutive_5xx.load(Ordering::Relaxed),
        )
    }

    /// Ejects, if the group's cap allows (`ejected_now`: endpoints of the group ejected now,
    /// `group_size`: all of them). Returns whether it was ejected. Call under the group lock.
    pub(crate) fn try_eject(
        &self,
        reason: EjectReason,
        settings: &OutlierSettings,
        ejected_now: usize,
        group_size: usize,
        now: Instant,
    ) -> bool {
        // The counter that fired starts over whatever happens (Envoy: a detector that could
        // not eject fires again after another full run of errors).
        self.reset_counter(reason);
        if self.is_ejected() || group_size == 0 {
            return false;
        }
        let within_cap =
            100 * (ejected_now + 1) <= settings.max_ejection_percent as usize * group_size;
        if !(within_cap || (settings.always_eject_one && ejected_now == 0)) {
            return false;
        }
        let mut detail = lock(&self.detail);
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
        true
    }

    /// Ends an ejection now (a passing active health check); the multiplier is kept, so a
    /// relapse still lasts longer. Returns whether it was ejected. Call under the group lock.
    pub(crate) fn uneject(&self, now: Instant) -> bool {
        if !self.is_ejected() {
            return false;
        }
        let mut detail = lock(&self.detail);
        self.ejected.store(false, Ordering::Relaxed);
        detail.last_unejected = Some(now);
        self.reset_counters();
        true
    }

    /// The interval tick for this endpoint: unejects when its time is up, and takes one step
    /// off the multiplier after each healthy interval. Returns true if it was unejected.
    pub(crate) fn tick(&self, settings: &OutlierSettings, now: Instant) -> bool {
        let mut detail = lock(&self.detail);
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

fn lock(m: &Mutex<Ejection>) -> std::sync::MutexGuard<'_, Ejection> {
    // Ejection is plain data copied in and out: a poisoned lock still holds a valid value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OutlierSettings {
        OutlierSettings {
            consecutive_5xx: Some(5),
            max_ejection_percent: 100,
            ..OutlierSettings::default()
        }
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
        // Envoy's BasicFlowGatewayFailure: 503, 500, 503×5 → 5xx fires at the 5th response
        // (if enforced), gateway at the 7th.
        let s = OutlierSettings {
            consecutive_5xx: None,
            ..settings()
        };
        let state = OutlierState::default();
        let seq = [
            Outcome::GatewayError,
            Outcome::ServerError,
            Outcome::GatewayError,
            Outcome::GatewayError,
            Outcome::GatewayError,
            Outcome::GatewayError,
        ];
        for o in seq {
            assert_eq!(state.record(o, &s), None);
        }
        assert_eq!(
            state.record(Outcome::GatewayError, &s),
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
            assert!(state.try_eject(EjectReason::Consecutive5xx, &s, 0, 2, at));
            durations.push(state.ejection().duration.as_secs());
            assert!(state.tick(&s, at + Duration::from_secs(100)));
        }
        assert_eq!(durations, vec![10, 20, 25, 25]);
    }

    #[test]
    fn the_cap_allows_one_when_always_eject_one_is_set() {
        let s = OutlierSettings {
            max_ejection_percent: 10,
            ..settings()
        };
        let now = Instant::now();
        let a = OutlierState::default();
        assert!(a.try_eject(EjectReason::Consecutive5xx, &s, 0, 3, now));
        let b = OutlierState::default();
        assert!(!b.try_eject(EjectReason::Consecutive5xx, &s, 1, 3, now));
        let strict = OutlierSettings {
            always_eject_one: false,
            ..s
        };
        assert!(!OutlierState::default().try_eject(
            EjectReason::Consecutive5xx,
            &strict,
            0,
            3,
            now
        ));
    }
}
