//! Which directories to watch (config directories, parents of extra files, symlink targets)
//! and keeping the notify registrations in line with them and with the disk.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tracing::{debug, info, warn};

/// Extra files resolved against the file system (symlink targets may move).
#[derive(Debug, Default)]
pub(super) struct Resolved {
    pub(super) matches: HashSet<PathBuf>,
    pub(super) parents: HashSet<PathBuf>,
    pub(super) watch_dirs: BTreeSet<PathBuf>,
}

impl Resolved {
    pub(super) fn compute(config_dirs: &[PathBuf], extra_files: &[PathBuf]) -> Self {
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
pub(super) type DirId = Option<(u64, u64)>;

/// `None` if `path` does not exist or is not a directory (following symlinks, as inotify does).
pub(super) fn dir_identity(path: &Path) -> Option<DirId> {
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
pub(super) struct WatchSet {
    watcher: RecommendedWatcher,
    /// Registered directories and the identity they had just before registration.
    pub(super) active: BTreeMap<PathBuf, DirId>,
    /// Directories we could not watch; remembered to warn once instead of every poll tick.
    failing: BTreeSet<PathBuf>,
}

impl WatchSet {
    pub(super) fn new(watcher: RecommendedWatcher) -> Self {
        Self {
            watcher,
            active: BTreeMap::new(),
            failing: BTreeSet::new(),
        }
    }

    /// Brings the registered watches in line with `desired` (the filter's `watch_dirs`, read
    /// while this set is locked, so the last reconcile sees the newest) and the disk.
    ///
    /// A registration is dropped when it is no longer wanted or when its path now names a
    /// different directory (deleted, moved away, recreated, symlink retargeted): an inotify
    /// watch follows the inode, not the name. Missing ones are (re)added, one per directory
    /// identity.
    /// Returns the filter's new aliases: a wanted directory that is the same directory as a
    /// watched one (events come under the watched name).
    pub(super) fn reconcile(
        &mut self,
        desired: BTreeSet<PathBuf>,
    ) -> HashMap<PathBuf, Vec<PathBuf>> {
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
        aliases
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
