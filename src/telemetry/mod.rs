//! What egressd tells operators: the access log and metrics.

pub mod access_log;
pub mod blocked;
pub mod log_level;
pub mod metrics;
pub mod time;
pub mod trace;
