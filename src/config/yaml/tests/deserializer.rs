use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Visitor};
use serde::Deserialize;

use super::{assert_err, load};
use crate::config::yaml::{from_node, parse_documents};

// ---- deserializer: scalars -------------------------------------------------------------

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Scalars {
    name: String,
    min_version: String,
    port: u16,
    weight: f64,
    enabled: bool,
    #[serde(default)]
    note: Option<String>,
    initial: char,
}

#[test]
fn strings_take_the_original_text_of_any_scalar() {
    let s: Scalars =
        load("name: 0123\nminVersion: 1.10\nport: 8080\nweight: 2\nenabled: false\ninitial: x\n")
            .unwrap();
    assert_eq!(
        s,
        Scalars {
            name: "0123".into(),
            min_version: "1.10".into(),
            port: 8080,
            weight: 2.0,
            enabled: false,
            note: None,
            initial: 'x',
        }
    );
    assert_eq!(load::<String>("true").unwrap(), "true");
    assert_eq!(load::<String>("'quoted'").unwrap(), "quoted");
}

#[test]
fn strings_reject_collections_and_null() {
    let err = load::<Scalars>("name: {a: 1}\n").unwrap_err();
    assert_err(&err, (1, 7), "name", "expected a string, found a mapping");
    let err = load::<BTreeMap<String, String>>("a: [1]\n").unwrap_err();
    assert_err(&err, (1, 4), "a", "expected a string, found a sequence");
    let err = load::<BTreeMap<String, String>>("a:\n").unwrap_err();
    assert_err(&err, (1, 2), "a", "expected a string, found null");
    let err = load::<char>("xy").unwrap_err();
    assert_err(&err, (1, 1), "", "expected a single character");
}

#[test]
fn typed_scalars_are_strict() {
    let err = load::<BTreeMap<String, u32>>("n: \"5\"\n").unwrap_err();
    assert_err(&err, (1, 4), "n", "expected an integer, found string \"5\"");
    let err = load::<BTreeMap<String, bool>>("b: yes\n").unwrap_err();
    assert_err(
        &err,
        (1, 4),
        "b",
        "expected a boolean, found string \"yes\"",
    );
    let err = load::<BTreeMap<String, u8>>("b: 1.5\n").unwrap_err();
    assert_err(&err, (1, 4), "b", "expected an integer, found float 1.5");
    let err = load::<BTreeMap<String, f64>>("f: '1.5'\n").unwrap_err();
    assert_err(&err, (1, 4), "f", "expected a number, found string \"1.5\"");
    assert!((load::<f32>("1.5").unwrap() - 1.5).abs() < f32::EPSILON);
    assert_eq!(load::<i8>("-128").unwrap(), -128);
    assert_eq!(load::<u64>("0x10").unwrap(), 16);
}

#[test]
fn integers_out_of_range_name_the_range() {
    let err = load::<Scalars>(
        "name: a\nminVersion: b\nport: 70000\nweight: 1\nenabled: true\ninitial: c\n",
    )
    .unwrap_err();
    assert_err(
        &err,
        (3, 7),
        "port",
        "70000 is out of range: it must be 0 to 65535",
    );
    let err = load::<u32>("-1").unwrap_err();
    assert_err(
        &err,
        (1, 1),
        "",
        "-1 is out of range: it must be 0 to 4294967295",
    );
    // Beyond i64 but within u64: saphyr sees a float, the source text still has the integer.
    assert_eq!(load::<u64>("18446744073709551615").unwrap(), u64::MAX);
    assert_eq!(load::<u128>("18446744073709551616").unwrap(), 1 << 64);
    let err = load::<u64>("18446744073709551616").unwrap_err();
    assert!(
        err.message
            .contains("out of range: it must be 0 to 18446744073709551615"),
        "{}",
        err.message
    );
}

#[test]
fn options_and_units() {
    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Opts {
        a: Option<u8>,
        b: Option<u8>,
        #[serde(default)]
        c: Option<u8>,
        d: (),
    }
    let o: Opts = load("a: 1\nb: ~\nd:\n").unwrap();
    assert_eq!(
        o,
        Opts {
            a: Some(1),
            b: None,
            c: None,
            d: ()
        }
    );
    let err = load::<Opts>("a: x\nb: 1\nd: 1\n").unwrap_err();
    assert_err(&err, (1, 4), "a", "expected an integer, found string \"x\"");
    let err = load::<Opts>("d: 1\n").unwrap_err();
    assert_err(&err, (1, 4), "d", "expected null, found integer 1");
}

