//! [`Spanned`]: a value that remembers the position of the node it was read from.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Visitor};
use serde::{Deserialize, Serialize};

use super::Pos;

/// Newtype-struct name by which [`Spanned`] asks our deserializer for a position. Other
/// deserializers pass newtype structs straight through, which is what makes them still work.
pub(super) const SPANNED_NAME: &str = "$__egressd_spanned";
pub(super) const SPANNED_LINE: &str = "$__egressd_spanned_line";
pub(super) const SPANNED_COLUMN: &str = "$__egressd_spanned_column";
pub(super) const SPANNED_VALUE: &str = "$__egressd_spanned_value";

/// A value plus the position of the node it was read from.
///
/// Works inside any serde-derived type deserialized by [`from_node_all`]. With any other
/// deserializer (e.g. `serde_json`), or below `#[serde(flatten)]`/untagged enums (which buffer
/// their input and lose positions), it deserializes the plain value with `Pos::default()`.
///
/// For an optional field, use `Option<Spanned<T>>` rather than `Spanned<Option<T>>`: the
/// latter is a required field for serde.
///
/// [`from_node_all`]: super::from_node_all
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Spanned<T> {
    /// Where the value's node starts.
    pub(crate) pos: Pos,
    /// The value itself.
    pub(crate) value: T,
}

impl<T> Spanned<T> {
    /// Wraps a value with a position.
    pub(crate) const fn new(pos: Pos, value: T) -> Self {
        Self { pos, value }
    }

    /// Drops the position.
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> T {
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

    /// Our deserializer answers with the reserved keys of `deserializer::SpannedAccess`.
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
