//! Upstream side: endpoints and their state, connection pools, connecting, DNS, active health
//! checks.

pub mod address;
pub mod body;
pub mod breaker;
pub mod connect;
pub mod dns;
pub mod endpoint;
pub mod group;
pub mod h1_conn;
pub mod h2_frames;
pub mod h2_pool;
pub mod health_check;
pub mod outlier_clock;
pub mod pem;
pub mod pool;
pub mod registry;
pub mod tls;
pub mod verify;

pub use endpoint::Endpoint;
pub use group::{EndpointGroup, EndpointSource, GroupSettings};
