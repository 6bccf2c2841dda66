//! Building the positioned tree from the `saphyr-parser` event stream: document splitting,
//! duplicate-key detection, alias expansion and the limits that keep hostile input cheap.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

use saphyr_parser::{Event, Marker, Parser, ScalarStyle, ScanError, Tag};

use super::{shorten, Node, Pos, Value};

/// Deepest collection nesting we accept. Real configuration never gets close; the limit exists
/// so that hostile input cannot overflow the stack in the (recursive) deserializer or in `Drop`.
pub(super) const MAX_DEPTH: usize = 128;

/// What one node costs in the tree before its text: the unit in which copies are counted.
const NODE_BYTES: usize = std::mem::size_of::<Node>();

/// Bounds on what parsing one file may build beyond what its text spells out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ParseLimits {
    /// Bytes of tree that anchors and aliases may copy in one file: every alias is a copy of
    /// its anchored node (and registering an anchor keeps one copy). Counted in bytes (each
    /// node's own size plus its text), not nodes, so that 10,000 aliases of one 50 KB string
    /// cost 500 MB of budget, not 10,000 nodes ("billion laughs" and its long-string cousin).
    pub(crate) max_copy_bytes: usize,
}

impl ParseLimits {
    /// 4 MiB: thousands of copies of a typical shared block (a policy, a header list) fit,
    /// and the worst a file can add stays small next to the process.
    pub(crate) const DEFAULT_MAX_COPY_BYTES: usize = 4 << 20;
}

impl Default for ParseLimits {
    fn default() -> Self {
        Self {
            max_copy_bytes: Self::DEFAULT_MAX_COPY_BYTES,
        }
    }
}

impl Pos {
    /// saphyr markers have 1-based lines but 0-based columns.
    fn from_marker(marker: &Marker) -> Self {
        Self {
            line: saturating_u32(marker.line()),
            column: saturating_u32(marker.col().saturating_add(1)),
        }
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A YAML syntax error (from saphyr), or a file that goes beyond a parse limit; positioned.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub(crate) struct SyntaxError {
    /// Where the problem was detected.
    pub(crate) pos: Pos,
    /// What went wrong.
    pub(crate) message: String,
    /// Set when the file may be well-formed but goes beyond a limit.
    pub(crate) limit: Option<Limit>,
}

/// The limit a [`SyntaxError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Collections nested deeper than 128 levels, aliases included.
    Nesting,
    /// Anchors and aliases copying more than [`ParseLimits::max_copy_bytes`].
    Copies,
}

impl SyntaxError {
    fn new(pos: Pos, message: impl Into<String>) -> Self {
        Self {
            pos,
            message: message.into(),
            limit: None,
        }
    }

