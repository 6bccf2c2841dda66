//! `HTTPRoute`s and implicit routes → one [`HttpRouter`] per HTTP listener.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method};
use regex::Regex;

use super::backends::Backends;
use super::listeners::CompiledListener;
use super::policy::PolicyIndex;
use super::{at, hostname_matches, is_valid_hostname_pattern, Cx};
use crate::config::wire::enums::{
    FilterType, PathMatchType, PathModifierType, Protocol, ValueMatchType,
};
use crate::config::wire::route::{HeaderModifier, HttpRouteRule, HttpRouteSpec};
use crate::config::wire::{Object, EGRESSD_GROUP, GATEWAY_GROUP};
use crate::config::yaml::Spanned;
use crate::config::{ConfigSet, ObjectId, Reason};
use crate::http::filters::{Filters, HeaderOps, PathRewrite};
use crate::http::router::{
    HttpRouter, ImplicitRoute, PathMatcher, RequestMatch, RouteAction, RouteEntry, ValueMatcher,
    WeightedTarget,
};
use crate::runtime::snapshot::Target;

pub(crate) fn compile(
    cx: &mut Cx,
    set: &ConfigSet,
    listeners: &[CompiledListener],
    backends: &Backends<'_>,
    policies: &PolicyIndex<'_>,
) -> HashMap<Arc<str>, Arc<HttpRouter>> {
    // Which listeners each route attaches to (validated once, not per listener).
    let attachments: Vec<Vec<usize>> = set
        .http_routes
        .iter()
        .map(|r| attach(cx, set, r, listeners))
        .collect();
    // Rules are validated once; their targets are resolved per Gateway (policies may differ).
    let mut validated: Vec<Option<Vec<CheckedRule<'_>>>> = Vec::new();
    for route in &set.http_routes {
        validated.push(check_route(cx, route, backends));
    }
    let implicit_backends = implicit_backends(cx, set, backends);

    let mut routers = HashMap::new();
    for (li, listener) in listeners.iter().enumerate() {
        let mut tiers = Tiers::default();
        // Alphabetical namespace/name is the tie-breaker between routes (Gateway API uses
        // creation time first; files have none).
        let mut order: Vec<usize> = (0..set.http_routes.len()).collect();
        order.sort_by(|a, b| set.http_routes[*a].id.cmp(&set.http_routes[*b].id));
        for (rank, ri) in order.into_iter().enumerate() {
            if !attachments[ri].contains(&li) {
                continue;
            }
            let Some(rules) = &validated[ri] else {
                continue;
            };
            let route = &set.http_routes[ri];
            let hostnames = effective_hostnames(&route.spec, listener.hostname.as_deref());
            if hostnames.as_ref().is_some_and(Vec::is_empty) {
                continue; // no hostname in common with the listener
            }
            for (rule_index, rule) in rules.iter().enumerate() {
                let action = Arc::new(build_action(
                    route,
                    rule_index,
                    rule,
                    backends,
                    policies,
                    &listener.gateway,
                ));
                for (match_index, m) in rule.matches.iter().enumerate() {
                    let entry = RouteEntry {
                        matcher: m.clone(),
                        action: action.clone(),
                    };
                    let key = SortKey::new(m, rank, rule_index, match_index);
                    match &hostnames {
                        None => tiers.any.push((key, entry)),
                        Some(hosts) => {
                            for h in hosts {
                                match h.strip_prefix('*') {
                                    Some(suffix) => tiers
                                        .wildcard
                                        .entry(suffix.to_owned())
                                        .or_default()
                                        .push((key.clone(), entry.clone())),
                                    None => tiers
                                        .exact
                                        .entry(h.clone())
                                        .or_default()
                                        .push((key.clone(), entry.clone())),
                                }
                            }
                        }
                    }
                }
            }
        }
        let mut implicit = HashMap::new();
        for (host, (backend, inline)) in &implicit_backends {
            if listener
                .hostname
                .as_deref()
                .is_some_and(|p| !hostname_matches(p, host))
            {
                continue;
            }
            let policy = policies.request_policy(None, &backend.id, *inline, &listener.gateway);
            let targets = backend
                .ports
                .iter()
                .map(|port| {
                    Arc::new(Target {
                        backend: backend.clone(),
                        port: port.clone(),
                        policy: policy.clone(),
                        rewrite_authority: true,
                    })
                })
                .collect();
            implicit.insert(
                host.clone(),
                ImplicitRoute {
                    backend: backend.clone(),
                    targets,
                },
            );
        }
        routers.insert(
            listener.plan.key.clone(),
            Arc::new(tiers.into_router(implicit)),
        );
    }
    routers
}

