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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tracing::{debug, info, warn};

/// Name of the symlink the Kubernetes AtomicWriter swaps to publish a new ConfigMap or
/// Secret revision. Per-key files are symlinks through it, so swapping it changes every
/// file without any event on the files' own names.
const DATA_LINK: &str = "..data";

/// A burst that never goes quiet still reloads after this many debounce periods, so a
/// directory that is rewritten constantly cannot starve the reload loop.
const MAX_BURST_FACTOR: u32 = 10;

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
pub enum ReloadCause {
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
pub struct ConfigWatcher {
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
    pub fn start(
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
        lock(&shared.watches).reconcile(&shared.filter);
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
    pub fn set_extra_files(&self, files: Vec<PathBuf>) {
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
        lock(&self.shared.watches).reconcile(&self.shared.filter);

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
        lock(&self.watches).reconcile(&self.filter);
        fingerprint.then(|| Fingerprint::compute(&self.config_dirs, &extra_files))
    }
}

/// Ignores lock poisoning. Every critical section leaves the data usable even if it panics
/// midway (worst case a stale filter or watch list, corrected by the next reconcile), and
/// propagating the panic into the notify thread or the reload loop would be worse.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// notify's event paths are the watched path joined with the entry name, and notify makes
/// relative paths absolute against the current directory. Doing the same (lexically, no
/// symlink resolution) makes event paths and our filter sets compare equal.
fn absolutize(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// Runs on the notify thread for every raw event.
fn forward(
    filter: &Mutex<Filter>,
    events: &mpsc::UnboundedSender<Vec<PathBuf>>,
    res: notify::Result<Event>,
) {
    match res {
        Ok(event) => {
            let hits = lock(filter).classify(&event);
            if let Some(paths) = hits {
                if event.need_rescan() {
                    warn!("file system event queue overflowed; reloading config to be safe");
                }
                // Fails only once the driver has stopped, when nobody needs to know.
                let _ = events.send(paths);
            }
        }
        Err(error) => warn!(%error, "file system watch error"),
    }
}

/// Decides which raw events matter.
#[derive(Debug, Default)]
struct Filter {
    config_dirs: HashSet<PathBuf>,
    /// Extra files as last given to `set_extra_files` (absolute, sorted, unique).
    extra_files: Vec<PathBuf>,
    /// Bumped by every `set_extra_files`, so a slower background resolution of an older
    /// list does not overwrite a newer one.
    generation: u64,
    /// Extra files plus the canonical targets of those that are symlinks.
    extra_match: HashSet<PathBuf>,
    /// Lexical parents of extra files, where a `..data` swap also counts.
    extra_dirs: HashSet<PathBuf>,
    /// Every directory that should be watched.
    watch_dirs: BTreeSet<PathBuf>,
    /// Watched path -> other wanted paths naming the same directory. inotify keeps one
    /// watch per inode and notify reports it under one path only, so events arriving under
    /// the watched spelling are also checked under each alias.
    aliases: HashMap<PathBuf, Vec<PathBuf>>,
}

impl Filter {
    fn apply(&mut self, resolved: Resolved) {
        self.extra_match = resolved.matches;
        self.extra_dirs = resolved.parents;
        self.watch_dirs = resolved.watch_dirs;
    }

    /// The relevant paths of `event`, or `None` if it does not concern the config.
    fn classify(&self, event: &Event) -> Option<Vec<PathBuf>> {
        if event.need_rescan() {
            // Events were dropped; we cannot know what changed, so assume something did.
            return Some(Vec::new());
        }
        if !is_change(&event.kind) {
            return None;
        }
        let replaces_entry = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
        );
        let mut hits = Vec::new();
        for path in &event.paths {
            if self.watch_dirs.contains(path) {
                // A watched directory itself was deleted, moved or recreated: its files
                // changed with it. (Attribute changes on it are not interesting.)
                if replaces_entry {
                    hits.push(path.clone());
                }
                continue;
            }
            if self.is_relevant_file(path) {
                hits.push(path.clone());
            }
            if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
                for alias in self.aliases.get(parent).into_iter().flatten() {
                    let candidate = alias.join(name);
                    if self.is_relevant_file(&candidate) {
                        hits.push(candidate);
                    }
                }
            }
        }
        (!hits.is_empty()).then_some(hits)
    }

