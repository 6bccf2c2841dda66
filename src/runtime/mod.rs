//! Runtime: compiling config into snapshots, and the reload loop that swaps them in.

pub(crate) mod background;
pub mod compile;
pub(crate) mod reload;
pub mod watch;
