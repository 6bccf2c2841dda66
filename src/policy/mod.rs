//! Egress policy: who a client is ([`identity`]), the proxy users it may authenticate as
//! ([`users`]), and which destinations it may reach ([`rules`], `EgressPolicy`).
//!
//! Nothing here runs for a config without `EgressPolicy` objects or `clientPolicy`: the
//! snapshot then holds no [`rules::ClientPolicy`] and the request path checks one `Option`.

pub mod identity;
pub mod rules;
pub mod users;

use std::sync::Arc;

/// What the request path checks about clients, when anything is configured.
#[derive(Debug)]
pub struct ClientAccess {
    /// `EgressPolicy` objects and `clientPolicy.default`.
    pub rules: rules::ClientPolicy,
    /// `clientPolicy.proxyUsers`.
    pub users: Option<Arc<users::ProxyUsers>>,
}
