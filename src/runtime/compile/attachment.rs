//! Which listeners a route attaches to (its `parentRefs`), and which hostnames it serves on
//! each.

use std::path::Path;

use super::listeners::CompiledListener;
use super::{at, Cx};
use crate::config::wire::common::ParentRef;
use crate::config::wire::gateway::GatewaySpec;
use crate::config::wire::{Object, GATEWAY_GROUP};
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId};
use crate::names::hostname_matches;

/// The route's hostnames intersected with the listener's (None: any host).
pub(super) fn effective_hostnames(
    hostnames: &[Spanned<String>],
    listener: Option<&str>,
) -> Option<Vec<String>> {
    let route: Vec<String> = hostnames
        .iter()
        .map(|h| h.value.to_ascii_lowercase())
        .collect();
    match (route.is_empty(), listener) {
        (true, None) => None,
        (true, Some(l)) => Some(vec![l.to_owned()]),
        (false, None) => Some(route),
        (false, Some(l)) => Some(
            route
                .into_iter()
                .filter_map(|h| {
                    // The narrower of the two names survives: a route host inside the
                    // listener's wildcard, or the listener's host inside the route's wildcard.
                    if hostname_matches(l, &h) || h == l {
                        Some(h)
                    } else if hostname_matches(&h, l) {
                        Some(l.to_owned())
                    } else {
                        None
                    }
                })
                .collect(),
        ),
    }
}

/// Indices of the listeners a route attaches to: HTTP and HTTPS listeners for an HTTPRoute,
/// TLS Passthrough listeners for a TLSRoute (`passthrough`).
pub(super) fn attach(
    cx: &mut Cx,
    set: &ConfigSet,
    file: &Path,
    id: &ObjectId,
    parent_refs: &[Spanned<ParentRef>],
    listeners: &[CompiledListener],
    passthrough: bool,
) -> Vec<usize> {
    let route = Route {
        file,
        id,
        passthrough,
    };
    if parent_refs.is_empty() {
        // egressd extension: a route without parentRefs attaches to every listener of its
        // kind that admits its namespace (the common single-Gateway sidecar case needs no
        // wiring).
        return listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_passthrough() == passthrough && route.admitted_by(l))
            .map(|(i, _)| i)
            .collect();
    }
    let mut out = Vec::new();
    for (pi, parent) in parent_refs.iter().enumerate() {
        let field = format!("spec.parentRefs[{pi}]");
        let Some(gw) = route.parent_gateway(cx, set, parent, &field) else {
            continue;
        };
        route.attach_to(cx, gw, parent, &field, listeners, &mut out);
    }
    out
}

/// The route being attached.
struct Route<'a> {
    file: &'a Path,
    id: &'a ObjectId,
    /// A TLSRoute (attaches to TLS Passthrough listeners), not an HTTPRoute.
    passthrough: bool,
}

impl Route<'_> {
    /// Whether `l` admits routes from this route's namespace.
    fn admitted_by(&self, l: &CompiledListener) -> bool {
        l.routes_from_all_namespaces || l.gateway.namespace == self.id.namespace
    }

    /// The Gateway `parent` names, when it is one and exists (with the listener its
    /// `sectionName` names, if any); else `None`, reported.
    fn parent_gateway<'s>(
        &self,
        cx: &mut Cx,
        set: &'s ConfigSet,
        parent: &Spanned<ParentRef>,
        field: &str,
    ) -> Option<&'s Object<GatewaySpec>> {
        let (file, id) = (self.file, self.id);
        let group = parent.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = parent.kind.as_deref().unwrap_or("Gateway");
        if group != GATEWAY_GROUP || kind != "Gateway" {
            cx.error(
                at(file, id, parent.pos, field),
                format!("parentRef to {kind} in group `{group}` is not supported"),
                "attach routes to a Gateway",
            );
            return None;
        }
        let ns = parent.namespace.as_deref().unwrap_or(&id.namespace);
        let Some(gw) = set
            .gateways
            .iter()
            .find(|g| &*g.id.namespace == ns && *g.id.name == *parent.name)
        else {
            cx.missing_ref(
                at(file, id, parent.pos, field),
                format!("Gateway {ns}/{} does not exist", parent.name),
                "check the name and namespace, or add the Gateway",
            );
            return None;
        };
        if let Some(section) = &parent.section_name {
            if !gw.spec.listeners.iter().any(|l| *l.name == **section) {
                cx.missing_ref(
                    at(file, id, parent.pos, format!("{field}.sectionName")),
                    format!("Gateway {ns}/{} has no listener `{section}`", parent.name),
                    "use one of the Gateway's listener names",
                );
                return None;
            }
        }
        Some(gw)
    }

    /// Adds to `out` the listeners of `gw` that `parent` selects (by section name and port),
    /// that are of the route's kind and admit its namespace.
    fn attach_to(
        &self,
        cx: &mut Cx,
        gw: &Object<GatewaySpec>,
        parent: &Spanned<ParentRef>,
        field: &str,
        listeners: &[CompiledListener],
        out: &mut Vec<usize>,
    ) {
        let (file, id) = (self.file, self.id);
        let mut attached = false;
        for (i, l) in listeners.iter().enumerate() {
            if l.gateway != gw.id
                || parent.section_name.as_ref().is_some_and(|s| **s != *l.name)
                || parent.port.is_some_and(|p| p != l.port)
            {
                continue;
            }
            if l.is_passthrough() != self.passthrough {
                // Only a listener named explicitly is a mistake; a whole-Gateway parentRef
                // simply skips the listeners of the other kind.
                if parent.section_name.is_some() {
                    let (message, hint) = self.wrong_kind(l);
                    cx.error(at(file, id, parent.pos, field), message, hint);
                }
                continue;
            }
            if !self.admitted_by(l) {
                cx.error(
                    at(file, id, parent.pos, field),
                    format!(
                        "listener `{}` of Gateway {} does not admit routes from namespace `{}`",
                        l.name, gw.id, id.namespace
                    ),
                    "set allowedRoutes.namespaces.from: All on the listener, or move the route",
                );
                continue;
            }
            if !out.contains(&i) {
                out.push(i);
            }
            attached = true;
        }
        if !attached && parent.port.is_some() {
            cx.missing_ref(
                at(file, id, parent.pos, format!("{field}.port")),
                "no listener of the Gateway has this port",
                "check the port",
            );
        }
    }

    /// The error (message and hint) for a listener named explicitly that cannot carry this
    /// kind of route.
    fn wrong_kind(&self, l: &CompiledListener) -> (String, &'static str) {
        if self.passthrough {
            (
                format!(
                    "listener `{}` is not a TLS Passthrough listener and cannot carry a TLSRoute",
                    l.name
                ),
                "attach the route to a listener with `protocol: TLS` and `tls: {mode: Passthrough}`",
            )
        } else {
            (
                format!(
                    "listener `{}` passes TLS through and cannot carry an HTTPRoute",
                    l.name
                ),
                "attach the route to an HTTP or HTTPS listener",
            )
        }
    }
}
