//! Egress policy: who a client is ([`identity`]), the proxy users it may authenticate as
//! ([`users`]), and which destinations it may reach ([`rules`], `EgressPolicy`).
//!
//! Nothing here runs for a config without `EgressPolicy` objects or `clientPolicy`: the
//! snapshot then holds no [`rules::ClientPolicy`] and the request path checks one `Option`.

pub(crate) mod identity;
pub(crate) mod rules;
pub(crate) mod users;

use std::sync::Arc;

/// What the request path checks about clients, when anything is configured.
#[derive(Debug)]
pub(crate) struct ClientAccess {
    /// `EgressPolicy` objects and `clientPolicy.default`.
    pub(crate) rules: rules::ClientPolicy,
    /// `clientPolicy.proxyUsers`.
    pub(crate) users: Option<Arc<users::ProxyUsers>>,
}
