//! Config change detection for the reload loop.
//!
//! [`ConfigWatcher`] turns file system activity in the config directories, and in the
//! directories of files the config references (certificates, keys, credentials), into
//! debounced [`ReloadCause`]s. It combines two sources because neither is enough alone:
//!
//! * inotify (through `notify`) for low latency. Kubernetes and editors replace files
//!   rather than rewrite them (rename over, the ConfigMap `..data` symlink swap), so we
//!   watch *directories* non-recursively and filter by name; a watch on the file itself
//!   would die with the replaced inode.
//! * A periodic fingerprint poll, because bind mounts, NFS and some overlay setups deliver
//!   no inotify events at all and kubelet sync can lag. The poll tick is also where watches
//!   on directories that were missing, deleted or replaced are re-established.
//!
//! Threading: notify calls our handler on its own thread. The handler only takes the short
//! `filter` lock and pushes into an unbounded channel, so it never blocks. One tokio task
//! (the driver) owns debouncing, polling and emission. (Re)registering a watch blocks on a
//! round trip to the notify thread, so it runs on the blocking pool or in the synchronous
//! API calls, and never while `filter` is held: the notify thread may be waiting for that
//! lock, which would deadlock.
//!
//! Layout: this file holds the public API and the state shared between the handle, the driver
//! task and the blocking maintenance jobs; `filter` decides which raw notify events matter;
//! `watch_set` resolves extra files and keeps the notify registrations in line with the
//! wanted directories; `fingerprint` is the poll snapshot; `driver` is the task that
//! debounces, polls and emits.

mod driver;
mod filter;
mod fingerprint;
#[cfg(test)]
mod tests;
mod watch_set;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use notify::Event;
use tokio::sync::{mpsc, oneshot};

use driver::Driver;
use filter::{forward, Filter};
use fingerprint::{Fingerprint, Stamp};
use watch_set::{Resolved, WatchSet};