    fn is_relevant_file(&self, path: &Path) -> bool {
        if self.extra_match.contains(path) {
            return true;
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return false;
        };
        let in_config_dir = self.config_dirs.contains(parent);
        if name == OsStr::new(DATA_LINK) {
            return in_config_dir || self.extra_dirs.contains(parent);
        }
        in_config_dir && is_config_file_name(name)
    }
}

/// Whether an event kind can mean changed content.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        // A finished write; cheap to count and marks the end of a writer's work.
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        // Opening and reading is what the reload itself does; counting it would make every
        // reload trigger the next one.
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// `*.yaml` / `*.yml` (any case), excluding dot-files: those are editor swap files and the
/// AtomicWriter's staging entries, never config.
fn is_config_file_name(name: &OsStr) -> bool {
    if name.as_encoded_bytes().first() == Some(&b'.') {
        return false;
    }
    Path::new(name)
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("yaml") || ext.eq_ignore_ascii_case("yml"))
}

/// Extra files resolved against the file system (symlink targets may move).
#[derive(Debug, Default)]
struct Resolved {
    matches: HashSet<PathBuf>,
    parents: HashSet<PathBuf>,
    watch_dirs: BTreeSet<PathBuf>,
}

impl Resolved {
    fn compute(config_dirs: &[PathBuf], extra_files: &[PathBuf]) -> Self {
        let mut resolved = Resolved::default();
        resolved.watch_dirs.extend(config_dirs.iter().cloned());
        for file in extra_files {
            resolved.matches.insert(file.clone());
            if let Some(parent) = file.parent() {
                resolved.parents.insert(parent.to_path_buf());
                resolved.watch_dirs.insert(parent.to_path_buf());
            }
            // Replacing a symlink's target makes no event next to the link (unless it is
            // the `..data` swap), so also watch the directory the link points into.
            if let Ok(target) = fs::canonicalize(file) {
                if target != *file {
                    if let Some(parent) = target.parent() {
                        resolved.watch_dirs.insert(parent.to_path_buf());
                    }
                    resolved.matches.insert(target);
                }
            }
        }
        resolved
    }
}

/// Identity of a directory: (device, inode) where the platform has them.
type DirId = Option<(u64, u64)>;

/// `None` if `path` does not exist or is not a directory (following symlinks, as inotify does).
fn dir_identity(path: &Path) -> Option<DirId> {
    let meta = fs::metadata(path).ok()?;
    meta.is_dir().then(|| platform_dir_id(&meta))
}

#[cfg(unix)]
fn platform_dir_id(meta: &fs::Metadata) -> DirId {
    use std::os::unix::fs::MetadataExt;
    Some((meta.dev(), meta.ino()))
}

#[cfg(not(unix))]
fn platform_dir_id(_meta: &fs::Metadata) -> DirId {
    None
}

/// The notify watcher and what we registered with it.
#[derive(Debug)]
struct WatchSet {
    watcher: RecommendedWatcher,
    /// Registered directories and the identity they had just before registration.
    active: BTreeMap<PathBuf, DirId>,
    /// Directories we could not watch; remembered to warn once instead of every poll tick.
    failing: BTreeSet<PathBuf>,
}

impl WatchSet {
    fn new(watcher: RecommendedWatcher) -> Self {
        Self {
            watcher,
            active: BTreeMap::new(),
            failing: BTreeSet::new(),
        }
    }

