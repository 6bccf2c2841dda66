//! `EgressPolicy` objects and `ProxyConfig.spec.clientPolicy` → the [`ClientAccess`] requests
//! are judged by (none when neither is configured: the request path then checks nothing).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::{at, Cx};
use crate::config::wire::egress_policy::{EgressClients, EgressPolicySpec};
use crate::config::wire::enums::{ClientPolicyDefault, EgressPolicyMode, OutboundPolicy};
use crate::config::wire::proxy::ProxyUsersSpec;
use crate::config::wire::{EGRESSD_GROUP, GATEWAY_X_GROUP};
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId};
use crate::names::{hostname_matches, is_valid_hostname};
use crate::policy::rules::{ClientPolicy, ClientSet, Covers, Rule};
use crate::policy::users::ProxyUsers;
use crate::policy::ClientAccess;
use crate::upstream::address::canonical_net;

/// Compiles every `EgressPolicy` and the ProxyConfig's `clientPolicy`. `backends`: the
/// `namespace/name` of every Backend, which `to.backendRefs` must name.
pub(super) fn compile(
    cx: &mut Cx,
    set: &ConfigSet,
    backends: &HashSet<String>,
) -> Option<Arc<ClientAccess>> {
    let mut default_deny = false;
    let mut users = None;
    if let Some(proxy) = set.proxy_configs.first() {
        if let Some(spec) = &proxy.spec.client_policy {
            default_deny = spec
                .default
                .as_ref()
                .is_some_and(|d| d.value == ClientPolicyDefault::Deny);
            if let Some(u) = &spec.proxy_users {
                users = proxy_users(cx, &proxy.file, &proxy.id, u);
            }
        }
    }
    let mut rules = Vec::with_capacity(set.egress_policies.len());
    for policy in &set.egress_policies {
        let (file, id) = (&*policy.file, &policy.id);
        rules.push(rule(cx, file, id, &policy.spec, backends));
        if default_deny {
            warn_report_under_deny(cx, file, id, &policy.spec);
        }
    }
    if !default_deny {
        warn_undeclared_bypass(cx, set);
    }
    warn_hostnames_of_ip_routes(cx, set);
    if rules.is_empty() && !default_deny && users.is_none() {
        return None;
    }
    Some(Arc::new(ClientAccess {
        rules: ClientPolicy::new(default_deny, rules),
        users,
    }))
}

/// Under `outboundPolicy: AllowAny`/`AuditOnly` with `clientPolicy.default: Allow`, an
/// `Enforce` policy keeps its clients off a Backend only by that Backend's name: the same
/// server is open to everyone by IP address, another DNS name, or `CONNECT` to the address.
fn warn_undeclared_bypass(cx: &mut Cx, set: &ConfigSet) {
    let Some(proxy) = set.proxy_configs.first() else {
        return;
    };
    let Some(outbound) = proxy
        .spec
        .outbound_policy
        .as_ref()
        .filter(|o| o.value != OutboundPolicy::RegistryOnly)
    else {
        return;
    };
    let enforcing: Vec<String> = set
        .egress_policies
        .iter()
        .filter(|p| {
            p.spec
                .mode
                .as_ref()
                .is_none_or(|m| m.value == EgressPolicyMode::Enforce)
        })
        .map(|p| format!("{}/{}", p.id.namespace, p.id.name))
        .collect();
    if enforcing.is_empty() {
        return;
    }
    cx.warn(
        at(&proxy.file, &proxy.id, outbound.pos, "spec.outboundPolicy"),
        crate::config::Reason::Degraded,
        format!(
            "outboundPolicy {:?} with clientPolicy.default Allow: a client EgressPolicy {} \
             refuses can still reach the same servers by IP address, by another DNS name or \
             by CONNECT to the address, which are undeclared destinations open to every client",
            outbound.value,
            enforcing.join(", ")
        ),
        "set clientPolicy.default: Deny (then undeclared destinations need a policy too), or \
         outboundPolicy: RegistryOnly",
    );
}

