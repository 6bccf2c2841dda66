//! `Gateway.spec.tls.backend.clientCertificateRef`: the client certificate `Mutual` Backends
//! present when they name none of their own.
//!
//! egressd's connections to a Backend are shared by every listener of every Gateway, so the
//! default is one per config, not one per Gateway: Gateways that set it must agree (name the
//! same Secret); a Mutual Backend without a certificate of its own under Gateways that
//! disagree is an error naming them.

use super::{at, secret_refs, Cx};
use crate::config::{ConfigSet, ObjectId};
use crate::upstream::pem::PemSource;

/// What `Mutual` Backends without a certificate of their own present.
#[derive(Clone, Debug, Default)]
pub(crate) enum GatewayClientCertificate {
    /// No Gateway sets one.
    #[default]
    None,
    /// The certificate chain and key the Gateways name.
    One((PemSource, PemSource)),
    /// Gateways name different Secrets.
    Conflict(Vec<(ObjectId, String)>),
    /// The reference cannot serve (reported at the Gateway).
    Broken,
}

/// One Gateway's default: the Gateway, the Secret it names, and the chain and key when the
/// reference can serve.
type Named = (ObjectId, String, Option<(PemSource, PemSource)>);

/// The default of `set`'s Gateways, each reference resolved (and its errors reported at it).
pub(crate) fn default_client_certificate(cx: &mut Cx, set: &ConfigSet) -> GatewayClientCertificate {
    let mut named: Vec<Named> = Vec::new();
    for gw in &set.gateways {
        let Some(r) = gw
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.value.backend.as_ref())
            .and_then(|b| b.client_certificate_ref.as_ref())
        else {
            continue;
        };
        let here = at(
            &gw.file,
            &gw.id,
            r.pos,
            "spec.tls.backend.clientCertificateRef",
        );
        let pair = secret_refs::certificate(cx, here, &r.value, &gw.id.namespace);
        let namespace = r.value.namespace.as_deref().unwrap_or(&gw.id.namespace);
        named.push((
            gw.id.clone(),
            format!("Secret {namespace}/{}", r.value.name),
            pair,
        ));
    }
    let Some(first) = named.first() else {
        return GatewayClientCertificate::None;
    };
    if named.iter().any(|(_, secret, _)| *secret != first.1) {
        return GatewayClientCertificate::Conflict(
            named
                .into_iter()
                .map(|(id, secret, _)| (id, secret))
                .collect(),
        );
    }
    match &first.2 {
        Some(pair) => GatewayClientCertificate::One(pair.clone()),
        None => GatewayClientCertificate::Broken,
    }
}
