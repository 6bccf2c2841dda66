use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{assert_err, load};
use crate::config::yaml::{Pos, Spanned};

// ---- Spanned ---------------------------------------------------------------------------

#[derive(Debug, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Listener {
    name: Spanned<String>,
    port: u16,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Gateway {
    listeners: Vec<Spanned<Listener>>,
    #[serde(default)]
    min_version: Option<Spanned<String>>,
}

#[test]
fn spanned_records_positions() {
    let gw: Gateway = load(
        "listeners:\n  - name: a\n    port: 80\n  - {name: 'b', port: 81}\nminVersion: 1.10\n",
    )
    .unwrap();
    assert_eq!(gw.listeners[0].pos, Pos::new(2, 5));
    assert_eq!(gw.listeners[0].name.pos, Pos::new(2, 11));
    assert_eq!(*gw.listeners[0].name, "a");
    assert_eq!(gw.listeners[1].pos, Pos::new(4, 5));
    assert_eq!(gw.listeners[1].name.pos, Pos::new(4, 12));
    assert_eq!(gw.listeners[1].value.port, 81);
    let min = gw.min_version.unwrap();
    assert_eq!((min.pos, min.value.as_str()), (Pos::new(5, 13), "1.10"));
}

#[test]
fn spanned_errors_keep_inner_positions() {
    let err = load::<Gateway>("listeners:\n  - name: a\n    port: x\n").unwrap_err();
    assert_err(&err, (3, 11), "listeners[0].port", "expected an integer");
    let err = load::<Gateway>("listeners:\n  - name: [a]\n    port: 1\n").unwrap_err();
    assert_err(
        &err,
        (2, 11),
        "listeners[0].name",
        "expected a string, found a sequence",
    );
    let err = load::<Gateway>("listeners:\n  - nam: a\n").unwrap_err();
    assert_err(&err, (2, 5), "listeners[0].nam", "unknown field `nam`");
}

#[test]
fn spanned_with_other_deserializers_and_serializers() {
    /// Below flatten, serde buffers the input: plain value, default position.
    #[derive(Deserialize)]
    struct Outer {
        #[serde(flatten)]
        inner: Listener,
    }
    let l: Listener = serde_json::from_str(r#"{"name": "a", "port": 80}"#).unwrap();
    assert_eq!(l.name, Spanned::new(Pos::default(), "a".to_owned()));
    assert_eq!(
        serde_json::to_string(&l).unwrap(),
        r#"{"name":"a","port":80}"#
    );
    let s: Spanned<Vec<u8>> = serde_json::from_str("[1, 2]").unwrap();
    assert_eq!(s.into_inner(), [1, 2]);
    let o: Outer = load("name: a\nport: 1\n").unwrap();
    assert_eq!(o.inner.name.pos, Pos::default());
}

#[test]
fn spanned_schema_is_the_inner_schema() {
    let plain = schemars::schema_for!(String);
    let spanned = schemars::schema_for!(Spanned<String>);
    assert_eq!(plain, spanned);
    let listener = schemars::schema_for!(Listener);
    assert_eq!(
        listener.get("properties").unwrap()["name"],
        serde_json::json!({"type": "string"})
    );
    assert_eq!(
        <Spanned<Listener> as JsonSchema>::schema_name(),
        <Listener as JsonSchema>::schema_name()
    );
    assert!(!<Spanned<Listener> as JsonSchema>::inline_schema());
}
