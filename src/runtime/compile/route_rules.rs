//! Validating one `HTTPRoute`: hostnames, matches, filters and backendRefs, into
//! [`CheckedRule`]s that the router assembly in `routes` turns into route entries.

use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method};
use regex::Regex;

use super::backends::Backends;
use super::{at, Cx};
use crate::config::wire::common::BackendRef;
use crate::config::wire::enums::{FilterType, PathMatchType, PathModifierType, ValueMatchType};
use crate::config::wire::route::{HeaderModifier, HttpRouteRule, HttpRouteSpec};
use crate::config::wire::{Object, EGRESSD_GROUP};
use crate::config::yaml::Spanned;
use crate::config::ObjectId;
use crate::names::is_valid_hostname_pattern;
use crate::snapshot::filters::{Filters, HeaderOps, PathRewrite};
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
            // The value may be a secret (a bearer token): never quoted, only its name.
            (Err(_), _) => {
                cx.error(
                    at(file, id, f.pos, field.to_owned()),
                    format!("invalid header name `{name}`"),
                    "header names are tokens such as x-env",
                );
                None
            }
            (Ok(_), Err(_)) => {
                cx.error(
                    at(file, id, f.pos, field.to_owned()),
                    format!("invalid value for header `{name}` (not shown)"),
                    "header values are visible ASCII: no control characters or line breaks",
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