/// FQDN Backends reachable by hostname; on a clash the lower namespace/name wins.
fn implicit_backends<'a>(
    cx: &mut Cx,
    set: &ConfigSet,
    backends: &'a Backends<'_>,
) -> HashMap<
    String,
    &'a (
        Arc<crate::runtime::snapshot::Backend>,
        Option<&'a crate::config::wire::policy::TrafficPolicySpec>,
    ),
> {
    let mut out: HashMap<
        String,
        &(
            Arc<crate::runtime::snapshot::Backend>,
            Option<&crate::config::wire::policy::TrafficPolicySpec>,
        ),
    > = HashMap::new();
    let mut sorted: Vec<_> = backends.by_name.values().collect();
    sorted.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    for entry in sorted {
        let backend = &entry.0;
        let Some(host) = &backend.hostname else {
            continue;
        };
        if !backend
            .ports
            .iter()
            .all(|p| matches!(p.protocol, Protocol::Http | Protocol::Http11))
        {
            continue;
        }
        if let Some(winner) = out.get(host) {
            if let Some(obj) = set.backends.iter().find(|o| o.id == backend.id) {
                cx.warn(
                    at(&obj.file, &obj.id, obj.spec.destination.pos, "spec.destination.fqdn.hostname"),
                    Reason::Conflicted,
                    format!("hostname `{host}` is also the destination of {}, which wins the implicit route", winner.0.id),
                    "give each hostname one Backend, or route explicitly with an HTTPRoute",
                );
            }
            continue;
        }
        out.insert(host.clone(), entry);
    }
    out
}

/// The route's hostnames intersected with the listener's (None: any host).
fn effective_hostnames(spec: &HttpRouteSpec, listener: Option<&str>) -> Option<Vec<String>> {
    let route: Vec<String> = spec
        .hostnames
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
                    if hostname_matches(l, &h) || h == l {
                        Some(h)
                    } else if hostname_matches(&h, l)
                        || (!l.starts_with('*') && h.starts_with('*') && hostname_matches(&h, l))
                    {
                        Some(l.to_owned())
                    } else {
                        None
                    }
                })
                .collect(),
        ),
    }
}