// ---- deserializer: any -----------------------------------------------------------------

/// Records what `deserialize_any` hands out, in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Unit,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(String),
    Seq(Vec<Seen>),
    Map(Vec<(Seen, Seen)>),
}

impl<'de> Deserialize<'de> for Seen {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Seen;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("anything")
            }
            fn visit_unit<E>(self) -> Result<Seen, E> {
                Ok(Seen::Unit)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Seen, E> {
                Ok(Seen::Bool(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Seen, E> {
                Ok(Seen::U64(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Seen, E> {
                Ok(Seen::I64(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Seen, E> {
                Ok(Seen::F64(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Seen, E> {
                Ok(Seen::Str(v.into()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Seen, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = a.next_element()? {
                    out.push(x);
                }
                Ok(Seen::Seq(out))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut a: A) -> Result<Seen, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = a.next_entry()? {
                    out.push(x);
                }
                Ok(Seen::Map(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[test]
fn deserialize_any_dispatches_on_kind_in_file_order() {
    let seen: Seen = load("z: ~\ny: true\nx: [1, -2, 2.5, s]\nw: {b: 1, a: 2}\n").unwrap();
    let s = |v: &str| Seen::Str(v.into());
    assert_eq!(
        seen,
        Seen::Map(vec![
            (s("z"), Seen::Unit),
            (s("y"), Seen::Bool(true)),
            (
                s("x"),
                Seen::Seq(vec![Seen::U64(1), Seen::I64(-2), Seen::F64(2.5), s("s")])
            ),
            (
                s("w"),
                Seen::Map(vec![(s("b"), Seen::U64(1)), (s("a"), Seen::U64(2))])
            ),
        ])
    );
}

// ---- deserializer: structs, paths and positions ------------------------------------------

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Route {
    api_version: String,
    spec: Spec,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Spec {
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    hostnames: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Rule {
    matches: Vec<Match>,
    #[serde(default)]
    timeout_ms: Option<Millis>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Match {
    path: PathMatch,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PathMatch {
    #[serde(rename = "type")]
    kind: PathKind,
    value: String,
}

#[derive(Debug, Deserialize, PartialEq)]
enum PathKind {
    Exact,
    PathPrefix,
}

/// Custom validation, the way hand-written newtypes do it.
#[derive(Debug, PartialEq)]
struct Millis(u32);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u32::deserialize(d)?;
        if n == 0 {
            return Err(de::Error::custom("timeout must be positive"));
        }
        Ok(Millis(n))
    }
}

const ROUTE: &str = "\
apiVersion: v1
spec:
  hostnames: [a.example]
  rules:
    - matches:
        - path: {type: Exact, value: /a}
        - path:
            type: Regex
            value: /b
";

#[test]
fn nested_structs_deserialize() {
    let ok = ROUTE.replace("Regex", "PathPrefix");
    let route: Route = load(&ok).unwrap();
    assert_eq!(route.api_version, "v1");
    assert_eq!(route.spec.hostnames, Some(vec!["a.example".to_owned()]));
    assert_eq!(
        route.spec.rules[0].matches[1].path.kind,
        PathKind::PathPrefix
    );
    assert_eq!(route.spec.rules[0].timeout_ms, None);
}

#[test]
fn unknown_variant_is_positioned_at_the_scalar_with_full_path() {
    let err = load::<Route>(ROUTE).unwrap_err();
    assert_err(
        &err,
        (8, 19),
        "spec.rules[0].matches[1].path.type",
        "unknown variant `Regex`, expected `Exact` or `PathPrefix`",
    );
}

#[test]
fn unknown_field_is_positioned_at_the_key() {
    let err = load::<Route>(&ROUTE.replace("    - matches:", "    - matchez:")).unwrap_err();
    assert_err(
        &err,
        (5, 7),
        "spec.rules[0].matchez",
        "unknown field `matchez`",
    );
    let err = load::<Route>(&ROUTE.replace("value: /a", "value: /a, extra: 1")).unwrap_err();
    assert_err(
        &err,
        (6, 42),
        "spec.rules[0].matches[0].path.extra",
        "unknown field `extra`, expected `type` or `value`",
    );
}

#[test]
fn missing_field_is_positioned_at_the_mapping() {
    let text = ROUTE
        .replace("Regex", "Exact")
        .replace("            value: /b\n", "");
    let err = load::<Route>(&text).unwrap_err();
    assert_err(
        &err,
        (8, 13),
        "spec.rules[0].matches[1].path",
        "missing field `value`",
    );
    let err = load::<Route>("spec: {}\n").unwrap_err();
    assert_err(&err, (1, 1), "", "missing field `apiVersion`");
}

#[test]
fn custom_errors_are_positioned_at_the_value() {
    let text = ROUTE.replace("    - matches:", "    - timeoutMs: 0\n      matches:");
    let err = load::<Route>(&text).unwrap_err();
    assert_err(
        &err,
        (5, 18),
        "spec.rules[0].timeoutMs",
        "timeout must be positive",
    );
}

#[test]
fn type_errors_in_collections() {
    let err = load::<Route>("apiVersion: v1\nspec:\n  rules: {}\n").unwrap_err();
    assert_err(
        &err,
        (3, 10),
        "spec.rules",
        "expected a sequence, found a mapping",
    );
    let err = load::<Route>("apiVersion: v1\nspec: x\n").unwrap_err();
    assert_err(
        &err,
        (2, 7),
        "spec",
        "expected a mapping, found string \"x\"",
    );
    let err = load::<(u8, u8)>("[1, 2, 3]").unwrap_err();
    assert_err(
        &err,
        (1, 1),
        "",
        "expected a sequence of 2 elements, found 3",
    );
    assert_eq!(load::<(u8, String)>("[1, 2]").unwrap(), (1, "2".to_owned()));
}

#[test]
fn odd_keys_are_quoted_in_paths() {
    let err =
        load::<BTreeMap<String, BTreeMap<String, u8>>>("example.com/a: {x: 1}\n\"\": {y: z}\n")
            .unwrap_err();
    assert_err(&err, (2, 9), "[\"\"].y", "expected an integer");
    let err =
        load::<BTreeMap<String, BTreeMap<String, u8>>>("example.com/a: {x: y}\n").unwrap_err();
    assert_err(
        &err,
        (1, 20),
        "[\"example.com/a\"].x",
        "expected an integer",
    );
}

#[test]
fn non_string_map_keys() {
    let m: BTreeMap<u16, String> = load("80: http\n443: https\n").unwrap();
    assert_eq!(m[&443], "https");
    let err = load::<BTreeMap<u16, String>>("80: http\nx: y\n").unwrap_err();
    assert_err(&err, (2, 1), "x", "expected an integer");
}

// ---- enums -----------------------------------------------------------------------------

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum Action {
    Allow,
    Deny,
    Redirect(String),
    Rewrite { host: String, port: Option<u16> },
    Pair(u8, u8),
}

#[test]
fn enums_from_strings_and_single_key_maps() {
    let a: Vec<Action> =
        load("- allow\n- redirect: https://x\n- rewrite: {host: h}\n- pair: [1, 2]\n- deny: ~\n")
            .unwrap();
    assert_eq!(
        a,
        [
            Action::Allow,
            Action::Redirect("https://x".into()),
            Action::Rewrite {
                host: "h".into(),
                port: None
            },
            Action::Pair(1, 2),
            Action::Deny,
        ]
    );
}

#[test]
fn enum_errors_are_positioned() {
    let err = load::<Vec<Action>>("- allow\n- alow\n").unwrap_err();
    assert_err(&err, (2, 3), "[1]", "unknown variant `alow`");
    let err = load::<Vec<Action>>("- {redirekt: x}\n").unwrap_err();
    assert_err(&err, (1, 4), "[0].redirekt", "unknown variant `redirekt`");
    let err = load::<Vec<Action>>("- rewrite: {host: h, port: x}\n").unwrap_err();
    assert_err(&err, (1, 28), "[0].rewrite.port", "expected an integer");
    let err = load::<Vec<Action>>("- rewrite: {hots: h}\n").unwrap_err();
    assert_err(&err, (1, 13), "[0].rewrite.hots", "unknown field `hots`");
    let err = load::<Vec<Action>>("- redirect\n").unwrap_err();
    assert_err(&err, (1, 3), "[0]", "variant `redirect` needs a value");
    let err = load::<Vec<Action>>("- allow: 1\n").unwrap_err();
    assert_err(&err, (1, 10), "[0].allow", "expected null, found integer 1");
    let err = load::<Vec<Action>>("- {allow: ~, deny: ~}\n").unwrap_err();
    assert_err(&err, (1, 3), "[0]", "expected one of `allow`, `deny`");
    let err = load::<Vec<Action>>("- pair: [1]\n").unwrap_err();
    assert_err(
        &err,
        (1, 9),
        "[0].pair",
        "expected a sequence of 2 elements, found 1",
    );
}

// ---- flatten, untagged, internally tagged ------------------------------------------------

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct WithFlatten {
    name: String,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Common {
    retries: u8,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(untagged)]
enum PortOrName {
    Port(u16),
    Name(String),
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "camelCase", deny_unknown_fields)]
enum Backend {
    Static { address: String },
    Dns { host: String, port: u16 },
}

#[test]
fn flatten_works_and_errors_point_at_the_enclosing_map() {
    let v: WithFlatten = load("name: a\nretries: 3\nlabels: {x: y}\n").unwrap();
    assert_eq!(v.common.retries, 3);
    assert_eq!(v.common.labels["x"], "y");
    let err = load::<Vec<WithFlatten>>("- name: a\n  retries: many\n").unwrap_err();
    assert_err(&err, (1, 3), "[0]", "expected u8");
}

#[test]
fn untagged_enums_work() {
    let v: Vec<PortOrName> = load("[80, http]").unwrap();
    assert_eq!(v, [PortOrName::Port(80), PortOrName::Name("http".into())]);
    let err = load::<Vec<PortOrName>>("[80, [x]]").unwrap_err();
    assert_err(&err, (1, 6), "[1]", "did not match any variant");
}

#[test]
fn internally_tagged_enums_work() {
    let v: Vec<Backend> =
        load("- type: static\n  address: 10.0.0.1\n- {type: dns, host: h, port: 53}\n").unwrap();
    assert_eq!(
        v,
        [
            Backend::Static {
                address: "10.0.0.1".into()
            },
            Backend::Dns {
                host: "h".into(),
                port: 53
            }
        ]
    );
    // The tag value is read directly from our deserializer, so it is exact.
    let err = load::<Vec<Backend>>("- type: dsn\n  host: h\n").unwrap_err();
    assert_err(&err, (1, 9), "[0].type", "unknown variant `dsn`");
    // The rest is buffered by serde: the enclosing mapping is the best we can do.
    let err = load::<Vec<Backend>>("- type: dns\n  host: h\n  port: 99999\n").unwrap_err();
    assert_err(&err, (1, 3), "[0]", "99999");
    let err = load::<Vec<Backend>>("- address: x\n").unwrap_err();
    assert_err(&err, (1, 3), "[0]", "missing field `type`");
}

// ---- whole files and aliases through serde ------------------------------------------------

#[test]
fn multi_document_files_deserialize_per_document() {
    let text = "apiVersion: v1\nspec: {}\n---\n# second\napiVersion: v2\nspec:\n  rules: []\n  hostnames: [x, 1]\n---\n";
    let docs = parse_documents(text).unwrap();
    let routes: Vec<Route> = docs
        .iter()
        .map(from_node)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(routes[1].api_version, "v2");
    assert_eq!(
        routes[1].spec.hostnames.as_deref(),
        Some(&["x".to_owned(), "1".to_owned()][..])
    );
    // Positions are relative to the file, not to the document.
    let err = from_node::<Route>(&parse_documents(&text.replace("[x, 1]", "[x, [1]]")).unwrap()[1])
        .unwrap_err();
    assert_err(&err, (8, 18), "spec.hostnames[1]", "expected a string");
}

#[test]
fn ignored_fields_and_aliases_through_serde() {
    #[derive(Deserialize)]
    struct Loose {
        a: u8,
    }
    let l: Loose = load("a: 1\nb: {deep: [1, 2]}\n").unwrap();
    assert_eq!(l.a, 1);
    let m: BTreeMap<String, Vec<u8>> = load("x: &l [1, 2]\ny: *l\n").unwrap();
    assert_eq!(m["y"], [1, 2]);
}
