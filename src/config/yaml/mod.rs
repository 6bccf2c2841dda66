//! A YAML document tree that remembers where every node came from, and a strict serde
//! deserializer over it whose errors point at the exact offending node.
//!
//! We build our own tree from the `saphyr-parser` event stream instead of using
//! `saphyr::MarkedYaml` because the latter stores mappings in a hash map keyed by value (so it
//! cannot tell us where the *first* of two duplicate keys was) and resolves scalars eagerly,
//! losing the source text (`1.10` would come back as `1.1`). Scalar resolution itself is
//! delegated to saphyr's YAML 1.2 core-schema resolver so we do not grow a second one.
//!
//! The module is split by concern:
//! - this file: the tree itself ([`Pos`], [`Node`], [`Value`]);
//! - `parse`: building the tree from saphyr-parser events ([`parse_documents_with`],
//!   [`parse::SyntaxError`], the nesting and alias-expansion limits);
//! - `deserializer`: the serde deserializer over the tree ([`from_node_all`],
//!   [`deserializer::DeError`], error paths);
//! - `spanned`: [`Spanned`], a value that remembers its position.

mod deserializer;
mod parse;
mod spanned;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::fmt::{self, Display};

pub(crate) use deserializer::from_node_all;
#[cfg(test)]
pub(crate) use deserializer::{from_node, DeError};
#[cfg(test)]
pub(crate) use parse::parse_documents;
pub(crate) use parse::{parse_documents_with, Limit, ParseLimits};
pub(crate) use spanned::Spanned;

/// Longest string shown verbatim in an error message before it is shortened.
const MAX_SHOWN_CHARS: usize = 40;

/// A position in the source text.
///
/// Both fields are 1-based, as editors show them; the column counts characters, not bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pos {
    /// Line number, starting at 1.
    pub(crate) line: u32,
    /// Column number in characters, starting at 1.
    pub(crate) column: u32,
}

impl Pos {
    /// Creates a position from a 1-based line and column.
    #[must_use]
    pub(crate) const fn new(line: u32, column: u32) -> Self {
        Self { line, column }
    }
}

impl Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One node of a YAML document together with where it starts in the source.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// Where the node starts: the first character of a scalar, the `[`/`{` of a flow
    /// collection, the first key or `-` of a block collection, or its anchor/tag if it has one.
    pub(crate) pos: Pos,
    /// The resolved value.
    pub(crate) value: Value,
    /// The source text of a plain scalar that resolved to null, a boolean or a number.
    ///
    /// Kept so that a field typed as a string reads exactly what was written (`1.10` stays
    /// `"1.10"`, `0123` stays `"0123"`). `None` for strings (their value already is the text)
    /// and for collections.
    pub(crate) raw: Option<Box<str>>,
}

/// The value of a [`Node`], resolved with the YAML 1.2 core schema.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// `null`, `~` or an empty value.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer that fits in `i64`.
    Int(i64),
    /// A floating-point number, including `.inf` and `.nan`.
    Float(f64),
    /// Any scalar that is not null/bool/int/float under the YAML 1.2 core schema, or any quoted scalar.
    String(String),
    /// A sequence, in source order.
    Seq(Vec<Node>),
    /// Keys keep their own nodes so errors can point at a key. Order as in the file.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Creates a node without source text; [`Node::scalar_text`] then formats the value.
    #[must_use]
    pub(crate) fn new(pos: Pos, value: Value) -> Self {
        Self {
            pos,
            value,
            raw: None,
        }
    }

    /// Looks up a mapping entry by key, comparing against each scalar key's text
    /// (so `get("80")` finds the key `80`). `None` if this is not a mapping.
    #[must_use]
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        let Value::Map(entries) = &self.value else {
            return None;
        };
        entries
            .iter()
            .find(|(k, _)| k.scalar_text().as_deref() == Some(key))
            .map(|(_, v)| v)
    }

    /// The value of a string scalar; `None` for anything else (including numbers).
    #[must_use]
    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a sequence.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// The entries of a mapping, in source order.
    #[must_use]
    pub(crate) fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The text of any scalar as written in the source; `None` for collections.
    ///
    /// Nodes built by hand without `raw` get their value formatted instead.
    #[must_use]
    pub(crate) fn scalar_text(&self) -> Option<Cow<'_, str>> {
        if let Some(raw) = &self.raw {
            return Some(Cow::Borrowed(raw));
        }
        match &self.value {
            Value::Null => Some(Cow::Borrowed("null")),
            Value::Bool(b) => Some(Cow::Owned(b.to_string())),
            Value::Int(i) => Some(Cow::Owned(i.to_string())),
            Value::Float(f) => Some(Cow::Owned(f.to_string())),
            Value::String(s) => Some(Cow::Borrowed(s)),
            Value::Seq(_) | Value::Map(_) => None,
        }
    }

    /// A human name for the node's kind, for messages: "null", "boolean", "integer", "float",
    /// "string", "sequence" or "mapping".
    #[must_use]
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::String(_) => "string",
            Value::Seq(_) => "sequence",
            Value::Map(_) => "mapping",
        }
    }

    /// Describes the node for "found ..." in error messages, e.g. `string "5"` or `a mapping`.
    fn describe(&self) -> String {
        match &self.value {
            Value::Null => "null".to_owned(),
            Value::String(s) => format!("string {:?}", shorten(s)),
            Value::Seq(_) => "a sequence".to_owned(),
            Value::Map(_) => "a mapping".to_owned(),
            Value::Bool(_) | Value::Int(_) | Value::Float(_) => {
                let text = self.scalar_text().unwrap_or_default();
                format!("{} {}", self.kind_name(), shorten(&text))
            }
        }
    }
}

/// Shortens long text for error messages so one bad value cannot flood a log line.
fn shorten(s: &str) -> Cow<'_, str> {
    match s.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((cut, _)) => Cow::Owned(format!("{}…", &s[..cut])),
        None => Cow::Borrowed(s),
    }
}
