//! Phase "authorize": who the client is — the identity its TLS client certificate proved
//! (on the connection), the proxy user it authenticates as (`Proxy-Authorization: Basic`) —
//! and whether it may reach the destination phase "route" chose (`EgressPolicy`,
//! `clientPolicy.default`). Runs only when the config has any of these. A passthrough
//! connection has neither a certificate egressd checked nor proxy credentials: only its source
//! address is judged.

use http::header::PROXY_AUTHORIZATION;
use http::Request;

use super::ctx::RequestCtx;
use super::destination::Destination;
use super::kind::Kind;
use super::route::Routed;
use crate::http::error::ProxyError;
use crate::policy::identity::Client;
use crate::policy::users::Rejected;
use crate::policy::ClientAccess;

/// The proxy user, before routing: a client without valid credentials learns that it needs
/// them (407) whatever it asks for, as forward proxies answer.
pub(super) async fn authenticate<B>(
    ctx: &mut RequestCtx<'_>,
    access: &ClientAccess,
    req: &Request<B>,
) -> Result<(), ProxyError> {
    let Some(users) = &access.users else {
        return Ok(());
    };
    match users
        .authenticate(req.headers().get(PROXY_AUTHORIZATION), ctx.conn.client.ip())
        .await
    {
        Ok(user) => {
            ctx.user = user;
            Ok(())
        }
        Err(rejected) => {
            crate::telemetry::log_limit::limited!(
                info,
                client = %ctx.conn.client,
                reason = rejected.as_str(),
                "proxy authentication failed"
            );
            Err(match rejected {
                Rejected::Busy => ProxyError::ProxyAuthBusy,
                _ => ProxyError::ProxyAuthRequired {
                    reason: rejected.as_str(),
                    challenge: users.challenge.clone(),
                },
            })
        }
    }
}

/// Whether the client may reach where the request was routed.
pub(super) fn phase(
    ctx: &RequestCtx<'_>,
    access: &ClientAccess,
    dest: &Destination,
    routed: &Routed<'_>,
    kind: Kind,
) -> Result<(), ProxyError> {
    let client = Client {
        addr: ctx.conn.client.ip(),
        tls: ctx.conn.identity.as_deref(),
        user: ctx.user.as_deref(),
    };
    let via = kind.via();
    let target = &routed.target;
    // The port the request goes to (a request naming none goes to the Backend's first).
    let (host, port) = (dest.host(), target.port.number);
    ctx.shared
        .judge_client(access, target, &client, (host, port, via))
        .map_err(|refused| ProxyError::ClientNotAllowed {
            client: refused.client,
            destination: format!("{host}:{port} (Backend {})", target.backend.label),
            reason: refused.reason,
        })
}
