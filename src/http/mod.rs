//! The HTTP data path: routing, header rules, forwarding, local replies.
//!
//! The life of a request, phase by phase, is `pipeline/` (its `mod.rs` lists the phases); the
//! modules here are what the phases use: bodies, header rules, route tables, local replies.

pub mod body;
pub mod budget;
pub mod deadline;
pub mod error;
pub mod grpc;
pub mod headers;
pub mod limits;
pub mod pipeline;
pub mod relay;
