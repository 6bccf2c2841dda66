//! BackendTrafficPolicy attachment and section precedence (docs/configuration.md "Precedence"), checked on
//! the compiled snapshot: which timeout applies to which route target, and the
//! `Conflicted`/`Overridden` conditions.

use std::sync::Arc;
use std::time::Duration;

use egressd::config::load_paths;
use egressd::runtime::compile::{compile, Compiled};
use egressd::snapshot::RequestPolicy;
use egressd::upstream::dns::DnsResolver;
use egressd::upstream::registry::StateRegistry;

const BASE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  listeners: [{name: http, port: 0, address: 127.0.0.1, protocol: HTTP}]
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: plain}
spec:
  destination: {type: IP, ip: {endpoints: [{address: 127.0.0.1}]}, ports: [{number: 9001}]}
  tls: {mode: InsecureDisable}
---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata: {name: inline}
spec:
  destination: {type: IP, ip: {endpoints: [{address: 127.0.0.1}]}, ports: [{number: 9002}]}
  tls: {mode: InsecureDisable}
  trafficPolicy:
    timeout: {http: {requestTimeout: 7s}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.test]
  rules:
  - matches: [{path: {type: PathPrefix, value: /plain}}]
    backendRefs: [{name: plain}]
  - matches: [{path: {type: PathPrefix, value: /inline}}]
    backendRefs: [{name: inline}]
  - matches: [{path: {type: PathPrefix, value: /rule}}]
    timeouts: {request: 3s}
    backendRefs: [{name: inline}]
"#;

fn compile_yaml(extra: &str) -> Compiled {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.yaml"), BASE).unwrap();
    std::fs::write(dir.path().join("extra.yaml"), extra).unwrap();
    let loaded = load_paths(&[dir.path().to_path_buf()]);
    let registry = Arc::new(StateRegistry::new(
        DnsResolver::new(&["127.0.0.1:53".parse().unwrap()]).unwrap(),
    ));
    compile(Arc::new(loaded.set), loaded.diagnostics, &registry, 1)
}

/// The route rule matching `path` on `host`.
fn entry_for<'a>(
    compiled: &'a Compiled,
    host: &str,
    path: &str,
) -> &'a egressd::snapshot::router::RouteEntry {
    let router = compiled
        .snapshot
        .routers
        .get("default/gw/http")
        .expect("listener router");
    let entries = router.exact.get(host).expect("routes for the host");
    let headers = http::HeaderMap::new();
    let input = egressd::snapshot::router::RouteInput {
        host,
        path,
        query: None,
        method: &http::Method::GET,
        headers: &headers,
    };
    entries
        .iter()
        .find(|e| e.matcher.matches(&input))
        .expect("a matching rule")
}

/// The request policy of the route rule matching `path` on host a.test.
fn policy_for(compiled: &Compiled, path: &str) -> RequestPolicy {
    let entry = entry_for(compiled, "a.test", path);
    entry.action.backends[0].target.policy.as_ref().clone()
}

/// Routes whose targets resolve to the same request policy, and rules with the same filters,
/// share one object of each (a config of 10,000 routes holds a handful, not 10,000): sharing
/// is by value, so a different policy or filter is its own object.
#[test]
fn equal_policies_and_filters_are_one_object() {
    let compiled = compile_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: other}
spec:
  parentRefs: [{name: gw}]
  hostnames: [b.test]
  rules:
  - matches: [{path: {type: PathPrefix, value: /plain}}]
    backendRefs: [{name: plain}]
  - matches: [{path: {type: PathPrefix, value: /tagged}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-tag, value: one}]}
    backendRefs: [{name: plain}]
"#,
    );
    assert!(!compiled.has_errors(), "{:?}", compiled.diagnostics);
    let (a, b) = (
        entry_for(&compiled, "a.test", "/plain"),
        entry_for(&compiled, "b.test", "/plain"),
    );
    let (rule, tagged) = (
        entry_for(&compiled, "a.test", "/rule"),
        entry_for(&compiled, "b.test", "/tagged"),
    );
    let policy =
        |e: &egressd::snapshot::router::RouteEntry| e.action.backends[0].target.policy.clone();
    assert!(Arc::ptr_eq(&policy(a), &policy(b)));
    assert!(!Arc::ptr_eq(&policy(a), &policy(rule)));
    assert_eq!(policy(rule).request_timeout, Some(Duration::from_secs(3)));
    assert!(Arc::ptr_eq(&a.action.filters, &b.action.filters));
    assert!(Arc::ptr_eq(&a.action.filters, &rule.action.filters));
    assert!(!Arc::ptr_eq(&a.action.filters, &tagged.action.filters));
    assert_eq!(tagged.action.filters.request_headers.set.len(), 1);
}

fn policy(name: &str, target_kind: &str, target: &str, timeout: &str) -> String {
    let group = if target_kind == "Backend" {
        "egressd.dev"
    } else {
        "gateway.networking.k8s.io"
    };
    format!(
        "---\napiVersion: egressd.dev/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {{name: {name}}}\nspec:\n  targetRefs: [{{group: {group}, kind: {target_kind}, name: {target}}}]\n  timeout: {{http: {{requestTimeout: {timeout}}}}}\n"
    )
}

