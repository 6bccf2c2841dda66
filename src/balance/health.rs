//! Active health checking: the per-endpoint state machine and the check schedule.
//!
//! An endpoint starts healthy (an egress proxy that refused traffic until the first check
//! passed would fail every request for up to one interval after each start and each DNS
//! change). `unhealthyThreshold` failed checks in a row mark it unhealthy; `healthyThreshold`
//! passed checks in a row mark it healthy again. Unhealthy endpoints leave the group's
//! pickable list exactly as ejected ones do (see `EndpointGroup`).
//!
//! Hot path: picks read nothing from here. The unhealthy flag is an atomic read only when the
//! group rebuilds its pickable list (a rare event); the rest sits behind a mutex that only the
//! checker and `/endpoints` take.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// What an active check does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CheckKind {
    /// A TCP connect succeeds.
    Tcp,
    /// An HTTP request answered with one of the expected statuses.
    Http(HttpCheck),
    /// An MCP `ping` answered with a result (after `initialize`, in a session the check
    /// deletes again; alone for the stateless protocol 2026-07-28).
    Mcp,
}

/// `healthCheck.active.http`, resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HttpCheck {
    pub(crate) path: String,
    pub(crate) method: http::Method,
    /// `Host` to send; `None`: the Backend's hostname (the endpoint address for IP Backends).
    pub(crate) host: Option<String>,
    pub(crate) expected_statuses: Vec<u16>,
}

/// `healthCheck.active`, resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ActiveSettings {
    pub(crate) kind: CheckKind,
    pub(crate) interval: Duration,
    pub(crate) interval_jitter: Duration,
    pub(crate) timeout: Duration,
    pub(crate) unhealthy_threshold: u32,
    pub(crate) healthy_threshold: u32,
    /// A pass ends an outlier ejection at once (Envoy's
    /// `successful_active_health_check_uneject_host`).
    pub(crate) uneject_on_pass: bool,
}

impl ActiveSettings {
    pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
    pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
    pub(crate) const DEFAULT_UNHEALTHY_THRESHOLD: u32 = 3;
    pub(crate) const DEFAULT_HEALTHY_THRESHOLD: u32 = 1;

    /// The time to the next check of an endpoint: the interval plus a random jitter.
    pub(crate) fn next_interval(&self) -> Duration {
        if self.interval_jitter.is_zero() {
            return self.interval;
        }
        let max = u64::try_from(self.interval_jitter.as_millis()).unwrap_or(u64::MAX);
        self.interval + Duration::from_millis(fastrand::u64(..=max))
    }
}

/// How one check went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CheckResult {
    Pass,
    /// Why it failed, for `/endpoints` and the logs.
    Fail(String),
}

/// A change of an endpoint's health, which makes its group rebuild its pickable list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    BecameHealthy,
    BecameUnhealthy,
}

/// What `/endpoints` shows of an endpoint's active health.
#[derive(Clone, Debug, Default)]
pub(crate) struct HealthDetail {
    /// Passed checks in a row (counted while unhealthy, towards `healthyThreshold`).
    pub(crate) consecutive_passes: u32,
    /// Failed checks in a row (counted while healthy, towards `unhealthyThreshold`).
    pub(crate) consecutive_failures: u32,
    pub(crate) last_check: Option<SystemTime>,
    pub(crate) last_pass: Option<bool>,
    pub(crate) last_failure: Option<String>,
    /// When the checker runs the next check (scheduling state that survives a reload, so that
    /// frequent reloads do not postpone checks).
    pub(crate) next_due: Option<Instant>,
}

/// Per-endpoint active health; lives in the `Endpoint`, so it survives reloads and DNS
/// refreshes that keep the address.
#[derive(Debug, Default)]
pub(crate) struct HealthState {
    unhealthy: AtomicBool,
    /// Boxed: `Endpoint` stays as small as before for the counters picks read. Made by the
    /// first check: most endpoints are never checked (10,000 Backends: 1.6 MB).
    detail: std::sync::OnceLock<Box<Mutex<HealthDetail>>>,
}

impl HealthState {
    pub(crate) fn is_unhealthy(&self) -> bool {
        self.unhealthy.load(Ordering::Relaxed)
    }

    /// A copy of the details (for `/endpoints`).
    pub(crate) fn detail(&self) -> HealthDetail {
        self.detail
            .get()
            .map_or_else(HealthDetail::default, |detail| unpoisoned(detail).clone())
    }

    /// Counts a check result; says when the endpoint changed health. Call under the group's
    /// lock, so the change and the pickable rebuild are not interleaved with another.
    pub(crate) fn record(
        &self,
        result: &CheckResult,
        settings: &ActiveSettings,
        at: SystemTime,
    ) -> Option<Transition> {
        let mut d = self.lock();
        d.last_check = Some(at);
        let unhealthy = self.is_unhealthy();
        match result {
            CheckResult::Pass => {
                d.last_pass = Some(true);
                d.consecutive_failures = 0;
                d.consecutive_passes = d.consecutive_passes.saturating_add(1);
                if unhealthy && d.consecutive_passes >= settings.healthy_threshold {
                    self.unhealthy.store(false, Ordering::Relaxed);
                    return Some(Transition::BecameHealthy);
                }
            }
            CheckResult::Fail(reason) => {
                d.last_pass = Some(false);
                d.last_failure = Some(reason.clone());
                d.consecutive_passes = 0;
                d.consecutive_failures = d.consecutive_failures.saturating_add(1);
                if !unhealthy && d.consecutive_failures >= settings.unhealthy_threshold {
                    self.unhealthy.store(true, Ordering::Relaxed);
                    return Some(Transition::BecameUnhealthy);
                }
            }
        }
        None
    }

