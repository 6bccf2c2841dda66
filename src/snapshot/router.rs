//! Request routing on one HTTP listener: HTTPRoute rules first, then the implicit route to an
//! FQDN Backend named by the request's host.
//!
//! Rules are ordered at compile time by Gateway API precedence (exact path, then regular
//! expression, then longest prefix, then method, then most header matches, then most query matches, then route age /
//! name, then rule order), within three tiers of hostname specificity: routes naming the exact
//! host, then wildcard hostnames (longest suffix first), then routes without hostnames. The first
//! match wins, so per-request routing is a hash lookup and a short scan.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method};
use regex::Regex;

use super::filters::Filters;
use crate::snapshot::Target;

/// A table looked up on every request: foldhash rather than SipHash (two SipHash lookups
/// were 1.3 % of a request's instructions). The keys come from the config, never from
/// clients, so no client can choose colliding keys; lookups of a client's host only probe.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The router of one listener.
#[derive(Debug, Default)]
pub struct HttpRouter {
    /// Rules of routes that name hosts exactly, by lower-case host.
    pub exact: FastMap<String, Vec<RouteEntry>>,
    /// Rules of routes with `*.suffix` hostnames: (suffix including the leading dot, rules),
    /// longest suffix first.
    pub(crate) wildcard: Vec<(String, Vec<RouteEntry>)>,
    /// Rules of routes without hostnames.
    pub(crate) any: Vec<RouteEntry>,
    /// HTTP ports of FQDN Backends, reachable by their hostname, by lower-case host.
    pub(crate) implicit: FastMap<String, ImplicitRoute>,
    /// TCP ports of FQDN Backends (Passthrough or plain TCP), reachable by `CONNECT
    /// host:port`, by lower-case host.
    pub(crate) tunnels: FastMap<String, ImplicitRoute>,
}

/// Routing on a TLS Passthrough listener: by the SNI of the client's ClientHello. TLSRoutes
/// come first (exact hostnames, then `*.suffix` wildcards longest first, then routes without
/// hostnames, as HTTPRoutes do), then the implicit route to the Backend of that hostname.
#[derive(Debug, Default)]
pub(crate) struct SniRouter {
    /// TLSRoutes naming the SNI exactly, by lower-case host.
    pub(crate) routes_exact: FastMap<String, Arc<SniRoute>>,
    /// TLSRoutes with `*.suffix` hostnames: (suffix including the leading dot, route), longest
    /// suffix first.
    pub(crate) routes_wildcard: Vec<(String, Arc<SniRoute>)>,
    /// The TLSRoute without hostnames (any SNI), if one is attached.
    pub(crate) routes_any: Option<Arc<SniRoute>>,
    /// The Passthrough port for each lower-case hostname (the implicit route).
    pub(crate) exact: FastMap<String, Arc<Target>>,
}

/// A TLSRoute's backends on one listener.
#[derive(Debug)]
pub(crate) struct SniRoute {
    /// `TLSRoute namespace/name`, for logs.
    pub(crate) name: Arc<str>,
    pub(crate) backends: Vec<WeightedTarget>,
    /// Sum of the backends' weights (0: the route has no usable backend).
    pub(crate) total_weight: u64,
}

/// What the SNI of a ClientHello leads to.
#[derive(Debug)]
pub(crate) enum SniDecision<'a> {
    Target(&'a Arc<Target>),
    /// A TLSRoute claims the SNI but none of its backends may receive traffic (all weigh 0).
    NoBackend(&'a SniRoute),
    /// Nothing declares this SNI.
    NotAllowed,
}

impl SniRouter {
    pub(crate) fn route(&self, sni: &str) -> SniDecision<'_> {
        let route = self.routes_exact.get(sni).or_else(|| {
            self.routes_wildcard
                .iter()
                // `*.example.com` matches `a.example.com` and `a.b.example.com`, not
                // `example.com`.
                .find(|(suffix, _)| sni.len() > suffix.len() && sni.ends_with(suffix.as_str()))
                .map(|(_, route)| route)
        });
        if let Some(route) = route.or(self.routes_any.as_ref()) {
            return match pick_weighted(&route.backends, route.total_weight) {
                Some(target) => SniDecision::Target(target),
                None => SniDecision::NoBackend(route),
            };
        }
        match exact_or_wildcard(&self.exact, sni) {
            Some(target) => SniDecision::Target(target),
            None => SniDecision::NotAllowed,
        }
    }
}

/// One match of a route rule, with what to do when it matches.
#[derive(Debug, Clone)]
pub struct RouteEntry {
    pub matcher: RequestMatch,
    pub action: Arc<RouteAction>,
}

