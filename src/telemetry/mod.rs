//! What egressd tells operators: the access log, metrics, and logs (rate-limited where
//! traffic can trigger them).

pub(crate) mod access_log;
pub(crate) mod blocked;
pub mod log_level;
pub mod log_limit;
pub(crate) mod metrics;
pub(crate) mod time;
pub mod trace;

/// An error and its sources, `: `-separated (hyper's own message alone says little).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}