/// Indices of the listeners a route attaches to.
fn attach(
    cx: &mut Cx,
    set: &ConfigSet,
    route: &Object<HttpRouteSpec>,
    listeners: &[CompiledListener],
) -> Vec<usize> {
    let (file, id) = (&*route.file, &route.id);
    let allowed =
        |l: &CompiledListener| l.routes_from_all_namespaces || l.gateway.namespace == id.namespace;
    if route.spec.parent_refs.is_empty() {
        // egressd extension: a route without parentRefs attaches to every HTTP listener that
        // admits its namespace (the common single-Gateway sidecar case needs no wiring).
        return listeners
            .iter()
            .enumerate()
            .filter(|(_, l)| allowed(l))
            .map(|(i, _)| i)
            .collect();
    }
    let mut out = Vec::new();
    for (pi, parent) in route.spec.parent_refs.iter().enumerate() {
        let field = format!("spec.parentRefs[{pi}]");
        let group = parent.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = parent.kind.as_deref().unwrap_or("Gateway");
        if group != GATEWAY_GROUP || kind != "Gateway" {
            cx.error(
                at(file, id, parent.pos, field),
                format!("parentRef to {kind} in group `{group}` is not supported"),
                "attach routes to a Gateway",
            );
            continue;
        }
        let ns = parent.namespace.as_deref().unwrap_or(&id.namespace);
        let Some(gw) = set
            .gateways
            .iter()
            .find(|g| g.id.namespace == ns && g.id.name == parent.name)
        else {
            cx.missing_ref(
                at(file, id, parent.pos, field),
                format!("Gateway {ns}/{} does not exist", parent.name),
                "check the name and namespace, or add the Gateway",
            );
            continue;
        };
        if let Some(section) = &parent.section_name {
            if !gw.spec.listeners.iter().any(|l| &l.name == section) {
                cx.missing_ref(
                    at(file, id, parent.pos, format!("{field}.sectionName")),
                    format!("Gateway {ns}/{} has no listener `{section}`", parent.name),
                    "use one of the Gateway's listener names",
                );
                continue;
            }
        }
        let mut attached = false;
        for (i, l) in listeners.iter().enumerate() {
            if l.gateway != gw.id
                || parent.section_name.as_ref().is_some_and(|s| s != &l.name)
                || parent.port.is_some_and(|p| p != l.port)
            {
                continue;
            }
            if !allowed(l) {
                cx.error(
                    at(file, id, parent.pos, field.clone()),
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
    out
}

struct CheckedRule<'a> {
    rule: &'a HttpRouteRule,
    matches: Vec<RequestMatch>,
    filters: Filters,
    /// (backend namespace/name, port, weight)
    refs: Vec<(
        Arc<crate::runtime::snapshot::Backend>,
        Option<&'a crate::config::wire::policy::TrafficPolicySpec>,
        usize,
        u32,
    )>,
}

/// Validates a route's hostnames and rules. None when it has errors.
fn check_route<'a>(
    cx: &mut Cx,
    route: &'a Object<HttpRouteSpec>,
    backends: &'a Backends<'_>,
) -> Option<Vec<CheckedRule<'a>>> {
    let (file, id) = (&*route.file, &route.id);
    let before = error_count(cx);
    for (i, h) in route.spec.hostnames.iter().enumerate() {
        if !is_valid_hostname_pattern(&h.value.to_ascii_lowercase()) {
            cx.error(
                at(file, id, h.pos, format!("spec.hostnames[{i}]")),
                format!("invalid hostname `{}`", h.value),
                "use a hostname or `*.suffix` (no port, no IP)",
            );
        }
    }
    let mut rules = Vec::new();
    for (ri, rule) in route.spec.rules.iter().enumerate() {
        let field = format!("spec.rules[{ri}]");
        if let Some(v) = &rule.retry {
            cx.not_yet(
                at(file, id, v.pos, format!("{field}.retry")),
                "retry",
                "[balance]",
            );
        }
        if let Some(v) = &rule.session_persistence {
            cx.not_yet(
                at(file, id, v.pos, format!("{field}.sessionPersistence")),
                "sessionPersistence",
                "[balance]",
            );
        }
        let mut matches = Vec::new();
        if rule.matches.is_empty() {
            matches.push(RequestMatch::default());
        }
        for (mi, m) in rule.matches.iter().enumerate() {
            if let Some(rm) =
                check_match(cx, file, id, m, &format!("{field}.matches[{mi}]"), rule.pos)
            {
                matches.push(rm);
            }
        }
        let filters = check_filters(cx, file, id, rule, &matches, &field);
        let mut refs = Vec::new();
        for (bi, r) in rule.backend_refs.iter().enumerate() {
            let bfield = format!("{field}.backendRefs[{bi}]");
            let group = r.group.as_deref().unwrap_or(EGRESSD_GROUP);
            let kind = r.kind.as_deref().unwrap_or("Backend");
            if group != EGRESSD_GROUP || kind != "Backend" {
                let g = if group.is_empty() { "core" } else { group };
                cx.error(
                    at(file, id, r.pos, bfield),
                    format!("backendRef to {kind} in group `{g}` is not supported"),
                    "reference `group: egressd.dev, kind: Backend`",
                );
                continue;
            }
            if let Some(v) = &r.filters {
                let _ = v;
                cx.not_yet(
                    at(file, id, r.pos, format!("{bfield}.filters")),
                    "backendRefs[].filters",
                    "",
                );
            }
            let ns = r.namespace.as_deref().unwrap_or(&id.namespace);
            if ns != id.namespace {
                cx.not_yet(
                    at(file, id, r.pos, format!("{bfield}.namespace")),
                    "a cross-namespace backendRef (it needs ReferenceGrant)",
                    "",
                );
                continue;
            }
            let Some((backend, inline)) = backends.get(ns, &r.name) else {
                cx.missing_ref(
                    at(file, id, r.pos, bfield),
                    format!("Backend {ns}/{} does not exist or has errors", r.name),
                    "check the name, or fix the Backend's own errors",
                );
                continue;
            };
            let port_index = match r.port {
                Some(p) => match backend.ports.iter().position(|bp| bp.number == p) {
                    Some(i) => i,
                    None => {
                        let ports: Vec<String> =
                            backend.ports.iter().map(|p| p.number.to_string()).collect();
                        cx.missing_ref(
                            at(file, id, r.pos, format!("{bfield}.port")),
                            format!("Backend {ns}/{} has no port {p}", r.name),
                            format!("use one of: {}", ports.join(", ")),
                        );
                        continue;
                    }
                },
                None if backend.ports.len() > 1 => {
                    cx.error(
                        at(file, id, r.pos, format!("{bfield}.port")),
                        format!("Backend {ns}/{} has several ports; name one", r.name),
                        "add `port:`",
                    );
                    continue;
                }
                None => 0,
            };
            refs.push((backend.clone(), *inline, port_index, r.weight.unwrap_or(1)));
        }
        rules.push(CheckedRule {
            rule,
            matches,
            filters,
            refs,
        });
    }
    (error_count(cx) == before).then_some(rules)
}

fn error_count(cx: &Cx) -> usize {
    cx.diagnostics.iter().filter(|d| d.is_error()).count()
}

fn check_match(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    m: &crate::config::wire::route::HttpRouteMatch,
    field: &str,
    rule_pos: crate::config::yaml::Pos,
) -> Option<RequestMatch> {
    let _ = rule_pos;
    let mut ok = true;
    let mut out = RequestMatch::default();
    if let Some(path) = &m.path {
        let value = path
            .value
            .value
            .as_ref()
            .map_or_else(|| "/".to_owned(), |v| v.value.clone());
        // Errors about the value point at the value (the match itself when it is omitted).
        let value_pos = path.value.value.as_ref().map_or(path.pos, |v| v.pos);
        let kind = path.value.kind.unwrap_or(PathMatchType::PathPrefix);
        out.path = match kind {
            PathMatchType::Exact | PathMatchType::PathPrefix if !value.starts_with('/') => {
                cx.error(
                    at(file, id, value_pos, format!("{field}.path.value")),
                    format!("path `{value}` must start with `/`"),
                    "e.g. /api",
                );
                ok = false;
                PathMatcher::default()
            }
            PathMatchType::Exact => PathMatcher::Exact(value),
            PathMatchType::PathPrefix => {
                PathMatcher::Prefix(value.trim_end_matches('/').to_owned())
            }
            PathMatchType::RegularExpression => match full_regex(&value) {
                Ok(re) => PathMatcher::Regex(re),
                Err(e) => {
                    cx.error(
                        at(file, id, value_pos, format!("{field}.path.value")),
                        format!("invalid regular expression `{value}`: {}", regex_error(&e)),
                        "RE2 syntax; the expression must match the whole path",
                    );
                    ok = false;
                    PathMatcher::default()
                }
            },
        };
    }
    if let Some(method) = m.method {
        out.method = Method::from_bytes(method.as_str().as_bytes()).ok();
    }
    for (kind_name, list, is_header) in [
        ("headers", &m.headers, true),
        ("queryParams", &m.query_params, false),
    ] {
        for (i, v) in list.iter().enumerate() {
            let f = format!("{field}.{kind_name}[{i}]");
            let matcher = match v.value.kind.unwrap_or(ValueMatchType::Exact) {
                ValueMatchType::Exact => ValueMatcher::Exact(v.value.value.value.clone()),
                ValueMatchType::RegularExpression => match full_regex(&v.value.value) {
                    Ok(re) => ValueMatcher::Regex(re),
                    Err(e) => {
                        cx.error(
                            at(file, id, v.value.value.pos, format!("{f}.value")),
                            format!(
                                "invalid regular expression `{}`: {}",
                                v.value.value.value,
                                regex_error(&e)
                            ),
                            "RE2 syntax; it must match the whole value",
                        );
                        ok = false;
                        continue;
                    }
                },
            };
            if is_header {
                match HeaderName::from_bytes(v.value.name.as_bytes()) {
                    Ok(name) => out.headers.push((name, matcher)),
                    Err(_) => {
                        cx.error(
                            at(file, id, v.pos, format!("{f}.name")),
                            format!("invalid header name `{}`", v.value.name),
                            "header names are tokens such as x-env",
                        );
                        ok = false;
                    }
                }
            } else {
                out.query.push((v.value.name.clone(), matcher));
            }
        }
    }
    ok.then_some(out)
}

/// Compiles a regex that must match the whole input.
fn full_regex(pattern: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!("^(?:{pattern})$"))
}

