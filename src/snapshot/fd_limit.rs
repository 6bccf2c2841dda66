//! The default cap on client connections, derived from how many file descriptors the process
//! may open (`RLIMIT_NOFILE`), so that idle or hostile clients run into egressd's cap, which
//! refuses them cleanly, before the kernel's, which makes `accept` fail for everyone.

use std::sync::OnceLock;

/// Descriptors kept out of the client budget for everything else: listening sockets, the
/// admin server, config and certificate files, the watcher, DNS, the access log.
const RESERVED: usize = 64;

/// Assumed when the limit cannot be read (not Linux, no `/proc`): the usual soft limit.
const ASSUMED_LIMIT: usize = 1024;

/// The fewest client connections the default allows, however low the descriptor limit.
const MIN_CONNECTIONS: usize = 16;

/// The default of `downstream.maxConnections`: half of the descriptors left after
/// [`RESERVED`], since each proxied client connection usually holds one upstream socket too
/// (pooled HTTP/1.1, a tunnel, a passthrough relay). Read once per process.
pub(crate) fn default_max_connections() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| from_limit(open_files_limit().unwrap_or(ASSUMED_LIMIT)))
}

fn from_limit(limit: usize) -> usize {
    (limit.saturating_sub(RESERVED) / 2).max(MIN_CONNECTIONS)
}

/// The soft `RLIMIT_NOFILE` of this process, from `/proc/self/limits` (read without `unsafe`
/// or a libc binding); `None` when unlimited or unreadable.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_limits(&limits)
}

/// The soft limit of the `Max open files` line:
/// `Max open files            1024                 524288               files`.
fn parse_limits(text: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_soft_limit() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max processes             63413                63413                processes \n\
                    Max open files            256                  524288               files     \n";
        assert_eq!(parse_limits(text), Some(256));
        assert_eq!(
            parse_limits(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
    }

    #[test]
    fn half_of_what_is_left_after_the_reserve() {
        assert_eq!(from_limit(256), 96);
        assert_eq!(from_limit(1024), 480);
        assert_eq!(from_limit(1_048_576), 524_256);
        // A tiny limit still lets a few clients in (the reserve was a guess anyway).
        assert_eq!(from_limit(50), MIN_CONNECTIONS);
    }
}
