//! A YAML document tree that remembers where every node came from, and a strict serde
//! deserializer over it whose errors point at the exact offending node.
//!
//! We build our own tree from the `saphyr-parser` event stream instead of using
//! `saphyr::MarkedYaml` because the latter stores mappings in a hash map keyed by value (so it
//! cannot tell us where the *first* of two duplicate keys was) and resolves scalars eagerly,
//! losing the source text (`1.10` would come back as `1.1`). Scalar resolution itself is
//! delegated to saphyr's YAML 1.2 core-schema resolver so we do not grow a second one.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt::{self, Display, Write as _};
use std::marker::PhantomData;
use std::ops::Deref;

use saphyr_parser::{Event, Marker, Parser, ScalarStyle, ScanError, Tag};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::{Deserialize, Serialize};

/// Deepest collection nesting we accept. Real configuration never gets close; the limit exists
/// so that hostile input cannot overflow the stack in the (recursive) deserializer or in `Drop`.
const MAX_DEPTH: usize = 128;

/// How many nodes alias expansion may create in one file, to defuse "billion laughs" inputs.
const ALIAS_NODE_BUDGET: usize = 100_000;

/// Longest string shown verbatim in an error message before it is shortened.
const MAX_SHOWN_CHARS: usize = 40;

/// A position in the source text.
///
/// Both fields are 1-based, as editors show them; the column counts characters, not bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// Line number, starting at 1.
    pub line: u32,
    /// Column number in characters, starting at 1.
    pub column: u32,
}

impl Pos {
    /// Creates a position from a 1-based line and column.
    #[must_use]
    pub const fn new(line: u32, column: u32) -> Self {
        Self { line, column }
    }

    /// saphyr markers have 1-based lines but 0-based columns.
    fn from_marker(marker: &Marker) -> Self {
        Self {
            line: saturating_u32(marker.line()),
            column: saturating_u32(marker.col().saturating_add(1)),
        }
    }
}

impl Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// One node of a YAML document together with where it starts in the source.
#[derive(Clone, Debug)]
pub struct Node {
    /// Where the node starts: the first character of a scalar, the `[`/`{` of a flow
    /// collection, the first key or `-` of a block collection, or its anchor/tag if it has one.
    pub pos: Pos,
    /// The resolved value.
    pub value: Value,
    /// The source text of a plain scalar that resolved to null, a boolean or a number.
    ///
    /// Kept so that a field typed as a string reads exactly what was written (`1.10` stays
    /// `"1.10"`, `0123` stays `"0123"`). `None` for strings (their value already is the text)
    /// and for collections.
    pub raw: Option<Box<str>>,
}

/// The value of a [`Node`], resolved with the YAML 1.2 core schema.
#[derive(Clone, Debug)]
pub enum Value {
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
    pub fn new(pos: Pos, value: Value) -> Self {
        Self {
            pos,
            value,
            raw: None,
        }
    }

    /// Looks up a mapping entry by key, comparing against each scalar key's text
    /// (so `get("80")` finds the key `80`). `None` if this is not a mapping.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Node> {
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
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The items of a sequence.
    #[must_use]
    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// The entries of a mapping, in source order.
    #[must_use]
    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The text of any scalar as written in the source; `None` for collections.
    ///
    /// Nodes built by hand without `raw` get their value formatted instead.
    #[must_use]
    pub fn scalar_text(&self) -> Option<Cow<'_, str>> {
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
    pub fn kind_name(&self) -> &'static str {
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

    /// Number of collection levels below and including this node (0 for a scalar).
    fn height(&self) -> usize {
        let children = match &self.value {
            Value::Seq(items) => items.iter().map(Node::height).max(),
            Value::Map(entries) => entries
                .iter()
                .map(|(k, v)| k.height().max(v.height()))
                .max(),
            _ => return 0,
        };
        1 + children.unwrap_or(0)
    }

