//! Where requests go: HTTPRoute matching and precedence, implicit routes to FQDN Backends,
//! refusals of undeclared destinations, and weighted splits.

mod common;

use std::collections::HashMap;
use std::net::Ipv4Addr;

use common::dns::TestDns;
use common::proxy::{
    fetch, fqdn_backend, get, get_absolute, get_with_headers, ip_backend, preamble, request,
    ClientBody, Conn, TestProxy,
};
use common::upstream::Upstream;

/// Named upstreams, each behind an IP Backend of the same name.
struct Fleet {
    upstreams: HashMap<&'static str, Upstream>,
}

impl Fleet {
    async fn start(names: &[&'static str]) -> Fleet {
        let mut upstreams = HashMap::new();
        for name in names {
            upstreams.insert(*name, Upstream::start(name).await);
        }
        Fleet { upstreams }
    }

    /// One IP Backend document per upstream.
    fn backends(&self) -> String {
        let mut names: Vec<_> = self.upstreams.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|name| ip_backend(name, self.upstreams[name].addr, ""))
            .collect()
    }

    fn get(&self, name: &str) -> &Upstream {
        &self.upstreams[name]
    }

    /// Requests each upstream received, by name, for failure messages and totals.
    fn counts(&self) -> HashMap<&'static str, usize> {
        self.upstreams
            .iter()
            .map(|(name, u)| (*name, u.request_count()))
            .collect()
    }
}

/// An HTTPRoute on `gw` for `hostname` with the given rules (YAML list items, indented for
/// `spec.rules`).
fn route(name: &str, hostname: &str, rules: &str) -> String {
    format!(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: {name}
spec:
  parentRefs:
  - name: gw
  hostnames: ["{hostname}"]
  rules:
{rules}"#
    )
}

/// A rule item sending matches `matches` (a YAML flow sequence) to Backend `backend`.
fn rule(matches: &str, backend: &str) -> String {
    format!(
        "  - matches: {matches}\n    backendRefs:\n    - {{group: egressd.dev, kind: Backend, name: {backend}}}\n"
    )
}

/// Sends `req` and asserts it was answered by upstream `expected` with 200.
async fn assert_routed(proxy: &TestProxy, req: http::Request<ClientBody>, expected: &str) {
    let what = format!("{} {}", req.method(), req.uri());
    let response = fetch(proxy.http(), req).await;
    assert_eq!(
        response.status,
        200,
        "{what}: {:?} {}",
        response.error_code(),
        response.text()
    );
    assert_eq!(response.upstream(), Some(expected), "{what}");
}

fn get_req(path: &str) -> http::Request<ClientBody> {
    request("GET", "app.test", path)
        .body(ClientBody::default())
        .unwrap()
}

#[tokio::test]
async fn path_matches_follow_gateway_api_precedence() {
    let fleet = Fleet::start(&["root", "foo", "foobar", "exact", "bar"]).await;
    // Rules are written least specific first, so only precedence (not file order) can make
    // the expected rule win.
    let rules = [
        rule("[{path: {type: PathPrefix, value: /}}]", "root"),
        rule("[{path: {type: PathPrefix, value: /foo}}]", "foo"),
        rule("[{path: {type: PathPrefix, value: /foo/bar}}]", "foobar"),
        rule("[{path: {type: Exact, value: /foo/bar}}]", "exact"),
        // A trailing slash in a prefix is ignored (Gateway API): `/bar/` matches `/bar`.
        rule("[{path: {type: PathPrefix, value: /bar/}}]", "bar"),
    ]
    .concat();
    let yaml = preamble(None) + &fleet.backends() + &route("paths", "app.test", &rules);
    let proxy = TestProxy::start(&yaml).await;

    // Exact beats the equally long prefix.
    assert_routed(&proxy, get_req("/foo/bar"), "exact").await;
    // Longest prefix wins; prefixes match whole path elements.
    assert_routed(&proxy, get_req("/foo/bar/baz"), "foobar").await;
    assert_routed(&proxy, get_req("/foo/bar/"), "foobar").await;
    assert_routed(&proxy, get_req("/foo/baz"), "foo").await;
    assert_routed(&proxy, get_req("/foo"), "foo").await;
    assert_routed(&proxy, get_req("/foo/"), "foo").await;
    assert_routed(&proxy, get_req("/foobar"), "root").await;
    assert_routed(&proxy, get_req("/foo/barbaz"), "foo").await;
    assert_routed(&proxy, get_req("/bar"), "bar").await;
    assert_routed(&proxy, get_req("/bar/x"), "bar").await;
    assert_routed(&proxy, get_req("/barx"), "root").await;
    assert_routed(&proxy, get_req("/other?x=1"), "root").await;

    // The upstream saw the path (and query) unchanged.
    assert_eq!(fleet.get("root").last_request().uri, "/other?x=1");
    assert_eq!(fleet.get("exact").last_request().uri, "/foo/bar");
}