fn assert_valid(c: &Compiled) {
    let errors: Vec<String> = c.errors().map(ToString::to_string).collect();
    assert!(errors.is_empty(), "unexpected errors: {errors:#?}");
}

#[test]
fn defaults_apply_without_any_policy() {
    let c = compile_yaml("");
    assert_valid(&c);
    let p = policy_for(&c, "/plain");
    assert_eq!(p, RequestPolicy::default());
    assert_eq!(p.connect_timeout, Duration::from_secs(10));
    assert_eq!(p.request_timeout, None);
}

#[test]
fn gateway_policy_applies_when_nothing_more_specific_sets_the_section() {
    let c = compile_yaml(&policy("gw-policy", "Gateway", "gw", "20s"));
    assert_valid(&c);
    assert_eq!(
        policy_for(&c, "/plain").request_timeout,
        Some(Duration::from_secs(20))
    );
}

#[test]
fn backend_policy_beats_gateway_policy() {
    let extra = policy("gw-policy", "Gateway", "gw", "20s")
        + &policy("be-policy", "Backend", "plain", "15s");
    let c = compile_yaml(&extra);
    assert_valid(&c);
    assert_eq!(
        policy_for(&c, "/plain").request_timeout,
        Some(Duration::from_secs(15))
    );
}

#[test]
fn inline_backend_policy_beats_backend_targeted_policy() {
    let c = compile_yaml(&policy("be-policy", "Backend", "inline", "15s"));
    assert_valid(&c);
    assert_eq!(
        policy_for(&c, "/inline").request_timeout,
        Some(Duration::from_secs(7))
    );
}

#[test]
fn route_policy_beats_inline_backend_policy() {
    let c = compile_yaml(&policy("route-policy", "HTTPRoute", "r", "9s"));
    assert_valid(&c);
    assert_eq!(
        policy_for(&c, "/inline").request_timeout,
        Some(Duration::from_secs(9))
    );
}

#[test]
fn route_rule_timeouts_beat_every_policy() {
    let c = compile_yaml(&policy("route-policy", "HTTPRoute", "r", "9s"));
    assert_valid(&c);
    assert_eq!(
        policy_for(&c, "/rule").request_timeout,
        Some(Duration::from_secs(3))
    );
}

#[test]
fn sections_are_taken_whole_not_merged() {
    // The route policy sets only requestTimeout: the Backend's connectTimeout is not merged in.
    let extra = r#"
---
apiVersion: egressd.dev/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: be}
spec:
  targetRefs: [{group: egressd.dev, kind: Backend, name: plain}]
  timeout: {tcp: {connectTimeout: 2s}}
---
apiVersion: egressd.dev/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: rt}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]
  timeout: {http: {requestTimeout: 9s}}
"#;
    let c = compile_yaml(extra);
    assert_valid(&c);
    let p = policy_for(&c, "/plain");
    assert_eq!(p.request_timeout, Some(Duration::from_secs(9)));
    assert_eq!(
        p.connect_timeout,
        Duration::from_secs(10),
        "connectTimeout must come from the winning section only"
    );
}

#[test]
fn two_policies_on_one_target_lower_name_wins_and_other_is_conflicted() {
    let extra = policy("b-policy", "Backend", "plain", "30s")
        + &policy("a-policy", "Backend", "plain", "12s");
    let c = compile_yaml(&extra);
    assert_valid(&c);
    assert_eq!(
        policy_for(&c, "/plain").request_timeout,
        Some(Duration::from_secs(12))
    );
    let status = &c.status().objects;
    let conditions = |name: &str| {
        status
            .iter()
            .find(|o| &*o.object.name == name)
            .map(|o| {
                o.conditions
                    .iter()
                    .map(|c| format!("{}={}", c.kind, c.status))
                    .collect::<Vec<_>>()
            })
            .unwrap()
    };
    assert!(
        conditions("b-policy").contains(&"Conflicted=True".to_owned()),
        "{:?}",
        conditions("b-policy")
    );
    assert!(!conditions("a-policy")
        .iter()
        .any(|c| c.starts_with("Conflicted")));
}

#[test]
fn connection_level_section_on_a_route_target_is_overridden() {
    let extra = r#"
---
apiVersion: egressd.dev/v1alpha1
kind: BackendTrafficPolicy
metadata: {name: rt}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: r}]
  dns: {dnsRefreshRate: 5s}
"#;
    let c = compile_yaml(extra);
    assert_valid(&c);
    let status = c.status();
    let rt = status
        .objects
        .iter()
        .find(|o| &*o.object.name == "rt")
        .unwrap();
    assert!(
        rt.conditions
            .iter()
            .any(|c| c.kind == "Overridden" && c.status == "True"),
        "{:?}",
        rt.conditions
    );
}

#[test]
fn dangling_policy_target_is_an_error() {
    let c = compile_yaml(&policy("p", "Backend", "missing", "1s"));
    let errors: Vec<String> = c.errors().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("target Backend default/missing does not exist"),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("extra.yaml:"), "{}", errors[0]);
}