    /// Total number of nodes in this subtree, counting mapping keys.
    fn count(&self) -> usize {
        match &self.value {
            Value::Seq(items) => 1 + items.iter().map(Node::count).sum::<usize>(),
            Value::Map(entries) => {
                1 + entries
                    .iter()
                    .map(|(k, v)| k.count() + v.count())
                    .sum::<usize>()
            }
            _ => 1,
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

/// A YAML syntax error (from saphyr), positioned.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    /// Where the problem was detected.
    pub pos: Pos,
    /// What went wrong.
    pub message: String,
}

impl SyntaxError {
    fn new(pos: Pos, message: impl Into<String>) -> Self {
        Self {
            pos,
            message: message.into(),
        }
    }
}

impl From<ScanError> for SyntaxError {
    fn from(e: ScanError) -> Self {
        Self::new(Pos::from_marker(e.marker()), e.info())
    }
}

/// Parse every `---`-separated document of a file. Empty documents (e.g. a trailing `---`, or a
/// file of only comments) are skipped.
///
/// Duplicate keys within one mapping are a [`SyntaxError`] at the second key
/// ("duplicate key `x` (first at line:col)"). Aliases are expanded into copies of the anchored
/// node (the copy's own position is that of the alias); anchors do not cross documents.
/// Tags are only used to resolve scalars (`!!str 5` is a string) and otherwise ignored.
///
/// # Errors
/// Malformed YAML, duplicate keys, undefined aliases, nesting deeper than 128 levels, or alias
/// expansion beyond 100 000 nodes.
pub fn parse_documents(text: &str) -> Result<Vec<Node>, SyntaxError> {
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder::default();
    let mut docs = Vec::new();
    while let Some(next) = parser.next_event() {
        let (event, span) = next?;
        let pos = Pos::from_marker(&span.start);
        match event {
            Event::Nothing | Event::StreamStart => {}
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                builder.stack.clear();
                builder.anchors.clear();
            }
            Event::DocumentEnd => {
                if let Some(root) = builder.root.take() {
                    if !is_empty_document(&root) {
                        docs.push(root);
                    }
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                builder.insert(scalar_node(text, style, tag.as_ref(), pos), anchor)?;
            }
            Event::SequenceStart(anchor, _) => builder.open(pos, anchor, Open::Seq(Vec::new()))?,
            Event::MappingStart(anchor, _) => {
                builder.open(pos, anchor, Open::Map(MapFrame::default()))?;
            }
            Event::SequenceEnd | Event::MappingEnd => builder.close(pos)?,
            Event::Alias(id) => builder.alias(id, pos)?,
        }
    }
    Ok(docs)
}

/// A document with no content at all comes out of the parser as one empty plain scalar.
fn is_empty_document(root: &Node) -> bool {
    matches!(root.value, Value::Null) && root.raw.as_deref() == Some("")
}

fn scalar_node(
    text: Cow<'_, str>,
    style: ScalarStyle,
    tag: Option<&Cow<'_, Tag>>,
    pos: Pos,
) -> Node {
    if style != ScalarStyle::Plain {
        return Node::new(pos, Value::String(text.into_owned()));
    }
    if text.is_empty() {
        // saphyr's resolver rejects `!!null` on an empty scalar; the spec says it is null.
        let forced_str = tag.is_some_and(|t| t.is_yaml_core_schema() && t.suffix == "str");
        if forced_str {
            return Node::new(pos, Value::String(String::new()));
        }
        return Node {
            pos,
            value: Value::Null,
            raw: Some("".into()),
        };
    }
    // A tag that does not fit its value (`!!int abc`) is ignored rather than fatal: tags are not
    // part of our configuration language, and the typed deserializer will complain if needed.
    let scalar = saphyr::Scalar::parse_from_cow_and_metadata(text.clone(), style, tag)
        .unwrap_or_else(|| saphyr::Scalar::parse_from_cow(text.clone()));
    let value = match scalar {
        saphyr::Scalar::String(s) => return Node::new(pos, Value::String(s.into_owned())),
        saphyr::Scalar::Null => Value::Null,
        saphyr::Scalar::Boolean(b) => Value::Bool(b),
        saphyr::Scalar::Integer(i) => Value::Int(i),
        saphyr::Scalar::FloatingPoint(f) => Value::Float(f.into_inner()),
    };
    Node {
        pos,
        value,
        raw: Some(text.into()),
    }
}

/// Turns the flat event stream into trees.
#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    /// Nodes already created by alias expansion in this file.
    alias_nodes: usize,
    root: Option<Node>,
}

/// A collection whose end event has not arrived yet.
struct Frame {
    pos: Pos,
    anchor: usize,
    open: Open,
}

enum Open {
    Seq(Vec<Node>),
    Map(MapFrame),
}

#[derive(Default)]
struct MapFrame {
    entries: Vec<(Node, Node)>,
    /// A key waiting for its value.
    key: Option<Node>,
    /// Scalar keys seen so far, for duplicate detection without a quadratic scan.
    seen: HashMap<ScalarKey, Pos>,
}

/// The identity of a scalar key. Keys of different types are different keys (`1` vs `"1"`),
/// as in YAML.
#[derive(PartialEq, Eq, Hash)]
enum ScalarKey {
    Null,
    Bool(bool),
    Int(i64),
    Float(u64),
    Str(String),
}

impl ScalarKey {
    fn of(node: &Node) -> Option<Self> {
        Some(match &node.value {
            Value::Null => Self::Null,
            Value::Bool(b) => Self::Bool(*b),
            Value::Int(i) => Self::Int(*i),
            // `+ 0.0` folds -0.0 into 0.0 so that they compare equal, as numbers do.
            Value::Float(f) => Self::Float((f + 0.0).to_bits()),
            Value::String(s) => Self::Str(s.clone()),
            Value::Seq(_) | Value::Map(_) => return None,
        })
    }
}

/// Structural equality of values, used for duplicate detection of (rare) collection keys.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => (x + 0.0).to_bits() == (y + 0.0).to_bits(),
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Seq(x), Value::Seq(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(&a.value, &b.value))
        }
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|((ka, va), (kb, vb))| {
                    same_value(&ka.value, &kb.value) && same_value(&va.value, &vb.value)
                })
        }
        _ => false,
    }
}

