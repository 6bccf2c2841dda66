//! The HTTP data path: routing, header rules, forwarding, local replies.
//!
//! The life of a request, phase by phase (see `proxy.rs`; "send" is `exchange.rs`):
//!
//! ```text
//! accept ─> destination (absolute URI or Host) ─> route (HTTPRoute, else implicit Backend,
//!   else 403) ─> select backend (weights) ─> prepare (filters, hop-by-hop, Via/XFF, Host)
//!   ─> pick endpoint ─> connect / pooled connection ─> send ─> respond (filters, stream body)
//! ```

pub mod body;
pub mod budget;
pub mod credentials;
pub mod error;
mod exchange;
pub mod filters;
pub mod grpc;
pub mod headers;
pub mod limits;
mod logged;
mod mcp;
pub mod proxy;
mod retry;
pub mod router;
pub mod tunnel;
pub mod websocket;