/// The cause of a regex error on one line. The regex crate renders syntax errors over several
/// lines, quoting the pattern as compiled (wrapped in `^(?:...)$`), which would break the
/// one-line diagnostic format and show the user a pattern they did not write.
fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find_map(|line| line.strip_prefix("error: "))
        .unwrap_or_else(|| text.lines().last().unwrap_or_default())
        .trim()
        .to_owned()
}

fn check_filters(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    rule: &HttpRouteRule,
    matches: &[RequestMatch],
    field: &str,
) -> Filters {
    let mut filters = Filters::default();
    for (i, f) in rule.filters.iter().enumerate() {
        let ff = format!("{field}.filters[{i}]");
        let v = &f.value;
        let set_fields = [
            (
                FilterType::RequestHeaderModifier,
                v.request_header_modifier.is_some(),
            ),
            (
                FilterType::ResponseHeaderModifier,
                v.response_header_modifier.is_some(),
            ),
            (FilterType::UrlRewrite, v.url_rewrite.is_some()),
            (FilterType::RequestRedirect, v.request_redirect.is_some()),
            (FilterType::RequestMirror, v.request_mirror.is_some()),
            (FilterType::ExtensionRef, v.extension_ref.is_some()),
            (FilterType::Cors, v.cors.is_some()),
        ];
        for (t, present) in set_fields {
            if present && t != v.kind {
                cx.error(
                    at(file, id, f.pos, ff.clone()),
                    format!(
                        "filter of type {} has a `{}` field",
                        v.kind,
                        lower_first(t.as_str())
                    ),
                    "each filter sets only the field named by its type",
                );
            }
        }
        match v.kind {
            FilterType::RequestHeaderModifier | FilterType::ResponseHeaderModifier => {
                let request = v.kind == FilterType::RequestHeaderModifier;
                let m = if request {
                    &v.request_header_modifier
                } else {
                    &v.response_header_modifier
                };
                let Some(m) = m else {
                    cx.error(
                        at(file, id, f.pos, ff),
                        format!(
                            "filter {} needs its `{}` field",
                            v.kind,
                            lower_first(v.kind.as_str())
                        ),
                        "",
                    );
                    continue;
                };
                let ops = header_ops(cx, file, id, f, m, &ff);
                if request {
                    filters.request_headers = ops;
                } else {
                    filters.response_headers = ops;
                }
            }
            FilterType::UrlRewrite => {
                let Some(rw) = &v.url_rewrite else {
                    cx.error(
                        at(file, id, f.pos, ff),
                        "filter URLRewrite needs its `urlRewrite` field",
                        "",
                    );
                    continue;
                };
                if let Some(h) = &rw.hostname {
                    match HeaderValue::from_str(h) {
                        Ok(v)
                            if is_valid_hostname_pattern(&h.to_ascii_lowercase())
                                && !h.starts_with('*') =>
                        {
                            filters.rewrite_host = Some(v)
                        }
                        _ => cx.error(
                            at(file, id, f.pos, format!("{ff}.urlRewrite.hostname")),
                            format!("invalid hostname `{h}`"),
                            "a DNS name such as api.example.com",
                        ),
                    }
                }
                if let Some(p) = &rw.path {
                    match (p.kind, &p.replace_full_path, &p.replace_prefix_match) {
                        (PathModifierType::ReplaceFullPath, Some(full), None) if full.starts_with('/') => filters.rewrite_path = Some(PathRewrite::Full(full.clone())),
                        (PathModifierType::ReplacePrefixMatch, None, Some(prefix)) if prefix.starts_with('/') => {
                            if matches.iter().all(|m| matches!(m.path, PathMatcher::Prefix(_))) {
                                filters.rewrite_path = Some(PathRewrite::Prefix(prefix.clone()));
                            } else {
                                cx.error(at(file, id, f.pos, format!("{ff}.urlRewrite.path")), "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match", "use ReplaceFullPath, or PathPrefix matches");
                            }
                        }
                        _ => cx.error(
                            at(file, id, f.pos, format!("{ff}.urlRewrite.path")),
                            "path rewrite needs exactly the field named by its type, starting with `/`",
                            "{type: ReplaceFullPath, replaceFullPath: /x} or {type: ReplacePrefixMatch, replacePrefixMatch: /x}",
                        ),
                    }
                }
            }
            other => cx.not_yet(at(file, id, f.pos, ff), &format!("filter {other}"), ""),
        }
    }
    filters
}