/// What a matched route rule does.
#[derive(Debug)]
pub struct RouteAction {
    /// `HTTPRoute namespace/name` and rule index, for logs.
    pub(crate) name: Arc<str>,
    /// Shared by the rules with the same filters (most have none).
    pub filters: Arc<Filters>,
    pub backends: Vec<WeightedTarget>,
    /// Sum of the backends' weights (0: the rule has no usable backend).
    pub(crate) total_weight: u64,
    /// backendRefs to Backends with `fallback: true`: used only while no primary Backend has
    /// a healthy endpoint.
    pub(crate) fallbacks: Vec<WeightedTarget>,
    /// Metric handles, looked up on the first request (the series outlive reloads).
    /// Boxed: most rules of a large config never see a request.
    pub(crate) stats: std::sync::OnceLock<Box<crate::telemetry::metrics::RequestStats>>,
}

impl RouteAction {
    /// The request metrics of this route rule.
    pub(crate) fn stats(
        &self,
        metrics: &crate::telemetry::metrics::Metrics,
    ) -> &crate::telemetry::metrics::RequestStats {
        self.stats
            .get_or_init(|| Box::new(metrics.route_stats(&self.name)))
    }

    /// Picks a backend by weight. With fallbacks: among the primaries that have a healthy
    /// endpoint; when none has, among the fallbacks that have one; when those have none
    /// either, among all primaries (whose panic mode then applies).
    pub(crate) fn pick(&self) -> Option<&Arc<Target>> {
        if self.fallbacks.is_empty() {
            return pick_weighted(&self.backends, self.total_weight);
        }
        let healthy = |b: &&WeightedTarget| b.target.port.endpoints.has_healthy();
        pick_weighted_filtered(&self.backends, healthy)
            .or_else(|| pick_weighted_filtered(&self.fallbacks, healthy))
            .or_else(|| pick_weighted(&self.backends, self.total_weight))
    }
}

impl RouteAction {
    /// The backendRef (primary or fallback, whatever its weight) that is `backend`'s `port`:
    /// where a request of an MCP session that port issued goes.
    pub(crate) fn target_of(&self, backend: &str, port: u16) -> Option<&Arc<Target>> {
        self.backends
            .iter()
            .chain(&self.fallbacks)
            .map(|b| &b.target)
            .find(|t| &*t.backend.label == backend && t.port.number == port)
    }
}

/// `pick_weighted` over the backends `keep` accepts (the rare path: computed per pick).
fn pick_weighted_filtered(
    backends: &[WeightedTarget],
    keep: impl Fn(&&WeightedTarget) -> bool,
) -> Option<&Arc<Target>> {
    let total: u64 = backends
        .iter()
        .filter(&keep)
        .map(|b| u64::from(b.weight))
        .sum();
    if total == 0 {
        return None;
    }
    let mut slot = fastrand::u64(..total);
    for b in backends.iter().filter(&keep) {
        if slot < u64::from(b.weight) {
            return Some(&b.target);
        }
        slot -= u64::from(b.weight);
    }
    None
}

/// Picks one of `backends` with probability proportional to its weight; None when `total`
/// (the sum of the weights) is 0.
fn pick_weighted(backends: &[WeightedTarget], total: u64) -> Option<&Arc<Target>> {
    if total == 0 {
        return None;
    }
    if backends.len() == 1 {
        return Some(&backends[0].target);
    }
    let mut slot = fastrand::u64(..total);
    for b in backends {
        if slot < u64::from(b.weight) {
            return Some(&b.target);
        }
        slot -= u64::from(b.weight);
    }
    None
}

#[derive(Debug)]
pub struct WeightedTarget {
    pub target: Arc<Target>,
    pub(crate) weight: u32,
}

/// An FQDN Backend reachable without a route, with one target per port (same order as
/// `backend.ports`).
#[derive(Debug)]
pub(crate) struct ImplicitRoute {
    /// One per declared port of the hostname (of the kind this table holds), in the Backends'
    /// `namespace/name` order, then port order; port numbers are distinct.
    pub(crate) targets: Vec<Arc<Target>>,
}

impl ImplicitRoute {
    /// The target of a request naming `port`. A request that names no port, or names the
    /// scheme's default port when no Backend declares it, goes to the first port.
    pub(crate) fn target_for(
        &self,
        port: Option<u16>,
        scheme_default: u16,
    ) -> Option<&Arc<Target>> {
        match port {
            None => self.targets.first(),
            Some(p) => self
                .targets
                .iter()
                .find(|t| t.port.number == p)
                .or_else(|| {
                    (p == scheme_default)
                        .then(|| self.targets.first())
                        .flatten()
                }),
        }
    }

    /// The target of exactly `port` (a CONNECT names the port it wants; no default applies).
    pub(crate) fn target_on(&self, port: u16) -> Option<&Arc<Target>> {
        self.targets.iter().find(|t| t.port.number == port)
    }

