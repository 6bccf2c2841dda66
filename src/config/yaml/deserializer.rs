//! A strict serde deserializer over the positioned tree, whose errors carry the position and
//! dotted path of the offending node.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Display, Write as _};

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use super::spanned::{SPANNED_COLUMN, SPANNED_LINE, SPANNED_NAME, SPANNED_VALUE};
use super::{shorten, Node, Pos, Value};

/// A deserialization error with the position of the offending node and a dotted path from the
/// root of the node given to [`from_node_all`], e.g. `spec.rules[0].matches[1].path.type` (empty
/// string at the root). Keys that are not plain words are written as `["a.b/c"]`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub(crate) struct DeError {
    /// Position of the node the error is about.
    pub(crate) pos: Pos,
    /// Dotted path of that node.
    pub(crate) path: String,
    /// What went wrong.
    pub(crate) message: String,
}

/// Deserialize `T` from a node, stopping at the first error: the unit tests' entry point (the
/// loader reads with [`from_node_all`]).
///
/// # Errors
/// The first mismatch between the YAML and `T`, as a [`DeError`].
#[cfg(test)]
pub(crate) fn from_node<T: de::DeserializeOwned>(node: &Node) -> Result<T, DeError> {
    attempt(node, &Pruned::new()).map_err(|e| e.positioned(node))
}

/// Deserialize `T` from a node, reporting every error of the node, up to `max_errors`.
///
/// Strict about types: numbers and booleans are only read from unquoted scalars, while strings
/// accept any non-null scalar verbatim. Errors are positioned at the deepest node involved: an
/// unknown field at its key, a missing field at the mapping, a bad value at the value.
///
/// serde stops at the first error, so after each error the offending node is left out (its
/// mapping entry, its sequence item) and deserialization starts over, until it succeeds or
/// nothing more can be left out. An error that only follows from a node left out (its mapping
/// now lacks that field, its sequence is now too short) is not reported; a field missing from
/// the start still is. Sequence indices in paths stay those of the file.
///
/// # Errors
/// Every mismatch found, in the order found (at least one).
pub(crate) fn from_node_all<T: de::DeserializeOwned>(
    node: &Node,
    max_errors: usize,
) -> Result<T, Vec<DeError>> {
    let mut pruned = Pruned::new();
    // Collections something was left out of, with the keys left out (none for sequences).
    let mut touched: HashMap<usize, Vec<String>> = HashMap::new();
    let mut errors = Vec::new();
    // Each attempt leaves out one more node, so this ends; the cap bounds the time a hostile
    // object can take (each attempt walks it whole).
    for _ in 0..max_errors.saturating_mul(4).saturating_add(16) {
        let e = match attempt::<T>(node, &pruned) {
            Ok(value) if errors.is_empty() => return Ok(value),
            Ok(_) => return Err(errors),
            Err(e) => e,
        };
        let consequence = e.chain.first().is_some_and(|id| {
            pruned.contains(id)
                || touched
                    .get(id)
                    .is_some_and(|left_out| !is_missing_field_other_than(&e.message, left_out))
        });
        // The innermost node not left out yet: one already left out is still visited when its
        // container cannot skip it (an enum's value), so its container goes instead.
        let victim = e.chain.iter().position(|id| !pruned.contains(id));
        let chain = e.chain.clone();
        if !consequence {
            errors.push(e.positioned(node));
            if errors.len() >= max_errors {
                return Err(errors);
            }
        }
        // The root cannot be left out: stop there.
        let Some((victim, parent)) = victim.and_then(|i| Some((chain[i], *chain.get(i + 1)?)))
        else {
            return Err(errors);
        };
        pruned.insert(victim);
        let key = entry_key(node, parent, victim);
        touched.entry(parent).or_default().extend(key);
    }
    Err(errors)
}

/// One deserialization of `node`, skipping the `pruned` nodes.
fn attempt<T: de::DeserializeOwned>(node: &Node, pruned: &Pruned) -> Result<T, Error> {
    T::deserialize(NodeDe {
        node,
        path: Path::Root,
        pruned,
    })
}

/// Whether `message` is serde's "missing field `x`" for an `x` that was not left out.
fn is_missing_field_other_than(message: &str, left_out: &[String]) -> bool {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
        .is_some_and(|field| !left_out.iter().any(|k| k == field))
}

/// The key of the entry of mapping `parent` (somewhere below `root`) whose key or value is
/// `child`; `None` for sequences.
fn entry_key(root: &Node, parent: usize, child: usize) -> Option<String> {
    let entries = find(root, parent)?.as_map()?;
    entries
        .iter()
        .find(|(k, v)| node_id(k) == child || node_id(v) == child)
        .and_then(|(k, _)| k.scalar_text().map(Cow::into_owned))
}

fn find(node: &Node, id: usize) -> Option<&Node> {
    if node_id(node) == id {
        return Some(node);
    }
    match &node.value {
        Value::Seq(items) => items.iter().find_map(|n| find(n, id)),
        Value::Map(entries) => entries
            .iter()
            .find_map(|(k, v)| find(k, id).or_else(|| find(v, id))),
        _ => None,
    }
}

/// A node's identity while one tree is deserialized: its address (the tree is borrowed, so
/// nothing moves).
fn node_id(node: &Node) -> usize {
    std::ptr::from_ref(node).addr()
}

/// Nodes an earlier attempt found bad, skipped by the next one.
type Pruned = HashSet<usize>;