fn lower_first(s: &str) -> String {
    match s {
        "URLRewrite" => "urlRewrite".to_owned(),
        "CORS" => "cors".to_owned(),
        _ => {
            let mut c = s.chars();
            c.next()
                .map(|f| f.to_ascii_lowercase().to_string() + c.as_str())
                .unwrap_or_default()
        }
    }
}

fn header_ops(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    f: &Spanned<crate::config::wire::route::HttpRouteFilter>,
    m: &HeaderModifier,
    field: &str,
) -> HeaderOps {
    let mut ops = HeaderOps::default();
    let header = |cx: &mut Cx, name: &str, value: &str| -> Option<(HeaderName, HeaderValue)> {
        let n = HeaderName::from_bytes(name.as_bytes());
        let v = HeaderValue::from_str(value);
        match (n, v) {
            (Ok(n), Ok(v)) => Some((n, v)),
            _ => {
                cx.error(
                    at(file, id, f.pos, field.to_owned()),
                    format!("invalid header `{name}: {value}`"),
                    "header names are tokens; values are visible ASCII",
                );
                None
            }
        }
    };
    for h in &m.set {
        if let Some(p) = header(cx, &h.name, &h.value) {
            ops.set.push(p);
        }
    }
    for h in &m.add {
        if let Some(p) = header(cx, &h.name, &h.value) {
            ops.add.push(p);
        }
    }
    for name in &m.remove {
        if let Some((n, _)) = header(cx, name, "") {
            ops.remove.push(n);
        }
    }
    ops
}