    /// The declared ports and their Backends, for errors: `80 (Backend a/b), 443 (Backend a/c)`.
    pub(crate) fn declared_ports(&self) -> String {
        self.targets
            .iter()
            .map(|t| format!("{} (Backend {})", t.port.number, t.backend.label))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Conditions a request must meet (all of them).
#[derive(Debug, Clone, Default)]
pub struct RequestMatch {
    pub(crate) path: PathMatcher,
    pub(crate) method: Option<Method>,
    pub(crate) headers: Vec<(HeaderName, ValueMatcher)>,
    pub(crate) query: Vec<(String, ValueMatcher)>,
}

#[derive(Debug, Clone)]
pub(crate) enum PathMatcher {
    Exact(String),
    /// Path-element prefix without its trailing slash: `/foo` matches `/foo`, `/foo/` and
    /// `/foo/bar`, not `/foobar`. An empty prefix matches everything.
    Prefix(String),
    /// Must match the whole path.
    Regex(Regex),
}

impl Default for PathMatcher {
    fn default() -> Self {
        PathMatcher::Prefix(String::new())
    }
}

#[derive(Debug, Clone)]
pub(crate) enum ValueMatcher {
    Exact(String),
    /// Must match the whole value.
    Regex(Regex),
}

impl ValueMatcher {
    fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatcher::Exact(v) => v == value,
            ValueMatcher::Regex(re) => re.is_match(value),
        }
    }
}

impl PathMatcher {
    fn matches(&self, path: &str) -> bool {
        match self {
            PathMatcher::Exact(p) => p == path,
            PathMatcher::Prefix(p) => {
                path.starts_with(p.as_str())
                    && matches!(path.as_bytes().get(p.len()), None | Some(b'/'))
            }
            PathMatcher::Regex(re) => re.is_match(path),
        }
    }
}

/// The parts of a request routing looks at.
pub struct RouteInput<'a> {
    /// Lower-case host without port.
    pub host: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
}

impl RequestMatch {
    pub fn matches(&self, input: &RouteInput<'_>) -> bool {
        if let Some(m) = &self.method {
            if m != input.method {
                return false;
            }
        }
        if !self.path.matches(input.path) {
            return false;
        }
        for (name, matcher) in &self.headers {
            // Repeated headers are matched on their values joined with ", " (RFC 9110 §5.3).
            let mut values = input.headers.get_all(name).iter();
            let Some(first) = values.next() else {
                return false;
            };
            let joined;
            let value = match values.next() {
                None => first.to_str().unwrap_or(""),
                Some(second) => {
                    let mut s = String::from(first.to_str().unwrap_or(""));
                    for v in std::iter::once(second).chain(values) {
                        s.push_str(", ");
                        s.push_str(v.to_str().unwrap_or(""));
                    }
                    joined = s;
                    &joined
                }
            };
            if !matcher.matches(value) {
                return false;
            }
        }
        for (name, matcher) in &self.query {
            // The first occurrence of a parameter is the one matched (Gateway API).
            let value = input.query.and_then(|q| {
                q.split('&').find_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (k == name).then_some(v)
                })
            });
            match value {
                Some(v) if matcher.matches(v) => {}
                _ => return false,
            }
        }
        true
    }
}

impl HttpRouter {
    /// The first matching route rule for the request, by precedence.
    pub(crate) fn route(&self, input: &RouteInput<'_>) -> Option<&RouteEntry> {
        if let Some(entries) = self.exact.get(input.host) {
            if let Some(action) = first_match(entries, input) {
                return Some(action);
            }
        }
        for (suffix, entries) in &self.wildcard {
            // `*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`.
            if input.host.len() > suffix.len() && input.host.ends_with(suffix.as_str()) {
                if let Some(action) = first_match(entries, input) {
                    return Some(action);
                }
            }
        }
        first_match(&self.any, input)
    }

    /// The implicit route to the HTTP ports of FQDN Backends with this exact hostname.
    /// A wildcard Backend (`*.example.com`) serves the hosts no Backend names exactly, the
    /// longest matching suffix first.
    pub(crate) fn implicit(&self, host: &str) -> Option<&ImplicitRoute> {
        exact_or_wildcard(&self.implicit, host)
    }

    /// The names a CONNECT may be intercepted for (`tlsInterception`): hosts of FQDN Backend
    /// ports whose TLS egressd originates and that allow it, and the hostnames of routes (a
    /// wildcard as written, `*.example.com`).
    pub(crate) fn interceptable_names(&self) -> impl Iterator<Item = &str> {
        let backends = self.implicit.iter().filter_map(|(host, route)| {
            let intercepted = route.targets.iter().any(|t| {
                t.port.interception
                    && matches!(
                        t.port.transport,
                        crate::upstream::connect::Transport::Tls(_)
                    )
            });
            intercepted.then_some(host.as_str())
        });
        let wildcard_routes = self.wildcard.iter().map(|(suffix, _)| suffix.as_str());
        backends
            .chain(self.exact.keys().map(String::as_str))
            .chain(wildcard_routes)
    }