/// Policies match a request by its Backend's `fqdn.hostname` (or an undeclared host), never
/// by the HTTPRoute's hostnames: a `to.hostnames` entry that only an HTTPRoute sending to an
/// IP Backend serves covers nothing.
fn warn_hostnames_of_ip_routes(cx: &mut Cx, set: &ConfigSet) {
    let ip_backends: HashSet<(&str, &str)> = set
        .backends
        .iter()
        .filter(|b| b.spec.destination.fqdn.is_none())
        .map(|b| (&*b.id.namespace, &*b.id.name))
        .collect();
    for policy in &set.egress_policies {
        for (i, h) in policy.spec.to.hostnames.iter().enumerate() {
            let Some((route, backend)) = ip_route_for(set, &ip_backends, &h.value) else {
                continue;
            };
            cx.warn(
                at(
                    &policy.file,
                    &policy.id,
                    h.pos,
                    format!("spec.to.hostnames[{i}]"),
                ),
                crate::config::Reason::Degraded,
                format!(
                    "`{}` covers nothing HTTPRoute {route} sends to Backend {}/{}: an IP \
                     Backend has no hostname, and policies match the Backend's, not the route's",
                    h.value, backend.0, backend.1
                ),
                format!(
                    "name the Backend instead: `backendRefs: [{{name: {}}}]`",
                    backend.1
                ),
            );
        }
    }
}

/// An HTTPRoute whose hostnames include `host` (or a pattern matching it) and that sends to
/// one of `ip_backends`: the route's and the Backend's `namespace/name`.
fn ip_route_for<'a>(
    set: &'a ConfigSet,
    ip_backends: &HashSet<(&'a str, &'a str)>,
    host: &str,
) -> Option<(String, (&'a str, &'a str))> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    set.http_routes.iter().find_map(|route| {
        let namespace = &*route.id.namespace;
        let serves = route.spec.hostnames.iter().any(|h| {
            let served = h.value.trim_end_matches('.').to_ascii_lowercase();
            // Either may be a `*.suffix` pattern.
            hostname_matches(&served, &host) || hostname_matches(&host, &served)
        });
        if !serves {
            return None;
        }
        let backend = route
            .spec
            .rules
            .iter()
            .flat_map(|r| r.value.backend_refs.iter())
            .find_map(|r| {
                let ns = r.namespace.as_deref().unwrap_or(namespace);
                ip_backends.get(&(ns, r.name.as_str())).copied()
            })?;
        Some((format!("{namespace}/{}", route.id.name), backend))
    })
}

/// A `Report` policy decides nothing: under `default: Deny` the default refuses every client
/// of what it alone covers, the clients it lists too — rarely what its author meant.
fn warn_report_under_deny(cx: &mut Cx, file: &Path, id: &ObjectId, spec: &EgressPolicySpec) {
    let Some(mode) = spec
        .mode
        .as_ref()
        .filter(|m| m.value == EgressPolicyMode::Report)
    else {
        return;
    };
    cx.warn(
        at(file, id, mode.pos, "spec.mode"),
        crate::config::Reason::Degraded,
        "mode Report under clientPolicy.default: Deny: a Report policy lets nothing through, so \
         the default refuses every client of the destinations no Enforce policy covers, the \
         clients this policy lists too",
        "to try a policy out before enforcing it, keep clientPolicy.default: Allow meanwhile, \
         or make this policy mode: Enforce",
    );
}

/// One `EgressPolicy`.
fn rule(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &EgressPolicySpec,
    backends: &HashSet<String>,
) -> (Rule, Covers) {
    let report = spec
        .mode
        .as_ref()
        .is_some_and(|m| m.value == EgressPolicyMode::Report);
    let clients = clients(cx, file, id, &spec.clients.value, "spec.clients");
    let mut covers = Covers::default();
    let to = &spec.to;
    if to.backend_refs.is_empty() && to.hostnames.is_empty() {
        cx.error(
            at(file, id, to.pos, "spec.to"),
            "the policy covers no destination",
            "add `backendRefs: [{name: api}]` or `hostnames: [\"*.example.com\"]`",
        );
    }
    for (i, r) in to.backend_refs.iter().enumerate() {
        let here = || at(file, id, r.pos, format!("spec.to.backendRefs[{i}]"));
        let group = r.group.as_deref().unwrap_or(EGRESSD_GROUP);
        let kind = r.kind.as_deref().unwrap_or("Backend");
        // An XBackend is a Backend of the same identity (see `config::xbackend`).
        let backend = (group, kind) == (EGRESSD_GROUP, "Backend")
            || (group, kind) == (GATEWAY_X_GROUP, "XBackend");
        if !backend {
            cx.error(
                here(),
                format!("`{group}/{kind}` is not a kind an EgressPolicy covers"),
                "name egressd.dev Backends (the default group and kind) or gateway.networking.x-k8s.io XBackends",
            );
            continue;
        }
        let namespace = r.namespace.as_deref().unwrap_or(&id.namespace);
        let label = format!("{namespace}/{}", r.name);
        if !backends.contains(&label) {
            cx.error(
                here(),
                format!("Backend {label} does not exist"),
                "name a Backend of this config (namespace: the policy's unless given)",
            );
            continue;
        }
        covers.backends.push(label);
    }
    for (i, h) in to.hostnames.iter().enumerate() {
        let host = h.value.trim_end_matches('.').to_ascii_lowercase();
        let plain = host.strip_prefix("*.").unwrap_or(&host);
        if !is_valid_hostname(plain) || plain.contains('*') {
            cx.error(
                at(file, id, h.pos, format!("spec.to.hostnames[{i}]")),
                format!("`{}` is not a hostname or `*.suffix` wildcard", h.value),
                "e.g. api.example.com or *.example.com (one or more labels, not the apex)",
            );
            continue;
        }
        covers.hostnames.push(host);
    }
    let rule = Rule {
        name: format!("{}/{}", id.namespace, id.name).into(),
        report,
        clients,
    };
    (rule, covers)
}

