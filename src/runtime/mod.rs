//! Runtime: compiling config into snapshots, and the reload loop that swaps them in.

pub mod background;
pub mod compile;
pub mod reload;
pub mod watch;
