//! `TLSRoute`s → route entries of the [`SniRouter`] of each TLS Passthrough listener.
//!
//! A TLSRoute has nothing to match but the SNI, so all backendRefs of all its rules form one
//! weighted set. Its backends must be Passthrough ports: egressd never terminates the client's
//! TLS on these listeners, so the endpoint must speak it.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::attachment::{attach, effective_hostnames};
use super::backends::Backends;
use super::listeners::CompiledListener;
use super::policy::PolicyIndex;
use super::route_rules::{check_hostnames, resolve_backend_ref};
use super::{at, Cx};
use crate::config::wire::policy::TrafficPolicySpec;
use crate::config::wire::tls_route::TlsRouteSpec;
use crate::config::wire::Object;
use crate::config::{ConfigSet, Reason};
use crate::snapshot::router::{SniRoute, SniRouter, WeightedTarget};
use crate::snapshot::{Backend, Target};

/// A TLSRoute without errors: the listeners it attaches to and its resolved backendRefs.
pub(super) struct CheckedTlsRoute<'a> {
    route: &'a Object<TlsRouteSpec>,
    listeners: Vec<usize>,
    /// (backend, its inline policy, port index, weight)
    refs: Vec<(Arc<Backend>, Option<&'a TrafficPolicySpec>, usize, u32)>,
}

/// Validates every TLSRoute; the valid ones are returned in precedence order (alphabetical
/// namespace/name, as for HTTPRoutes: files carry no creation time).
pub(super) fn check<'a>(
    cx: &mut Cx,
    set: &'a ConfigSet,
    listeners: &[CompiledListener],
    backends: &'a Backends<'_>,
) -> Vec<CheckedTlsRoute<'a>> {
    let mut routes: Vec<&Object<TlsRouteSpec>> = set.tls_routes.iter().map(|r| &**r).collect();
    routes.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = Vec::new();
    for route in routes {
        let (file, id) = (&*route.file, &route.id);
        let before = cx.error_count();
        let attached = attach(cx, set, file, id, &route.spec.parent_refs, listeners, true);
        check_hostnames(cx, file, id, &route.spec.hostnames);
        if route.spec.rules.is_empty() {
            cx.error(
                at(file, id, route.pos, "spec.rules"),
                "a TLSRoute needs a rule with backendRefs",
                "add `rules: [{backendRefs: [{name: BACKEND}]}]`",
            );
        }
        let mut refs = Vec::new();
        for (ri, rule) in route.spec.rules.iter().enumerate() {
            for (bi, r) in rule.backend_refs.iter().enumerate() {
                let bfield = format!("spec.rules[{ri}].backendRefs[{bi}]");
                let Some((backend, inline, port_index)) =
                    resolve_backend_ref(cx, file, id, r, &bfield, backends)
                else {
                    continue;
                };
                let port = &backend.ports[port_index];
                if !port.passthrough {
                    cx.error(
                        at(file, id, r.pos, bfield),
                        format!(
                            "port {} of {} is not a TLS Passthrough port",
                            port.number, backend.id
                        ),
                        "TLSRoute backends must be `tls.mode: Passthrough` (the client's own TLS reaches the endpoint untouched); set it on the Backend or the port",
                    );
                    continue;
                }
                refs.push((backend.clone(), inline, port_index, r.weight.unwrap_or(1)));
            }
        }
        if cx.error_count() == before {
            out.push(CheckedTlsRoute {
                route,
                listeners: attached,
                refs,
            });
        }
    }
    out
}

/// Adds the routes attached to listener `li` to its router. On a hostname claimed by several
/// routes, the first in precedence order wins and the others get a `Conflicted` warning.
pub(super) fn install(
    cx: &mut Cx,
    router: &mut SniRouter,
    routes: &[CheckedTlsRoute<'_>],
    li: usize,
    listener: &CompiledListener,
    policies: &PolicyIndex<'_>,
) {
    for checked in routes.iter().filter(|c| c.listeners.contains(&li)) {
        let route = checked.route;
        let Some(hostnames) = effective_hostnames_or_any(route, listener) else {
            continue; // no hostname in common with the listener
        };
        let sni_route = Arc::new(build(checked, listener, policies));
        // Warn once per route, not once per listener it attaches to.
        let report = checked.listeners.first() == Some(&li);
        let mut conflicts = Vec::new();
        match hostnames {
            None => match &router.routes_any {
                Some(winner) => conflicts.push(("any SNI".to_owned(), winner.name.clone())),
                None => router.routes_any = Some(sni_route),
            },
            Some(hosts) => {
                for host in hosts {
                    if let Some(suffix) = host.strip_prefix('*') {
                        match router.routes_wildcard.iter().find(|(s, _)| s == suffix) {
                            Some((_, winner)) => {
                                conflicts.push((host.clone(), winner.name.clone()))
                            }
                            None => router
                                .routes_wildcard
                                .push((suffix.to_owned(), sni_route.clone())),
                        }
                    } else {
                        match router.routes_exact.entry(host.clone()) {
                            Entry::Occupied(winner) => {
                                conflicts.push((host.clone(), winner.get().name.clone()))
                            }
                            Entry::Vacant(slot) => {
                                slot.insert(sni_route.clone());
                            }
                        }
                    }
                }
            }
        }
        if report {
            for (host, winner) in conflicts {
                cx.warn(
                    at(&route.file, &route.id, route.pos, "spec.hostnames"),
                    Reason::Conflicted,
                    format!("`{host}` is also claimed by {winner}, which wins"),
                    "give each SNI hostname one TLSRoute",
                );
            }
        }
    }
    // Longest suffix first, so the most specific wildcard wins.
    router
        .routes_wildcard
        .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
}

/// `Some(None)`: any SNI; `Some(Some(hosts))`: these; `None`: nothing in common with the
/// listener's hostname.
fn effective_hostnames_or_any(
    route: &Object<TlsRouteSpec>,
    listener: &CompiledListener,
) -> Option<Option<Vec<String>>> {
    match effective_hostnames(&route.spec.hostnames, listener.hostname.as_deref()) {
        Some(hosts) if hosts.is_empty() => None,
        other => Some(other),
    }
}

/// The route's weighted targets on this listener (policies may differ per Gateway).
fn build(
    checked: &CheckedTlsRoute<'_>,
    listener: &CompiledListener,
    policies: &PolicyIndex<'_>,
) -> SniRoute {
    let mut total = 0u64;
    let backends = checked
        .refs
        .iter()
        .filter(|(_, _, _, weight)| *weight > 0)
        .map(|(backend, inline, port_index, weight)| {
            total += u64::from(*weight);
            WeightedTarget {
                target: Arc::new(Target {
                    backend: backend.clone(),
                    port: backend.ports[*port_index].clone(),
                    policy: policies.request_policy(None, &backend.id, *inline, &listener.gateway),
                    rewrite_authority: true,
                }),
                weight: *weight,
            }
        })
        .collect();
    let id = &checked.route.id;
    SniRoute {
        name: format!("TLSRoute {}/{}", id.namespace, id.name).into(),
        backends,
        total_weight: total,
    }
}
