//! The driver task: debounces events into bursts, runs the poll tick and emits causes.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::{debug, warn};

use super::fingerprint::Fingerprint;
use super::{lock, ReloadCause, Shared};

/// A burst that never goes quiet still reloads after this many debounce periods, so a
/// directory that is rewritten constantly cannot starve the reload loop.
const MAX_BURST_FACTOR: u32 = 10;

/// Relevant events seen since the first one that is not yet announced.
#[derive(Debug)]
struct Burst {
    paths: BTreeSet<PathBuf>,
    first: Instant,
    last: Instant,
}

impl Burst {
    fn new(now: Instant) -> Self {
        Self {
            paths: BTreeSet::new(),
            first: now,
            last: now,
        }
    }

    fn add(&mut self, paths: Vec<PathBuf>, now: Instant) {
        self.paths.extend(paths);
        self.last = now;
    }

    /// Quiet for `debounce`, or capped at `MAX_BURST_FACTOR` debounces since the first event.
    fn deadline(&self, debounce: Duration) -> Instant {
        let quiet = later(self.last, debounce);
        let cap = later(self.first, debounce.saturating_mul(MAX_BURST_FACTOR));
        quiet.min(cap)
    }
}

/// `t + d`, without panicking on absurd durations (a year is "never" here).
fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .unwrap_or_else(|| t + Duration::from_secs(365 * 24 * 3600))
}

/// The task that debounces events, polls and emits causes.
pub(super) struct Driver {
    // Declared first so it is dropped before `out`: once the receiver sees `None`, the
    // notify watcher is already gone (unless the handle still exists).
    pub(super) shared: Arc<Shared>,
    pub(super) events: mpsc::UnboundedReceiver<Vec<PathBuf>>,
    pub(super) out: mpsc::Sender<ReloadCause>,
    pub(super) debounce: Duration,
    pub(super) poll_interval: Option<Duration>,
}

impl Driver {
    pub(super) async fn run(mut self, mut shutdown: oneshot::Receiver<()>) {
        let mut poll = self.poll_interval.map(|period| {
            let mut interval = tokio::time::interval_at(Instant::now() + period, period);
            // After a slow tick, do not fire a catch-up volley of polls.
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            interval
        });
        let mut burst: Option<Burst> = None;
        let mut events_open = true;
        loop {
            let deadline = burst.as_ref().map(|b| b.deadline(self.debounce));
            tokio::select! {
                // Shutdown first; then the deadline ahead of new events, so a constant
                // stream of events cannot postpone the capped deadline forever.
                biased;
                _ = &mut shutdown => break,
                () = sleep_until_opt(deadline) => {
                    let Some(mut pending) = burst.take() else {
                        continue; // Unreachable: the sleep only completes with a deadline.
                    };
                    // Events that queued up while we were not looking belong to this burst.
                    let now = Instant::now();
                    while let Ok(paths) = self.events.try_recv() {
                        pending.add(paths, now);
                    }
                    if pending.deadline(self.debounce) > now {
                        burst = Some(pending);
                        continue;
                    }
                    if !self.finish_burst(pending, poll.is_some()).await {
                        break;
                    }
                }
                msg = self.events.recv(), if events_open => match msg {
                    Some(paths) => {
                        let now = Instant::now();
                        burst.get_or_insert_with(|| Burst::new(now)).add(paths, now);
                    }
                    None => {
                        // The notify thread died (it only does on an internal failure).
                        // Polling, if enabled, still detects changes, so keep going.
                        warn!("file system notifier stopped; relying on polling alone");
                        events_open = false;
                    }
                },
                () = tick_opt(&mut poll) => {
                    if !self.poll_tick(burst.is_some()).await {
                        break;
                    }
                }
            }
        }
        debug!("config watcher stopped");
    }

    /// Announces a finished burst. Returns `false` when the receiver is gone.
    async fn finish_burst(&mut self, burst: Burst, polling: bool) -> bool {
        // Re-establish watches before announcing: a directory that was deleted and
        // recreated during the burst must be watched again before the reload reads it, or
        // a change right after the reload would go unseen until the next poll. The new
        // fingerprint also keeps the poll from reporting this same change a second time.
        if let Some(print) = self.maintain(polling).await {
            if let Some(base) = lock(&self.shared.baseline).as_mut() {
                base.absorb(print);
            }
        }
        let paths: Vec<PathBuf> = burst.paths.into_iter().collect();
        debug!(?paths, "config change detected");
        self.emit(ReloadCause::FileChange { paths })
    }

    /// One poll tick. Returns `false` when the receiver is gone.
    async fn poll_tick(&mut self, burst_open: bool) -> bool {
        let Some(print) = self.maintain(true).await else {
            return true;
        };
        let changed = match lock(&self.shared.baseline).as_mut() {
            Some(base) => base.absorb(print),
            None => Vec::new(),
        };
        // An open burst is announced shortly and covers whatever the poll saw.
        if changed.is_empty() || burst_open {
            return true;
        }
        debug!(?changed, "config change detected by polling");
        self.emit(ReloadCause::Poll)
    }

    async fn maintain(&self, fingerprint: bool) -> Option<Fingerprint> {
        let shared = Arc::clone(&self.shared);
        match tokio::task::spawn_blocking(move || shared.maintain(fingerprint)).await {
            Ok(print) => print,
            Err(error) => {
                warn!(%error, "config watch maintenance failed");
                None
            }
        }
    }

    fn emit(&self, cause: ReloadCause) -> bool {
        emit(&self.out, cause)
    }
}

/// Never waits: if a cause is already pending, the reload it triggers has not started yet
/// and will read this change too. Returns `false` when the receiver is gone.
pub(super) fn emit(out: &mpsc::Sender<ReloadCause>, cause: ReloadCause) -> bool {
    match out.try_send(cause) {
        Ok(()) => true,
        Err(TrySendError::Full(cause)) => {
            debug!(?cause, "reload already pending; it covers this change");
            true
        }
        Err(TrySendError::Closed(_)) => {
            debug!("reload receiver dropped; stopping config watcher");
            false
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

async fn tick_opt(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}