#[tokio::test]
async fn regular_expression_path_must_match_the_whole_path() {
    let fleet = Fleet::start(&["items", "exact"]).await;
    let rules = [
        rule(
            "[{path: {type: RegularExpression, value: \"/items/[0-9]+\"}}]",
            "items",
        ),
        rule("[{path: {type: Exact, value: /items/7}}]", "exact"),
    ]
    .concat();
    let yaml = preamble(None) + &fleet.backends() + &route("regex", "app.test", &rules);
    let proxy = TestProxy::start(&yaml).await;

    assert_routed(&proxy, get_req("/items/42"), "items").await;
    // An Exact match outranks a regular expression that also matches.
    assert_routed(&proxy, get_req("/items/7"), "exact").await;
    // Anchored at both ends: neither a longer path nor a prefix of it matches.
    for path in ["/items/42/x", "/items/4x", "/x/items/42", "/items/"] {
        let response = fetch(proxy.http(), get_req(path)).await;
        assert_eq!(response.status, 404, "{path} must not be routed");
        assert_eq!(response.error_code(), Some("no_route"));
        assert!(
            response.text().contains("no route for app.test"),
            "{}",
            response.text()
        );
    }
    assert_eq!(fleet.get("items").request_count(), 1);
}

#[tokio::test]
async fn regular_expression_outranks_a_catch_all_prefix() {
    let fleet = Fleet::start(&["items", "rest"]).await;
    let rules = [
        rule("[{path: {type: PathPrefix, value: /}}]", "rest"),
        rule(
            "[{path: {type: RegularExpression, value: \"/items/[0-9]+\"}}]",
            "items",
        ),
    ]
    .concat();
    let yaml = preamble(None) + &fleet.backends() + &route("regex", "app.test", &rules);
    let proxy = TestProxy::start(&yaml).await;
    assert_routed(&proxy, get_req("/items/42"), "items").await;
    assert_routed(&proxy, get_req("/items/x"), "rest").await;
}

#[tokio::test]
async fn unmatched_request_for_a_routed_host_falls_back_to_its_fqdn_backend() {
    let dns = TestDns::start().await;
    let fleet = Fleet::start(&["api"]).await;
    let implicit = Upstream::start("implicit").await;
    dns.set("app.test", &[Ipv4Addr::LOCALHOST], 300);
    let rules = rule("[{path: {type: PathPrefix, value: /api}}]", "api");
    let yaml = preamble(Some(dns.addr))
        + &fleet.backends()
        + &fqdn_backend("app", "app.test", &[implicit.addr.port()], "")
        + &route("r", "app.test", &rules);
    let proxy = TestProxy::start(&yaml).await;
    assert_routed(&proxy, get_req("/api/x"), "api").await;
    // No rule matches /other: the implicit route to the Backend named app.test takes it.
    assert_routed(&proxy, get_req("/other"), "implicit").await;
}

#[tokio::test]
async fn routes_by_header_query_parameter_and_method() {
    let fleet = Fleet::start(&["default", "canary", "query", "post", "regexhdr"]).await;
    let rules = [
        rule("[{path: {type: PathPrefix, value: /}}]", "default"),
        rule("[{headers: [{name: x-env, value: canary}]}]", "canary"),
        rule(
            "[{headers: [{type: RegularExpression, name: x-tenant, value: \"t-[0-9]+\"}]}]",
            "regexhdr",
        ),
        rule("[{queryParams: [{name: v, value: \"2\"}]}]", "query"),
        rule("[{method: POST}]", "post"),
    ]
    .concat();
    let yaml = preamble(None) + &fleet.backends() + &route("attrs", "app.test", &rules);
    let proxy = TestProxy::start(&yaml).await;

    let with_header = |name: &str, value: &str| {
        request("GET", "app.test", "/")
            .header(name, value)
            .body(ClientBody::default())
            .unwrap()
    };
    assert_routed(&proxy, with_header("x-env", "canary"), "canary").await;
    assert_routed(&proxy, with_header("X-Env", "canary"), "canary").await;
    assert_routed(&proxy, with_header("x-env", "prod"), "default").await;
    assert_routed(&proxy, with_header("x-tenant", "t-17"), "regexhdr").await;
    assert_routed(&proxy, with_header("x-tenant", "t-17x"), "default").await;
    assert_routed(&proxy, get_req("/?a=1&v=2"), "query").await;
    assert_routed(&proxy, get_req("/?v=3"), "default").await;
    assert_routed(&proxy, get_req("/?vv=2"), "default").await;
    let post = request("POST", "app.test", "/submit")
        .body(ClientBody::from("hello"))
        .unwrap();
    assert_routed(&proxy, post, "post").await;
    assert_routed(&proxy, get_req("/"), "default").await;

    let posted = fleet.get("post").last_request();
    assert_eq!(posted.method, http::Method::POST);
    assert_eq!(posted.uri, "/submit");
    assert_eq!(posted.body_len, 5);
}