impl MapFrame {
    /// Fails if `key` already occurs in this mapping.
    fn check_duplicate(&mut self, key: &Node) -> Result<(), SyntaxError> {
        let first = match ScalarKey::of(key) {
            Some(id) => match self.seen.entry(id) {
                Entry::Occupied(e) => Some(*e.get()),
                Entry::Vacant(e) => {
                    e.insert(key.pos);
                    None
                }
            },
            None => self
                .entries
                .iter()
                .find(|(k, _)| same_value(&k.value, &key.value))
                .map(|(k, _)| k.pos),
        };
        match first {
            Some(first) => {
                let name = key.scalar_text().unwrap_or(Cow::Borrowed(key.kind_name()));
                Err(SyntaxError::new(
                    key.pos,
                    format!("duplicate key `{}` (first at {first})", shorten(&name)),
                ))
            }
            None => Ok(()),
        }
    }
}

impl Builder {
    fn open(&mut self, pos: Pos, anchor: usize, open: Open) -> Result<(), SyntaxError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(SyntaxError::new(
                pos,
                format!("collections are nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.stack.push(Frame { pos, anchor, open });
        Ok(())
    }

    fn close(&mut self, pos: Pos) -> Result<(), SyntaxError> {
        // The parser only emits balanced events; an unmatched end would be a saphyr bug, which
        // we report rather than panic on.
        let frame = self
            .stack
            .pop()
            .ok_or_else(|| SyntaxError::new(pos, "unexpected end of collection"))?;
        let value = match frame.open {
            Open::Seq(items) => Value::Seq(items),
            Open::Map(map) => Value::Map(map.entries),
        };
        self.insert(Node::new(frame.pos, value), frame.anchor)
    }

    fn alias(&mut self, id: usize, pos: Pos) -> Result<(), SyntaxError> {
        let target = self.anchors.get(&id).ok_or_else(|| {
            SyntaxError::new(
                pos,
                "alias refers to an anchor that is not defined earlier in this document",
            )
        })?;
        if self.stack.len() + target.height() > MAX_DEPTH {
            return Err(SyntaxError::new(
                pos,
                format!("alias expansion nests collections deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.alias_nodes += target.count();
        if self.alias_nodes > ALIAS_NODE_BUDGET {
            return Err(SyntaxError::new(
                pos,
                format!("aliases expand to more than {ALIAS_NODE_BUDGET} nodes"),
            ));
        }
        let mut node = target.clone();
        node.pos = pos;
        self.insert(node, 0)
    }

    /// Attaches a finished node to its parent (or makes it the document root).
    fn insert(&mut self, node: Node, anchor: usize) -> Result<(), SyntaxError> {
        // saphyr numbers anchors from 1; 0 means "no anchor".
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame {
                open: Open::Seq(items),
                ..
            }) => items.push(node),
            Some(Frame {
                open: Open::Map(map),
                ..
            }) => match map.key.take() {
                None => {
                    map.check_duplicate(&node)?;
                    map.key = Some(node);
                }
                Some(key) => map.entries.push((key, node)),
            },
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Deserialization
// ---------------------------------------------------------------------------------------------

/// A deserialization error with the position of the offending node and a dotted path from the
/// root of the node given to [`from_node`], e.g. `spec.rules[0].matches[1].path.type` (empty
/// string at the root). Keys that are not plain words are written as `["a.b/c"]`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DeError {
    /// Position of the node the error is about.
    pub pos: Pos,
    /// Dotted path of that node.
    pub path: String,
    /// What went wrong.
    pub message: String,
}

/// Deserialize `T` from a node.
///
/// Strict about types: numbers and booleans are only read from unquoted scalars, while strings
/// accept any non-null scalar verbatim. Errors are positioned at the deepest node involved: an
/// unknown field at its key, a missing field at the mapping, a bad value at the value.
///
/// # Errors
/// Any mismatch between the YAML and `T`, as a [`DeError`].
pub fn from_node<T: de::DeserializeOwned>(node: &Node) -> Result<T, DeError> {
    let root = NodeDe {
        node,
        path: Path::Root,
    };
    T::deserialize(root).map_err(|e| {
        let (pos, path) = e.loc.unwrap_or((node.pos, String::new()));
        DeError {
            pos,
            path,
            message: e.message,
        }
    })
}

/// The serde error type used inside the deserializer.
///
/// Errors start out unpositioned (serde-derived code creates them through `Error::custom` and
/// friends); the first deserializer layer that sees one attaches its node, and since that is
/// the innermost layer, outer layers leave it alone.
#[derive(Debug)]
struct Error {
    loc: Option<(Pos, String)>,
    message: String,
}

impl Error {
    fn at(mut self, node: &Node, path: &Path<'_>) -> Self {
        if self.loc.is_none() {
            self.loc = Some((node.pos, path.render()));
        }
        self
    }
}

impl Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Self {
            loc: None,
            message: msg.to_string(),
        }
    }
}

/// The path from the root to a node, as a linked list through the deserializer's stack frames,
/// so it costs nothing unless an error needs it rendered.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a Node),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match *self {
            Path::Root => {}
            Path::Index(parent, i) => {
                parent.write(out);
                // Writing to a String cannot fail.
                let _ = write!(out, "[{i}]");
            }
            Path::Key(parent, key) => {
                parent.write(out);
                match key.scalar_text() {
                    Some(text) if is_plain_segment(&text) => {
                        if !out.is_empty() {
                            out.push('.');
                        }
                        out.push_str(&text);
                    }
                    Some(text) => {
                        let _ = write!(out, "[{:?}]", shorten(&text));
                    }
                    None => {
                        let _ = write!(out, "[<{}>]", key.kind_name());
                    }
                }
            }
        }
    }
}

/// Whether a key can appear bare in a dotted path without becoming ambiguous.
fn is_plain_segment(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}

/// Deserializes one node.
struct NodeDe<'a> {
    node: &'a Node,
    path: Path<'a>,
}

