//! Upstream side: endpoints and their state, connection pools, connecting, DNS, active health
//! checks.

pub mod address;
pub(crate) mod body;
pub(crate) mod breaker;
pub(crate) mod connect;
pub mod dns;
pub mod endpoint;
pub mod group;
pub(crate) mod h1_conn;
pub(crate) mod h2_frames;
pub(crate) mod h2_pool;
pub(crate) mod health_check;
pub(crate) mod outlier_clock;
pub(crate) mod pem;
pub mod pool;
pub mod registry;
pub(crate) mod tls;
pub(crate) mod verify;

pub use endpoint::Endpoint;
pub(crate) use group::EndpointSource;
pub use group::{EndpointGroup, GroupSettings};
