//! Deciding which raw notify events concern the config, on the notify thread.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{Event, EventKind};
use tokio::sync::mpsc;
use tracing::warn;

use super::lock;
use super::watch_set::Resolved;

/// Name of the symlink the Kubernetes AtomicWriter swaps to publish a new ConfigMap or
/// Secret revision. Per-key files are symlinks through it, so swapping it changes every
/// file without any event on the files' own names.
pub(super) const DATA_LINK: &str = "..data";

/// Runs on the notify thread for every raw event.
pub(super) fn forward(
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
pub(super) struct Filter {
    pub(super) config_dirs: HashSet<PathBuf>,
    /// Extra files as last given to `set_extra_files` (absolute, sorted, unique).
    pub(super) extra_files: Vec<PathBuf>,
    /// Bumped by every `set_extra_files`, so a slower background resolution of an older
    /// list does not overwrite a newer one.
    pub(super) generation: u64,
    /// Extra files plus the canonical targets of those that are symlinks.
    pub(super) extra_match: HashSet<PathBuf>,
    /// Lexical parents of extra files, where a `..data` swap also counts.
    pub(super) extra_dirs: HashSet<PathBuf>,
    /// Every directory that should be watched.
    pub(super) watch_dirs: BTreeSet<PathBuf>,
    /// Watched path -> other wanted paths naming the same directory. inotify keeps one
    /// watch per inode and notify reports it under one path only, so events arriving under
    /// the watched spelling are also checked under each alias.
    pub(super) aliases: HashMap<PathBuf, Vec<PathBuf>>,
}

impl Filter {
    pub(super) fn apply(&mut self, resolved: Resolved) {
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
pub(super) fn is_config_file_name(name: &OsStr) -> bool {
    if name.as_encoded_bytes().first() == Some(&b'.') {
        return false;
    }
    Path::new(name)
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("yaml") || ext.eq_ignore_ascii_case("yml"))
}