    /// Brings the registered watches in line with `filter.watch_dirs` and the disk.
    ///
    /// A registration is dropped when it is no longer wanted or when its path now names a
    /// different directory (deleted, moved away, recreated, symlink retargeted): an inotify
    /// watch follows the inode, not the name. Missing ones are (re)added, one per directory
    /// identity. Never called with `filter` locked (see the module docs).
    fn reconcile(&mut self, filter: &Mutex<Filter>) {
        let desired = lock(filter).watch_dirs.clone();
        let current: BTreeMap<PathBuf, Option<DirId>> = desired
            .iter()
            .map(|dir| (dir.clone(), dir_identity(dir)))
            .collect();

        let mut stale: Vec<PathBuf> = self
            .active
            .iter()
            .filter(|(dir, id)| current.get(*dir) != Some(&Some(**id)))
            .map(|(dir, _)| dir.clone())
            .collect();
        // Two registrations sharing an inode (a symlink was retargeted onto a directory we
        // already watch) share one inotify watch; removing either kills both, so redo both.
        let mut seen: HashMap<(u64, u64), &PathBuf> = HashMap::new();
        for (dir, id) in &self.active {
            if let Some(id) = id {
                if let Some(other) = seen.insert(*id, dir) {
                    stale.push(other.clone());
                    stale.push(dir.clone());
                }
            }
        }
        for dir in stale {
            if self.active.remove(&dir).is_some() {
                // Fails harmlessly when notify already dropped the watch (directory deleted).
                if let Err(error) = self.watcher.unwatch(&dir) {
                    debug!(dir = %dir.display(), %error, "unwatch failed");
                }
            }
        }

        let mut by_id: HashMap<(u64, u64), PathBuf> = self
            .active
            .iter()
            .filter_map(|(dir, id)| id.map(|id| (id, dir.clone())))
            .collect();
        let mut aliases: HashMap<PathBuf, Vec<PathBuf>> = HashMap::new();
        for (dir, id) in current {
            if self.active.contains_key(&dir) {
                continue;
            }
            let Some(id) = id else {
                self.note_failure(&dir, &"does not exist or is not a directory");
                continue;
            };
            if let Some(watched) = id.and_then(|id| by_id.get(&id)) {
                aliases
                    .entry(watched.clone())
                    .or_default()
                    .push(dir.clone());
                self.failing.remove(&dir);
                continue;
            }
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    if self.failing.remove(&dir) {
                        info!(dir = %dir.display(), "watching config directory again");
                    }
                    if let Some(id) = id {
                        by_id.insert(id, dir.clone());
                    }
                    self.active.insert(dir, id);
                }
                Err(error) => self.note_failure(&dir, &error),
            }
        }
        self.failing.retain(|dir| desired.contains(dir));
        lock(filter).aliases = aliases;
    }

    fn note_failure(&mut self, dir: &Path, reason: &dyn Display) {
        if self.failing.insert(dir.to_path_buf()) {
            warn!(
                dir = %dir.display(),
                %reason,
                "cannot watch directory; retrying on each poll tick and after each change",
            );
        } else {
            debug!(dir = %dir.display(), %reason, "directory still cannot be watched");
        }
    }
}

/// Cheap change detector for one file: follows symlinks, so a `..data` swap or a replaced
/// target shows up as a new inode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Stamp {
    /// `None` for missing files (and dangling symlinks), so appearing and vanishing count.
    fn of(path: &Path) -> Option<Self> {
        let meta = fs::metadata(path).ok()?;
        Some(Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode: inode(&meta),
        })
    }
}

#[cfg(unix)]
fn inode(meta: &fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.ino()
}

#[cfg(not(unix))]
fn inode(_meta: &fs::Metadata) -> u64 {
    0
}

/// Poll snapshot. Extra files are kept apart from the directory scan because their set
/// changes with every `set_extra_files`, and that change alone must not count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Fingerprint {
    dirs: BTreeMap<PathBuf, Option<Stamp>>,
    extras: BTreeMap<PathBuf, Option<Stamp>>,
}

