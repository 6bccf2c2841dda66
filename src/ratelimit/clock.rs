//! The local counters' clock: milliseconds since the process first asked, monotonic.

use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds since the first call in this process (windows of local counters start there).
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}