/// `spec.clients` (or a rate limit selector's `clients`, at `field`).
pub(super) fn clients(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &EgressClients,
    field: &str,
) -> ClientSet {
    let mut set = ClientSet::default();
    let prefix = field;
    let names = |cx: &mut Cx,
                 names: &[Spanned<String>],
                 list: &str,
                 out: &mut crate::policy::rules::Names| {
        for (i, name) in names.iter().enumerate() {
            let value = name.value.trim();
            let star = value.find('*');
            let bad = if value.is_empty() || value == "*" {
                Some("an empty name (or a lone `*`, which would be every client)")
            } else if star.is_some_and(|at| at != value.len() - 1) {
                Some("`*` only at the end (a prefix)")
            } else if list == "spiffeIds" && !value.starts_with("spiffe://") {
                Some("a SPIFFE ID starts with spiffe://")
            } else {
                None
            };
            match bad {
                Some(why) => cx.error(
                    at(file, id, name.pos, format!("{prefix}.{list}[{i}]")),
                    format!("`{value}`: {why}"),
                    "write the exact name, or a prefix ending in `*`",
                ),
                None => out.add(value),
            }
        }
    };
    names(cx, &spec.spiffe_ids, "spiffeIds", &mut set.spiffe_ids);
    names(
        cx,
        &spec.subject_names,
        "subjectNames",
        &mut set.subject_names,
    );
    names(cx, &spec.proxy_users, "proxyUsers", &mut set.proxy_users);
    for (i, cidr) in spec.cidrs.iter().enumerate() {
        match super::undeclared::parse_cidr(&cidr.value) {
            Some(net) => set.cidrs.push(canonical_net(net)),
            None => cx.error(
                at(file, id, cidr.pos, format!("{prefix}.cidrs[{i}]")),
                format!("invalid CIDR `{}`", cidr.value),
                "write an address with a prefix length, e.g. 10.0.0.0/8 (a bare address is one host)",
            ),
        }
    }
    set
}

/// The largest users file read (10,000 users with bcrypt hashes are ~0.8 MB).
const MAX_USERS_FILE: u64 = 2 << 20;

/// `clientPolicy.proxyUsers`: the users file read now (and watched).
fn proxy_users(
    cx: &mut Cx,
    file: &Path,
    id: &ObjectId,
    spec: &Spanned<ProxyUsersSpec>,
) -> Option<Arc<ProxyUsers>> {
    let path = super::tls::resolve(file, &spec.file.value);
    cx.refer(&path);
    let here = || at(file, id, spec.file.pos, "spec.clientPolicy.proxyUsers.file");
    let read = crate::config::read_regular_file(&path, MAX_USERS_FILE)
        .and_then(|bytes| String::from_utf8(bytes).map_err(std::io::Error::other));
    let text = match read {
        Ok(text) => text,
        Err(e) => {
            cx.error(
                here(),
                format!("cannot read the users file {}: {e}", path.display()),
                "write `user:hash` lines (htpasswd -B, or openssl passwd -5); the file is watched",
            );
            return None;
        }
    };
    let realm = spec.realm.as_ref().map_or("egressd", |r| r.value.as_str());
    match ProxyUsers::parse(&text, spec.required.unwrap_or(false), realm) {
        Ok(users) => Some(Arc::new(users)),
        Err(errors) => {
            for e in errors {
                cx.error(
                    here(),
                    format!("users file {}: {e}", path.display()),
                    "each line is `user:hash` with a bcrypt ($2y$) or SHA-crypt ($5$/$6$) hash",
                );
            }
            None
        }
    }
}
