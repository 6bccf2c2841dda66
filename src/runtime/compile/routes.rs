//! `HTTPRoute`s and implicit routes → one [`HttpRouter`] per HTTP listener.

use std::collections::HashMap;
use std::sync::Arc;

use super::attachment::{attach, effective_hostnames};
use super::backends::{BackendEntry, Backends};
use super::listeners::CompiledListener;
use super::policy::PolicyIndex;
use super::policy::RouteSettings;
use super::route_rules::{check_route, CheckedRule};
use super::{at, Cx};
use crate::config::wire::enums::Protocol;
use crate::config::wire::route::HttpRouteSpec;
use crate::config::wire::Object;
use crate::config::{ConfigSet, ObjectId, Reason};
use crate::names::hostname_matches;
use crate::snapshot::router::{
    FastMap, HttpRouter, ImplicitRoute, PathMatcher, RequestMatch, RouteAction, RouteEntry,
    WeightedTarget,
};
use crate::snapshot::Target;

/// One router per HTTP listener: the HTTPRoutes attached to it by precedence, then the
/// implicit routes to the ports FQDN Backends declare.
pub(crate) fn compile(
    cx: &mut Cx,
    set: &ConfigSet,
    listeners: &[CompiledListener],
    backends: &Backends<'_>,
    declared: &DeclaredPorts<'_>,
    policies: &PolicyIndex<'_>,
) -> FastMap<Arc<str>, Arc<HttpRouter>> {
    let routes = CheckedRoutes::check(cx, set, listeners, backends);
    let mut routers = FastMap::default();
    for (li, listener) in listeners.iter().enumerate() {
        if listener.is_passthrough() {
            continue;
        }
        let tiers = routes.tiers(li, listener, policies);
        // HTTP requests reach the HTTP-speaking ports; `CONNECT host:port` the TCP ones.
        let implicit = implicit_routes(
            declared,
            |p| p.protocol != Protocol::Tcp,
            listener,
            policies,
        );
        let tunnels = implicit_routes(
            declared,
            |p| p.protocol == Protocol::Tcp,
            listener,
            policies,
        );
        routers.insert(
            listener.plan.key.clone(),
            Arc::new(tiers.into_router(implicit, tunnels)),
        );
    }
    routers
}

/// The config's HTTPRoutes, each checked once: the listeners it attaches to and its rules
/// (`None` when it has errors). Targets are resolved per Gateway (policies may differ).
struct CheckedRoutes<'a> {
    set: &'a ConfigSet,
    /// By route, the indices of the listeners it attaches to.
    attachments: Vec<Vec<usize>>,
    rules: Vec<Option<Vec<CheckedRule<'a>>>>,
    /// Route indices by alphabetical namespace/name, the tie-breaker between routes (Gateway
    /// API uses creation time first; files have none).
    ranked: Vec<usize>,
}

impl<'a> CheckedRoutes<'a> {
    /// Attaches and checks every HTTPRoute of `set` (attachments first, then rules).
    fn check(
        cx: &mut Cx,
        set: &'a ConfigSet,
        listeners: &[CompiledListener],
        backends: &'a Backends<'_>,
    ) -> Self {
        let attachments: Vec<Vec<usize>> = set
            .http_routes
            .iter()
            .map(|r| {
                attach(
                    cx,
                    set,
                    &r.file,
                    &r.id,
                    &r.spec.parent_refs,
                    listeners,
                    false,
                )
            })
            .collect();
        let mut rules: Vec<Option<Vec<CheckedRule<'_>>>> = Vec::new();
        for route in &set.http_routes {
            rules.push(check_route(cx, route, backends));
        }
        let mut ranked: Vec<usize> = (0..set.http_routes.len()).collect();
        ranked.sort_by(|a, b| set.http_routes[*a].id.cmp(&set.http_routes[*b].id));
        CheckedRoutes {
            set,
            attachments,
            rules,
            ranked,
        }
    }

    /// The entries of every valid route attached to listener `li`, by host tier, each with
    /// its precedence.
    fn tiers(&self, li: usize, listener: &CompiledListener, policies: &PolicyIndex<'_>) -> Tiers {
        let mut tiers = Tiers::default();
        for (rank, &ri) in self.ranked.iter().enumerate() {
            if !self.attachments[ri].contains(&li) {
                continue;
            }
            let Some(rules) = &self.rules[ri] else {
                continue;
            };
            let route = &self.set.http_routes[ri];
            let hostnames =
                effective_hostnames(&route.spec.hostnames, listener.hostname.as_deref());
            if hostnames.as_ref().is_some_and(Vec::is_empty) {
                continue; // no hostname in common with the listener
            }
            for (rule_index, rule) in rules.iter().enumerate() {
                let action = Arc::new(build_action(
                    route,
                    rule_index,
                    rule,
                    policies,
                    &listener.gateway,
                ));
                let at = (rank, rule_index);
                tiers.add_rule(&rule.matches, &action, at, hostnames.as_deref());
            }
        }
        tiers
    }
}