impl Fingerprint {
    fn compute(config_dirs: &[PathBuf], extra_files: &[PathBuf]) -> Self {
        let mut dirs = BTreeMap::new();
        for dir in config_dirs {
            // A missing directory contributes nothing; its files appearing is the change.
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if is_config_file_name(&entry.file_name()) {
                    let path = entry.path();
                    let stamp = Stamp::of(&path);
                    dirs.insert(path, stamp);
                }
            }
        }
        let extras = extra_files
            .iter()
            .map(|path| (path.clone(), Stamp::of(path)))
            .collect();
        Self { dirs, extras }
    }

    /// Makes `current` the new baseline and returns the paths that differ. Extra files are
    /// compared only where both snapshots know them: the set may have been replaced while
    /// `current` was computed, and set membership changes are not file changes.
    fn absorb(&mut self, current: Fingerprint) -> Vec<PathBuf> {
        let mut changed: Vec<PathBuf> = current
            .dirs
            .iter()
            .filter(|(path, stamp)| self.dirs.get(*path) != Some(*stamp))
            .map(|(path, _)| path.clone())
            .collect();
        changed.extend(
            self.dirs
                .keys()
                .filter(|path| !current.dirs.contains_key(*path))
                .cloned(),
        );
        self.dirs = current.dirs;
        for (path, stamp) in &mut self.extras {
            if let Some(now) = current.extras.get(path) {
                if now != stamp {
                    changed.push(path.clone());
                    stamp.clone_from(now);
                }
            }
        }
        changed
    }
}

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
struct Driver {
    // Declared first so it is dropped before `out`: once the receiver sees `None`, the
    // notify watcher is already gone (unless the handle still exists).
    shared: Arc<Shared>,
    events: mpsc::UnboundedReceiver<Vec<PathBuf>>,
    out: mpsc::Sender<ReloadCause>,
    debounce: Duration,
    poll_interval: Option<Duration>,
}

