//! How much config egressd reads. A config cannot configure its own loading, so these bounds
//! come from the command line (or the environment) and hold for the whole process.

use std::sync::OnceLock;

use super::yaml::ParseLimits;

/// Bounds on reading a config: each file, the whole config, and what YAML anchors and aliases
/// may copy. Something beyond a bound is a positioned error like any other, so a reload keeps
/// the last good config serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadLimits {
    /// Largest file read, in bytes.
    pub max_file_bytes: u64,
    /// Largest sum of all the files of a config, in bytes.
    pub max_total_bytes: u64,
    /// Bytes of tree anchors and aliases may copy in one file (see [`ParseLimits`]).
    pub max_alias_bytes: usize,
    /// How long one step of a reload (reading, parsing, checking, assembling the config) may
    /// take before the reload is reported as failed; the last good config keeps serving.
    pub reload_timeout: std::time::Duration,
}

impl LoadLimits {
    /// 1 MiB: a Kubernetes ConfigMap holds at most 1 MiB, and a hand-written file is far
    /// smaller. A file's tree takes at most a few dozen times its size in memory.
    pub(crate) const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 20;
    /// 16 MiB: sixteen files at the per-file bound.
    pub(crate) const DEFAULT_MAX_TOTAL_BYTES: u64 = 16 << 20;
    /// 4 MiB (see [`ParseLimits::DEFAULT_MAX_COPY_BYTES`]).
    pub(crate) const DEFAULT_MAX_ALIAS_BYTES: usize = ParseLimits::DEFAULT_MAX_COPY_BYTES;
    /// 60 s: a config of 10,000 Backends loads in well under a second on a busy machine; a
    /// step taking a minute is stuck (a config file on a hung network mount).
    pub const DEFAULT_RELOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

    /// The bounds of this process: those given to [`LoadLimits::install`], else the defaults.
    pub(crate) fn current() -> Self {
        PROCESS_LIMITS.get().copied().unwrap_or_default()
    }

    /// Makes `self` the bounds of every later load in this process (`egressd` does it once,
    /// from its flags, before loading anything). Returns false if bounds were installed
    /// already; they are not changed then.
    pub fn install(self) -> bool {
        PROCESS_LIMITS.set(self).is_ok()
    }

    /// What the YAML parser needs to know.
    pub(crate) fn parse(&self) -> ParseLimits {
        ParseLimits {
            max_copy_bytes: self.max_alias_bytes,
        }
    }
}

impl Default for LoadLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: Self::DEFAULT_MAX_FILE_BYTES,
            max_total_bytes: Self::DEFAULT_MAX_TOTAL_BYTES,
            max_alias_bytes: Self::DEFAULT_MAX_ALIAS_BYTES,
            reload_timeout: Self::DEFAULT_RELOAD_TIMEOUT,
        }
    }
}

static PROCESS_LIMITS: OnceLock<LoadLimits> = OnceLock::new();

/// `1048576` as `1Mi`, for messages.
pub(crate) fn show_bytes(n: u64) -> String {
    super::units::Quantity(n).to_string()
}
