//! The HTTP data path: routing, header rules, forwarding, local replies.
//!
//! The life of a request, phase by phase, is `pipeline/` (its `mod.rs` lists the phases); the
//! modules here are what the phases use: bodies, header rules, route tables, local replies.

pub(crate) mod body;
pub(crate) mod budget;
pub(crate) mod deadline;
pub(crate) mod error;
pub(crate) mod grpc;
pub(crate) mod headers;
pub(crate) mod limits;
pub(crate) mod path;
pub(crate) mod pipeline;
pub(crate) mod relay;
pub(crate) mod sending;