/// Lower bound for the poll interval: tokio intervals panic on zero, and polling faster
/// than this only burns CPU on stat calls.
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Tuning for [`ConfigWatcher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchOptions {
    /// Quiet period after the last relevant event before a reload is requested. A burst
    /// that keeps going is cut off after ten times this.
    pub debounce: Duration,
    /// How often to fingerprint the watched files as a fallback for file systems that emit
    /// no events, and to retry watches on directories that could not be watched. `None`
    /// disables both; intervals below 10ms are raised to 10ms.
    pub poll_interval: Option<Duration>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(250),
            poll_interval: Some(Duration::from_secs(5)),
        }
    }
}

/// Why a reload was triggered (for logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReloadCause {
    /// File system events reported changes to these paths (de-duplicated, sorted). Empty
    /// when the kernel's event queue overflowed and the individual events were lost.
    FileChange {
        /// The changed paths as the watcher knows them (config dir or extra-file spelling).
        paths: Vec<PathBuf>,
    },
    /// The poll fingerprint changed without any event having announced it.
    Poll,
}

impl std::fmt::Display for ReloadCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadCause::FileChange { paths } if paths.is_empty() => f.write_str("file change"),
            ReloadCause::FileChange { paths } => {
                f.write_str("file change: ")?;
                for (i, p) in paths.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}", p.display())?;
                }
                Ok(())
            }
            ReloadCause::Poll => f.write_str("poll"),
        }
    }
}

/// Errors from [`ConfigWatcher::start`]. Missing directories are not errors: they are
/// logged and picked up by the poll once they appear.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// `start` was called outside a tokio runtime, so the driver task cannot be spawned.
    #[error("ConfigWatcher::start must be called from within a tokio runtime")]
    NoRuntime,
    /// The platform file system notifier (inotify instance, its thread) could not be created.
    #[error("cannot create file system watcher: {0}")]
    Notify(#[from] notify::Error),
}

/// Watches config directories and extra files; sends one `ReloadCause` per debounced burst.
///
/// Dropping it stops everything: the driver task ends (so the receiver yields `None`) and
/// the notify thread shuts down.
#[derive(Debug)]
pub(crate) struct ConfigWatcher {
    shared: Arc<Shared>,
    /// Never sent on: dropping it is the shutdown signal for the driver task.
    _shutdown: oneshot::Sender<()>,
}

impl ConfigWatcher {
    /// Starts watching `dirs` (non-recursively) for `*.yaml`/`*.yml` changes.
    ///
    /// Must be called inside a tokio runtime with timers enabled. Returns the watcher and
    /// the receiving end. The channel holds a single pending cause: if one is already
    /// waiting, later changes are covered by it and are not queued separately.
    pub(crate) fn start(
        dirs: Vec<PathBuf>,
        opts: WatchOptions,
    ) -> Result<(ConfigWatcher, mpsc::Receiver<ReloadCause>), WatchError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| WatchError::NoRuntime)?;

        let config_dirs: Vec<PathBuf> = dirs
            .into_iter()
            .map(absolutize)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut filter = Filter {
            config_dirs: config_dirs.iter().cloned().collect(),
            ..Filter::default()
        };
        filter.apply(Resolved::compute(&config_dirs, &[]));
        let filter = Arc::new(Mutex::new(filter));

        let (event_tx, event_rx) = mpsc::unbounded_channel();
        let handler_filter = Arc::clone(&filter);
        // The handler holds the filter but not `Shared`: `Shared` owns the notify watcher,
        // whose thread owns the handler, so holding `Shared` here would be a cycle that
        // keeps the thread alive forever.
        let watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            forward(&handler_filter, &event_tx, res);
        })?;

        let poll_interval = opts.poll_interval.map(|p| p.max(MIN_POLL_INTERVAL));
        let shared = Arc::new(Shared {
            config_dirs,
            filter,
            watches: Mutex::new(WatchSet::new(watcher)),
            baseline: Mutex::new(None),
        });
        reconcile(&shared.watches, &shared.filter);
        if poll_interval.is_some() {
            // Taken synchronously, after the watches exist: a change made right after
            // `start` returns must differ from the baseline (or be seen by inotify).
            let print = Fingerprint::compute(&shared.config_dirs, &[]);
            *lock(&shared.baseline) = Some(print);
        }

        let (out_tx, out_rx) = mpsc::channel(1);
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let driver = Driver {
            shared: Arc::clone(&shared),
            events: event_rx,
            out: out_tx,
            debounce: opts.debounce,
            poll_interval,
        };
        runtime.spawn(driver.run(shutdown_rx));

        Ok((
            ConfigWatcher {
                shared,
                _shutdown: shutdown_tx,
            },
            out_rx,
        ))
    }

    /// Replace the set of extra files (called after every successful load with the files
    /// the new config references).
    ///
    /// Their parent directories are watched non-recursively; for symlinks, the target's
    /// directory too. Blocks briefly while watches are (un)registered.
    pub(crate) fn set_extra_files(&self, files: Vec<PathBuf>) {
        let files: Vec<PathBuf> = files
            .into_iter()
            .map(absolutize)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let resolved = Resolved::compute(&self.shared.config_dirs, &files);
        {
            let mut filter = lock(&self.shared.filter);
            filter.generation = filter.generation.wrapping_add(1);
            filter.extra_files = files.clone();
            filter.apply(resolved);
        }
        reconcile(&self.shared.watches, &self.shared.filter);

        if lock(&self.shared.baseline).is_none() {
            return;
        }
        let stamps: Vec<(PathBuf, Option<Stamp>)> = files
            .into_iter()
            .map(|p| {
                let stamp = Stamp::of(&p);
                (p, stamp)
            })
            .collect();
        if let Some(base) = lock(&self.shared.baseline).as_mut() {
            // Files we already tracked keep their old stamp, so a change that happened
            // since the last poll is still reported. New files are stamped now: the
            // config that references them has just been loaded, so their current state
            // is what is in use.
            let old = std::mem::take(&mut base.extras);
            base.extras = stamps
                .into_iter()
                .map(|(path, now)| {
                    let stamp = old.get(&path).cloned().unwrap_or(now);
                    (path, stamp)
                })
                .collect();
        }
    }
}

/// State shared by the public handle, the driver task and blocking maintenance jobs.
#[derive(Debug)]
struct Shared {
    /// Absolute, de-duplicated; fixed for the watcher's lifetime.
    config_dirs: Vec<PathBuf>,
    /// What counts as relevant; also read by the notify handler.
    filter: Arc<Mutex<Filter>>,
    /// Lock order: `watches` may be held while taking `filter`, never the reverse.
    watches: Mutex<WatchSet>,
    /// Last poll fingerprint; `None` when polling is disabled.
    baseline: Mutex<Option<Fingerprint>>,
}

impl Shared {
    /// Re-resolves symlinked extra files, re-establishes lost watches and, if asked,
    /// fingerprints the watched files. Blocking: run it on the blocking pool.
    fn maintain(&self, fingerprint: bool) -> Option<Fingerprint> {
        let (generation, extra_files) = {
            let filter = lock(&self.filter);
            (filter.generation, filter.extra_files.clone())
        };
        let resolved = Resolved::compute(&self.config_dirs, &extra_files);
        {
            let mut filter = lock(&self.filter);
            // If set_extra_files ran meanwhile it installed a resolution of the newer list.
            if filter.generation == generation {
                filter.apply(resolved);
            }
        }
        reconcile(&self.watches, &self.filter);
        fingerprint.then(|| Fingerprint::compute(&self.config_dirs, &extra_files))
    }
}

/// Ignores lock poisoning. Every critical section leaves the data usable even if it panics
/// midway (worst case a stale filter or watch list, corrected by the next reconcile), and
/// propagating the panic into the notify thread or the reload loop would be worse.
/// Brings `watches` in line with `filter`'s directories. The filter is read while `watches`
/// is locked (never the other way round), so the last of two reconciles sees the newest set.
fn reconcile(watches: &Mutex<WatchSet>, filter: &Mutex<Filter>) {
    let mut watches = lock(watches);
    let desired = lock(filter).watch_dirs.clone();
    let aliases = watches.reconcile(desired);
    lock(filter).aliases = aliases;
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// notify's event paths are the watched path joined with the entry name, and notify makes
/// relative paths absolute against the current directory. Doing the same (lexically, no
/// symlink resolution) makes event paths and our filter sets compare equal.
fn absolutize(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}
