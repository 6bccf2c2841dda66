//! Validating one `HTTPRoute`: hostnames, matches, filters and backendRefs, into
//! [`CheckedRule`]s that the router assembly in `routes` turns into route entries.

use std::sync::Arc;

use http::{HeaderName, Method};
use regex::Regex;

use super::backends::Backends;
use super::route_filters::check_filters;
use super::{at, Cx};
use crate::config::wire::common::BackendRef;
use crate::config::wire::enums::{PathMatchType, ValueMatchType};
use crate::config::wire::route::{HttpRouteRule, HttpRouteSpec};
use crate::config::wire::{Object, EGRESSD_GROUP};
use crate::config::yaml::Spanned;
use crate::config::ObjectId;
use crate::names::is_valid_hostname_pattern;
use crate::snapshot::filters::Filters;
use crate::snapshot::router::{PathMatcher, RequestMatch, ValueMatcher};

/// A rule that passed validation: its matches, filters and resolved backendRefs.
pub(super) struct CheckedRule<'a> {
    pub(super) rule: &'a HttpRouteRule,
    pub(super) matches: Vec<RequestMatch>,
    pub(super) filters: Arc<Filters>,
    /// (backend namespace/name, port, weight)
    pub(super) refs: Vec<(
        Arc<crate::snapshot::Backend>,
        Option<&'a crate::config::wire::policy::TrafficPolicySpec>,
        usize,
        u32,
    )>,
}

/// Validates a route's hostnames and rules. None when it has errors.
pub(super) fn check_route<'a>(
    cx: &mut Cx,
    route: &'a Object<HttpRouteSpec>,
    backends: &'a Backends<'_>,
) -> Option<Vec<CheckedRule<'a>>> {
    let (file, id) = (&*route.file, &route.id);
    let before = cx.error_count();
    check_hostnames(cx, file, id, &route.spec.hostnames);
    let mut rules = Vec::with_capacity(route.spec.rules.len());
    for (ri, rule) in route.spec.rules.iter().enumerate() {
        let field = format!("spec.rules[{ri}]");
        if let Some(v) = &rule.retry {
            for code in v.value.codes.iter().flatten() {
                if !(400..=599).contains(code) {
                    cx.error(
                        at(file, id, v.pos, format!("{field}.retry.codes")),
                        format!("retry code {code} is not an error status"),
                        "list 4xx or 5xx statuses, e.g. [503]",
                    );
                }
            }
        }
        if let Some(v) = &rule.session_persistence {
            cx.not_yet(
                at(file, id, v.pos, format!("{field}.sessionPersistence")),
                "sessionPersistence",
                "",
            );
        }
        let mut matches = Vec::with_capacity(rule.matches.len().max(1));
        if rule.matches.is_empty() {
            matches.push(RequestMatch::default());
        }
        for (mi, m) in rule.matches.iter().enumerate() {
            if let Some(rm) = check_match(cx, file, id, m, &format!("{field}.matches[{mi}]")) {
                matches.push(rm);
            }
        }
        let filters = check_filters(cx, file, id, rule, &matches, &field);
        let filters = cx.filters.get(filters);
        let mut refs = Vec::with_capacity(rule.backend_refs.len());
        for (bi, r) in rule.backend_refs.iter().enumerate() {
            let bfield = format!("{field}.backendRefs[{bi}]");
            if let Some((backend, inline, port_index)) =
                resolve_backend_ref(cx, file, id, r, &bfield, backends)
            {
                refs.push((backend.clone(), inline, port_index, r.weight.unwrap_or(1)));
            }
        }
        rules.push(CheckedRule {
            rule,
            matches,
            filters,
            refs,
        });
    }
    (cx.error_count() == before).then_some(rules)
}

/// Checks that every hostname is a DNS name or `*.suffix`.
pub(super) fn check_hostnames(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    hostnames: &[Spanned<String>],
) {
    for (i, h) in hostnames.iter().enumerate() {
        if !is_valid_hostname_pattern(&h.value.to_ascii_lowercase()) {
            cx.error(
                at(file, id, h.pos, format!("spec.hostnames[{i}]")),
                format!("invalid hostname `{}`", h.value),
                "use a hostname or `*.suffix` (no port, no IP)",
            );
        }
    }
}