#[tokio::test]
async fn method_match_outranks_header_matches_which_outrank_fewer_headers() {
    let fleet = Fleet::start(&["plain", "post", "one", "two"]).await;
    let rules = [
        rule("[{path: {type: PathPrefix, value: /api}}]", "plain"),
        rule(
            "[{path: {type: PathPrefix, value: /api}, headers: [{name: x-a, value: \"1\"}]}]",
            "one",
        ),
        rule(
            "[{path: {type: PathPrefix, value: /api}, headers: [{name: x-a, value: \"1\"}, {name: x-b, value: \"1\"}]}]",
            "two",
        ),
        rule(
            "[{path: {type: PathPrefix, value: /api}, method: POST}]",
            "post",
        ),
    ]
    .concat();
    let yaml = preamble(None) + &fleet.backends() + &route("prec", "app.test", &rules);
    let proxy = TestProxy::start(&yaml).await;

    let req = |method: &str, headers: &[(&str, &str)]| {
        let mut b = request(method, "app.test", "/api/x");
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(ClientBody::default()).unwrap()
    };
    assert_routed(&proxy, req("POST", &[("x-a", "1"), ("x-b", "1")]), "post").await;
    assert_routed(&proxy, req("GET", &[("x-a", "1"), ("x-b", "1")]), "two").await;
    assert_routed(&proxy, req("GET", &[("x-a", "1")]), "one").await;
    assert_routed(&proxy, req("GET", &[("x-b", "1")]), "plain").await;
    assert_routed(&proxy, req("GET", &[]), "plain").await;
}

/// The DNS name of the FQDN Backend in the implicit-route tests (not in /etc/hosts).
const API_HOST: &str = "api.egress.test";

#[tokio::test]
async fn implicit_route_reaches_fqdn_backend_by_host_header_and_by_absolute_uri() {
    let dns = TestDns::start().await;
    let upstream = Upstream::start("api").await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let port = upstream.addr.port();
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[port], "");
    let proxy = TestProxy::start(&yaml).await;

    let by_host = get(proxy.http(), &format!("{API_HOST}:{port}"), "/v1/models").await;
    assert_eq!(by_host.status, 200, "{}", by_host.text());
    assert_eq!(by_host.upstream(), Some("api"));
    assert_eq!(upstream.last_request().uri, "/v1/models");

    // Host names are case-insensitive.
    let upper = get(proxy.http(), &format!("API.Egress.TEST:{port}"), "/").await;
    assert_eq!(upper.status, 200, "{}", upper.text());

    let absolute = get_absolute(
        proxy.http(),
        &format!("http://{API_HOST}:{port}/v1/chat?q=1"),
    )
    .await;
    assert_eq!(absolute.status, 200, "{}", absolute.text());
    assert_eq!(absolute.upstream(), Some("api"));
    // Forwarded in origin-form, with the query kept.
    let seen = upstream.last_request();
    assert_eq!(seen.uri, "/v1/chat?q=1");
    assert_eq!(seen.headers["host"], format!("{API_HOST}:{port}").as_str());
    assert_eq!(upstream.request_count(), 3);
    assert!(
        dns.query_count(API_HOST) >= 1,
        "the name was resolved through TestDns"
    );
}

#[tokio::test]
async fn absolute_uri_authority_wins_over_host_header() {
    let dns = TestDns::start().await;
    let upstream = Upstream::start("api").await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let port = upstream.addr.port();
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[port], "");
    let proxy = TestProxy::start(&yaml).await;

    // RFC 9112 §3.2.2: with an absolute-form target the proxy ignores Host.
    let req = http::Request::builder()
        .uri(format!("http://{API_HOST}:{port}/"))
        .header("host", "evil.test")
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.upstream(), Some("api"));

    // And the reverse: Host naming the backend does not make an undeclared URI host allowed.
    let req = http::Request::builder()
        .uri("http://evil.test/")
        .header("host", format!("{API_HOST}:{port}"))
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 403);
    assert_eq!(response.error_code(), Some("destination_not_allowed"));
    assert_eq!(upstream.request_count(), 1);
}

