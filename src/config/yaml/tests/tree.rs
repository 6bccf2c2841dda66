use std::fmt::Write as _;

use super::one;
use crate::config::yaml::parse::MAX_DEPTH;
use crate::config::yaml::{parse_documents, Node, Pos, Value};

// ---- tree ------------------------------------------------------------------------------

#[test]
fn pos_displays_as_line_colon_column() {
    assert_eq!(Pos::new(3, 14).to_string(), "3:14");
    assert!(Pos::new(1, 9) < Pos::new(2, 1));
}

#[test]
fn tree_has_positions_kinds_and_order() {
    let root = one("b: 1\na:\n  - x\n  - [y, \"z\"]\nc: {k: v}\nd: 1.5\ne: true\nf:\n");
    assert_eq!(root.pos, Pos::new(1, 1));
    assert_eq!(root.kind_name(), "mapping");
    let keys: Vec<_> = root
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, ["b", "a", "c", "d", "e", "f"]);

    let b = root.get("b").unwrap();
    assert!(matches!(b.value, Value::Int(1)));
    assert_eq!(b.pos, Pos::new(1, 4));
    assert_eq!(b.kind_name(), "integer");

    let a = root.get("a").unwrap();
    assert_eq!((a.kind_name(), a.pos), ("sequence", Pos::new(3, 3)));
    let items = a.as_seq().unwrap();
    assert_eq!(items[0].as_str(), Some("x"));
    assert_eq!(items[0].pos, Pos::new(3, 5));
    assert_eq!(items[1].pos, Pos::new(4, 5));
    let flow = items[1].as_seq().unwrap();
    assert_eq!(flow[1].as_str(), Some("z"));
    assert_eq!(flow[1].pos, Pos::new(4, 9));

    let c = root.get("c").unwrap();
    assert_eq!(
        (c.pos, c.get("k").unwrap().pos),
        (Pos::new(5, 4), Pos::new(5, 8))
    );
    assert_eq!(root.get("d").unwrap().kind_name(), "float");
    assert_eq!(root.get("e").unwrap().kind_name(), "boolean");
    assert_eq!(root.get("f").unwrap().kind_name(), "null");
    assert!(root.get("zz").is_none());
    assert!(b.get("x").is_none());
    assert_eq!(b.as_str(), None);
}

#[test]
fn columns_count_characters_not_bytes() {
    let root = one("é: ü\n");
    assert_eq!(root.get("é").unwrap().pos, Pos::new(1, 4));
}

#[test]
fn scalars_keep_source_text() {
    let root = one("v: 1.10\nn: 0123\nh: 0x1F\nt: True\nz: ~\ns: \"1.10\"\n");
    let text = |k: &str| root.get(k).unwrap().scalar_text().unwrap().into_owned();
    assert_eq!(text("v"), "1.10");
    assert_eq!(text("n"), "0123");
    assert!(matches!(root.get("n").unwrap().value, Value::Int(123)));
    assert_eq!(text("h"), "0x1F");
    assert_eq!(text("t"), "True");
    assert_eq!(text("z"), "~");
    assert_eq!(text("s"), "1.10");
    assert_eq!(root.get("s").unwrap().as_str(), Some("1.10"));
    // Hand-built nodes have no raw text; the value is formatted.
    assert_eq!(
        Node::new(Pos::default(), Value::Int(7))
            .scalar_text()
            .unwrap(),
        "7"
    );
    assert!(one("[1]").scalar_text().is_none());
}

#[test]
fn get_matches_non_string_keys_by_text() {
    let root = one("80: http\n\"443\": https\n");
    assert_eq!(root.get("80").unwrap().as_str(), Some("http"));
    assert_eq!(root.get("443").unwrap().as_str(), Some("https"));
}