/// Resolves one backendRef of a route to a Backend of the route's namespace and the index of
/// the referenced port. None (with a diagnostic) when it cannot be used.
pub(super) fn resolve_backend_ref<'a>(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    r: &Spanned<BackendRef>,
    bfield: &str,
    backends: &'a Backends<'_>,
) -> Option<(
    &'a Arc<crate::snapshot::Backend>,
    Option<&'a crate::config::wire::policy::TrafficPolicySpec>,
    usize,
)> {
    let group = r.group.as_deref().unwrap_or(EGRESSD_GROUP);
    let kind = r.kind.as_deref().unwrap_or("Backend");
    // An XBackend is a Backend mapped when loaded: both answer to the same namespace/name.
    let x = (crate::config::wire::GATEWAY_X_GROUP, "XBackend");
    if (group, kind) != (EGRESSD_GROUP, "Backend") && (group, kind) != x {
        let g = if group.is_empty() { "core" } else { group };
        cx.error(
            at(file, id, r.pos, bfield),
            format!("backendRef to {kind} in group `{g}` is not supported"),
            "reference `group: egressd.dev, kind: Backend` or `group: gateway.networking.x-k8s.io, kind: XBackend`",
        );
        return None;
    }
    if r.filters.is_some() {
        cx.not_yet(
            at(file, id, r.pos, format!("{bfield}.filters")),
            "backendRefs[].filters",
            "",
        );
    }
    let ns = r.namespace.as_deref().unwrap_or(&id.namespace);
    if *ns != *id.namespace {
        cx.not_yet(
            at(file, id, r.pos, format!("{bfield}.namespace")),
            "a cross-namespace backendRef (it needs ReferenceGrant)",
            "",
        );
        return None;
    }
    let Some((backend, inline)) = backends.get(ns, &r.name) else {
        cx.missing_ref(
            at(file, id, r.pos, bfield),
            format!("Backend {ns}/{} does not exist or has errors", r.name),
            "check the name, or fix the Backend's own errors",
        );
        return None;
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
                return None;
            }
        },
        None if backend.ports.len() > 1 => {
            cx.error(
                at(file, id, r.pos, format!("{bfield}.port")),
                format!("Backend {ns}/{} has several ports; name one", r.name),
                "add `port:`",
            );
            return None;
        }
        None => 0,
    };
    Some((backend, *inline, port_index))
}

/// One entry of a rule's `matches`, as the router matches it; `None` when it has errors
/// (reported).
fn check_match(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    m: &crate::config::wire::route::HttpRouteMatch,
    field: &str,
) -> Option<RequestMatch> {
    let mut ok = true;
    let mut out = RequestMatch::default();
    if let Some(path) = &m.path {
        match path_matcher(cx, file, id, path, field) {
            Some(matcher) => out.path = matcher,
            None => ok = false,
        }
    }
    if let Some(method) = m.method {
        out.method = Method::from_bytes(method.as_str().as_bytes()).ok();
    }
    ok &= value_matchers(cx, file, id, m, field, &mut out);
    ok.then_some(out)
}

/// The `path` of a match (a `/` prefix when its value is omitted); `None` when the value
/// does not start with `/` or is not a valid regular expression (reported).
fn path_matcher(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    path: &Spanned<crate::config::wire::route::PathMatch>,
    field: &str,
) -> Option<PathMatcher> {
    let value = path
        .value
        .value
        .as_ref()
        .map_or_else(|| "/".to_owned(), |v| v.value.clone());
    // Errors about the value point at the value (the match itself when it is omitted).
    let value_pos = path.value.value.as_ref().map_or(path.pos, |v| v.pos);
    let kind = path.value.kind.unwrap_or(PathMatchType::PathPrefix);
    match kind {
        PathMatchType::Exact | PathMatchType::PathPrefix if !value.starts_with('/') => {
            cx.error(
                at(file, id, value_pos, format!("{field}.path.value")),
                format!("path `{value}` must start with `/`"),
                "e.g. /api",
            );
            None
        }
        PathMatchType::Exact => Some(PathMatcher::Exact(value)),
        PathMatchType::PathPrefix => {
            Some(PathMatcher::Prefix(value.trim_end_matches('/').to_owned()))
        }
        PathMatchType::RegularExpression => match full_regex(&value) {
            Ok(re) => Some(PathMatcher::Regex(re)),
            Err(e) => {
                cx.error(
                    at(file, id, value_pos, format!("{field}.path.value")),
                    format!("invalid regular expression `{value}`: {}", regex_error(&e)),
                    "RE2 syntax; the expression must match the whole path",
                );
                None
            }
        },
    }
}

/// Adds the `headers` and `queryParams` matchers of `m` to `out`; false when one has errors
/// (reported).
fn value_matchers(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    m: &crate::config::wire::route::HttpRouteMatch,
    field: &str,
    out: &mut RequestMatch,
) -> bool {
    let mut ok = true;
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
                            // Match values may be secrets (a signature): never quoted.
                            format!(
                                "invalid regular expression for `{}`: {}",
                                v.value.name,
                                regex_error(&e)
                            ),
                            "RE2 syntax; it must match the whole value",
                        );
                        ok = false;
                        continue;
                    }
                },
            };
            if !is_header {
                out.query.push((v.value.name.clone(), matcher));
                continue;
            }
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
        }
    }
    ok
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
