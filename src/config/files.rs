//! Finding and reading config files without trusting the file system: every entry that looks
//! like config but cannot be read as a regular file is an error naming it, nothing but a
//! regular file is ever opened (a FIFO would block the loader), and a file is read only up to
//! its size bound.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::bounded::file::not_a_file;
pub(crate) use crate::bounded::file::read_regular_file;

use super::error::Diagnostic;
use super::limits::show_bytes;
use super::yaml::Pos;

/// A problem with a whole file or directory has no line: it is reported at `0:0`.
const WHOLE_FILE: Pos = Pos::new(0, 0);

/// The config files of `path`: `path` itself when it is a file, else the `*.yaml`/`*.yml`
/// entries of the directory (not recursive, hidden entries skipped), sorted. An entry with a
/// config name that is not a readable regular file (a dangling symlink, a symlink loop, a
/// directory, a FIFO, a socket, a device) is an error in `diagnostics`.
pub(super) fn list(path: &Path, diagnostics: &mut Vec<Diagnostic>) -> Vec<PathBuf> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => {
            diagnostics.push(
                Diagnostic::error(path, WHOLE_FILE, format!("cannot read config path: {e}"))
                    .hint("pass an existing directory of *.yaml files"),
            );
            return Vec::new();
        }
    };
    if meta.is_file() {
        return vec![path.to_path_buf()];
    }
    if !meta.is_dir() {
        diagnostics.push(
            Diagnostic::error(
                path,
                WHOLE_FILE,
                format!("config path is {}", not_a_file(&meta)),
            )
            .hint("pass a directory of *.yaml files, or one regular file"),
        );
        return Vec::new();
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            diagnostics.push(Diagnostic::error(
                path,
                WHOLE_FILE,
                format!("cannot list directory: {e}"),
            ));
            return Vec::new();
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                diagnostics.push(Diagnostic::error(
                    path,
                    WHOLE_FILE,
                    format!("cannot list directory: {e}"),
                ));
                continue;
            }
        };
        let file = entry.path();
        if !is_config_file(&file) {
            if looks_like_config(&file) {
                diagnostics.push(
                    Diagnostic::warning(
                        &file,
                        WHOLE_FILE,
                        "is not read: config files end in lower-case .yaml or .yml",
                    )
                    .hint("rename it to end in .yaml if it is config"),
                );
            }
            continue;
        }
        match regular_file(&file) {
            Ok(()) => files.push(file),
            Err(d) => diagnostics.push(*d),
        }
    }
    files.sort();
    files
}

/// `*.yaml`/`*.yml`, not hidden. Hidden entries include the `..data`/`..<timestamp>`
/// machinery of Kubernetes ConfigMap volumes, whose files are reached through the visible
/// per-key symlinks.
pub(crate) fn is_config_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

/// `*.YAML`, `*.Yml`, …: meant as config, but not read (the extension is matched exactly, as
/// Kubernetes' ConfigMap keys and editors write it), so the operator is told.
fn looks_like_config(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let lower = name.to_ascii_lowercase();
    !name.starts_with('.') && (lower.ends_with(".yaml") || lower.ends_with(".yml"))
}

/// Ok when `file` is, or is a symlink to, a regular file; else the error that says why not.
fn regular_file(file: &Path) -> Result<(), Box<Diagnostic>> {
    let error = |message: String, hint: &str| {
        Err(Box::new(
            Diagnostic::error(file, WHOLE_FILE, message).hint(hint),
        ))
    };
    match fs::metadata(file) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(meta) if meta.is_dir() => error(
            "is a directory named like a config file; config directories are not read recursively"
                .to_owned(),
            "rename it, or pass it as a config path of its own",
        ),
        Ok(meta) => error(
            format!(
                "is {}, not a regular file; it was not read",
                not_a_file(&meta)
            ),
            "a config entry must be a regular file or a symlink to one",
        ),
        Err(e) => {
            let is_link = fs::symlink_metadata(file).is_ok_and(|m| m.file_type().is_symlink());
            if !is_link {
                return error(
                    format!("cannot read file: {e}"),
                    "check the file's permissions",
                );
            }
            let target = fs::read_link(file)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "?".to_owned());
            if e.kind() == io::ErrorKind::NotFound {
                error(
                    format!("is a dangling symlink: its target `{target}` does not exist"),
                    "restore the target or remove the symlink",
                )
            } else {
                // ELOOP lands here ("Too many levels of symbolic links").
                error(
                    format!("is a symlink that cannot be followed (to `{target}`): {e}"),
                    "a symlink loop never reaches a file; point it at a regular file",
                )
            }
        }
    }
}