impl<'a> NodeDe<'a> {
    fn error(&self, message: impl Into<String>) -> Error {
        Error {
            loc: Some((self.node.pos, self.path.render())),
            message: message.into(),
        }
    }

    fn type_error(&self, expected: &str) -> Error {
        self.error(format!(
            "expected {expected}, found {}",
            self.node.describe()
        ))
    }

    fn wrap<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        result.map_err(|e| e.at(self.node, &self.path))
    }

    /// The text of a non-null scalar, for string-like targets.
    fn text(&self) -> Result<Cow<'a, str>, Error> {
        match self.node.value {
            // An empty value is almost always a forgotten value, so it is not silently "".
            Value::Null => Err(self.type_error("a string")),
            _ => self
                .node
                .scalar_text()
                .ok_or_else(|| self.type_error("a string")),
        }
    }

    fn integer(&self) -> Result<i128, Error> {
        match &self.node.value {
            Value::Int(i) => Ok(i128::from(*i)),
            // saphyr resolves integers beyond i64 as floats; the source text still has them.
            Value::Float(_) => self
                .node
                .raw
                .as_deref()
                .and_then(|raw| raw.parse::<i128>().ok())
                .ok_or_else(|| self.type_error("an integer")),
            _ => Err(self.type_error("an integer")),
        }
    }

    fn integer_in<T>(&self, ty: &str, min: T, max: T) -> Result<T, Error>
    where
        T: TryFrom<i128> + Display + Copy,
    {
        let n = self.integer()?;
        T::try_from(n).map_err(|_| {
            self.error(format!(
                "integer {n} is out of range for {ty} ({min}..={max})"
            ))
        })
    }

    fn float(&self) -> Result<f64, Error> {
        match &self.node.value {
            Value::Float(f) => Ok(*f),
            // Writing `1` for a float is natural; the conversion is exact for any sane config.
            #[allow(clippy::cast_precision_loss)]
            Value::Int(i) => Ok(*i as f64),
            _ => Err(self.type_error("a number")),
        }
    }

    fn seq<'de, V: Visitor<'de>>(
        self,
        visitor: V,
        expected: Option<usize>,
    ) -> Result<V::Value, Error> {
        let Value::Seq(items) = &self.node.value else {
            return Err(match expected {
                Some(n) => self.type_error(&format!("a sequence of {n} elements")),
                None => self.type_error("a sequence"),
            });
        };
        if let Some(n) = expected {
            if items.len() != n {
                return Err(self.error(format!(
                    "expected a sequence of {n} elements, found {}",
                    items.len()
                )));
            }
        }
        let mut access = SeqDe {
            items: items.iter().enumerate(),
            path: &self.path,
        };
        let value = self.wrap(visitor.visit_seq(&mut access))?;
        let left = access.items.len();
        if left > 0 {
            return Err(self.error(format!(
                "expected {} elements, found {}",
                items.len() - left,
                items.len()
            )));
        }
        Ok(value)
    }

    fn map<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let Value::Map(entries) = &self.node.value else {
            return Err(self.type_error("a mapping"));
        };
        let access = MapDe {
            entries: entries.iter(),
            value: None,
            path: &self.path,
        };
        self.wrap(visitor.visit_map(access))
    }
}

