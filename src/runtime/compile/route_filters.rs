//! The `filters` of an HTTPRoute rule: header modifiers and URL rewrites checked into the
//! rule's [`Filters`]; other filter types are not supported yet.

use http::{HeaderName, HeaderValue};

use super::{at, At, Cx};
use crate::config::wire::enums::{FilterType, PathModifierType};
use crate::config::wire::route::{HeaderModifier, HttpRouteFilter, HttpRouteRule, UrlRewrite};
use crate::config::yaml::Spanned;
use crate::config::ObjectId;
use crate::names::is_valid_hostname_pattern;
use crate::snapshot::filters::{Filters, HeaderOps, PathRewrite};
use crate::snapshot::router::{PathMatcher, RequestMatch};

/// The filters of `rule` (whose matches are `matches`), each checked.
pub(super) fn check_filters(
    cx: &mut Cx,
    file: &std::path::Path,
    id: &ObjectId,
    rule: &HttpRouteRule,
    matches: &[RequestMatch],
    field: &str,
) -> Filters {
    let mut filters = Filters::default();
    for (i, f) in rule.filters.iter().enumerate() {
        let site = FilterSite {
            file,
            id,
            filter: f,
            field: format!("{field}.filters[{i}]"),
        };
        site.check_fields(cx);
        let v = &f.value;
        match v.kind {
            FilterType::RequestHeaderModifier | FilterType::ResponseHeaderModifier => {
                site.header_modifier(cx, &mut filters);
            }
            FilterType::UrlRewrite => {
                let Some(rw) = &v.url_rewrite else {
                    cx.error(
                        site.at(""),
                        "filter URLRewrite needs its `urlRewrite` field",
                        "",
                    );
                    continue;
                };
                site.rewrite_host(cx, rw, &mut filters);
                site.rewrite_path(cx, rw, matches, &mut filters);
            }
            other => cx.not_yet(site.at(""), &format!("filter {other}"), ""),
        }
    }
    filters
}

/// One filter of a rule, and where it is written.
struct FilterSite<'a> {
    file: &'a std::path::Path,
    id: &'a ObjectId,
    filter: &'a Spanned<HttpRouteFilter>,
    /// `...filters[i]`.
    field: String,
}

impl<'a> FilterSite<'a> {
    /// Where a diagnostic about the filter's field `suffix` points (the filter itself).
    fn at(&self, suffix: &str) -> At<'a> {
        at(
            self.file,
            self.id,
            self.filter.pos,
            format!("{}{suffix}", self.field),
        )
    }

    /// A filter sets only the field its type names.
    fn check_fields(&self, cx: &mut Cx) {
        let v = &self.filter.value;
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
                    self.at(""),
                    format!(
                        "filter of type {} has a `{}` field",
                        v.kind,
                        lower_first(t.as_str())
                    ),
                    "each filter sets only the field named by its type",
                );
            }
        }
    }

    /// A Request- or ResponseHeaderModifier: the header operations of its side.
    fn header_modifier(&self, cx: &mut Cx, filters: &mut Filters) {
        let v = &self.filter.value;
        let request = v.kind == FilterType::RequestHeaderModifier;
        let m = if request {
            &v.request_header_modifier
        } else {
            &v.response_header_modifier
        };
        let Some(m) = m else {
            cx.error(
                self.at(""),
                format!(
                    "filter {} needs its `{}` field",
                    v.kind,
                    lower_first(v.kind.as_str())
                ),
                "",
            );
            return;
        };
        let ops = header_ops(cx, self.file, self.id, self.filter, m, &self.field);
        if request {
            filters.request_headers = ops;
        } else {
            filters.response_headers = ops;
        }
    }

    /// `urlRewrite.hostname`: a DNS name (not a wildcard).
    fn rewrite_host(&self, cx: &mut Cx, rw: &UrlRewrite, filters: &mut Filters) {
        let Some(h) = &rw.hostname else {
            return;
        };
        match HeaderValue::from_str(h) {
            Ok(v) if is_valid_hostname_pattern(&h.to_ascii_lowercase()) && !h.starts_with('*') => {
                filters.rewrite_host = Some(v)
            }
            _ => cx.error(
                self.at(".urlRewrite.hostname"),
                format!("invalid hostname `{h}`"),
                "a DNS name such as api.example.com",
            ),
        }
    }

    /// `urlRewrite.path`: the field its type names, starting with `/`; a prefix replaced only
    /// when every match of the rule is a prefix match.
    fn rewrite_path(
        &self,
        cx: &mut Cx,
        rw: &UrlRewrite,
        matches: &[RequestMatch],
        filters: &mut Filters,
    ) {
        let Some(p) = &rw.path else {
            return;
        };
        match (p.kind, &p.replace_full_path, &p.replace_prefix_match) {
            (PathModifierType::ReplaceFullPath, Some(full), None) if full.starts_with('/') => {
                filters.rewrite_path = Some(PathRewrite::Full(full.clone()))
            }
            (PathModifierType::ReplacePrefixMatch, None, Some(prefix))
                if prefix.starts_with('/') =>
            {
                if matches.iter().all(|m| matches!(m.path, PathMatcher::Prefix(_))) {
                    filters.rewrite_path = Some(PathRewrite::Prefix(prefix.clone()));
                } else {
                    cx.error(
                        self.at(".urlRewrite.path"),
                        "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match",
                        "use ReplaceFullPath, or PathPrefix matches",
                    );
                }
            }
            _ => cx.error(
                self.at(".urlRewrite.path"),
                "path rewrite needs exactly the field named by its type, starting with `/`",
                "{type: ReplaceFullPath, replaceFullPath: /x} or {type: ReplacePrefixMatch, replacePrefixMatch: /x}",
            ),
        }
    }
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
    f: &Spanned<HttpRouteFilter>,
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