/// The bytes of a regular file, at most `max` of them.
///
/// `size` is the size the file had when opened; it is checked against the bounds before
/// anything is read.
pub(super) struct Opened {
    file: File,
    pub(crate) size: u64,
}

/// Hashes what a referenced file holds now into `hasher`: its bytes (within the config file
/// size limit), or the error reading it, so that a missing, unreadable or oversized file is a
/// state of its own and its appearing later is a change.
pub(crate) fn hash_file_state(path: &Path, hasher: &mut impl std::hash::Hasher) {
    use std::hash::Hash;
    read_regular_file(path, crate::config::LoadLimits::current().max_file_bytes)
        .map_err(|e| e.to_string())
        .hash(hasher);
}

/// Opens `path` for reading if it is a regular file.
///
/// Opened non-blocking, so that a FIFO swapped in after [`list`] looked cannot block the
/// loader (for a regular file the flag changes nothing); the open file is then checked again.
pub(super) fn open(path: &Path) -> Result<Opened, Box<Diagnostic>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| read_error(path, &e))?;
    let meta = file.metadata().map_err(|e| read_error(path, &e))?;
    if !meta.is_file() {
        return Err(Box::new(
            Diagnostic::error(
                path,
                WHOLE_FILE,
                format!(
                    "is {}, not a regular file; it was not read",
                    not_a_file(&meta)
                ),
            )
            .hint("a config entry must be a regular file or a symlink to one"),
        ));
    }
    Ok(Opened {
        file,
        size: meta.len(),
    })
}

impl Opened {
    /// The whole content as UTF-8, refusing more than `max` bytes (a file may grow after it
    /// was measured).
    pub(super) fn read(self, path: &Path, max: u64) -> Result<String, Box<Diagnostic>> {
        if self.size > max {
            return Err(too_large(path, self.size, max));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
        self.file
            .take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| read_error(path, &e))?;
        if bytes.len() as u64 > max {
            return Err(too_large(path, bytes.len() as u64, max));
        }
        String::from_utf8(bytes).map_err(|e| Box::new(utf8_error(path, e.as_bytes())))
    }
}

fn too_large(path: &Path, size: u64, max: u64) -> Box<Diagnostic> {
    Box::new(
        Diagnostic::error(
            path,
            WHOLE_FILE,
            format!(
                "file is {size} bytes, more than the {} a config file may have; it was not read",
                show_bytes(max)
            ),
        )
        .hint("split it into several files, or raise --max-config-file-size"),
    )
}

fn read_error(path: &Path, e: &io::Error) -> Box<Diagnostic> {
    let d = Diagnostic::error(path, WHOLE_FILE, format!("cannot read file: {e}"));
    Box::new(if e.kind() == io::ErrorKind::PermissionDenied {
        d.hint("check the file's permissions")
    } else {
        d
    })
}

/// Invalid UTF-8, positioned at the first bad byte (line, and column in characters).
fn utf8_error(path: &Path, bytes: &[u8]) -> Diagnostic {
    let valid = match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) => e.valid_up_to(),
    };
    // Everything before `valid` is UTF-8 by definition of `valid_up_to`.
    let before = String::from_utf8_lossy(&bytes[..valid]);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    let pos = Pos::new(
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(column).unwrap_or(u32::MAX),
    );
    let byte = bytes.get(valid).copied().unwrap_or_default();
    Diagnostic::error(
        path,
        pos,
        format!("file is not valid UTF-8: byte 0x{byte:02x} cannot start or continue a character"),
    )
    .hint("config files are UTF-8; convert it (e.g. `iconv -t UTF-8`)")
}