macro_rules! deserialize_integers {
    ($($method:ident => $ty:ident, $visit:ident;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            let n = self.integer_in(stringify!($ty), $ty::MIN, $ty::MAX)?;
            self.wrap(visitor.$visit(n))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for NodeDe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let result = match &self.node.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            // Non-negative integers go through visit_u64 as in serde_json, so visitors that only
            // implement the unsigned case still work.
            Value::Int(i) => match u64::try_from(*i) {
                Ok(u) => visitor.visit_u64(u),
                Err(_) => visitor.visit_i64(*i),
            },
            Value::Float(f) => match self.node.raw.as_deref().map(str::parse::<u64>) {
                Some(Ok(u)) => visitor.visit_u64(u),
                _ => visitor.visit_f64(*f),
            },
            Value::String(s) => visitor.visit_str(s),
            Value::Seq(_) => return self.seq(visitor, None),
            Value::Map(_) => return self.map(visitor),
        };
        self.wrap(result)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.node.value {
            Value::Bool(b) => self.wrap(visitor.visit_bool(b)),
            _ => Err(self.type_error("a boolean")),
        }
    }

    deserialize_integers! {
        deserialize_i8 => i8, visit_i8;
        deserialize_i16 => i16, visit_i16;
        deserialize_i32 => i32, visit_i32;
        deserialize_i64 => i64, visit_i64;
        deserialize_i128 => i128, visit_i128;
        deserialize_u8 => u8, visit_u8;
        deserialize_u16 => u16, visit_u16;
        deserialize_u32 => u32, visit_u32;
        deserialize_u64 => u64, visit_u64;
        deserialize_u128 => u128, visit_u128;
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        // Narrowing is what the caller asked for by choosing f32.
        #[allow(clippy::cast_possible_truncation)]
        let f = self.float()? as f32;
        self.wrap(visitor.visit_f32(f))
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let f = self.float()?;
        self.wrap(visitor.visit_f64(f))
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let text = self.text()?;
        let mut chars = text.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => self.wrap(visitor.visit_char(c)),
            _ => Err(self.type_error("a single character")),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let text = self.text()?;
        self.wrap(visitor.visit_str(&text))
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if let Value::Seq(_) = self.node.value {
            return self.seq(visitor, None);
        }
        let text = self.text()?;
        self.wrap(visitor.visit_bytes(text.as_bytes()))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if let Value::Null = self.node.value {
            self.wrap(visitor.visit_none())
        } else {
            let (node, path) = (self.node, self.path);
            let inner = NodeDe { node, path };
            visitor.visit_some(inner).map_err(|e| e.at(node, &path))
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.node.value {
            Value::Null => self.wrap(visitor.visit_unit()),
            _ => Err(self.type_error("null")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let (node, path) = (self.node, self.path);
        let result = if name == SPANNED_NAME {
            visitor.visit_map(SpannedAccess {
                node,
                path: &path,
                step: 0,
            })
        } else {
            visitor.visit_newtype_struct(NodeDe { node, path })
        };
        result.map_err(|e| e.at(node, &path))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.seq(visitor, None)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        self.seq(visitor, Some(len))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.seq(visitor, Some(len))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.map(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let single_entry = match &self.node.value {
            Value::Map(entries) => match entries.as_slice() {
                [(key, value)] => Some((key, Some(value))),
                _ => None,
            },
            Value::Null | Value::Seq(_) => None,
            _ => Some((self.node, None)),
        };
        let Some((variant, value)) = single_entry else {
            let names: Vec<String> = variants.iter().map(|v| format!("`{v}`")).collect();
            return Err(self.type_error(&format!(
                "one of {} (or a single-key mapping `variant: value`)",
                names.join(", ")
            )));
        };
        let access = EnumDe {
            path: &self.path,
            variant,
            value,
        };
        self.wrap(visitor.visit_enum(access))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        // Keys such as `null:` or `80:` are still names here; the visitor decides if they fit.
        let text = self
            .node
            .scalar_text()
            .ok_or_else(|| self.type_error("a string"))?;
        self.wrap(visitor.visit_str(&text))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        // Nothing to read: the tree is already parsed, so skipping is free.
        self.wrap(visitor.visit_unit())
    }
}

struct SeqDe<'a> {
    items: std::iter::Enumerate<std::slice::Iter<'a, Node>>,
    path: &'a Path<'a>,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some((i, node)) = self.items.next() else {
            return Ok(None);
        };
        let path = Path::Index(self.path, i);
        seed.deserialize(NodeDe { node, path })
            .map(Some)
            .map_err(|e| e.at(node, &path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapDe<'a> {
    entries: std::slice::Iter<'a, (Node, Node)>,
    /// The entry whose key was just handed out and whose value is next.
    value: Option<&'a (Node, Node)>,
    path: &'a Path<'a>,
}

impl<'de> de::MapAccess<'de> for MapDe<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(entry) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some(entry);
        // The key's path includes the key itself, so "unknown field" errors name it.
        let path = Path::Key(self.path, &entry.0);
        seed.deserialize(NodeDe {
            node: &entry.0,
            path,
        })
        .map(Some)
        .map_err(|e| e.at(&entry.0, &path))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let Some((key, node)) = self.value.take() else {
            return Err(de::Error::custom("map value requested before its key"));
        };
        let path = Path::Key(self.path, key);
        seed.deserialize(NodeDe { node, path })
            .map_err(|e| e.at(node, &path))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// Enum access for both `Variant` (value `None`) and `{Variant: value}`.
struct EnumDe<'a> {
    /// Path of the enum node itself.
    path: &'a Path<'a>,
    variant: &'a Node,
    value: Option<&'a Node>,
}

impl<'a> EnumDe<'a> {
    fn value_path(&self) -> Path<'a> {
        match self.value {
            Some(_) => Path::Key(self.path, self.variant),
            None => *self.path,
        }
    }

    /// The value of a `{Variant: value}` mapping, or an error at the bare variant name.
    fn value_de(&self, what: &str) -> Result<NodeDe<'a>, Error> {
        let path = self.value_path();
        if let Some(node) = self.value {
            return Ok(NodeDe { node, path });
        }
        let name = self.variant.scalar_text().unwrap_or_default();
        let at_variant = NodeDe {
            node: self.variant,
            path,
        };
        Err(at_variant.error(format!(
            "variant `{name}` needs {what}: write it as `{name}: ...`"
        )))
    }
}

impl<'de> de::EnumAccess<'de> for EnumDe<'_> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let path = self.value_path();
        let node = self.variant;
        let value = seed
            .deserialize(NodeDe { node, path })
            .map_err(|e| e.at(node, &path))?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for EnumDe<'_> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.value {
            None => Ok(()),
            Some(node) => de::Deserializer::deserialize_unit(
                NodeDe {
                    node,
                    path: self.value_path(),
                },
                de::IgnoredAny,
            )
            .map(|_| ()),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        let de = self.value_de("a value")?;
        let (node, path) = (de.node, de.path);
        seed.deserialize(de).map_err(|e| e.at(node, &path))
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_tuple(self.value_de("a sequence")?, len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.value_de("a mapping")?.map(visitor)
    }
}

// ---------------------------------------------------------------------------------------------
// Spanned
// ---------------------------------------------------------------------------------------------

/// Newtype-struct name by which [`Spanned`] asks our deserializer for a position. Other
/// deserializers pass newtype structs straight through, which is what makes them still work.
const SPANNED_NAME: &str = "$__egressd_spanned";
const SPANNED_LINE: &str = "$__egressd_spanned_line";
const SPANNED_COLUMN: &str = "$__egressd_spanned_column";
const SPANNED_VALUE: &str = "$__egressd_spanned_value";

/// A value plus the position of the node it was read from.
///
/// Works inside any serde-derived type deserialized by [`from_node`]. With any other
/// deserializer (e.g. `serde_json`), or below `#[serde(flatten)]`/untagged enums (which buffer
/// their input and lose positions), it deserializes the plain value with `Pos::default()`.
///
/// For an optional field, use `Option<Spanned<T>>` rather than `Spanned<Option<T>>`: the
/// latter is a required field for serde.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Spanned<T> {
    /// Where the value's node starts.
    pub pos: Pos,
    /// The value itself.
    pub value: T,
}