/// The serde error type used inside the deserializer.
///
/// Errors start out unpositioned (serde-derived code creates them through `Error::custom` and
/// friends); the first deserializer layer that sees one attaches its node, and since that is
/// the innermost layer, outer layers leave it alone.
#[derive(Debug)]
struct Error {
    loc: Option<(Pos, String)>,
    /// The offending node and its ancestors, innermost first, as the error passed them on
    /// its way out (for [`from_node_all`]).
    chain: Vec<usize>,
    message: String,
}

impl Error {
    fn at(mut self, node: &Node, path: &Path<'_>) -> Self {
        if self.loc.is_none() {
            self.loc = Some((node.pos, path.render()));
        }
        let id = node_id(node);
        if self.chain.last() != Some(&id) {
            self.chain.push(id);
        }
        self
    }

    fn positioned(self, root: &Node) -> DeError {
        let (pos, path) = self.loc.unwrap_or((root.pos, String::new()));
        DeError {
            pos,
            path,
            message: self.message,
        }
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
            chain: Vec::new(),
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
    pruned: &'a Pruned,
}

/// Whether an earlier attempt left `node` out.
fn is_pruned(pruned: &Pruned, node: &Node) -> bool {
    !pruned.is_empty() && pruned.contains(&node_id(node))
}

impl<'a> NodeDe<'a> {
    fn error(&self, message: impl Into<String>) -> Error {
        Error {
            loc: Some((self.node.pos, self.path.render())),
            chain: vec![node_id(self.node)],
            message: message.into(),
        }
    }

    /// Another node deserialized in this one's attempt.
    fn child(&self, node: &'a Node, path: Path<'a>) -> NodeDe<'a> {
        NodeDe {
            node,
            path,
            pruned: self.pruned,
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

    /// The integer, if `min..=max` holds it. The error says only the range: the Rust type
    /// means nothing to whoever writes YAML.
    fn integer_in<T>(&self, min: T, max: T) -> Result<T, Error>
    where
        T: TryFrom<i128> + Display + Copy,
    {
        let n = self.integer()?;
        T::try_from(n)
            .map_err(|_| self.error(format!("{n} is out of range: it must be {min} to {max}")))
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
        let pruned = self.pruned;
        let live = |items: &mut dyn Iterator<Item = &Node>| {
            items.filter(|n| !is_pruned(pruned, n)).count()
        };
        let len = live(&mut items.iter());
        if let Some(n) = expected {
            if len != n {
                return Err(self.error(format!("expected a sequence of {n} elements, found {len}")));
            }
        }
        let mut access = SeqDe {
            items: items.iter().enumerate(),
            path: &self.path,
            pruned: self.pruned,
        };
        let value = self.wrap(visitor.visit_seq(&mut access))?;
        let left = live(&mut access.items.clone().map(|(_, n)| n));
        if left > 0 {
            return Err(self.error(format!("expected {} elements, found {len}", len - left)));
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
            pruned: self.pruned,
        };
        self.wrap(visitor.visit_map(access))
    }
}

macro_rules! deserialize_integers {
    ($($method:ident => $ty:ident, $visit:ident;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            let n = self.integer_in($ty::MIN, $ty::MAX)?;
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
            let inner = self.child(node, path);
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
                pruned: self.pruned,
                step: 0,
            })
        } else {
            visitor.visit_newtype_struct(self.child(node, path))
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
            pruned: self.pruned,
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
    pruned: &'a Pruned,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        // Indices count the items left out, so paths stay those of the file.
        let Some((i, node)) = self.items.find(|(_, n)| !is_pruned(self.pruned, n)) else {
            return Ok(None);
        };
        let path = Path::Index(self.path, i);
        let pruned = self.pruned;
        seed.deserialize(NodeDe { node, path, pruned })
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
    pruned: &'a Pruned,
}

impl<'de> de::MapAccess<'de> for MapDe<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let pruned = self.pruned;
        let Some(entry) = self
            .entries
            .find(|(k, v)| !is_pruned(pruned, k) && !is_pruned(pruned, v))
        else {
            return Ok(None);
        };
        self.value = Some(entry);
        // The key's path includes the key itself, so "unknown field" errors name it.
        let path = Path::Key(self.path, &entry.0);
        seed.deserialize(NodeDe {
            node: &entry.0,
            path,
            pruned,
        })
        .map(Some)
        .map_err(|e| e.at(&entry.0, &path))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let Some((key, node)) = self.value.take() else {
            return Err(de::Error::custom("map value requested before its key"));
        };
        let path = Path::Key(self.path, key);
        let pruned = self.pruned;
        seed.deserialize(NodeDe { node, path, pruned })
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
    pruned: &'a Pruned,
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
        let pruned = self.pruned;
        if let Some(node) = self.value {
            return Ok(NodeDe { node, path, pruned });
        }
        let name = self.variant.scalar_text().unwrap_or_default();
        let at_variant = NodeDe {
            node: self.variant,
            path,
            pruned,
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
        let (node, pruned) = (self.variant, self.pruned);
        let value = seed
            .deserialize(NodeDe { node, path, pruned })
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
                    pruned: self.pruned,
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

/// Presents a node as `{line, column, value}` to `spanned::SpannedVisitor`.
struct SpannedAccess<'a> {
    node: &'a Node,
    path: &'a Path<'a>,
    pruned: &'a Pruned,
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
                let (node, path, pruned) = (self.node, *self.path, self.pruned);
                seed.deserialize(NodeDe { node, path, pruned })
                    .map_err(|e| e.at(node, &path))
            }
        }
    }
}
