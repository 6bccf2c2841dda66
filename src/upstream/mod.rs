//! Upstream side: endpoints and their state, connection pools, connecting, DNS.

pub mod connect;
pub mod dns;
pub mod endpoint;
pub mod pool;

pub use endpoint::{Endpoint, EndpointGroup, EndpointList, EndpointSource};
