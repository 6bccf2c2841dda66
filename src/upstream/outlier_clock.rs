//! One timer for the outlier detectors of every endpoint group with the same interval.
//!
//! Each endpoint group's detector runs its interval logic (success rate, failure percentage,
//! ejection expiry) on a tick. A task and a timer per group cost about 370 bytes each and, at
//! 10,000 Backends with the default 10 s interval, a thousand wake-ups per second of an idle
//! proxy; one task per distinct interval ticks them all. Intervals come from the config, so the
//! number of tasks is bounded by it. A group leaves its list on the first tick after its last
//! snapshot is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::group::DetectionSink;
use super::EndpointGroup;

/// The detector ticks of every group, by interval.
#[derive(Default)]
pub(crate) struct OutlierClock {
    by_interval: Mutex<HashMap<Duration, Arc<Mutex<Vec<Ticked>>>>>,
}

impl std::fmt::Debug for OutlierClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutlierClock").finish_non_exhaustive()
    }
}

/// A group whose detector ticks, and where its detections are reported.
struct Ticked {
    group: Weak<EndpointGroup>,
    detections: DetectionSink,
}

impl OutlierClock {
    /// Ticks `group`'s detector at its interval until the group is dropped, reporting what the
    /// ticks detect to `detections`. Called within a tokio runtime (it may start the task of a
    /// new interval).
    pub(crate) fn add(&self, group: Weak<EndpointGroup>, detections: DetectionSink) {
        let Some(interval) = group.upgrade().map(|g| g.outlier_interval()) else {
            return;
        };
        let list = {
            let mut clocks = lock(&self.by_interval);
            clocks
                .entry(interval)
                .or_insert_with(|| {
                    let list = Arc::default();
                    tokio::spawn(tick_every(interval, Arc::clone(&list)));
                    list
                })
                .clone()
        };
        lock(&list).push(Ticked { group, detections });
    }

    /// How many groups are ticked (those dropped since the last tick included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.by_interval)
            .values()
            .map(|list| lock(list).len())
            .sum()
    }
}

async fn tick_every(interval: Duration, list: Arc<Mutex<Vec<Ticked>>>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    loop {
        tick.tick().await;
        lock(&list).retain(|t| match t.group.upgrade() {
            Some(group) => {
                for detection in group.outlier_tick() {
                    (t.detections)(detection);
                }
                true
            }
            None => false,
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Pushes and retains leave the lists consistent even after a panic elsewhere.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::outlier::{Outcome, OutlierSettings};
    use crate::balance::RoundRobin;
    use crate::upstream::endpoint::test_endpoint;
    use crate::upstream::GroupSettings;

    fn settings() -> OutlierSettings {
        OutlierSettings {
            max_ejection_percent: 100,
            ..OutlierSettings::default()
        }
    }

    fn group() -> Arc<EndpointGroup> {
        let outlier = settings();
        Arc::new(EndpointGroup::new_static(
            vec![test_endpoint(1, 1), test_endpoint(2, 1)],
            || Box::new(RoundRobin::new()),
            GroupSettings {
                outlier,
                ..GroupSettings::default()
            },
        ))
    }

    /// Two groups of one interval share one task; the tick brings an ejected endpoint back
    /// once its ejection time is up, and a dropped group leaves the list. Virtual time.
    #[tokio::test(start_paused = true)]
    async fn one_task_ticks_every_group_of_an_interval_and_forgets_dropped_ones() {
        let clock = OutlierClock::default();
        let (kept, dropped) = (group(), group());
        clock.add(Arc::downgrade(&kept), Box::new(|_| {}));
        clock.add(Arc::downgrade(&dropped), Box::new(|_| {}));
        assert_eq!(clock.len(), 2);
        assert_eq!(lock(&clock.by_interval).len(), 1);

        let first = kept.list().endpoints[0].clone();
        for _ in 0..5 {
            kept.record(&first, Outcome::GatewayError);
        }
        assert!(first.outlier.is_ejected());
        drop(dropped);
        let settings = settings();
        tokio::time::sleep(settings.base_ejection_time + settings.interval * 2).await;
        assert!(!first.outlier.is_ejected(), "the tick ended the ejection");
        assert_eq!(clock.len(), 1);
    }
}