/// Every (hostname, port) that FQDN Backends declare, by lower-case hostname: the Backend
/// and the index of its port, in `namespace/name` order, then port order. A hostname may have
/// many Backends (one per port is the normal way to declare `api.example.com:443` next to
/// `:80`, and the only way with one-port-per-Backend APIs); only the same hostname *and* port in
/// two Backends clash. The Backend that held the port in the serving config keeps it (as the
/// Gateway API gives a conflict to the oldest object: a team adding a Backend for a host
/// another team's Backend serves cannot take it over, whatever their names); between two
/// newcomers the lower `namespace/name` wins. The other is `Conflicted` (its other ports stay
/// reachable).
pub(crate) type DeclaredPorts<'a> = HashMap<String, Vec<(&'a BackendEntry<'a>, usize)>>;

/// Who holds each declared (hostname, port) of an accepted config: the next reload keeps them.
pub(crate) type HeldPorts = HashMap<(String, u16), ObjectId>;

pub(crate) fn declared_ports<'a>(
    cx: &mut Cx,
    set: &ConfigSet,
    backends: &'a Backends<'_>,
    held: &HeldPorts,
) -> DeclaredPorts<'a> {
    let mut claims: Vec<(&'a BackendEntry<'a>, &str, usize)> = Vec::new();
    for entry in backends.entries() {
        if let Some(host) = &entry.0.hostname {
            claims.extend((0..entry.0.ports.len()).map(|index| (entry, host.as_str(), index)));
        }
    }
    // Holders first, so that they claim before any newcomer; then name order.
    let holds = |(entry, host, index): &(&BackendEntry<'_>, &str, usize)| {
        let key = ((*host).to_owned(), entry.0.ports[*index].number);
        held.get(&key) == Some(&entry.0.id)
    };
    claims.sort_by_cached_key(|c| (!holds(c), c.0 .0.id.clone(), c.2));
    let mut out: DeclaredPorts<'a> = HashMap::new();
    for (entry, host, index) in claims {
        let backend = &entry.0;
        let port = backend.ports[index].number;
        let claimed = out.entry(host.to_owned()).or_default();
        let owner = claimed
            .iter()
            .find(|(other, i)| other.0.ports[*i].number == port)
            .map(|(other, _)| other.0.id.clone());
        match owner {
            Some(winner) => warn_conflicted(cx, set, backend, host, port, &winner, held),
            None => claimed.push((entry, index)),
        }
    }
    for ports in out.values_mut() {
        ports.sort_by(|a, b| (&a.0 .0.id, a.1).cmp(&(&b.0 .0.id, b.1)));
    }
    out
}

/// The (hostname, port) pairs `declared` gives each Backend, for the next reload.
pub(crate) fn held_ports(declared: &DeclaredPorts<'_>) -> HeldPorts {
    let mut out = HeldPorts::new();
    for (host, ports) in declared {
        for (entry, index) in ports {
            let key = (host.clone(), entry.0.ports[*index].number);
            out.insert(key, entry.0.id.clone());
        }
    }
    out
}

/// `backend` declares `host:port`, which `winner` keeps.
fn warn_conflicted(
    cx: &mut Cx,
    set: &ConfigSet,
    backend: &crate::snapshot::Backend,
    host: &str,
    port: u16,
    winner: &ObjectId,
    held: &HeldPorts,
) {
    let Some(obj) = set.backends.iter().find(|o| o.id == backend.id) else {
        return;
    };
    let why = if held.get(&(host.to_owned(), port)) == Some(winner) {
        "which held it before this Backend appeared and keeps it"
    } else {
        "which sorts first by namespace/name and wins it"
    };
    cx.warn(
        at(
            &obj.file,
            &obj.id,
            obj.spec.destination.pos,
            "spec.destination.fqdn.hostname",
        ),
        Reason::Conflicted,
        format!(
            "`{host}:{port}` is also declared by {}, {why}; {} serves nothing on that port",
            winner, backend.id
        ),
        "give each hostname and port one Backend, or route explicitly with an HTTPRoute",
    );
}

/// The declared ports that `serves` accepts, as one implicit route per hostname, each port
/// with the request policy of its Backend for this listener's Gateway.
fn implicit_routes(
    declared: &DeclaredPorts<'_>,
    serves: impl Fn(&crate::snapshot::BackendPort) -> bool,
    listener: &CompiledListener,
    policies: &PolicyIndex<'_>,
) -> FastMap<String, ImplicitRoute> {
    let mut out = FastMap::default();
    for (host, ports) in declared {
        if listener
            .hostname
            .as_deref()
            .is_some_and(|p| !hostname_matches(p, host))
        {
            continue;
        }
        let mut targets: Vec<Arc<Target>> = Vec::new();
        for ((backend, inline), index) in ports {
            let port = &backend.ports[*index];
            if !serves(port) {
                continue;
            }
            // The Backend's previous port (if any) already has its policy.
            let policy = match targets.last().filter(|t| Arc::ptr_eq(&t.backend, backend)) {
                Some(t) => t.policy.clone(),
                None => policies.request_policy(None, &backend.id, *inline, &listener.gateway),
            };
            targets.push(Arc::new(Target {
                backend: backend.clone(),
                port: port.clone(),
                policy,
                rewrite_authority: true,
            }));
        }
        if !targets.is_empty() {
            out.insert(host.clone(), ImplicitRoute { targets });
        }
    }
    out
}

