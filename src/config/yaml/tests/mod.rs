//! Unit tests for the YAML tree, the deserializer and `Spanned`, one file per concern.

use serde::de;

use super::{from_node, parse_documents, DeError, Node, Pos};

mod deserializer;
mod spanned;
mod tree;

fn one(text: &str) -> Node {
    let mut docs = parse_documents(text).unwrap();
    assert_eq!(docs.len(), 1, "expected one document");
    docs.remove(0)
}

fn load<T: de::DeserializeOwned>(text: &str) -> Result<T, DeError> {
    from_node(&one(text))
}

/// Asserts an error's position, path and message.
#[track_caller]
fn assert_err(err: &DeError, pos: (u32, u32), path: &str, message: &str) {
    assert_eq!(
        (err.pos, err.path.as_str()),
        (Pos::new(pos.0, pos.1), path),
        "error: {err:?}"
    );
    assert!(
        err.message.contains(message),
        "message {:?} does not contain {message:?}",
        err.message
    );
}