impl<T> Spanned<T> {
    /// Wraps a value with a position.
    pub const fn new(pos: Pos, value: T) -> Self {
        Self { pos, value }
    }

    /// Drops the position.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for Spanned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Serialize> Serialize for Spanned<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

/// The position is not part of the data, so the schema is exactly `T`'s.
impl<T: JsonSchema> JsonSchema for Spanned<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_newtype_struct(SPANNED_NAME, SpannedVisitor(PhantomData))
    }
}

struct SpannedVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for SpannedVisitor<T> {
    type Value = Spanned<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }

    /// Any deserializer other than ours lands here.
    fn visit_newtype_struct<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        T::deserialize(deserializer).map(|value| Spanned::new(Pos::default(), value))
    }

    /// Our deserializer answers with the reserved keys of [`SpannedAccess`].
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut line, mut column, mut value) = (None, None, None);
        while let Some(key) = map.next_key::<SpannedKey>()? {
            match key {
                SpannedKey::Line => line = Some(map.next_value::<u32>()?),
                SpannedKey::Column => column = Some(map.next_value::<u32>()?),
                SpannedKey::Value => value = Some(map.next_value::<T>()?),
            }
        }
        match (line, column, value) {
            (Some(line), Some(column), Some(value)) => {
                Ok(Spanned::new(Pos { line, column }, value))
            }
            _ => Err(de::Error::custom("incomplete spanned value")),
        }
    }
}

