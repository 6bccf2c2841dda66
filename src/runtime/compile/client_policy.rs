//! `EgressPolicy` objects and `ProxyConfig.spec.clientPolicy` → the [`ClientAccess`] requests
//! are judged by (none when neither is configured: the request path then checks nothing).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::{at, Cx};
use crate::config::wire::egress_policy::{EgressClients, EgressPolicySpec};
use crate::config::wire::enums::{ClientPolicyDefault, EgressPolicyMode};
use crate::config::wire::proxy::ProxyUsersSpec;
use crate::config::wire::{EGRESSD_GROUP, GATEWAY_X_GROUP};
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId};
use crate::names::is_valid_hostname;
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
    if rules.is_empty() && !default_deny && users.is_none() {
        return None;
    }
    Some(Arc::new(ClientAccess {
        rules: ClientPolicy::new(default_deny, rules),
        users,
    }))
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
    let clients = clients(cx, file, id, &spec.clients.value);
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

/// `spec.clients`.
fn clients(cx: &mut Cx, file: &Path, id: &ObjectId, spec: &EgressClients) -> ClientSet {
    let mut set = ClientSet::default();
    let names = |cx: &mut Cx,
                 list: &[Spanned<String>],
                 field: &str,
                 out: &mut crate::policy::rules::Names| {
        for (i, name) in list.iter().enumerate() {
            let value = name.value.trim();
            let star = value.find('*');
            let bad = if value.is_empty() || value == "*" {
                Some("an empty name (or a lone `*`, which would be every client)")
            } else if star.is_some_and(|at| at != value.len() - 1) {
                Some("`*` only at the end (a prefix)")
            } else if field == "spiffeIds" && !value.starts_with("spiffe://") {
                Some("a SPIFFE ID starts with spiffe://")
            } else {
                None
            };
            match bad {
                Some(why) => cx.error(
                    at(file, id, name.pos, format!("spec.clients.{field}[{i}]")),
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
                at(file, id, cidr.pos, format!("spec.clients.cidrs[{i}]")),
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