#[tokio::test]
async fn backend_ports_decide_where_a_request_goes_and_undeclared_ports_are_refused() {
    let dns = TestDns::start().await;
    let first = Upstream::start("first").await;
    let second = Upstream::start("second").await;
    dns.set(API_HOST, &[Ipv4Addr::LOCALHOST], 60);
    let (a, b) = (first.addr.port(), second.addr.port());
    let yaml = preamble(Some(dns.addr)) + &fqdn_backend("api", API_HOST, &[a, b], "");
    let proxy = TestProxy::start(&yaml).await;

    let response = get(proxy.http(), &format!("{API_HOST}:{b}"), "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.upstream(), Some("second"));

    let response = get(proxy.http(), &format!("{API_HOST}:{a}"), "/").await;
    assert_eq!(response.upstream(), Some("first"));

    // No port named: the Backend's first port.
    let response = get(proxy.http(), API_HOST, "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.upstream(), Some("first"));
    let response = get_absolute(proxy.http(), &format!("http://{API_HOST}/")).await;
    assert_eq!(response.upstream(), Some("first"));
    let response = get_absolute(proxy.http(), &format!("http://{API_HOST}:{b}/")).await;
    assert_eq!(response.upstream(), Some("second"));
    // The scheme's default port, not declared by the Backend, also means the first port.
    let response = get(proxy.http(), &format!("{API_HOST}:80"), "/").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.upstream(), Some("first"));

    // A port the Backend does not declare (neither of the two upstream ports).
    let undeclared = if a.max(b) < u16::MAX {
        a.max(b) + 1
    } else {
        a.min(b) - 1
    };
    let response = get(proxy.http(), &format!("{API_HOST}:{undeclared}"), "/").await;
    assert_eq!(response.status, 403);
    assert_eq!(response.error_code(), Some("destination_not_allowed"));
    assert!(
        response.text().contains(&undeclared.to_string()),
        "body names the port: {}",
        response.text()
    );
    let response = get_absolute(proxy.http(), &format!("http://{API_HOST}:{undeclared}/")).await;
    assert_eq!(response.status, 403);
    assert_eq!(first.request_count() + second.request_count(), 6);
}

#[tokio::test]
async fn undeclared_host_is_refused_with_403_naming_the_host() {
    let fleet = Fleet::start(&["app"]).await;
    let yaml = preamble(None)
        + &fleet.backends()
        + &route(
            "app",
            "app.test",
            &rule("[{path: {type: PathPrefix, value: /}}]", "app"),
        );
    let proxy = TestProxy::start(&yaml).await;

    let response = get(proxy.http(), "nowhere.test", "/").await;
    assert_eq!(response.status, 403);
    assert_eq!(response.error_code(), Some("destination_not_allowed"));
    assert!(
        response.text().contains("nowhere.test"),
        "{}",
        response.text()
    );

    let response = get_absolute(proxy.http(), "http://other.test:8080/x").await;
    assert_eq!(response.status, 403);
    assert_eq!(response.error_code(), Some("destination_not_allowed"));
    assert!(
        response.text().contains("other.test"),
        "{}",
        response.text()
    );

    // A route's hostname is matched exactly, not as a suffix.
    let response = get(proxy.http(), "sub.app.test", "/").await;
    assert_eq!(response.status, 403);
    assert_eq!(fleet.counts()["app"], 0);
}

#[tokio::test]
async fn request_without_host_is_rejected_with_400() {
    let proxy = TestProxy::start(&preamble(None)).await;
    let req = http::Request::builder()
        .uri("/")
        .body(ClientBody::default())
        .unwrap();
    let response = fetch(proxy.http(), req).await;
    assert_eq!(response.status, 400, "{}", response.text());
    assert_eq!(response.error_code(), Some("invalid_request"));
}

#[tokio::test]
async fn weighted_backend_refs_split_traffic_by_weight() {
    let fleet = Fleet::start(&["light", "heavy", "zero"]).await;
    let rules = "  - backendRefs:\n    - {group: egressd.dev, kind: Backend, name: light, weight: 1}\n    - {group: egressd.dev, kind: Backend, name: heavy, weight: 3}\n    - {group: egressd.dev, kind: Backend, name: zero, weight: 0}\n";
    let yaml = preamble(None) + &fleet.backends() + &route("split", "app.test", rules);
    let proxy = TestProxy::start(&yaml).await;

    const N: usize = 2000;
    let mut conn = Conn::open(proxy.http()).await;
    for _ in 0..N {
        let response = conn.fetch(get_req("/")).await;
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let counts = fleet.counts();
    // `heavy` ~ Binomial(N = 2000, p = 3/4): mean 1500, standard deviation
    // sqrt(2000 * 0.75 * 0.25) ≈ 19.4. A band of ±116 is 6 standard deviations, so a correct
    // split falls outside it with probability below 2e-9, while an even split (1000) or a
    // reversed one (500) lands far outside.
    let heavy = counts["heavy"];
    assert!(
        (1500 - 116..=1500 + 116).contains(&heavy),
        "heavy got {heavy} of {N}: {counts:?}"
    );
    assert_eq!(counts["light"] + heavy, N, "{counts:?}");
    assert_eq!(counts["zero"], 0, "a weight-0 backend gets nothing");
}

#[tokio::test]
async fn rule_whose_backends_all_weigh_zero_answers_500_no_backend() {
    let fleet = Fleet::start(&["zero"]).await;
    let rules =
        "  - backendRefs:\n    - {group: egressd.dev, kind: Backend, name: zero, weight: 0}\n";
    let yaml = preamble(None) + &fleet.backends() + &route("none", "app.test", rules);
    let proxy = TestProxy::start(&yaml).await;
    let response = get(proxy.http(), "app.test", "/").await;
    assert_eq!(response.status, 500, "{}", response.text());
    assert_eq!(response.error_code(), Some("no_backend"));
    assert_eq!(fleet.counts()["zero"], 0);
}

#[tokio::test]
async fn requests_on_one_connection_are_routed_independently() {
    // One client connection, alternating hosts: routing happens per request, not per connection.
    let fleet = Fleet::start(&["one", "two"]).await;
    let yaml = preamble(None)
        + &fleet.backends()
        + &route(
            "one",
            "one.test",
            &rule("[{path: {type: PathPrefix, value: /}}]", "one"),
        )
        + &route(
            "two",
            "two.test",
            &rule("[{path: {type: PathPrefix, value: /}}]", "two"),
        );
    let proxy = TestProxy::start(&yaml).await;
    let mut conn = Conn::open(proxy.http()).await;
    for i in 0..6 {
        let host = if i % 2 == 0 { "one.test" } else { "two.test" };
        let response = conn
            .fetch(
                request("GET", host, "/")
                    .body(ClientBody::default())
                    .unwrap(),
            )
            .await;
        assert_eq!(response.upstream(), Some(host.trim_end_matches(".test")));
    }
    let response = get_with_headers(proxy.http(), "one.test", "/", &[("x-any", "1")]).await;
    assert_eq!(response.upstream(), Some("one"));
    // HTTPRoute hostnames also match the host of an absolute-form request.
    let response = get_absolute(proxy.http(), "http://two.test/").await;
    assert_eq!(response.upstream(), Some("two"));
}

#[tokio::test]
async fn listener_hostname_limits_what_its_routes_serve() {
    let fleet = Fleet::start(&["inside", "any"]).await;
    let yaml = format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata: {{name: egressd}}
spec:
  accessLog: {{enabled: false}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  listeners:
  - {{name: http, address: 127.0.0.1, port: 0, protocol: HTTP, hostname: "*.internal.test"}}
{backends}---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: named}}
spec:
  hostnames: [a.internal.test, b.other.test]
  rules: [{{backendRefs: [{{name: inside}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: unnamed}}
spec:
  rules: [{{backendRefs: [{{name: any}}]}}]
"#,
        backends = fleet.backends()
    );
    let proxy = TestProxy::start(&yaml).await;
    let to = |host: &'static str| {
        request("GET", host, "/")
            .body(ClientBody::default())
            .unwrap()
    };
    // The named route keeps only the host inside the listener's wildcard.
    assert_routed(&proxy, to("a.internal.test"), "inside").await;
    // A route without hostnames takes the listener's: any host under it, nothing else.
    assert_routed(&proxy, to("c.internal.test"), "any").await;
    for host in ["b.other.test", "internal.test"] {
        let response = fetch(proxy.http(), to(host)).await;
        assert_eq!(
            response.status, 403,
            "{host} is outside the listener hostname"
        );
        assert_eq!(response.error_code(), Some("destination_not_allowed"));
    }
}
