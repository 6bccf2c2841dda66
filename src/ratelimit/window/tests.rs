use super::*;

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60_000;
const DAY: u64 = 86_400_000;

fn quota(requests: u32, period_ms: u64) -> Quota {
    Quota {
        requests,
        period: Duration::from_millis(period_ms),
    }
}

/// A counter holding `cur` requests in window `window` and `prev` in the one before.
fn holding(window: u32, cur: u32, prev: u32) -> WindowCounter {
    WindowCounter {
        current: AtomicU64::new(pack(window, cur)),
        previous: AtomicU64::new(pack(window.saturating_sub(1), prev)),
    }
}

/// A copy of the counter's state, to probe a decision without changing the original.
fn copy(counter: &WindowCounter) -> WindowCounter {
    WindowCounter {
        current: AtomicU64::new(counter.current.load(Ordering::Relaxed)),
        previous: AtomicU64::new(counter.previous.load(Ordering::Relaxed)),
    }
}

fn allowed_of(counter: &WindowCounter, q: Quota, now_ms: u64, n: usize) -> usize {
    (0..n)
        .filter(|_| counter.acquire(q, now_ms).allowed)
        .count()
}

/// 4 threads released at once by a barrier, `rounds` times on a fresh counter each: thread `i`
/// acquires `per_thread` times at `now(i)`. Returns the requests allowed in each round.
fn race(rounds: usize, per_thread: usize, q: Quota, now: fn(usize) -> u64) -> Vec<usize> {
    let counters: Vec<WindowCounter> = (0..rounds).map(|_| WindowCounter::new()).collect();
    let allowed: Vec<AtomicU64> = (0..rounds).map(|_| AtomicU64::new(0)).collect();
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for i in 0..4 {
            let (counters, allowed, barrier) = (&counters, &allowed, &barrier);
            s.spawn(move || {
                for (counter, total) in counters.iter().zip(allowed) {
                    barrier.wait();
                    let n = allowed_of(counter, q, now(i), per_thread);
                    total.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    allowed
        .iter()
        .map(|n| n.load(Ordering::Relaxed) as usize)
        .collect()
}

#[test]
fn threads_get_exactly_the_limit_through() {
    // 4 threads × 2,500 = 10,000 requests at once against 1,000 a minute.
    let q = quota(1_000, MINUTE);
    for allowed in race(20, 2_500, q, |_| 5 * SECOND) {
        assert_eq!(allowed, 1_000);
    }
    // Small limits, many rounds: more chances for two threads to see the same count.
    for allowed in race(2_000, 20, quota(10, MINUTE), |_| 5 * SECOND) {
        assert_eq!(allowed, 10);
    }
}

#[test]
fn threads_racing_a_rollover_lose_no_count() {
    // Two threads at the last ms of window 4, two at the first of window 5, where window 4
    // weighs fully: whichever order, window 4's count carries over whole, and exactly the
    // limit gets through in all.
    let q = quota(10, SECOND);
    let now = |i: usize| {
        if i.is_multiple_of(2) {
            5 * SECOND - 1
        } else {
            5 * SECOND
        }
    };
    for allowed in race(3_000, 20, q, now) {
        assert_eq!(allowed, 10);
    }
}

#[test]
fn threads_racing_a_rollover_keep_the_previous_window() {
    // 600 in window 4; at the middle of window 5 they weigh 300: exactly 700 more fit, whichever
    // thread rolls the counter over.
    let q = quota(1_000, SECOND);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 4 * SECOND + 10, 600), 600);
    let allowed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let n = allowed_of(&counter, q, 5 * SECOND + 500, 2_500);
                allowed.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(allowed.into_inner(), 700);
}

#[test]
fn a_stale_rollover_keeps_the_winners_previous_count() {
    let q = quota(10, SECOND);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 4 * SECOND, 3), 3);
    // A thread reads (4, 3) and stalls; two more are counted and another thread rolls over.
    let stale = counter.current.load(Ordering::Relaxed);
    assert_eq!(allowed_of(&counter, q, 4 * SECOND, 2), 2);
    assert!(counter.acquire(q, 5 * SECOND).allowed);
    // The stalled thread rolls over from what it read: its CAS fails, `previous` keeps 5.
    counter.roll_over(stale, 5);
    assert_eq!(unpack(counter.previous.load(Ordering::Relaxed)), (4, 5));
    assert_eq!(unpack(counter.current.load(Ordering::Relaxed)), (5, 1));
    assert_eq!(counter.used(q, 5 * SECOND), 6);
    assert_eq!(allowed_of(&counter, q, 5 * SECOND, 10), 4);
}