    fn limit(limit: Limit, pos: Pos, message: impl Into<String>) -> Self {
        Self {
            limit: Some(limit),
            ..Self::new(pos, message)
        }
    }
}

impl From<ScanError> for SyntaxError {
    fn from(e: ScanError) -> Self {
        Self::new(Pos::from_marker(e.marker()), e.info())
    }
}

/// [`parse_documents_with`] with the default [`ParseLimits`]: the unit tests' shorthand.
///
/// # Errors
/// As [`parse_documents_with`].
#[cfg(test)]
pub(crate) fn parse_documents(text: &str) -> Result<Vec<Node>, SyntaxError> {
    parse_documents_with(text, ParseLimits::default())
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
/// Malformed YAML, duplicate keys, undefined aliases, nesting deeper than 128 levels, or
/// anchors and aliases copying more than `limits` allow.
pub(crate) fn parse_documents_with(
    text: &str,
    limits: ParseLimits,
) -> Result<Vec<Node>, SyntaxError> {
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder::new(limits);
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
                let node = scalar_node(text, style, tag.as_ref(), pos);
                let size = Size {
                    bytes: own_bytes(&node),
                    height: 0,
                };
                builder.insert(node, size, anchor)?;
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

/// A node's own size and text: what a copy of a scalar costs.
fn own_bytes(node: &Node) -> usize {
    let text = match &node.value {
        Value::String(s) => s.len(),
        _ => 0,
    };
    NODE_BYTES + text + node.raw.as_deref().map_or(0, str::len)
}

/// What a finished subtree costs to copy, and how deep it nests; tracked as the tree is
/// built, so an alias is priced without walking its target.
#[derive(Clone, Copy, Default)]
struct Size {
    /// Bytes of the whole subtree (see [`own_bytes`]).
    bytes: usize,
    /// Collection levels below and including the node (0 for a scalar).
    height: usize,
}

/// An anchored node, kept for the aliases that refer to it.
struct Anchored {
    node: Node,
    size: Size,
}

/// Takes `bytes` from the copy budget before anything is copied.
fn charge(
    budget: &mut usize,
    limits: ParseLimits,
    bytes: usize,
    pos: Pos,
) -> Result<(), SyntaxError> {
    match budget.checked_sub(bytes) {
        Some(left) => {
            *budget = left;
            Ok(())
        }
        None => Err(SyntaxError::limit(
            Limit::Copies,
            pos,
            format!(
                "anchors and aliases expand to more than {}",
                crate::config::limits::show_bytes(limits.max_copy_bytes as u64)
            ),
        )),
    }
}

/// Turns the flat event stream into trees.
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Anchored>,
    /// Bytes anchors and aliases may still copy in this file.
    copy_budget: usize,
    limits: ParseLimits,
    root: Option<Node>,
}

/// A collection whose end event has not arrived yet.
struct Frame {
    pos: Pos,
    anchor: usize,
    open: Open,
    /// The sizes of its children so far: bytes summed, height the deepest.
    children: Size,
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
    fn new(limits: ParseLimits) -> Self {
        Self {
            stack: Vec::new(),
            anchors: HashMap::new(),
            copy_budget: limits.max_copy_bytes,
            limits,
            root: None,
        }
    }

    fn open(&mut self, pos: Pos, anchor: usize, open: Open) -> Result<(), SyntaxError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(SyntaxError::limit(
                Limit::Nesting,
                pos,
                format!("collections are nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.stack.push(Frame {
            pos,
            anchor,
            open,
            children: Size::default(),
        });
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
        let size = Size {
            bytes: NODE_BYTES.saturating_add(frame.children.bytes),
            height: frame.children.height + 1,
        };
        self.insert(Node::new(frame.pos, value), size, frame.anchor)
    }

    fn alias(&mut self, id: usize, pos: Pos) -> Result<(), SyntaxError> {
        let target = self.anchors.get(&id).ok_or_else(|| {
            SyntaxError::new(
                pos,
                "alias refers to an anchor that is not defined earlier in this document",
            )
        })?;
        let size = target.size;
        if self.stack.len() + size.height > MAX_DEPTH {
            return Err(SyntaxError::limit(
                Limit::Nesting,
                pos,
                format!("alias expansion nests collections deeper than {MAX_DEPTH} levels"),
            ));
        }
        charge(&mut self.copy_budget, self.limits, size.bytes, pos)?;
        let mut node = target.node.clone();
        node.pos = pos;
        self.insert(node, size, 0)
    }

    /// Attaches a finished node to its parent (or makes it the document root).
    fn insert(&mut self, node: Node, size: Size, anchor: usize) -> Result<(), SyntaxError> {
        // saphyr numbers anchors from 1; 0 means "no anchor".
        if anchor > 0 {
            // Keeping the anchor is a copy too: nested anchors would otherwise copy a large
            // subtree once per level without a single alias.
            charge(&mut self.copy_budget, self.limits, size.bytes, node.pos)?;
            let anchored = Anchored {
                node: node.clone(),
                size,
            };
            self.anchors.insert(anchor, anchored);
        }
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(node);
            return Ok(());
        };
        frame.children.bytes = frame.children.bytes.saturating_add(size.bytes);
        frame.children.height = frame.children.height.max(size.height);
        match &mut frame.open {
            Open::Seq(items) => items.push(node),
            Open::Map(map) => match map.key.take() {
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
