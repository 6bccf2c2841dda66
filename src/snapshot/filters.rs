//! HTTPRoute filters: header modifiers and URL rewrites, compiled to ready-to-apply values.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::router::PathMatcher;

/// The filters of one route rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Filters {
    pub request_headers: HeaderOps,
    pub(crate) response_headers: HeaderOps,
    /// `URLRewrite.hostname`: the `Host` sent upstream.
    pub(crate) rewrite_host: Option<HeaderValue>,
    pub(crate) rewrite_path: Option<PathRewrite>,
}

/// RequestHeaderModifier / ResponseHeaderModifier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HeaderOps {
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub(crate) add: Vec<(HeaderName, HeaderValue)>,
    pub(crate) remove: Vec<HeaderName>,
}

impl HeaderOps {
    /// Applies remove, then set, then add — the order Gateway API implementations use, so a
    /// header can be both removed and re-added by `set`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }
}

/// URLRewrite path modifiers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PathRewrite {
    /// Replace the whole path.
    Full(String),
    /// Replace the matched path prefix.
    Prefix(String),
}

impl PathRewrite {
    /// The rewritten path, given the path matcher that selected the rule.
    pub(crate) fn apply(&self, path: &str, matched: &PathMatcher) -> String {
        match self {
            PathRewrite::Full(p) => p.clone(),
            PathRewrite::Prefix(replacement) => {
                let prefix = match matched {
                    PathMatcher::Prefix(p) => p.as_str(),
                    // Validation only allows prefix replacement with PathPrefix matches.
                    _ => "",
                };
                let rest = &path[prefix.len().min(path.len())..];
                let replacement = replacement.trim_end_matches('/');
                match (replacement.is_empty(), rest.is_empty()) {
                    (true, true) => "/".to_owned(),
                    (true, false) => rest.to_owned(),
                    (false, _) => format!("{replacement}{rest}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rewrite_keeps_the_rest() {
        let m = PathMatcher::Prefix("/v1".into());
        let r = PathRewrite::Prefix("/api/v2".into());
        assert_eq!(r.apply("/v1/users", &m), "/api/v2/users");
        assert_eq!(r.apply("/v1", &m), "/api/v2");
        let strip = PathRewrite::Prefix("/".into());
        assert_eq!(strip.apply("/v1/users", &m), "/users");
        assert_eq!(strip.apply("/v1", &m), "/");
    }

    #[test]
    fn header_ops_order() {
        let mut h = HeaderMap::new();
        h.insert("a", HeaderValue::from_static("1"));
        h.insert("b", HeaderValue::from_static("1"));
        let ops = HeaderOps {
            set: vec![(HeaderName::from_static("a"), HeaderValue::from_static("2"))],
            add: vec![(HeaderName::from_static("c"), HeaderValue::from_static("3"))],
            remove: vec![HeaderName::from_static("b")],
        };
        ops.apply(&mut h);
        assert_eq!(h.get("a").unwrap(), "2");
        assert!(h.get("b").is_none());
        assert_eq!(h.get("c").unwrap(), "3");
    }
}
