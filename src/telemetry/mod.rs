//! What egressd tells operators: the access log, metrics, and logs (rate-limited where
//! traffic can trigger them).

pub mod access_log;
pub mod blocked;
pub mod log_level;
pub mod log_limit;
pub mod metrics;
pub mod time;
pub mod trace;