    /// The Backend a `CONNECT host:port` may tunnel to: declared, with `port` a TCP port.
    pub(crate) fn tunnel(&self, host: &str, port: u16) -> Option<&Arc<Target>> {
        exact_or_wildcard(&self.tunnels, host)?
            .targets
            .iter()
            .find(|t| t.port.number == port)
    }

    /// Whether an HTTPRoute names this host (exactly or by wildcard): a request for it that
    /// matches no rule is then 404 `no_route`, not an undeclared destination.
    pub(crate) fn declares_host(&self, host: &str) -> bool {
        self.exact.contains_key(host)
            || self
                .wildcard
                .iter()
                .any(|(suffix, _)| host.len() > suffix.len() && host.ends_with(suffix.as_str()))
    }
}

/// `map`'s entry for `host`, else for the longest wildcard pattern covering it: `*.b.example.com`,
/// then `*.example.com`, … (a wildcard matches one or more labels, never the apex). The
/// patterns are spelled in a buffer on the stack: a miss costs a few lookups, no allocation.
fn exact_or_wildcard<'m, V>(map: &'m FastMap<String, V>, host: &str) -> Option<&'m V> {
    if let Some(v) = map.get(host) {
        return Some(v);
    }
    let mut buf = [0u8; crate::names::MAX_HOST_LEN + 1];
    for (dot, _) in host.match_indices('.') {
        let suffix = &host.as_bytes()[dot..];
        let pattern = buf.get_mut(..=suffix.len())?;
        pattern[0] = b'*';
        pattern[1..].copy_from_slice(suffix);
        // Only ASCII was copied after a char boundary ('.'), so this is valid UTF-8.
        if let Some(v) = std::str::from_utf8(pattern).ok().and_then(|p| map.get(p)) {
            return Some(v);
        }
    }
    None
}

fn first_match<'a>(entries: &'a [RouteEntry], input: &RouteInput<'_>) -> Option<&'a RouteEntry> {
    entries.iter().find(|e| e.matcher.matches(input))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(path: &'a str, query: Option<&'a str>, headers: &'a HeaderMap) -> RouteInput<'a> {
        RouteInput {
            host: "h",
            path,
            query,
            method: &Method::GET,
            headers,
        }
    }

    #[test]
    fn the_exact_host_then_the_longest_wildcard_suffix_is_found() {
        let map: FastMap<String, &str> = [
            ("*.b.example.com", "narrow"),
            ("*.example.com", "wide"),
            ("a.b.example.com", "exact"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(exact_or_wildcard(&map, "a.b.example.com"), Some(&"exact"));
        assert_eq!(exact_or_wildcard(&map, "x.b.example.com"), Some(&"narrow"));
        assert_eq!(
            exact_or_wildcard(&map, "x.y.b.example.com"),
            Some(&"narrow")
        );
        assert_eq!(exact_or_wildcard(&map, "c.example.com"), Some(&"wide"));
        // Never the apex, and a single label has no suffix to look up.
        assert_eq!(exact_or_wildcard(&map, "example.com"), None);
        assert_eq!(exact_or_wildcard(&map, "localhost"), None);
    }

    #[test]
    fn prefix_matches_path_elements() {
        let m = PathMatcher::Prefix("/foo".into());
        assert!(m.matches("/foo"));
        assert!(m.matches("/foo/"));
        assert!(m.matches("/foo/bar"));
        assert!(!m.matches("/foobar"));
        assert!(PathMatcher::Prefix(String::new()).matches("/anything"));
    }

    #[test]
    fn query_and_headers_must_all_match() {
        let mut headers = HeaderMap::new();
        headers.insert("x-env", "canary".parse().unwrap());
        let m = RequestMatch {
            headers: vec![(
                HeaderName::from_static("x-env"),
                ValueMatcher::Exact("canary".into()),
            )],
            query: vec![(
                "v".into(),
                ValueMatcher::Regex(Regex::new("^[0-9]+$").unwrap()),
            )],
            ..Default::default()
        };
        assert!(m.matches(&input("/", Some("a=1&v=2"), &headers)));
        assert!(!m.matches(&input("/", Some("v=x"), &headers)));
        assert!(!m.matches(&input("/", None, &headers)));
        assert!(!m.matches(&input("/", Some("v=2"), &HeaderMap::new())));
    }
}