fn build_action(
    route: &Object<HttpRouteSpec>,
    rule_index: usize,
    rule: &CheckedRule<'_>,
    _backends: &Backends<'_>,
    policies: &PolicyIndex<'_>,
    gateway: &ObjectId,
) -> RouteAction {
    let timeouts = rule.rule.timeouts.as_ref().map(|t| &t.value);
    let mut total = 0u64;
    let targets = rule
        .refs
        .iter()
        .filter(|(_, _, _, w)| *w > 0)
        .map(|(backend, inline, port_index, weight)| {
            total += u64::from(*weight);
            let policy =
                policies.request_policy(Some((&route.id, timeouts)), &backend.id, *inline, gateway);
            WeightedTarget {
                target: Arc::new(Target {
                    backend: backend.clone(),
                    port: backend.ports[*port_index].clone(),
                    policy,
                    rewrite_authority: true,
                }),
                weight: *weight,
            }
        })
        .collect();
    RouteAction {
        name: format!(
            "HTTPRoute {}/{} rule {rule_index}",
            route.id.namespace, route.id.name
        )
        .into(),
        filters: rule.filters.clone(),
        backends: targets,
        total_weight: total,
    }
}

/// Gateway API precedence of one match.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SortKey {
    path_kind: u8,
    path_len: std::cmp::Reverse<usize>,
    no_method: bool,
    headers: std::cmp::Reverse<usize>,
    query: std::cmp::Reverse<usize>,
    route_rank: usize,
    rule: usize,
    index: usize,
}

impl SortKey {
    fn new(m: &RequestMatch, route_rank: usize, rule: usize, index: usize) -> Self {
        let (path_kind, len) = match &m.path {
            // Gateway API leaves regex precedence to implementations; between exact and prefix
            // (as Envoy Gateway does) keeps regex rules reachable next to a catch-all prefix.
            PathMatcher::Exact(p) => (0, p.len()),
            PathMatcher::Regex(r) => (1, r.as_str().len()),
            PathMatcher::Prefix(p) => (2, p.len()),
        };
        SortKey {
            path_kind,
            path_len: std::cmp::Reverse(len),
            no_method: m.method.is_none(),
            headers: std::cmp::Reverse(m.headers.len()),
            query: std::cmp::Reverse(m.query.len()),
            route_rank,
            rule,
            index,
        }
    }
}

#[derive(Default)]
struct Tiers {
    exact: HashMap<String, Vec<(SortKey, RouteEntry)>>,
    wildcard: HashMap<String, Vec<(SortKey, RouteEntry)>>,
    any: Vec<(SortKey, RouteEntry)>,
}

impl Tiers {
    fn into_router(self, implicit: HashMap<String, ImplicitRoute>) -> HttpRouter {
        fn sorted(mut v: Vec<(SortKey, RouteEntry)>) -> Vec<RouteEntry> {
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v.into_iter().map(|(_, e)| e).collect()
        }
        let mut wildcard: Vec<(String, Vec<RouteEntry>)> = self
            .wildcard
            .into_iter()
            .map(|(k, v)| (k, sorted(v)))
            .collect();
        wildcard.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        HttpRouter {
            exact: self
                .exact
                .into_iter()
                .map(|(k, v)| (k, sorted(v)))
                .collect(),
            wildcard,
            any: sorted(self.any),
            implicit,
        }
    }
}
