//! One timer for the outlier detectors of every endpoint group with the same interval.
//!
//! Each endpoint group's detector runs its interval logic (success rate, failure percentage,
//! ejection expiry) on a tick. A task and a timer per group cost about 370 bytes each and, at
//! 10,000 Backends with the default 10 s interval, a thousand wake-ups per second of an idle
//! proxy; one task per distinct interval ticks them all. Intervals come from the config, so the
//! number of tasks is bounded by it. A group leaves its list on the first tick after its last
//! snapshot is gone, or earlier when groups are added faster than ticks prune (the hosts
//! clients name under a wildcard Backend): a list is pruned whenever it has doubled since.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::group::DetectionSink;
use super::EndpointGroup;

/// The detector ticks of every group, by interval.
#[derive(Default)]
pub(crate) struct OutlierClock {
    by_interval: Mutex<HashMap<Duration, Arc<Mutex<Ticks>>>>,
}

/// The groups of one interval.
#[derive(Default)]
struct Ticks {
    groups: Vec<Ticked>,
    /// Groups after the last prune (a tick, or an add that found the list doubled).
    live_after_prune: usize,
}

/// Lists this short are pruned by ticks only.
const PRUNE_FLOOR: usize = 32;

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
        let mut ticks = lock(&list);
        if ticks.groups.len() >= 2 * ticks.live_after_prune.max(PRUNE_FLOOR) {
            ticks.groups.retain(|t| t.group.strong_count() > 0);
            ticks.live_after_prune = ticks.groups.len();
        }
        ticks.groups.push(Ticked { group, detections });
    }

    /// How many groups are ticked (those dropped since the last tick included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.by_interval)
            .values()
            .map(|list| lock(list).groups.len())
            .sum()
    }
}

async fn tick_every(interval: Duration, list: Arc<Mutex<Ticks>>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate
    loop {
        tick.tick().await;
        let mut ticks = lock(&list);
        ticks.groups.retain(|t| match t.group.upgrade() {
            Some(group) => {
                for detection in group.outlier_tick() {
                    (t.detections)(detection);
                }
                true
            }
            None => false,
        });
        ticks.live_after_prune = ticks.groups.len();
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

    /// Groups added faster than ticks come (hosts clients name, each forgotten at once) do
    /// not pile up until the next tick.
    #[tokio::test(start_paused = true)]
    async fn dropped_groups_are_pruned_between_ticks_as_they_pile_up() {
        let clock = OutlierClock::default();
        for _ in 0..1000 {
            let dropped = group();
            clock.add(Arc::downgrade(&dropped), Box::new(|_| {}));
            assert!(clock.len() <= 2 * PRUNE_FLOOR);
        }
    }
}
