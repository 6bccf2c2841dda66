//! Runtime: compiling config into snapshots, long-lived state, and the reload loop.

pub mod compile;
pub mod registry;
pub mod reload;
pub mod shared;
pub mod snapshot;
pub mod status;
pub mod undeclared;
pub mod watch;