impl Driver {
    async fn run(mut self, mut shutdown: oneshot::Receiver<()>) {
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
fn emit(out: &mpsc::Sender<ReloadCause>, cause: ReloadCause) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Weak;
    use tokio::time::timeout;

    const DEBOUNCE: Duration = Duration::from_millis(50);
    const DEADLINE: Duration = Duration::from_secs(5);

    fn events_only() -> WatchOptions {
        WatchOptions {
            debounce: DEBOUNCE,
            poll_interval: None,
        }
    }

    async fn next(rx: &mut mpsc::Receiver<ReloadCause>) -> ReloadCause {
        timeout(DEADLINE, rx.recv())
            .await
            .expect("no reload trigger before the deadline")
            .expect("trigger channel closed")
    }

    async fn next_paths(rx: &mut mpsc::Receiver<ReloadCause>) -> Vec<PathBuf> {
        match next(rx).await {
            ReloadCause::FileChange { paths } => paths,
            other => panic!("expected a file change, got {other:?}"),
        }
    }

    async fn assert_quiet(rx: &mut mpsc::Receiver<ReloadCause>, debounce: Duration) {
        let res = timeout(debounce * 3, rx.recv()).await;
        assert!(res.is_err(), "unexpected trigger: {res:?}");
    }

    fn write_replace(path: &Path, content: &str) {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        fs::write(&tmp, content).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    #[cfg(unix)]
    fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
        std::os::unix::fs::symlink(target, link).unwrap();
    }

    /// Builds a Kubernetes AtomicWriter-style volume: `..<ts>/<key>`, `..data -> ..<ts>`,
    /// `<key> -> ..data/<key>`.
    #[cfg(unix)]
    fn atomic_writer_init(dir: &Path, ts: &str, key: &str, content: &str) {
        let data = dir.join(format!("..{ts}"));
        fs::create_dir(&data).unwrap();
        fs::write(data.join(key), content).unwrap();
        symlink(format!("..{ts}"), dir.join(DATA_LINK));
        symlink(format!("{DATA_LINK}/{key}"), dir.join(key));
    }

    /// The AtomicWriter update: new timestamped dir, `..data_tmp` renamed over `..data`,
    /// old dir removed.
    #[cfg(unix)]
    fn atomic_writer_swap(dir: &Path, old_ts: &str, new_ts: &str, key: &str, content: &str) {
        let data = dir.join(format!("..{new_ts}"));
        fs::create_dir(&data).unwrap();
        fs::write(data.join(key), content).unwrap();
        symlink(format!("..{new_ts}"), dir.join("..data_tmp"));
        fs::rename(dir.join("..data_tmp"), dir.join(DATA_LINK)).unwrap();
        fs::remove_dir_all(dir.join(format!("..{old_ts}"))).unwrap();
    }

    #[test]
    fn config_file_names() {
        for yes in ["a.yaml", "a.yml", "B.YAML", "x.y.yml"] {
            assert!(is_config_file_name(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "a.yaml.tmp",
            ".a.yaml.swp",
            ".hidden.yaml",
            "..data",
            "yaml",
            "a.json",
            "4913",
        ] {
            assert!(!is_config_file_name(OsStr::new(no)), "{no}");
        }
    }

    #[test]
    fn fingerprint_ignores_extra_set_changes() {
        let stamp = |len| {
            Some(Stamp {
                len,
                modified: None,
                inode: 1,
            })
        };
        let mut base = Fingerprint::default();
        base.extras.insert(PathBuf::from("/a"), stamp(1));
        let mut now = Fingerprint::default();
        now.extras.insert(PathBuf::from("/b"), stamp(2));
        assert!(base.absorb(now.clone()).is_empty());
        now.extras.insert(PathBuf::from("/a"), stamp(3));
        assert_eq!(base.absorb(now), vec![PathBuf::from("/a")]);
    }

    #[test]
    fn start_outside_runtime_is_an_error() {
        let res = ConfigWatcher::start(vec![], events_only());
        assert!(matches!(res, Err(WatchError::NoRuntime)));
    }

    #[test]
    fn watcher_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ConfigWatcher>();
    }

    #[tokio::test]
    async fn in_place_edit_triggers_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.yaml");
        fs::write(&file, "a: 1\n").unwrap();
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

        fs::write(&file, "a: 2\n").unwrap();
        assert_eq!(next_paths(&mut rx).await, vec![file]);
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[tokio::test]
    async fn reading_config_does_not_trigger() {
        // The reload reads the files it was told about; that must not loop.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.yaml");
        fs::write(&file, "a: 1\n").unwrap();
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

        assert_eq!(fs::read_to_string(&file).unwrap(), "a: 1\n");
        let _ = fs::read_dir(dir.path()).unwrap().count();
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[tokio::test]
    async fn temp_file_rename_triggers() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.yaml");
        fs::write(&file, "a: 1\n").unwrap();
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

        write_replace(&file, "a: 2\n");
        assert_eq!(next_paths(&mut rx).await, vec![file]);
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[tokio::test]
    async fn create_and_delete_each_trigger() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.yml");
        fs::write(&old, "a: 1\n").unwrap();
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

        let new = dir.path().join("new.yaml");
        fs::write(&new, "b: 1\n").unwrap();
        assert_eq!(next_paths(&mut rx).await, vec![new]);

        fs::remove_file(&old).unwrap();
        assert_eq!(next_paths(&mut rx).await, vec![old]);
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[tokio::test]
    async fn burst_of_writes_coalesces() {
        // A longer debounce than elsewhere so a slow CI machine still fits 20 writes in it.
        let debounce = Duration::from_millis(200);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.yaml");
        fs::write(&file, "n: 0\n").unwrap();
        let opts = WatchOptions {
            debounce,
            poll_interval: None,
        };
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], opts).unwrap();

        for i in 1..=20 {
            fs::write(&file, format!("n: {i}\n")).unwrap();
        }
        assert_eq!(next_paths(&mut rx).await, vec![file]);
        assert_quiet(&mut rx, debounce).await;
    }

    #[test]
    fn pending_trigger_covers_later_changes() {
        // Capacity 1: while a trigger is unread, later ones are folded into it, never
        // waited on; only a dropped receiver stops the driver.
        let (tx, mut rx) = mpsc::channel(1);
        assert!(emit(&tx, ReloadCause::Poll));
        let second = ReloadCause::FileChange { paths: vec![] };
        assert!(emit(&tx, second));
        assert_eq!(rx.try_recv(), Ok(ReloadCause::Poll));
        assert!(rx.try_recv().is_err());
        drop(rx);
        assert!(!emit(&tx, ReloadCause::Poll));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn configmap_data_swap_triggers_once() {
        let dir = tempfile::tempdir().unwrap();
        atomic_writer_init(dir.path(), "2026_11_22_04_00_00.123", "app.yaml", "v: 1\n");
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

        atomic_writer_swap(
            dir.path(),
            "2026_11_22_04_00_00.123",
            "2026_11_22_04_05_00.456",
            "app.yaml",
            "v: 2\n",
        );
        assert_eq!(next_paths(&mut rx).await, vec![dir.path().join(DATA_LINK)]);
        let seen = fs::read_to_string(dir.path().join("app.yaml")).unwrap();
        assert_eq!(seen, "v: 2\n");
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[tokio::test]
    async fn extra_file_in_other_dir() {
        let cfg = tempfile::tempdir().unwrap();
        fs::write(cfg.path().join("app.yaml"), "a: 1\n").unwrap();
        let certs = tempfile::tempdir().unwrap();
        let cert = certs.path().join("cert.pem");
        let unrelated = certs.path().join("notes.yaml");
        fs::write(&cert, "old").unwrap();
        fs::write(&unrelated, "x").unwrap();
        let (w, mut rx) = ConfigWatcher::start(vec![cfg.path().into()], events_only()).unwrap();
        w.set_extra_files(vec![cert.clone()]);

        fs::write(&unrelated, "y").unwrap();
        write_replace(&unrelated, "z");
        assert_quiet(&mut rx, DEBOUNCE).await;

        write_replace(&cert, "new");
        assert_eq!(next_paths(&mut rx).await, vec![cert.clone()]);

        // No longer referenced: no longer watched.
        w.set_extra_files(vec![]);
        fs::write(&cert, "newer").unwrap();
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn extra_file_in_secret_volume_swap() {
        let cfg = tempfile::tempdir().unwrap();
        let secret = tempfile::tempdir().unwrap();
        atomic_writer_init(secret.path(), "ts1", "tls.crt", "cert 1");
        let cert = secret.path().join("tls.crt");
        let (w, mut rx) = ConfigWatcher::start(vec![cfg.path().into()], events_only()).unwrap();
        w.set_extra_files(vec![cert.clone()]);

        atomic_writer_swap(secret.path(), "ts1", "ts2", "tls.crt", "cert 2");
        let paths = next_paths(&mut rx).await;
        assert!(paths.contains(&secret.path().join(DATA_LINK)), "{paths:?}");
        assert_eq!(fs::read_to_string(&cert).unwrap(), "cert 2");
        assert_quiet(&mut rx, DEBOUNCE).await;

        // The watch on the symlink's target directory followed the swap.
        w.set_extra_files(vec![cert.clone()]);
        write_replace(&secret.path().join("..ts2/tls.crt"), "cert 2b");
        let paths = next_paths(&mut rx).await;
        assert!(
            paths.contains(&secret.path().join("..ts2/tls.crt")),
            "{paths:?}"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn same_directory_under_two_names() {
        // inotify has one watch per inode and notify reports it under one name; both
        // spellings must still match.
        let base = tempfile::tempdir().unwrap();
        let real = base.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = base.path().join("link");
        symlink(&real, &link);
        fs::write(real.join("app.yaml"), "a: 1\n").unwrap();
        fs::write(real.join("ca.pem"), "ca").unwrap();
        let (w, mut rx) = ConfigWatcher::start(vec![link.clone()], events_only()).unwrap();
        w.set_extra_files(vec![real.join("ca.pem")]);

        fs::write(link.join("app.yaml"), "a: 2\n").unwrap();
        assert_eq!(next_paths(&mut rx).await, vec![link.join("app.yaml")]);
        write_replace(&real.join("ca.pem"), "ca 2");
        let paths = next_paths(&mut rx).await;
        assert!(paths.contains(&real.join("ca.pem")), "{paths:?}");
    }

    #[tokio::test]
    async fn poll_sees_dir_that_appears_later() {
        let base = tempfile::tempdir().unwrap();
        let cfg = base.path().join("cfg");
        let opts = WatchOptions {
            debounce: DEBOUNCE,
            poll_interval: Some(Duration::from_millis(100)),
        };
        let (_w, mut rx) = ConfigWatcher::start(vec![cfg.clone()], opts).unwrap();

        // Populate elsewhere and move into place, so no inotify watch can see the file.
        let staging = base.path().join("staging");
        fs::create_dir(&staging).unwrap();
        fs::write(staging.join("app.yaml"), "a: 1\n").unwrap();
        fs::rename(&staging, &cfg).unwrap();
        assert_eq!(next(&mut rx).await, ReloadCause::Poll);
    }

    #[tokio::test]
    async fn deleted_and_recreated_dir_is_watched_again() {
        let base = tempfile::tempdir().unwrap();
        let cfg = base.path().join("cfg");
        fs::create_dir(&cfg).unwrap();
        fs::write(cfg.join("app.yaml"), "a: 1\n").unwrap();
        let (w, mut rx) = ConfigWatcher::start(vec![cfg.clone()], events_only()).unwrap();

        fs::remove_dir_all(&cfg).unwrap();
        let paths = next_paths(&mut rx).await;
        assert!(paths.contains(&cfg.join("app.yaml")), "{paths:?}");

        let staging = base.path().join("staging");
        fs::create_dir(&staging).unwrap();
        fs::write(staging.join("app.yaml"), "a: 2\n").unwrap();
        fs::rename(&staging, &cfg).unwrap();
        // What the poll tick does (polling is off here to keep the causes deterministic).
        let _ = w.shared.maintain(false);
        assert_eq!(
            lock(&w.shared.watches).active.get(&cfg),
            dir_identity(&cfg).as_ref(),
        );

        fs::write(cfg.join("app.yaml"), "a: 3\n").unwrap();
        assert_eq!(next_paths(&mut rx).await, vec![cfg.join("app.yaml")]);
    }

    #[tokio::test]
    async fn constant_changes_still_reload() {
        // Without the 10x cap a directory rewritten every few ms would never go quiet.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.yaml");
        fs::write(&file, "n: 0\n").unwrap();
        let (_w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], events_only()).unwrap();

        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (stop, file) = (Arc::clone(&stop), file.clone());
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let mut n = 0u64;
                // Paces the writes (faster than the debounce); not used for synchronisation.
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() < Duration::from_secs(10)
                {
                    n += 1;
                    fs::write(&file, format!("n: {n}\n")).unwrap();
                    std::thread::sleep(DEBOUNCE / 5);
                }
            })
        };
        let res = timeout(Duration::from_secs(3), rx.recv()).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert!(
            matches!(res, Ok(Some(ReloadCause::FileChange { .. }))),
            "{res:?}"
        );
    }

    #[tokio::test]
    async fn poll_does_not_repeat_event_triggers() {
        let poll = Duration::from_millis(40);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.yaml");
        fs::write(&file, "a: 1\n").unwrap();
        let certs = tempfile::tempdir().unwrap();
        let cert = certs.path().join("cert.pem");
        fs::write(&cert, "c").unwrap();
        let opts = WatchOptions {
            debounce: DEBOUNCE,
            poll_interval: Some(poll),
        };
        let (w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], opts).unwrap();

        // A new extra-file set is not a change by itself.
        w.set_extra_files(vec![cert.clone()]);
        assert_quiet(&mut rx, DEBOUNCE).await;

        // The event trigger refreshes the poll baseline, so no Poll follows it.
        fs::write(&file, "a: 2\n").unwrap();
        assert_eq!(next_paths(&mut rx).await, vec![file]);
        assert_quiet(&mut rx, DEBOUNCE).await;
    }

    #[tokio::test]
    async fn drop_ends_receiver_and_releases_everything() {
        let dir = tempfile::tempdir().unwrap();
        let opts = WatchOptions {
            debounce: DEBOUNCE,
            poll_interval: Some(Duration::from_millis(20)),
        };
        let (w, mut rx) = ConfigWatcher::start(vec![dir.path().into()], opts).unwrap();
        let shared: Weak<Shared> = Arc::downgrade(&w.shared);
        drop(w);

        let end = timeout(DEADLINE, rx.recv())
            .await
            .expect("receiver not closed");
        assert_eq!(end, None);
        // The driver dropped its handle before the sender, so the notify watcher is gone.
        assert!(shared.upgrade().is_none());
    }
}
