//! egressd: a Layer-7 egress/backend proxy data plane driven by `Backend` definitions.
//!
//! Map of the crate (`docs/design.md` draws the data flow; `docs/architecture.md` the phases). The
//! modules form layers: each imports only modules below it (`.ci/module-cycles` checks that
//! no two import each other).
//!
//! | layer | module | owns |
//! |---|---|---|
//! | entry | [`app`] | starting and stopping a whole proxy |
//! | | [`commands`], [`probe`] | what the CLI subcommands do; `egressd check --probe` |
//! | control | [`runtime`] | compiling config into a [`snapshot::Snapshot`], reloads, file watching |
//! | | [`admin`] | the admin server |
//! | request path | [`listener`] | binding, accept loops on worker runtimes, draining |
//! | | [`http`] | the request pipeline: named phases from destination to log |
//! | model | [`snapshot`] | what the request path reads: settings, Backends, targets, route tables, `Shared` |
//! | upstream | [`upstream`] | endpoints, endpoint groups, connection pools, connecting, TLS, DNS, active checks |
//! | | [`balance`] | choosing an endpoint: balancers, outlier detection, health state |
//! | | [`interception`] | HTTPS interception: the operator's CA, leaf certificates minted per host |
//! | leaves | [`telemetry`] | access log, metrics, rate-limited logs |
//! | | [`config`] | wire types as people write them, YAML loading with positions, JSON Schema, status conditions |
//! | | [`mcp`] | MCP: JSON-RPC inspection, session ids, SSE rewriting |
//! | | [`names`], [`bounded`] | host-name rules; size-capped maps and the body budget |
//!
//! The library is public only for its four users: the CLI (`src/main.rs`), the integration
//! tests in `tests/` (which start a whole [`Proxy`] in-process and read a few internals: the
//! serving snapshot, config loading and compiling, validation), the criterion benches
//! (`benches/balance.rs`: balancers and endpoint groups; `benches/ratelimit.rs`: rate limit
//! counters, through `ratelimit::bench_support`) and the fuzz targets
//! (`fuzz/fuzz_targets/`: the config loader, ClientHello and host parsers, MCP inspection and
//! stream rewriting). Everything else is crate-private: `pub(crate)` or narrower. The `[lints]`
//! of Cargo.toml flag a `pub` that outside code cannot reach (`unreachable_pub`) and forbid
//! `unsafe` code in every target.

pub(crate) mod admin;
pub(crate) mod app;
pub mod balance;
pub(crate) mod bounded;
pub mod commands;
pub mod config;
pub(crate) mod http;
pub(crate) mod interception;
pub mod listener;
pub mod mcp;
pub(crate) mod names;
pub(crate) mod policy;
pub mod probe;
#[doc(hidden)]
pub mod ratelimit;
pub mod runtime;
pub mod snapshot;
pub mod telemetry;
pub mod upstream;

pub use app::{Options, Proxy};