#[test]
fn block_scalars_and_tags() {
    let root = one("a: |\n  x\n  y\nb: !!str 5\nc: !!int abc\nd: !!null\ne: !!str\n");
    assert_eq!(root.get("a").unwrap().as_str(), Some("x\ny\n"));
    assert_eq!(root.get("b").unwrap().as_str(), Some("5"));
    assert_eq!(root.get("c").unwrap().as_str(), Some("abc"));
    assert!(matches!(root.get("d").unwrap().value, Value::Null));
    assert_eq!(root.get("e").unwrap().as_str(), Some(""));
}

#[test]
fn documents_are_split_and_empty_ones_skipped() {
    let docs = parse_documents("---\na: 1\n---\n# nothing\n---\n- b\n---\n").unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].pos, Pos::new(2, 1));
    assert_eq!(docs[1].pos, Pos::new(6, 1));
    assert!(parse_documents("# only a comment\n").unwrap().is_empty());
    assert!(parse_documents("").unwrap().is_empty());
    // An explicit null is content, not an empty document.
    assert_eq!(parse_documents("--- ~\n").unwrap().len(), 1);
}

#[test]
fn syntax_errors_are_positioned() {
    let err = parse_documents("a: 1\nb: [1, 2\n").unwrap_err();
    assert_eq!(err.pos, Pos::new(3, 1));
    assert!(err.message.contains("flow sequence"), "{}", err.message);
    let err = parse_documents("a: b: c\n").unwrap_err();
    assert_eq!(err.pos.line, 1);
}

#[test]
fn duplicate_keys_are_rejected_at_the_second_key() {
    let err = parse_documents("spec:\n  x: 1\n  y: 2\n  x: 3\n").unwrap_err();
    assert_eq!(err.pos, Pos::new(4, 3));
    assert_eq!(err.message, "duplicate key `x` (first at 2:3)");
    // Quoting does not make a string key different.
    let err = parse_documents("{a: 1, 'a': 2}").unwrap_err();
    assert_eq!(err.message, "duplicate key `a` (first at 1:2)");
    assert_eq!(err.pos, Pos::new(1, 8));
    // Collection keys are compared structurally.
    let err = parse_documents("? [1, 2]\n: a\n? [1, 2]\n: b\n").unwrap_err();
    assert!(err.message.starts_with("duplicate key"), "{}", err.message);
    // Different types and different mappings are fine.
    assert!(parse_documents("1: a\n\"1\": b\nm: {1: x}\nn: {1: y}\n").is_ok());
    // Each document is checked on its own.
    assert!(parse_documents("a: 1\n---\na: 2\n").is_ok());
}

#[test]
fn aliases_are_expanded() {
    let root = one("base: &b\n  port: 80\nuse: *b\nlist: [&x 1, *x]\n");
    let used = root.get("use").unwrap();
    assert_eq!(used.pos, Pos::new(3, 6));
    let port = used.get("port").unwrap();
    assert!(matches!(port.value, Value::Int(80)));
    assert_eq!(port.pos, Pos::new(2, 9));
    let list = root.get("list").unwrap().as_seq().unwrap();
    assert!(matches!(list[1].value, Value::Int(1)));

    let err = parse_documents("a: &x 1\n---\nb: *x\n").unwrap_err();
    assert_eq!(err.pos, Pos::new(3, 4));
}

#[test]
fn alias_bombs_and_deep_nesting_are_refused() {
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (name, prev) in ["b", "c", "d", "e", "f", "g"]
        .iter()
        .zip(["a", "b", "c", "d", "e", "f"])
    {
        let refs = vec![format!("*{prev}"); 10].join(", ");
        writeln!(bomb, "{name}: &{name} [{refs}]").unwrap();
    }
    let err = parse_documents(&bomb).unwrap_err();
    assert!(
        err.message
            .contains("anchors and aliases expand to more than"),
        "{}",
        err.message
    );

    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let err = parse_documents(&deep).unwrap_err();
    assert!(err.message.contains("nested deeper"), "{}", err.message);
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse_documents(&ok).is_ok());
}