enum SpannedKey {
    Line,
    Column,
    Value,
}

impl<'de> Deserialize<'de> for SpannedKey {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl Visitor<'_> for KeyVisitor {
            type Value = SpannedKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a spanned-value field")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<SpannedKey, E> {
                match v {
                    SPANNED_LINE => Ok(SpannedKey::Line),
                    SPANNED_COLUMN => Ok(SpannedKey::Column),
                    SPANNED_VALUE => Ok(SpannedKey::Value),
                    _ => Err(E::custom(format!("unexpected spanned-value field `{v}`"))),
                }
            }
        }

        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// Presents a node as `{line, column, value}` to [`SpannedVisitor`].
struct SpannedAccess<'a> {
    node: &'a Node,
    path: &'a Path<'a>,
    step: u8,
}

impl<'de> de::MapAccess<'de> for SpannedAccess<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let key = match self.step {
            0 => SPANNED_LINE,
            1 => SPANNED_COLUMN,
            2 => SPANNED_VALUE,
            _ => return Ok(None),
        };
        seed.deserialize(key.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let step = self.step;
        self.step += 1;
        match step {
            0 => seed.deserialize(self.node.pos.line.into_deserializer()),
            1 => seed.deserialize(self.node.pos.column.into_deserializer()),
            _ => {
                let (node, path) = (self.node, *self.path);
                seed.deserialize(NodeDe { node, path })
                    .map_err(|e| e.at(node, &path))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
            err.message.contains("more than 100000 nodes"),
            "{}",
            err.message
        );

        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let err = parse_documents(&deep).unwrap_err();
        assert!(err.message.contains("nested deeper"), "{}", err.message);
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse_documents(&ok).is_ok());
    }

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
        let s: Scalars = load(
            "name: 0123\nminVersion: 1.10\nport: 8080\nweight: 2\nenabled: false\ninitial: x\n",
        )
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
            "integer 70000 is out of range for u16 (0..=65535)",
        );
        let err = load::<u32>("-1").unwrap_err();
        assert_err(
            &err,
            (1, 1),
            "",
            "integer -1 is out of range for u32 (0..=4294967295)",
        );
        // Beyond i64 but within u64: saphyr sees a float, the source text still has the integer.
        assert_eq!(load::<u64>("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(load::<u128>("18446744073709551616").unwrap(), 1 << 64);
        let err = load::<u64>("18446744073709551616").unwrap_err();
        assert!(
            err.message.contains("out of range for u64"),
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
        let a: Vec<Action> = load(
            "- allow\n- redirect: https://x\n- rewrite: {host: h}\n- pair: [1, 2]\n- deny: ~\n",
        )
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
            load("- type: static\n  address: 10.0.0.1\n- {type: dns, host: h, port: 53}\n")
                .unwrap();
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
        let err =
            from_node::<Route>(&parse_documents(&text.replace("[x, 1]", "[x, [1]]")).unwrap()[1])
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
}
