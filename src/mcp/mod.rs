//! MCP (Model Context Protocol) Backends: session affinity, protocol version checks and
//! stream handling for `protocol: MCP` (see README, "MCP").

pub mod session;