#[test]
fn the_previous_window_weighs_by_its_overlap() {
    let q = quota(100, MINUTE);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 10 * SECOND, 80), 80);
    // 15 s into the next minute, 45/60 of the 80 still count: 60.
    let now = MINUTE + 15 * SECOND;
    assert_eq!(counter.used(q, now), 60);
    // 80 × 44,999 / 60,000 = 59.998...: rounded down.
    assert_eq!(counter.used(q, now + 1), 59);
    let first = counter.acquire(q, now);
    assert_eq!(
        first,
        Decision {
            allowed: true,
            remaining: 39,
            reset: Duration::from_millis(45 * SECOND),
        }
    );
    // (cur + 1) × 60,000 + 80 × 45,000 ≤ 100 × 60,000 ⇔ cur + 1 ≤ 40.
    assert_eq!(allowed_of(&counter, q, now, 100), 39);
    assert_eq!(counter.used(q, now), 100);
    // Over by (41 × 60,000 + 80 × 45,000) − 6,000,000 = 60,000, shrinking by 80 a ms: 750 ms.
    let denied = counter.acquire(q, now);
    assert_eq!(
        denied,
        Decision {
            allowed: false,
            remaining: 0,
            reset: Duration::from_millis(750),
        }
    );
    assert!(!counter.acquire(q, now + 749).allowed);
    assert!(counter.acquire(q, now + 750).allowed);
}

#[test]
fn retry_after_into_the_next_window() {
    let q = quota(10, SECOND);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 500, 10), 10);
    // No previous window: not before the next one, where the 10 weigh (1,000 − t') / 1,000:
    // 1,000 + 10 × (1,000 − t') ≤ 10,000 ⇔ t' ≥ 100.
    let denied = counter.acquire(q, 500);
    assert!(!denied.allowed);
    assert_eq!(denied.reset, Duration::from_millis(600));
    assert!(!counter.acquire(q, 1_099).allowed);
    assert!(counter.acquire(q, 1_100).allowed);
}

#[test]
fn retry_after_of_a_limit_of_one_is_two_windows_away_at_most() {
    let q = quota(1, SECOND);
    let counter = WindowCounter::new();
    assert!(counter.acquire(q, 300).allowed);
    let denied = counter.acquire(q, 300);
    // The one request weighs until window 2 starts.
    assert_eq!(denied.reset, Duration::from_millis(1_700));
    assert!(!counter.acquire(q, 1_999).allowed);
    assert!(counter.acquire(q, 2_000).allowed);
}

/// A denial's `reset` is the first moment one more request goes through: at `now + reset` it
/// does, at `now + reset − 1` it does not (varied quotas, fills and moments).
#[test]
fn retry_after_is_the_first_moment_allowed() {
    let mut rng = fastrand::Rng::with_seed(33);
    for _ in 0..2_000 {
        let period = [SECOND, MINUTE, 7][rng.usize(..3)];
        let q = quota([1, 2, 3, 10, 97, 1_000][rng.usize(..6)], period);
        let counter = WindowCounter::new();
        let mut now = rng.u64(..3 * period);
        // Requests at increasing moments, at least twice as fast as the limit on average,
        // until one is denied.
        let step = period / (2 * u64::from(q.requests));
        let denied = (0..100_000)
            .find_map(|_| {
                let decision = counter.acquire(q, now);
                if decision.allowed {
                    now += rng.u64(..=step);
                }
                (!decision.allowed).then_some(decision)
            })
            .expect("denied at last");
        let reset = u64::try_from(denied.reset.as_millis()).unwrap();
        assert!(reset >= 1);
        let probe = copy(&counter);
        assert!(
            probe.acquire(q, now + reset).allowed,
            "{q:?} at {now}: reset {reset}"
        );
        let probe = copy(&counter);
        assert!(
            !probe.acquire(q, now + reset - 1).allowed,
            "{q:?} at {now}: reset {reset}"
        );
    }
}