/// The action of one rule of `route` as it serves `gateway`'s listeners: its targets, each
/// with its request policy, split into primaries and fallbacks.
fn build_action(
    route: &Object<HttpRouteSpec>,
    rule_index: usize,
    rule: &CheckedRule<'_>,
    policies: &PolicyIndex<'_>,
    gateway: &ObjectId,
) -> RouteAction {
    let timeouts = rule.rule.timeouts.as_ref().map(|t| &*t.value);
    let retry = rule.rule.retry.as_ref().map(|r| &*r.value);
    let targets: Vec<WeightedTarget> = rule
        .refs
        .iter()
        .filter(|(_, _, _, w)| *w > 0)
        .map(|(backend, inline, port_index, weight)| {
            let policy = policies.request_policy(
                Some(RouteSettings {
                    id: &route.id,
                    timeouts,
                    retry,
                }),
                &backend.id,
                *inline,
                gateway,
            );
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
    // A rule whose backends are all fallbacks has no primary to fall back from: they are
    // its primaries.
    let (fallbacks, targets): (Vec<_>, Vec<_>) =
        if targets.iter().all(|t| t.target.backend.fallback) {
            (Vec::new(), targets)
        } else {
            targets.into_iter().partition(|t| t.target.backend.fallback)
        };
    let total = targets.iter().map(|t| u64::from(t.weight)).sum();
    RouteAction {
        name: format!(
            "HTTPRoute {}/{} rule {rule_index}",
            route.id.namespace, route.id.name
        )
        .into(),
        filters: rule.filters.clone(),
        backends: targets,
        total_weight: total,
        fallbacks,
        stats: std::sync::OnceLock::new(),
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
    /// Adds an entry per match of one rule (`at`: the route's rank and the rule's index)
    /// under each of `hostnames`, or under any host.
    fn add_rule(
        &mut self,
        matches: &[RequestMatch],
        action: &Arc<RouteAction>,
        at: (usize, usize),
        hostnames: Option<&[String]>,
    ) {
        let (rank, rule_index) = at;
        for (match_index, m) in matches.iter().enumerate() {
            let entry = RouteEntry {
                matcher: m.clone(),
                action: action.clone(),
            };
            let key = SortKey::new(m, rank, rule_index, match_index);
            let Some(hosts) = hostnames else {
                self.any.push((key, entry));
                continue;
            };
            for h in hosts {
                // Most hosts have one entry: a first push would reserve four (freed again,
                // but it sets the peak).
                let entries = match h.strip_prefix('*') {
                    Some(suffix) => self.wildcard.entry(suffix.to_owned()),
                    None => self.exact.entry(h.clone()),
                };
                entries
                    .or_insert_with(|| Vec::with_capacity(1))
                    .push((key.clone(), entry.clone()));
            }
        }
    }

    /// The router: each tier's entries sorted by precedence.
    fn into_router(
        self,
        implicit: FastMap<String, ImplicitRoute>,
        tunnels: FastMap<String, ImplicitRoute>,
    ) -> HttpRouter {
        fn sorted(mut v: Vec<(SortKey, RouteEntry)>) -> Vec<RouteEntry> {
            v.sort_by(|a, b| a.0.cmp(&b.0));
            // Collected in place, the entries would keep the larger buffer (and its growth
            // by doubling) for as long as the config serves: 700 bytes for a one-rule route.
            let mut entries: Vec<RouteEntry> = v.into_iter().map(|(_, e)| e).collect();
            entries.shrink_to_fit();
            entries
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
            tunnels,
        }
    }
}

/// SNI routing for TLS Passthrough listeners: attached TLSRoutes, then the implicit route to
/// each hostname with a Passthrough port of an FQDN Backend.
pub(crate) fn compile_sni(
    cx: &mut Cx,
    set: &ConfigSet,
    listeners: &[CompiledListener],
    backends: &Backends<'_>,
    declared: &DeclaredPorts<'_>,
    policies: &PolicyIndex<'_>,
) -> FastMap<Arc<str>, Arc<crate::snapshot::router::SniRouter>> {
    let tls_routes = super::tls_routes::check(cx, set, listeners, backends);
    let mut out = FastMap::default();
    for (li, listener) in listeners.iter().enumerate() {
        if !listener.is_passthrough() {
            continue;
        }
        let mut router = crate::snapshot::router::SniRouter::default();
        super::tls_routes::install(cx, &mut router, &tls_routes, li, listener, policies);
        // The ClientHello names no port: the Passthrough port numbered like the listener's,
        // else the hostname's first Passthrough port.
        let port = listener.plan.addr.port();
        for (host, route) in implicit_routes(declared, |p| p.passthrough, listener, policies) {
            let chosen = route
                .targets
                .iter()
                .find(|t| t.port.number == port)
                .or(route.targets.first());
            if let Some(target) = chosen {
                router.exact.insert(host, target.clone());
            }
        }
        out.insert(listener.plan.key.clone(), Arc::new(router));
    }
    out
}
