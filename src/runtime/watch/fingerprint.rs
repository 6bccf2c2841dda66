//! The poll fallback: a cheap snapshot of the watched files, compared tick by tick.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::filter::is_config_file_name;

/// Cheap change detector for one file: follows symlinks, so a `..data` swap or a replaced
/// target shows up as a new inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stamp {
    pub(super) len: u64,
    pub(super) modified: Option<SystemTime>,
    pub(super) inode: u64,
}

impl Stamp {
    /// `None` for missing files (and dangling symlinks), so appearing and vanishing count.
    pub(super) fn of(path: &Path) -> Option<Self> {
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
pub(super) struct Fingerprint {
    dirs: BTreeMap<PathBuf, Option<Stamp>>,
    pub(super) extras: BTreeMap<PathBuf, Option<Stamp>>,
}

impl Fingerprint {
    pub(super) fn compute(config_dirs: &[PathBuf], extra_files: &[PathBuf]) -> Self {
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
    pub(super) fn absorb(&mut self, current: Fingerprint) -> Vec<PathBuf> {
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