#[test]
fn a_late_clock_is_decided_at_the_start_of_the_counters_window() {
    let q = quota(2, SECOND);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 0, 2), 2);
    // Another thread read 1,000 and rolled over; this one read 999.
    assert!(!counter.acquire(q, SECOND).allowed);
    let late = counter.acquire(q, SECOND - 1);
    assert!(!late.allowed);
    // From 1,000: the two of window 0 weigh 2 × (1,000 − t) / 1,000, so one fits at t = 500.
    assert_eq!(late.reset, Duration::from_millis(501));
    assert!(!counter.acquire(q, 1_499).allowed);
    assert!(counter.acquire(q, 1_500).allowed);
}

#[test]
fn release_gives_back_in_the_same_window_only() {
    let q = quota(3, SECOND);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 100, 3), 3);
    assert!(!counter.acquire(q, 100).allowed);
    counter.release(q, 100);
    assert_eq!(counter.used(q, 100), 2);
    assert!(counter.acquire(q, 200).allowed);
    // Once the window is over, giving back changes nothing.
    assert!(!counter.acquire(q, 1_000).allowed);
    counter.release(q, 900);
    assert_eq!(counter.used(q, 1_000), 3);
    // Nothing counted in this window: nothing to give back.
    counter.release(q, 1_000);
    assert_eq!(counter.current.load(Ordering::Relaxed), pack(1, 0));
}

#[test]
fn idle_once_both_windows_are_past() {
    let q = quota(5, SECOND);
    let counter = WindowCounter::new();
    assert!(counter.is_idle(q, 0));
    assert!(counter.is_idle(q, 5 * SECOND));
    assert!(counter.acquire(q, 5 * SECOND + 10).allowed);
    assert!(!counter.is_idle(q, 5 * SECOND + 10));
    // Still weighs in the next window, up to its last ms.
    assert!(!counter.is_idle(q, 6 * SECOND + 999));
    assert!(counter.is_idle(q, 7 * SECOND));
    // Given back: idle again.
    let counter = WindowCounter::new();
    assert!(counter.acquire(q, 10).allowed);
    counter.release(q, 10);
    assert!(counter.is_idle(q, 10));
}

#[test]
fn a_skipped_window_leaves_no_previous_count() {
    let q = quota(4, SECOND);
    let counter = WindowCounter::new();
    assert_eq!(allowed_of(&counter, q, 3 * SECOND + 900, 4), 4);
    assert_eq!(counter.used(q, 4 * SECOND), 4);
    // Window 4 saw nothing: in window 5 the 4 of window 3 no longer count.
    assert_eq!(counter.used(q, 5 * SECOND), 0);
    assert_eq!(allowed_of(&counter, q, 5 * SECOND, 10), 4);
    assert_eq!(counter.used(q, 5 * SECOND), 4);
    // Rolled over from 3 to 5: `previous` holds window 3, which is not window 4.
    assert_eq!(unpack(counter.previous.load(Ordering::Relaxed)), (3, 4));
}

#[test]
fn a_day_of_u32_max_requests_does_not_overflow() {
    let q = quota(u32::MAX, DAY);
    let day = 10_000u32;
    let start = u64::from(day) * DAY;
    let half = start + DAY / 2;
    // One short of the limit, nothing before: the last one fits.
    let counter = holding(day, u32::MAX - 1, 0);
    let last = counter.acquire(q, half);
    assert_eq!(
        last,
        Decision {
            allowed: true,
            remaining: 0,
            reset: Duration::from_millis(DAY / 2),
        }
    );
    assert_eq!(counter.used(q, half), u32::MAX);
    let denied = counter.acquire(q, half);
    assert!(!denied.allowed);
    // In the next window they weigh u32::MAX × (P − t') / P: one fits after t' = 1 ms.
    assert_eq!(denied.reset, Duration::from_millis(DAY / 2 + 1));
    assert!(counter.acquire(q, start + DAY + 1).allowed);
    // A full previous window at its last ms weighs u32::MAX / P ≈ 49.7: with this one, 50.7.
    let counter = holding(day, 0, u32::MAX);
    let first = counter.acquire(q, start + DAY - 1);
    assert!(first.allowed);
    assert_eq!(first.remaining, u32::MAX - 51);
    // Both windows full: the estimate saturates.
    let counter = holding(day, u32::MAX, u32::MAX);
    assert_eq!(counter.used(q, start), u32::MAX);
    let denied = counter.acquire(q, start);
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    assert_eq!(denied.reset, Duration::from_millis(DAY + 1));
}