    /// When the next check is due, setting it to `first` if the endpoint was never scheduled.
    pub(crate) fn due_or(&self, first: Instant) -> Instant {
        *self.lock().next_due.get_or_insert(first)
    }

    pub(crate) fn set_next_due(&self, at: Instant) {
        self.lock().next_due = Some(at);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthDetail> {
        unpoisoned(self.detail.get_or_init(Box::default))
    }
}

fn unpoisoned(detail: &Mutex<HealthDetail>) -> std::sync::MutexGuard<'_, HealthDetail> {
    // Plain data copied in and out: a poisoned lock still holds a valid value.
    detail.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first check of the `i`-th of `n` endpoints: the group's checks are spread evenly over
/// one interval from a random `phase` (so that many groups started together do not check at
/// the same instants either), never fired all at once.
pub(crate) fn start_offset(i: usize, n: usize, interval: Duration, phase: Duration) -> Duration {
    if n == 0 || interval.is_zero() {
        return Duration::ZERO;
    }
    let interval_ns = interval.as_nanos();
    let slot = interval_ns * (i % n) as u128 / n as u128;
    let offset = (phase.as_nanos() + slot) % interval_ns;
    Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(unhealthy: u32, healthy: u32) -> ActiveSettings {
        ActiveSettings {
            kind: CheckKind::Tcp,
            interval: Duration::from_secs(1),
            interval_jitter: Duration::ZERO,
            timeout: Duration::from_millis(100),
            unhealthy_threshold: unhealthy,
            healthy_threshold: healthy,
            uneject_on_pass: true,
        }
    }

    fn fail() -> CheckResult {
        CheckResult::Fail("connection refused".into())
    }

    #[test]
    fn an_endpoint_starts_healthy() {
        assert!(!HealthState::default().is_unhealthy());
    }

    #[test]
    fn unhealthy_after_the_threshold_of_failures_in_a_row() {
        let s = settings(3, 1);
        let h = HealthState::default();
        let now = SystemTime::now();
        assert_eq!(h.record(&fail(), &s, now), None);
        assert_eq!(h.record(&fail(), &s, now), None);
        assert_eq!(
            h.record(&fail(), &s, now),
            Some(Transition::BecameUnhealthy)
        );
        assert!(h.is_unhealthy());
        // More failures change nothing.
        assert_eq!(h.record(&fail(), &s, now), None);
        assert_eq!(
            h.detail().last_failure.as_deref(),
            Some("connection refused")
        );
    }

    #[test]
    fn a_pass_resets_the_failure_run() {
        let s = settings(3, 1);
        let h = HealthState::default();
        let now = SystemTime::now();
        h.record(&fail(), &s, now);
        h.record(&fail(), &s, now);
        assert_eq!(h.record(&CheckResult::Pass, &s, now), None);
        assert_eq!(h.record(&fail(), &s, now), None);
        assert_eq!(h.record(&fail(), &s, now), None);
        assert!(!h.is_unhealthy());
    }

    #[test]
    fn healthy_again_after_the_threshold_of_passes_in_a_row() {
        let s = settings(1, 2);
        let h = HealthState::default();
        let now = SystemTime::now();
        assert_eq!(
            h.record(&fail(), &s, now),
            Some(Transition::BecameUnhealthy)
        );
        assert_eq!(h.record(&CheckResult::Pass, &s, now), None);
        // A failure in between starts the run of passes over.
        assert_eq!(h.record(&fail(), &s, now), None);
        assert_eq!(h.record(&CheckResult::Pass, &s, now), None);
        assert_eq!(
            h.record(&CheckResult::Pass, &s, now),
            Some(Transition::BecameHealthy)
        );
        assert!(!h.is_unhealthy());
    }

    #[test]
    fn start_offsets_spread_a_group_over_the_interval() {
        let interval = Duration::from_millis(400);
        let offsets: Vec<Duration> = (0..4)
            .map(|i| start_offset(i, 4, interval, Duration::from_millis(50)))
            .collect();
        assert_eq!(
            offsets,
            [50, 150, 250, 350].map(Duration::from_millis).to_vec()
        );
        // The phase wraps around the interval.
        assert_eq!(
            start_offset(3, 4, interval, Duration::from_millis(100)),
            Duration::ZERO
        );
        assert_eq!(start_offset(0, 0, interval, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn jitter_stays_within_its_bound() {
        let s = ActiveSettings {
            interval_jitter: Duration::from_millis(50),
            ..settings(1, 1)
        };
        for _ in 0..100 {
            let next = s.next_interval();
            assert!(next >= s.interval && next <= s.interval + s.interval_jitter);
        }
        assert_eq!(settings(1, 1).next_interval(), Duration::from_secs(1));
    }
}
