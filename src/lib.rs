//! egressd: a Layer-7 egress/backend proxy data plane driven by `Backend` definitions.
//!
//! Map of the crate (DESIGN.md draws the data flow):
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | wire types as people write them, YAML loading with positions, JSON Schema |
//! | [`runtime`] | compiling config into a [`runtime::snapshot::Snapshot`], long-lived state, reloads, file watching |
//! | [`listener`] | binding, accept loops on worker runtimes, draining |
//! | [`http`] | the request lifecycle: routing, header rules, forwarding, local replies |
//! | [`upstream`] | endpoints, connection pools, connecting, DNS |
//! | [`balance`] | choosing an endpoint |
//! | [`admin`] | the admin server |
//! | [`telemetry`] | access log and metrics |
//! | [`names`], [`bounded`] | leaves anything may use: host-name limits, size-capped maps |
//! | [`app`] | starting and stopping a whole proxy |
//! | [`commands`] | what the CLI subcommands do |
//! | [`probe`] | `egressd check --probe`: real connections and TLS handshakes to every Backend endpoint |

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod balance;
pub mod bounded;
pub mod commands;
pub mod config;
pub mod http;
pub mod listener;
pub mod mcp;
pub mod names;
pub mod probe;
pub mod runtime;
pub mod snapshot;
pub mod telemetry;
pub mod upstream;

pub use app::{Options, Proxy};
